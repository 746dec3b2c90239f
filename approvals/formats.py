"""Strict string formats for tool schemas, registered on the format checker the gate uses.

jsonschema's own "email" check is only "contains an @": it let "bob@acme.test, evil@x.test" (two
recipients in one entry) and "ceo@acme.test\\u202emoc.live@" (a right-to-left override that makes
a reviewer read another address) through. Here an address is exactly one plain mailbox, the way
an SMTP envelope takes it: an ASCII local part (RFC 5321 dot-atom) and a domain that IDNA 2008
accepts as written (no character that its mapping would change, so what a reviewer reads is
what is sent), with at least two labels. No display name, no comment, no whitespace, no control
or invisible character.
"""

from __future__ import annotations

import re
from typing import Any

import idna
from jsonschema import Draft202012Validator

from console.lib.reveal import ascii_domain, hidden_characters

_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LOCAL = re.compile(rf"{_ATEXT}(?:\.{_ATEXT})*")
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


class NotAMailbox(ValueError):
    pass


def check_mailbox(value: str) -> None:
    """Raise NotAMailbox saying why `value` is not exactly one plain address."""
    if hidden_characters(value) or " " in value:
        raise NotAMailbox("holds whitespace, control or invisible characters")
    local, at, domain = value.rpartition("@")
    if not at or not local or not domain:
        raise NotAMailbox("is not local-part@domain")
    if len(value) > 254 or len(local) > 64:
        raise NotAMailbox("is longer than an address may be")
    if not _LOCAL.fullmatch(local):
        raise NotAMailbox("has a local part that is not a plain dot-atom (one address, no name, no comma)")
    encoded = ascii_domain(domain)
    if encoded is None:
        raise NotAMailbox("has a domain that is not a valid (international) domain name")
    if not domain.isascii() and idna.decode(encoded) != domain.lower():
        raise NotAMailbox("has a domain that IDNA would change: it would not be sent as shown")
    labels = encoded.lower().split(".")
    if len(labels) < 2 or not all(_LABEL.fullmatch(label) for label in labels):
        raise NotAMailbox("has a domain that is not host.tld")


def is_mailbox(value: Any) -> bool:
    if not isinstance(value, str):
        return True  # the schema's "type" judges other values
    check_mailbox(value)
    return True


# The gate validates with Draft202012Validator.FORMAT_CHECKER (approvals/gate.py): the strict
# check replaces jsonschema's for "email" and "idn-email" there, and wherever else it is used.
for _name in ("email", "idn-email"):
    Draft202012Validator.FORMAT_CHECKER.checks(_name, raises=NotAMailbox)(is_mailbox)
