"""Domain errors. Each carries the API error code and HTTP status it maps to."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    code = "invalid"
    status = 400

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class InvalidInput(DomainError):
    code, status = "invalid", 400


class NotPermitted(DomainError):
    code, status = "forbidden", 403


class NotFound(DomainError):
    code, status = "not_found", 404


class Conflict(DomainError):
    """A compare-and-set lost, a version or token is stale, or the thing is in flight."""

    code, status = "conflict", 409


class StaleFencingToken(Conflict):
    """Another holder of the task's lease took it since this token was granted: the caller may
    no longer act for the task (details: `fencing_token` sent, `current`)."""

    code = "stale_fencing_token"


class IllegalTransition(Conflict):
    code = "illegal_transition"


class IntentMismatch(DomainError):
    """Same key (call ID or operation ID), other intent."""

    code, status = "intent_mismatch", 422


class RateLimited(DomainError):
    code, status = "rate_limited", 429

    def __init__(self, message: str, *, retry_after: int, details: dict[str, Any] | None = None):
        super().__init__(message, details=details)
        self.retry_after = retry_after
