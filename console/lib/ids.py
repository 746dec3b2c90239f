"""Identifiers: time-ordered random IDs with a readable prefix, and derived operation IDs."""

from __future__ import annotations

import hashlib

from ulid import PureRandomPolicy, ULIDGenerator

# Fresh randomness for every ID, as a ULID's 80 random bits are meant: the library's default
# policy instead adds one to the previous ID within a millisecond, which a forked worker (Celery
# prefork) would repeat from its parent's state.
_ULIDS = ULIDGenerator(policy=PureRandomPolicy())


def new_id(prefix: str) -> str:
    """`prefix_` + a ULID (26 characters, sortable by creation time) in lower case.

    Existing rows hold lower-case IDs; lower-casing the canonical upper-case Crockford base32
    keeps their order, because both alphabets sort the same way."""
    return f"{prefix}_{str(_ULIDS.generate()).lower()}"


def derive_operation_id(*, tenant: str, task_id: str, step_id: str, tool: str) -> str:
    """One logical step yields one operation, whatever call ID the model invents next time."""
    material = "\x1f".join((tenant, task_id, step_id, tool)).encode()
    return "op_" + hashlib.sha256(material).hexdigest()[:32]
