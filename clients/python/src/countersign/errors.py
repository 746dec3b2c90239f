"""What a call can end in, besides its result. Every error says what happened, never a silent
"approval required": a call that is still waiting when the caller stops waiting is `NotFinal`."""

from __future__ import annotations

from typing import Any


class CountersignError(Exception):
    """Base class of everything this client raises."""


class CountersignUnavailable(CountersignError):
    """The server could not be reached (connection refused, timeouts, 502/503/504) after retries.
    Nothing is known about the call: retrying it with the same step is safe."""


class ApiError(CountersignError):
    """The server answered with its error shape ({"error": {"code", "message", "details"}})."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details or {}


class LeaseLost(CountersignError):
    """Another owner holds the task's lease: this process may no longer act for the task."""


class StaleFencingToken(LeaseLost):
    """A proposal or commit carried a fencing token the server no longer accepts: a newer holder
    of the lease (this agent's own restart, or another owner after expiry) replaced this process.
    `current` is the token in force."""

    def __init__(self, message: str, *, current: int | None) -> None:
        super().__init__(message)
        self.current = current


class TaskFinished(CountersignError):
    """The task registered under this key is finished (handed to its verifier, succeeded, failed
    or cancelled) and takes no lease: a restart has nothing left to do for it. `task` is the task
    as `GET /api/v1/tasks?idempotency_key=` reads it."""

    def __init__(self, task: dict[str, Any]) -> None:
        super().__init__(f"task {task.get('task_id')} is {task.get('status')}")
        self.task = task


class CallError(CountersignError):
    """A call that ended without running to a result. `answer` is the server's last call answer."""

    def __init__(self, message: str, answer: dict[str, Any]) -> None:
        super().__init__(message)
        self.answer = answer
        self.call_id = answer.get("call_id")
        self.operation_id = answer.get("operation_id")


class Rejected(CallError):
    """A reviewer said no."""

    def __init__(self, answer: dict[str, Any]) -> None:
        decision = answer.get("decision") or {}
        self.reason: str = decision.get("reason") or ""
        self.by: str = decision.get("by") or ""
        super().__init__(f"rejected by {self.by}: {self.reason}", answer)


class Refused(CallError):
    """The gate said no (policy, budget)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.reasons: list[str] = list(answer.get("reasons") or [])
        super().__init__("refused: " + "; ".join(self.reasons), answer)


class Expired(CallError):
    """Nobody decided in time."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__("the approval expired", answer)


class Cancelled(CallError):
    """The approval no longer held (the task moved, the tool's schema changed, the call was edited)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        decision = answer.get("decision") or {}
        self.reason: str = decision.get("reason") or ""
        super().__init__(f"cancelled: {self.reason}", answer)


class Failed(CallError):
    """The provider answered that the call failed: no effect happened."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.error: str = answer.get("last_error") or ""
        super().__init__(f"failed: {self.error}", answer)


class OutcomeUnknown(CallError):
    """The call may or may not have had its effect (`unknown`, `manual`, `compensation_required`):
    people resolve it in the console. Never retry it under a new step."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.status: str = answer.get("status") or ""
        super().__init__(f"outcome unknown ({self.status}) for operation {answer.get('operation_id')}", answer)


class NotFinal(CallError):
    """The caller's `timeout` passed while the call was still open (waiting for a person, running
    or being reconciled). Calling again with the same step continues the same call."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(f"still {answer.get('status')} ({(answer.get('decision') or {}).get('outcome')})", answer)
