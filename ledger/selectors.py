"""Reads of the ledger the agent API answers from: operations, calls, and the decision an
operation stands for (the same answer a repeated proposal gets)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models

from approvals.gate import Decision
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from console.lib import sql
from console.lib.errors import Conflict, NotFound
from console.models import AgentPrincipal, Event
from ledger import queries
from ledger.models import OPERATION_TERMINAL, Attempt, Call, Operation, OperationStatus
from runs.models import Task

GATE_ACTOR = "system:gate"
# A call the gate refused has no operation; its status reads as this.
REFUSED = "refused"
CALL_STATUSES = [*OperationStatus.values, REFUSED]
FINAL_STATUSES = frozenset({*OPERATION_TERMINAL, REFUSED})
# Where a wait on a call ends (the agent API's `until=final`, a proposal's `wait`, the MCP
# server's): the call is final, or it waits for a person (`manual`: nothing moves it on without
# one, perhaps hours later), which the agent hears at once instead of when its wait runs out.
WAIT_ENDS = frozenset({*FINAL_STATUSES, OperationStatus.MANUAL})


class Outcome(models.TextChoices):
    """The decision on a call, as the agent is told it."""

    DISPATCHED = "dispatched"  # the gate ran it at once
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    REJECTED = "rejected"  # by a reviewer
    REFUSED = "refused"  # by the gate
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class CallOutcome:
    """One fact, in one place: what was decided on a call, by whom, when and why."""

    outcome: str
    final: bool
    by: str | None = None
    at: datetime | None = None
    reason: str | None = None
    approvals_given: int = 0
    approvals_needed: int = 0
    expires_at: datetime | None = None
    approval_id: str | None = None


def refusal_outcome(*, reasons: list[str] | tuple[str, ...], at: datetime) -> CallOutcome:
    return CallOutcome(outcome=Outcome.REFUSED, final=True, by=GATE_ACTOR, at=at, reason="; ".join(reasons) or None)


def _last_event(operation: Operation, to_status: str) -> Event | None:
    return (Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id,
                                 to_status=to_status).order_by("-id").first())


def operation_outcome(operation: Operation, approval: ApprovalRequest | None) -> CallOutcome:
    """The decision an operation stands for. Rejected, expired and cancelled are told by the
    event that ended it (a rejection's reason is the reviewer's); approved by the last approval
    given; a call the gate ran at once by its authorization."""
    given = (approval.decisions.filter(verdict=ApprovalDecision.Verdict.APPROVE).select_related("reviewer")
             .order_by("created_at", "id") if approval is not None else [])
    common = {
        "final": operation.status in OPERATION_TERMINAL,
        "approvals_given": len(given),
        "approvals_needed": approval.approvals_needed if approval is not None else 0,
        "expires_at": approval.expires_at if approval is not None else None,
        "approval_id": approval.approval_id if approval is not None else None,
    }
    status = operation.status
    if status == OperationStatus.PLANNED:
        return CallOutcome(outcome=Outcome.AWAITING_APPROVAL, **common)
    if status in (OperationStatus.REJECTED, OperationStatus.EXPIRED, OperationStatus.CANCELLED):
        event = _last_event(operation, status)
        return CallOutcome(outcome=status, by=event.actor if event else None, at=event.created_at if event else None,
                           reason=(event.reason or None) if event else None, **common)
    if operation.needs_approval and given:
        last = given[len(given) - 1]
        return CallOutcome(outcome=Outcome.APPROVED, by=f"user:{last.reviewer.get_username()}",
                           at=approval.decided_at or last.created_at, reason=last.reason or None, **common)
    # The gate ran it at once: decided when the operation was created.
    return CallOutcome(outcome=Outcome.DISPATCHED, by=GATE_ACTOR, at=operation.created_at, **common)

# Operations that ended without ever being sent: the call's answer is a refusal.
REFUSED_STATUSES = frozenset({OperationStatus.REJECTED, OperationStatus.EXPIRED, OperationStatus.CANCELLED})


def operation_for_principal(*, principal: AgentPrincipal, operation_id: str) -> Operation:
    """Another tenant's operation does not exist (404), it is not forbidden."""
    operation = (
        Operation.objects.select_related("tool", "step", "task")
        .filter(operation_id=operation_id, tenant_id=principal.tenant_id)
        .first()
    )
    if operation is None:
        raise NotFound(f"No operation {operation_id}.", details={"operation_id": operation_id})
    return operation


def call_for_principal(*, principal: AgentPrincipal, call_id: str, task_id: str | None = None) -> Call:
    """The call with this ID in the principal's tenant. Call IDs are unique per task only:
    without `task_id`, an ID used in several tasks is a Conflict naming them (answering the
    newest would hand an agent another task's call)."""
    # Its operation, tool, step and task in the same query: what the long-poll and the MCP
    # server answer from when the call needs no waiting.
    qs = (Call.objects.select_related("operation__tool", "operation__step", "operation__task")
          .filter(call_id=call_id, task__tenant_id=principal.tenant_id))
    if task_id:
        qs = qs.filter(task_id=task_id)
    calls = list(qs.order_by("-created_at", "-id")[:2] if task_id else qs.order_by("-created_at", "-id")[:21])
    if not calls:
        raise NotFound(f"No call {call_id}.", details={"call_id": call_id, "task_id": task_id})
    if len(calls) > 1:
        raise Conflict(f"Call ID {call_id} is used in several tasks; say which with ?task_id=.",
                       details={"call_id": call_id, "task_ids": sorted({call.task_id for call in calls})})
    return calls[0]


def call_operation_status(*, call_pk: int) -> str:
    """The cheap read a long-poll repeats: the operation's status, `refused` for a call the
    gate refused."""
    return Call.objects.filter(pk=call_pk).values_list("operation__status", flat=True).first() or REFUSED


def call_operation_statuses(call_pks: list[int]) -> dict[int, str]:
    """`call_operation_status` of many calls in one query: what one ring of the doorbell reads
    for every poll of a process that waits on it."""
    rows = Call.objects.filter(pk__in=call_pks).values_list("pk", "operation__status")
    return {pk: status or REFUSED for pk, status in rows}


def call_status(call: Call) -> str:
    """The status of a call read with its operation (`call_for_principal`)."""
    return call.operation.status if call.operation_id is not None else REFUSED


def operation_approval(operation: Operation, *, call_id: str | None = None) -> ApprovalRequest | None:
    """The approval request that governs the operation now: the newest one (bound to the call
    that created the operation; a regenerated call ID shares it). A call the gate ran at once
    has none (the dispatcher looks none up either), unless the policy asked for one since, which
    sets `needs_approval`."""
    if not operation.needs_approval:
        return None
    qs = ApprovalRequest.objects.filter(operation=operation)
    if call_id:
        # The request bound to this call first, else the newest: one query.
        return qs.order_by(models.Case(models.When(call_id=call_id, then=0), default=1), "-created_at").first()
    return qs.order_by("-created_at").first()


def operation_decision(operation: Operation, approval: ApprovalRequest | None) -> tuple[str, list[str]]:
    """What a proposal that led to this operation was answered: (decision, reasons)."""
    if operation.status in REFUSED_STATUSES:
        event = (
            Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id,
                                 to_status=operation.status)
            .order_by("-id").first()
        )
        detail = f": {event.reason}" if event is not None and event.reason else ""
        return Decision.REFUSED, [f"operation {operation.status}{detail}"]
    if operation.status == OperationStatus.PLANNED:
        return Decision.AWAITING_APPROVAL, list(approval.escalation_reasons) if approval is not None else []
    return Decision.DISPATCHED, []


def approval_detail(approval: ApprovalRequest | None, *, approvals_given: int | None = None) -> dict[str, Any] | None:
    if approval is None:
        return None
    if approvals_given is None:
        approvals_given = approval.decisions.filter(verdict=ApprovalDecision.Verdict.APPROVE).count()
    return {
        "approval_id": approval.approval_id,
        "status": approval.status,
        "call_id": approval.call_id,
        "risk_tier": approval.risk_tier,
        "approvals_needed": approval.approvals_needed,
        "approvals_given": approvals_given,
        "reasons": list(approval.escalation_reasons or []),
        "arguments_hash": approval.arguments_hash,
        "state_version": approval.state_version,
        "expires_at": approval.expires_at,
        "decided_at": approval.decided_at,
        "pending": approval.status == ApprovalStatus.PENDING,
    }


def _task_version(task_id: str) -> int:
    return Task.objects.values_list("version", flat=True).get(pk=task_id)


def _operation_task_version(operation: Operation) -> int:
    # Read with the operation (select_related) when it was: the same moment, no second query.
    if Operation.task.is_cached(operation):
        return operation.task.version
    return _task_version(operation.task_id)


def _history(rows: list[sql.Row], at: int, connection) -> tuple[list[Attempt], list[str]]:
    """The attempts (their columns from `at` on) and the call IDs (the last three columns, NULL
    on an attempt's row) of `queries.ANSWER_SQL` or `queries.HISTORY_SQL`."""
    attempts, call_ids = [], []
    for row in rows:
        if row[-3] is not None:
            call_ids.append(row[-3])
            continue
        attempt = sql.load(Attempt, row, at, connection=connection, only=queries.ANSWER_ATTEMPT_FIELDS)
        if attempt is not None:
            attempts.append(attempt)
    return attempts, call_ids


def _detail(operation: Operation, *, call_id: str, step_id: str, tool: str, task_version: int,
            attempts: list[Attempt], call_ids: list[str]) -> dict[str, Any]:
    """The detail of `operation` (a whole row, or the columns `queries.ANSWER_OPERATION_FIELDS`
    names) with what was read beside it; the decision's reads (approval, event) when it has any."""
    approval = operation_approval(operation, call_id=call_id)
    _, reasons = operation_decision(operation, approval)
    outcome = operation_outcome(operation, approval)
    return {
        "operation_id": operation.operation_id,
        "call_id": call_id,
        "task_id": operation.task_id,
        "step_id": step_id,
        "tool": tool,
        "status": operation.status,
        "decision": outcome,
        "final": outcome.final,
        "task_version": task_version,
        "reasons": reasons,
        "risk_tier": operation.risk_tier,
        "idempotency_key": operation.idempotency_key,
        "arguments_hash": operation.arguments_hash,
        "attempt_count": operation.attempt_count,
        "attempts": [
            {
                "number": a.number,
                "fact": a.fact or None,
                "started_at": a.started_at,
                "finished_at": a.finished_at,
                "error_class": a.error_class,
                "error_code": a.error_code,
                "latency_ms": a.latency_ms,
                "stale": a.stale,
            }
            for a in attempts
        ],
        "receipt": operation.receipt,
        "result": operation.result,
        "last_error": operation.last_error,
        "approval": approval_detail(approval, approvals_given=outcome.approvals_given),
        "call_ids": call_ids,
        "created_at": operation.created_at,
        "updated_at": operation.updated_at,
    }


def operation_detail(operation: Operation, *, call: Call | None = None) -> dict[str, Any]:
    """The shape of GET /operations/{id} and GET /calls/{id}. Through a call, `call_id` is that
    call's ID (which may be a regeneration of the one that created the operation). Its attempts
    and call IDs in one statement (`queries.HISTORY_SQL`); the approval, when the operation
    needs one, and the event that ended it, when one did, with the ORM."""
    connection = sql.connection_for(Operation)
    rows = sql.fetchall(connection, queries.HISTORY_SQL, [operation.pk, operation.pk])
    attempts, call_ids = _history(rows, 0, connection)
    return _detail(operation, call_id=call.call_id if call is not None else operation.call_id,
                   step_id=operation.step.step_id, tool=operation.tool.name,
                   task_version=_operation_task_version(operation), attempts=attempts, call_ids=call_ids)


def read_detail(operation_id: str, *, call_id: str) -> dict[str, Any]:
    """`operation_detail` of the operation read now (through the call `call_id`), with its
    tool's name, its step's ID, its task's version, its attempts and its call IDs: one
    statement (`queries.ANSWER_SQL`), the whole answer of a call the gate ran at once."""
    connection = sql.connection_for(Operation)
    rows = sql.fetchall(connection, queries.ANSWER_SQL, [operation_id, operation_id])
    row = next((row for row in rows if row[-3] is None), None)
    if row is None:
        raise Operation.DoesNotExist(f"No operation {operation_id}.")
    operation = sql.load(Operation, row, connection=connection, only=queries.ANSWER_OPERATION_FIELDS)
    at = sql.width(Operation, only=queries.ANSWER_OPERATION_FIELDS)
    tool, step_id, task_version = row[at:at + 3]
    attempts, call_ids = _history(rows, at + 3, connection)
    return _detail(operation, call_id=call_id, step_id=step_id, tool=tool, task_version=task_version,
                   attempts=attempts, call_ids=call_ids)


def refused_call_detail(call: Call) -> dict[str, Any]:
    """A call the gate refused, in the shape of an operation's detail (it has none)."""
    refusal = call.refusal or {}
    outcome = refusal_outcome(reasons=refusal.get("reasons", []), at=call.created_at)
    return {
        "operation_id": None, "call_id": call.call_id, "task_id": call.task_id, "step_id": call.step_id,
        "tool": call.tool_name, "status": REFUSED, "decision": outcome, "final": True,
        "task_version": _task_version(call.task_id), "reasons": list(refusal.get("reasons", [])),
        "risk_tier": refusal.get("risk_tier"), "idempotency_key": "", "arguments_hash": call.arguments_hash,
        "attempt_count": 0, "attempts": [], "receipt": None, "result": None, "last_error": "", "approval": None,
        "call_ids": [call.call_id], "created_at": call.created_at, "updated_at": call.created_at,
    }


def call_detail(call: Call, *, fresh: bool = True) -> dict[str, Any]:
    """The call's answer; `fresh=False` answers from the operation read with the call (a
    call read by `call_for_principal` in this same database hop), `fresh` reads it again."""
    if call.operation_id is None:
        return refused_call_detail(call)
    if fresh or not Call.operation.is_cached(call):
        return read_detail(call.operation_id, call_id=call.call_id)
    return operation_detail(call.operation, call=call)
