"""Every write to approval requests and decisions, and only to them.

What a decision does to the operation it is about (authorize, reject, cancel, expire) is a move
of two records; `ledger.decisions` owns those and calls the functions here for the approval's
half.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.notifications import notifications_plan
from approvals.stops import active_stop
from console.access import reviewer_max_tier
from console.lib.errors import Conflict, InvalidInput, NotFound, NotPermitted
from console.lib.ids import new_id
from console.lib.transitions import record_event, transition
from console.models import Event
from console.tracing import tracer


class ProposedOperation(Protocol):
    """What an approval request copies from the operation it is about."""

    operation_id: str
    tenant_id: int
    task_id: str
    tool_id: int
    principal_id: int
    arguments_hash: str
    tool_schema_version: int


def user_ref(user: AbstractBaseUser) -> str:
    return f"user:{user.get_username()}"


def _trace_wait(request: ApprovalRequest, *, outcome: str) -> None:
    """The console's `approval.wait` span: from the request to the decision (exported with the
    console's other spans when OpenTelemetry export is on)."""
    span = tracer.start_span("approval.wait", start_time=int(request.created_at.timestamp() * 1e9), attributes={
        "countersign.task_id": request.task_id, "countersign.operation_id": request.operation_id,
        "gen_ai.tool.call.id": request.call_id, "countersign.approval_id": request.approval_id,
        "countersign.risk_tier": request.risk_tier, "countersign.approval.outcome": outcome,
    })
    span.end()


def approval_request_create(
    *, operation: ProposedOperation, task_type: str, call_id: str, state_version: int, risk_tier: int,
    approvals_needed: int, ttl_seconds: int, reasons: list[str], actor: str,
) -> ApprovalRequest:
    with transaction.atomic():
        request = ApprovalRequest.objects.create(
            approval_id=new_id("apr"),
            tenant_id=operation.tenant_id,
            task_id=operation.task_id,
            operation=operation,
            tool_id=operation.tool_id,
            task_type=task_type,
            call_id=call_id,
            arguments_hash=operation.arguments_hash,
            tool_schema_version=operation.tool_schema_version,
            requested_by_id=operation.principal_id,
            state_version=state_version,
            risk_tier=risk_tier,
            escalation_reasons=reasons,
            approvals_needed=approvals_needed,
            expires_at=timezone.now() + timedelta(seconds=ttl_seconds),
        )
        record_event(
            entity=ApprovalRequest.EVENT_ENTITY, entity_id=request.approval_id, tenant_id=request.tenant_id,
            kind=Event.Kind.CREATED, to_status=request.status, actor=actor,
            reason=f"L{risk_tier} call {call_id} needs {approvals_needed} approval(s)",
            evidence={"operation_id": operation.operation_id, "arguments_hash": request.arguments_hash,
                      "reasons": reasons},
        )
        # Rows now, deliveries on commit: a rolled-back request announces nothing.
        notifications_plan(request)
    return request


def approval_lock_pending(approval_id: str, reviewer: AbstractBaseUser) -> ApprovalRequest:
    """The pending request, locked, if this reviewer may decide it (tenant, tier, not expired)."""
    request = ApprovalRequest.objects.select_for_update().filter(approval_id=approval_id).first()
    if request is None:
        raise NotFound(f"No approval request {approval_id}.")
    max_tier = reviewer_max_tier(reviewer, request.tenant_id)
    if max_tier is None:
        raise NotPermitted("You are not a reviewer in this tenant.")
    if request.risk_tier > max_tier:
        raise NotPermitted(f"This call is L{request.risk_tier}; you may approve up to L{max_tier}.")
    if request.status != ApprovalStatus.PENDING:
        raise Conflict(f"This request is already {request.status}.", details={"status": request.status})
    if request.expires_at <= timezone.now():
        raise Conflict("This request has expired.", details={"status": "expired"})
    return request


def approval_give(*, approval_id: str, reviewer: AbstractBaseUser, reason: str = "",
                  arguments_hash: str | None = None) -> ApprovalRequest:
    """Record one reviewer's approval; the last one needed moves the request to `approved`
    (the caller, `ledger.decisions.approval_approve`, then authorizes the operation in the same
    transaction). A request still short of approvals stays `pending`."""
    with transaction.atomic():
        request = approval_lock_pending(approval_id, reviewer)
        if arguments_hash is not None and arguments_hash != request.arguments_hash:
            raise Conflict("The arguments changed since you looked; reload the request.")
        refuse_if_frozen(request)
        try:
            with transaction.atomic():
                ApprovalDecision.objects.create(
                    request=request, reviewer=reviewer, verdict=ApprovalDecision.Verdict.APPROVE,
                    reason=reason, arguments_hash=request.arguments_hash,
                )
        except IntegrityError as exc:
            raise Conflict("You have already approved this request; a second approver is needed.") from exc
        approvals = request.decisions.filter(verdict=ApprovalDecision.Verdict.APPROVE).count()
        if approvals < request.approvals_needed:
            record_event(
                entity=ApprovalRequest.EVENT_ENTITY, entity_id=request.approval_id, tenant_id=request.tenant_id,
                kind=Event.Kind.APPROVAL_GIVEN, to_status=request.status, actor=user_ref(reviewer),
                reason=f"approval {approvals} of {request.approvals_needed}: {reason}".strip(),
                evidence={"arguments_hash": request.arguments_hash},
            )
            return request
        _trace_wait(request, outcome="approved")
        transition(request, to=ApprovalStatus.APPROVED, actor=user_ref(reviewer), reason=reason,
                   evidence={"arguments_hash": request.arguments_hash, "approvals": approvals},
                   changes={"decided_at": timezone.now()})
    return request


def refuse_if_frozen(request: ApprovalRequest) -> None:
    """A stop in force over the request's tenant, agent or tool freezes it: it cannot be
    approved until the stop is resumed (rejecting stays possible)."""
    stop = active_stop(tenant_id=request.tenant_id, agent_id=request.requested_by_id, tool_id=request.tool_id)
    if stop is not None:
        raise Conflict(f"Frozen: {stop.describe()} is stopped ({stop.reason}); approve after it is resumed.",
                       details={"stop_id": stop.stop_id, "status": "frozen"})


def approval_decline(*, approval_id: str, reviewer: AbstractBaseUser, reason: str) -> ApprovalRequest:
    """Record one reviewer's rejection: the request is `rejected` (the caller,
    `ledger.decisions.approval_reject`, rejects the operation with it)."""
    if not reason.strip():
        raise InvalidInput("A rejection needs a reason.", details={"field": "reason"})
    with transaction.atomic():
        request = approval_lock_pending(approval_id, reviewer)
        try:
            with transaction.atomic():
                ApprovalDecision.objects.create(
                    request=request, reviewer=reviewer, verdict=ApprovalDecision.Verdict.REJECT,
                    reason=reason, arguments_hash=request.arguments_hash,
                )
        except IntegrityError as exc:
            raise Conflict("You have already decided on this request.") from exc
        _trace_wait(request, outcome="rejected")
        transition(request, to=ApprovalStatus.REJECTED, actor=user_ref(reviewer), reason=reason,
                   changes={"decided_at": timezone.now()})
    return request


def _locked_request(approval_id: str) -> ApprovalRequest:
    request = ApprovalRequest.objects.select_for_update().filter(approval_id=approval_id).first()
    if request is None:
        raise NotFound(f"No approval request {approval_id}.")
    return request


def approval_close(*, approval_id: str, to: str, actor: str, reason: str, evidence: dict | None = None,
                   changes: dict | None = None) -> tuple[ApprovalRequest, bool]:
    """Close a request without a reviewer's verdict (expired, invalidated, superseded): the
    request locked, moved, and whether it moved (False: it was already there)."""
    with transaction.atomic():
        request = _locked_request(approval_id)
        moved = transition(request, to=to, actor=actor, reason=reason, evidence=evidence, changes=changes)
    return request, moved


def approval_consume(*, approval_id: str, actor: str) -> ApprovalRequest:
    """The dispatcher used the approval: it cannot authorize anything again."""
    with transaction.atomic():
        request = _locked_request(approval_id)
        transition(request, to=ApprovalStatus.CONSUMED, actor=actor, reason="dispatched")
    return request
