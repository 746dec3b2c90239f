"""Signing per Standard Webhooks (symmetric, version 1).

A message carries three headers: `webhook-id` (the message's ID, the same on every retry, so a
receiver can drop duplicates), `webhook-timestamp` (integer seconds since the epoch, of this
attempt) and `webhook-signature`: `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}`
under the secret. The secret is written `whsec_` and the base64 of its bytes (at least 24 bytes,
at most 64, by the specification's advice; `new_secret` makes 32).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64


class InvalidSecret(ValueError):
    pass


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_bytes(secret: str) -> bytes:
    """The key of a `whsec_…` secret; InvalidSecret says what is wrong (never the secret)."""
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidSecret(f"a webhook secret starts with {SECRET_PREFIX}")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidSecret("a webhook secret is whsec_ followed by base64") from exc
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise InvalidSecret(f"a webhook secret holds {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, not {len(key)}")
    return key


def signature(key: bytes, *, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def headers(secret: str, *, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of one attempt to send `body`."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret_bytes(secret), msg_id=msg_id, timestamp=timestamp, body=body),
    }
