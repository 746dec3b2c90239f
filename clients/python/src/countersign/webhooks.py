"""Verify Countersign's decision webhooks (Standard Webhooks, symmetric version 1).

```python
from countersign import webhooks

event = webhooks.verify(request.headers, request.body, secret)   # raises WebhookVerificationError
if event["type"] == "call.decided": ...
```

`body` must be the raw bytes received (a re-serialised JSON object does not verify). `secret`
is the agent's `whsec_…` signing secret. `event["data"]` is the call answer of
`GET /api/v1/calls/{id}` as of the decision. The same event may arrive more than once (a retry
after a lost answer): `event_id(headers)` is the same each time, so keep the ones you handled.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

SECRET_PREFIX = "whsec_"
TOLERANCE_SECONDS = 300


class WebhookVerificationError(Exception):
    """The request is not a webhook signed with this secret (or it is too old or too new)."""


def _key(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        return secret
    raw = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("a webhook secret is whsec_ followed by base64") from exc


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    raise WebhookVerificationError(f"missing header {name}")


def event_id(headers: Mapping[str, str]) -> str:
    """The message's `webhook-id`: the same on every delivery attempt of one event."""
    return _header(headers, "webhook-id")


def verify(headers: Mapping[str, str], body: bytes | str, secret: str | bytes, *,
           tolerance: float = TOLERANCE_SECONDS, now: float | None = None) -> dict[str, Any]:
    """Checks the signature and the timestamp; returns the parsed event
    `{"type", "timestamp", "data"}`. Raises WebhookVerificationError otherwise."""
    body = body.encode() if isinstance(body, str) else body
    msg_id = _header(headers, "webhook-id")
    stamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    try:
        timestamp = int(stamp)
    except ValueError as exc:
        raise WebhookVerificationError("webhook-timestamp is not a number of seconds") from exc
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise WebhookVerificationError("webhook-timestamp is too old or too new")
    expected = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    for candidate in signatures.split():
        version, _, value = candidate.partition(",")
        if version != "v1":
            continue
        try:
            given = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        if hmac.compare_digest(expected, given):
            return json.loads(body)
    raise WebhookVerificationError("no matching signature")
