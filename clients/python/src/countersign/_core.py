"""What the sync and async clients share: request bodies, the stable call ID and the reading of
a call answer. No I/O here."""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import quote

import httpx

from countersign.errors import (
    ApiError,
    Cancelled,
    CountersignUnavailable,
    Expired,
    Failed,
    LeaseLost,
    OutcomeUnknown,
    Refused,
    Rejected,
)

API = "/api/v1"
# Transport failures and these statuses are retried: every write the client makes is idempotent
# (the task by its Idempotency-Key, a call by its call ID, a lease renewal by its owner).
RETRY_STATUSES = {502, 503, 504}
RETRIES = 6
BACKOFF_SECONDS = 0.25
POLL_SECONDS = 25  # under the server's 30 s cap, and under the HTTP timeout
UNRESOLVED = {"unknown", "manual", "compensation_required"}


def call_id_for(task_id: str, step_id: str, tool: str) -> str:
    """The same (task, step, tool) always proposes under the same call ID, so a process that
    died after proposing finds its call (and its operation) again."""
    digest = hashlib.sha256(f"{task_id}\0{step_id}\0{tool}".encode()).hexdigest()
    return f"cs-{digest[:40]}"


def call_path(call_id: str) -> str:
    return f"{API}/calls/{quote(call_id, safe='')}"


def start_body(*, task_type: str, goal: str, inputs: dict | None, constraints: dict | None,
               success_criteria: list | None, owner: str, ttl_seconds: int) -> dict[str, Any]:
    body: dict[str, Any] = {"task_type": task_type, "goal": goal, "lease": {"owner": owner, "ttl_seconds": ttl_seconds}}
    if inputs is not None:
        body["inputs"] = inputs
    if constraints is not None:
        body["constraints"] = constraints
    if success_criteria is not None:
        body["success_criteria"] = success_criteria
    return body


def api_error(response: httpx.Response) -> ApiError:
    try:
        error = response.json()["error"]
        return ApiError(response.status_code, error.get("code", ""), error.get("message", ""), error.get("details"))
    except (ValueError, KeyError, TypeError):
        return ApiError(response.status_code, "http_error", response.text[:500])


def settle(response: httpx.Response) -> dict[str, Any] | None:
    """The answer's body; None when the request is worth retrying; the error shape raised."""
    if response.status_code in RETRY_STATUSES:
        return None
    if response.status_code >= 400:
        raise api_error(response)
    return response.json()


def backoff(attempt: int) -> float:
    return BACKOFF_SECONDS * 2 ** (attempt - 1) if attempt else 0.0


def unavailable(base_url: str, last: object) -> CountersignUnavailable:
    return CountersignUnavailable(f"Countersign at {base_url} cannot be reached: {last}")


def is_open(answer: dict[str, Any]) -> bool:
    """Still worth waiting on: not final, and not parked as unresolved for people to settle."""
    return not answer.get("final") and answer.get("status") not in {"manual"}


def outcome(answer: dict[str, Any]) -> Any:
    """The result of a final answer, or the error it ends in."""
    decision = (answer.get("decision") or {}).get("outcome")
    status = answer.get("status")
    if status == "confirmed":
        return answer.get("result")
    if decision == "refused" or status == "refused":
        raise Refused(answer)
    if decision == "rejected" or status == "rejected":
        raise Rejected(answer)
    if decision == "expired" or status == "expired":
        raise Expired(answer)
    if decision == "cancelled" or status == "cancelled":
        raise Cancelled(answer)
    if status == "failed":
        raise Failed(answer)
    if status in UNRESOLVED:
        raise OutcomeUnknown(answer)
    raise OutcomeUnknown(answer)


def lease_error(error: ApiError) -> Exception:
    return LeaseLost(error.message) if error.status == 409 else error


def fenced(error: ApiError) -> Exception:
    """A 409 naming the current fencing token: a newer holder of the lease (this agent's own
    restart, or another owner after expiry) replaced this process."""
    if error.status == 409 and {"fencing_token", "current"} <= set(error.details):
        return LeaseLost(error.message)
    return error
