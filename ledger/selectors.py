"""Reads of the ledger the agent API answers from: operations, calls, and the decision an
operation stands for (the same answer a repeated proposal gets)."""

from __future__ import annotations

from typing import Any

from approvals.gate import Decision
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from console.lib.errors import NotFound
from console.models import AgentPrincipal, Event
from ledger.models import Call, Operation, OperationStatus

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
    """The call with this ID in the principal's tenant (call IDs are unique per task: without
    `task_id` the newest one wins)."""
    qs = Call.objects.filter(call_id=call_id, task__tenant_id=principal.tenant_id)
    if task_id:
        qs = qs.filter(task_id=task_id)
    call = qs.order_by("-created_at", "-id").first()
    if call is None:
        raise NotFound(f"No call {call_id}.", details={"call_id": call_id, "task_id": task_id})
    return call


def call_operation_status(*, call_pk: int) -> str | None:
    """The cheap read a long-poll repeats."""
    return Call.objects.filter(pk=call_pk).values_list("operation__status", flat=True).first()


def operation_approval(operation: Operation, *, call_id: str | None = None) -> ApprovalRequest | None:
    """The approval request that governs the operation now: the newest one (bound to the call
    that created the operation; a regenerated call ID shares it)."""
    qs = ApprovalRequest.objects.filter(operation=operation)
    if call_id:
        bound = qs.filter(call_id=call_id).order_by("-created_at").first()
        if bound is not None:
            return bound
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


def approval_detail(approval: ApprovalRequest | None) -> dict[str, Any] | None:
    if approval is None:
        return None
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


def operation_detail(operation: Operation, *, call: Call | None = None) -> dict[str, Any]:
    """The shape of GET /operations/{id} and GET /calls/{id}. Through a call, `call_id` is that
    call's ID (which may be a regeneration of the one that created the operation)."""
    call_id = call.call_id if call is not None else operation.call_id
    approval = operation_approval(operation, call_id=call_id)
    decision, reasons = operation_decision(operation, approval)
    return {
        "operation_id": operation.operation_id,
        "call_id": call_id,
        "task_id": operation.task_id,
        "step_id": operation.step.step_id,
        "tool": operation.tool.name,
        "status": operation.status,
        "decision": decision,
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
            for a in operation.attempts.order_by("number")
        ],
        "receipt": operation.receipt,
        "result": operation.result,
        "last_error": operation.last_error,
        "approval": approval_detail(approval),
        "call_ids": list(operation.calls.order_by("created_at", "id").values_list("call_id", flat=True)),
        "created_at": operation.created_at,
        "updated_at": operation.updated_at,
    }


def call_detail(call: Call) -> dict[str, Any]:
    operation = Operation.objects.select_related("tool", "step").get(pk=call.operation_id)
    return operation_detail(operation, call=call)
