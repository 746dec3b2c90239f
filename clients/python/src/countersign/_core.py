"""What the sync and async clients share: request bodies, the stable call ID and the reading of
a call answer. No I/O here."""

from __future__ import annotations

import hashlib
import time
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
    NotFinal,
    OutcomeUnknown,
    Refused,
    Rejected,
    StaleFencingToken,
    TaskFinished,
)

API = "/api/v1"
# Transport failures and these statuses are retried: every write the client makes is idempotent
# (the task by its Idempotency-Key, a call by its call ID, a lease renewal by its owner).
RETRY_STATUSES = {502, 503, 504}
RETRIES = 6
BACKOFF_SECONDS = 0.25
POLL_SECONDS = 25  # under the server's 30 s cap, and under the HTTP timeout
# Reading the task while its verifiers run (no long-poll for tasks): from this interval, doubling.
VERDICT_POLL_SECONDS = 0.2
VERDICT_POLL_MAX_SECONDS = 2.0
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
    """The server's `stale_fencing_token`: a newer holder of the lease (this agent's own restart,
    or another owner after expiry) replaced this process."""
    if error.code == "stale_fencing_token":
        return StaleFencingToken(error.message, current=error.details.get("current"))
    return error


# A task in these statuses takes no lease: the agent's part is over.
FINISHED = {"verifying", "succeeded", "failed", "cancelled"}


def by_key_request(key: str) -> tuple[str, dict[str, Any]]:
    return f"{API}/tasks", {"idempotency_key": key}


def finished_or(error: ApiError, task: dict[str, Any] | None) -> Exception:
    """Why a start under a key was refused: the task is finished, or `error` as it was."""
    if task is not None and task.get("status") in FINISHED:
        return TaskFinished(task)
    return error


def deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def judged(task: dict[str, Any]) -> bool:
    """The verifiers have ruled: the task left `verifying` (to `succeeded`, `failed`,
    `waiting_review` for a person, or back to `running` when a criterion is not settled yet)."""
    return task.get("status") != "verifying"


def verdict_pause(attempt: int) -> float:
    return min(VERDICT_POLL_SECONDS * 2 ** attempt, VERDICT_POLL_MAX_SECONDS)


def time_left(until: float | None) -> float | None:
    return None if until is None else max(0.0, until - time.monotonic())


def propose_params(wait: float | None) -> dict[str, Any] | None:
    """The proposal's query: with `wait`, the server answers a call it runs at once when the
    call is final (a server without it answers at once, and the client polls as before)."""
    return {"wait": wait} if wait else None


def poll_wait(until: float | None) -> float | None:
    """Seconds the next long-poll may wait, or None when the caller's deadline passed."""
    left = None if until is None else until - time.monotonic()
    if left is not None and left <= 0:
        return None
    return POLL_SECONDS if left is None else max(1, min(POLL_SECONDS, int(left)))


def final_poll(task_id: str, status: str | None, wait: float) -> dict[str, Any]:
    """The query of a long-poll that the server answers once the call is final (`until=final`):
    one poll per call, not one per status on the way. From `unknown` the next status may be
    `manual`, where the client stops (`is_open`) though the call is not final: that poll answers
    any change instead."""
    if status == "unknown":
        return {"task_id": task_id, "wait": wait, "seen": status}
    return {"task_id": task_id, "wait": wait, "until": "final"}


def first_wait_poll(task_id: str, until: float | None) -> dict[str, Any]:
    """The first long-poll of a call whose status the client does not know yet."""
    wait = poll_wait(until)
    return final_poll(task_id, None, 0 if wait is None else wait)


def next_poll(task_id: str, answer: dict[str, Any], until: float | None) -> dict[str, Any] | None:
    """The query of the next long-poll of a call, or None when waiting is over (the call is no
    longer open, or the caller's deadline passed)."""
    if not is_open(answer):
        return None
    wait = poll_wait(until)
    return None if wait is None else final_poll(task_id, answer["status"], wait)


def answers_for_itself(proposed: dict[str, Any]) -> bool:
    """A proposal answered final needs no poll: its answer carries the decision, the reasons
    and the result. Not a failed call's: the error (`last_error`) is in the call's answer only."""
    return bool(proposed.get("final")) and proposed.get("status") != "failed"


def awaiting_approval(answer: dict[str, Any]) -> bool:
    return not answer.get("final") and (answer.get("decision") or {}).get("outcome") == "awaiting_approval"


def next_decision_poll(task_id: str, answer: dict[str, Any], until: float | None) -> dict[str, Any] | None:
    """The query of the next long-poll while a call waits for a person, or None once it is
    decided; NotFinal when the caller's deadline passed first."""
    if not awaiting_approval(answer):
        return None
    if until is not None and time.monotonic() >= until:
        raise NotFinal(answer)
    return {"task_id": task_id, "wait": POLL_SECONDS, "seen": answer["status"]}


class TaskState:
    """The task as this process holds it: the version of its own last commit and its fencing
    token, which every proposal and commit carries. The I/O is the sync or async subclass's."""

    def __init__(self, answer: dict[str, Any], *, owner: str, ttl_seconds: int) -> None:
        self.task_id: str = answer["task_id"]
        self.status: str = answer["status"]
        self.version: int = answer["version"]
        self.fencing_token: int | None = answer.get("fencing_token")
        self.owner, self.ttl_seconds = owner, ttl_seconds
        self.lease_error: Exception | None = None

    @property
    def renew_every(self) -> float:
        return max(self.ttl_seconds / 3, 1)

    def call_id(self, tool: str, step_id: str) -> str:
        return call_id_for(self.task_id, step_id, tool)

    def lease_request(self) -> tuple[str, dict[str, Any]]:
        return f"{API}/tasks/{self.task_id}/lease", {"owner": self.owner, "ttl_seconds": self.ttl_seconds}

    def propose_request(self, tool: str, arguments: dict[str, Any], step_id: str,
                        call_id: str | None) -> tuple[str, dict[str, Any]]:
        if self.lease_error is not None:
            raise self.lease_error
        return f"{API}/tasks/{self.task_id}/calls", {
            "call_id": call_id or self.call_id(tool, step_id), "step_id": step_id, "tool": tool,
            "arguments": arguments, "expected_version": self.version, "fencing_token": self.fencing_token}

    def check_request(self, tool: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return f"{API}/tasks/{self.task_id}/calls", {"dry_run": True, "tool": tool, "arguments": arguments}

    def transition_request(self, to: str, evidence: dict[str, Any] | None, reason: str) -> tuple[str, dict[str, Any]]:
        return f"{API}/tasks/{self.task_id}/transition", {
            "to": to, "expected_version": self.version, "fencing_token": self.fencing_token,
            "evidence": evidence or {}, "reason": reason}

    def committed(self, answer: dict[str, Any]) -> dict[str, Any]:
        self.version, self.status = answer["version"], answer["status"]
        return answer

    def first_poll(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "wait": 0}
