"""What a tool adapter declares and returns.

An adapter turns one call into one provider request and classifies the answer into the four
facts (docs/architecture.md). Its outcome keeps apart transport status, provider status, data status and
side-effect status, because "the HTTP call failed" and "the refund did not happen" are not the
same statement.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from ledger.models import Fact


@dataclass(frozen=True)
class Outcome:
    fact: str  # one of Fact
    transport: str  # ok, timeout, connect_error, reset, protocol_error
    provider_status: str = ""  # e.g. HTTP 201, SMTP 250
    data_status: str = ""  # valid, invalid, conflict, ...
    side_effect: str = "unknown"  # committed, none, unknown
    error_class: str = ""  # rate_limited, unavailable, validation, timeout, connect, ...
    error_code: str = ""
    retry_after: float | None = None
    receipt: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def as_evidence(self) -> dict[str, Any]:
        """Every field, for the attempt's JSON column (written at once, so not copied)."""
        return {name: getattr(self, name) for name in _OUTCOME_FIELDS}


_OUTCOME_FIELDS = tuple(f.name for f in fields(Outcome))


@dataclass(frozen=True)
class QueryAnswer:
    """What the provider says about a key: found (with receipt), processing, absent, or
    cannot tell (error)."""

    state: str  # found, processing, absent, error
    receipt: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict)


FOUND, PROCESSING, ABSENT, ERROR = "found", "processing", "absent", "error"


class Adapter(Protocol):
    name: str
    can_query: bool

    def execute(self, arguments: dict[str, Any], *, key: str, timeout: float) -> Outcome: ...

    def query(self, *, key: str, timeout: float) -> QueryAnswer: ...

    def preview(self, arguments: dict[str, Any]) -> dict[str, Any] | None: ...


def effect_differences(adapter: Adapter, arguments: dict[str, Any], receipt: dict[str, Any]) -> dict[str, dict]:
    """Where an effect the provider holds differs from the approved intent, per adapter
    (`differences(arguments, receipt)`): {field: {"intent": …, "found": …}}. An adapter that
    cannot compare (nothing in its receipt to compare) reports none."""
    compare = getattr(adapter, "differences", None)
    return compare(arguments, receipt) if compare is not None else {}


def not_sent(error_class: str, *, transport: str, code: str = "", retry_after: float | None = None,
             raw: dict | None = None, provider_status: str = "") -> Outcome:
    return Outcome(Fact.NOT_SENT, transport, provider_status=provider_status, side_effect="none",
                   error_class=error_class, error_code=code, retry_after=retry_after, raw=raw or {})


def unknown(error_class: str, *, transport: str, code: str = "", raw: dict | None = None,
            provider_status: str = "") -> Outcome:
    return Outcome(Fact.UNKNOWN, transport, provider_status=provider_status, side_effect="unknown",
                   error_class=error_class, error_code=code, raw=raw or {})


def known_failure(error_class: str, *, code: str, raw: dict | None = None, data_status: str = "invalid",
                  provider_status: str = "") -> Outcome:
    return Outcome(Fact.KNOWN_FAILURE, "ok", provider_status=provider_status or code, data_status=data_status,
                   side_effect="none", error_class=error_class, error_code=code, raw=raw or {})


def known_success(*, receipt: dict[str, Any], result: dict[str, Any] | None = None, code: str = "",
                  raw: dict | None = None) -> Outcome:
    return Outcome(Fact.KNOWN_SUCCESS, "ok", provider_status=code, data_status="valid",
                   side_effect="committed", receipt=receipt, result=result, raw=raw or {})
