"""Identifiers: time-ordered random IDs with a readable prefix, and derived operation IDs."""

from __future__ import annotations

import hashlib
import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _base32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, rem = divmod(value, 32)
        chars.append(_ALPHABET[rem])
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    """`prefix_` + 26 characters, sortable by creation time (ULID layout)."""
    millis = int(time.time() * 1000)
    randomness = int.from_bytes(os.urandom(10), "big")
    return f"{prefix}_{_base32(millis, 10)}{_base32(randomness, 16)}"


def derive_operation_id(*, tenant: str, task_id: str, step_id: str, tool: str) -> str:
    """One logical step yields one operation, whatever call ID the model invents next time."""
    material = "\x1f".join((tenant, task_id, step_id, tool)).encode()
    return "op_" + hashlib.sha256(material).hexdigest()[:32]
