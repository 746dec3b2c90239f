"""Canonical JSON (RFC 8785) and the hashes bound to it."""

from __future__ import annotations

import hashlib
from decimal import Decimal
from typing import Any

import rfc8785


def _plain(value: Any) -> Any:
    # RFC 8785 knows JSON numbers only; a Decimal from a form or the ORM is its float value.
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def canonical_json(value: Any) -> bytes:
    return rfc8785.dumps(_plain(value))


def sha256_hex(value: Any) -> str:
    return digest(canonical_json(value))


def digest(canonical: bytes) -> str:
    """The hex SHA-256 of canonical JSON already made."""
    return hashlib.sha256(canonical).hexdigest()


def arguments_hash(arguments: dict[str, Any]) -> str:
    return sha256_hex(arguments)


def intent_hash(*, tool: str, arguments: dict[str, Any], principal: str) -> str:
    """SHA-256 of the canonical JSON of tool, arguments and principal (one object)."""
    return intent_hash_of(tool=tool, arguments_json=canonical_json(arguments), principal=principal)


def intent_hash_of(*, tool: str, arguments_json: bytes, principal: str) -> str:
    """`intent_hash`, given the arguments' canonical JSON (a proposal has it already, for the
    arguments' own hash). The object's canonical form is its members in key order, each value
    in its own canonical form: "arguments" < "principal" < "tool"."""
    return digest(b'{"arguments":' + arguments_json + b',"principal":' + rfc8785.dumps(principal)
                  + b',"tool":' + rfc8785.dumps(tool) + b"}")
