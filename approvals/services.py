"""Every write to approval requests and decisions."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from console.access import reviewer_max_tier
from console.lib.errors import Conflict, InvalidInput, NotFound, NotPermitted
from console.lib.ids import new_id
from console.lib.transitions import record_event, transition
from ledger import services as ledger_services
from ledger.models import Operation, OperationStatus

A = ApprovalStatus


def user_ref(user: AbstractBaseUser) -> str:
    return f"user:{user.get_username()}"


def approval_request_create(
    *, operation: Operation, call_id: str, state_version: int, risk_tier: int,
    approvals_needed: int, ttl_seconds: int, reasons: list[str], actor: str,
) -> ApprovalRequest:
    with transaction.atomic():
        request = ApprovalRequest.objects.create(
            approval_id=new_id("apr"),
            tenant_id=operation.tenant_id,
            task_id=operation.task_id,
            operation=operation,
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
            to_status=request.status, actor=actor,
            reason=f"L{risk_tier} call {call_id} needs {approvals_needed} approval(s)",
            evidence={"operation_id": operation.operation_id, "arguments_hash": request.arguments_hash,
                      "reasons": reasons},
        )
    return request


def _pending_for_reviewer(approval_id: str, reviewer: AbstractBaseUser) -> ApprovalRequest:
    request = ApprovalRequest.objects.select_for_update().filter(approval_id=approval_id).first()
    if request is None:
        raise NotFound(f"No approval request {approval_id}.")
    max_tier = reviewer_max_tier(reviewer, request.tenant_id)
    if max_tier is None:
        raise NotPermitted("You are not a reviewer in this tenant.")
    if request.risk_tier > max_tier:
        raise NotPermitted(f"This call is L{request.risk_tier}; you may approve up to L{max_tier}.")
    if request.status != A.PENDING:
        raise Conflict(f"This request is already {request.status}.", details={"status": request.status})
    if request.expires_at <= timezone.now():
        raise Conflict("This request has expired.", details={"status": "expired"})
    return request


def approval_approve(*, approval_id: str, reviewer: AbstractBaseUser, reason: str = "",
                     arguments_hash: str | None = None) -> ApprovalRequest:
    """Record one approval; the last one needed authorizes the operation in the same
    transaction, and the dispatch is enqueued on commit."""
    with transaction.atomic():
        request = _pending_for_reviewer(approval_id, reviewer)
        if arguments_hash is not None and arguments_hash != request.arguments_hash:
            raise Conflict("The arguments changed since you looked; reload the request.")
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
                from_status=request.status, to_status=request.status, actor=user_ref(reviewer),
                reason=f"approval {approvals} of {request.approvals_needed}: {reason}".strip(),
                evidence={"arguments_hash": request.arguments_hash},
            )
            return request
        transition(request, to=A.APPROVED, actor=user_ref(reviewer), reason=reason,
                   evidence={"arguments_hash": request.arguments_hash, "approvals": approvals},
                   changes={"decided_at": timezone.now()})
        ledger_services.operation_authorize(
            operation_id=request.operation_id, actor=user_ref(reviewer),
            reason=f"approved ({request.approval_id})", evidence={"approval_id": request.approval_id},
        )
    return request


def approval_reject(*, approval_id: str, reviewer: AbstractBaseUser, reason: str) -> ApprovalRequest:
    if not reason.strip():
        raise InvalidInput("A rejection needs a reason.", details={"field": "reason"})
    with transaction.atomic():
        request = _pending_for_reviewer(approval_id, reviewer)
        try:
            with transaction.atomic():
                ApprovalDecision.objects.create(
                    request=request, reviewer=reviewer, verdict=ApprovalDecision.Verdict.REJECT,
                    reason=reason, arguments_hash=request.arguments_hash,
                )
        except IntegrityError as exc:
            raise Conflict("You have already decided on this request.") from exc
        transition(request, to=A.REJECTED, actor=user_ref(reviewer), reason=reason,
                   changes={"decided_at": timezone.now()})
        ledger_services.operation_reject(
            operation_id=request.operation_id, actor=user_ref(reviewer), reason=reason
        )
    return request


def _locked_request(approval_id: str) -> ApprovalRequest:
    request = ApprovalRequest.objects.select_for_update().filter(approval_id=approval_id).first()
    if request is None:
        raise NotFound(f"No approval request {approval_id}.")
    return request


def _close(approval_id: str, *, to: str, actor: str, reason: str, operation_verb) -> ApprovalRequest:
    with transaction.atomic():
        request = _locked_request(approval_id)
        if transition(request, to=to, actor=actor, reason=reason):
            operation = Operation.objects.get(pk=request.operation_id)
            if operation.status in (OperationStatus.PLANNED, OperationStatus.AUTHORIZED):
                operation_verb(operation_id=operation.operation_id, actor=actor, reason=reason)
    return request


def approval_expire(*, approval_id: str, actor: str = "system:sweeper",
                    reason: str = "approval expired") -> ApprovalRequest:
    return _close(approval_id, to=A.EXPIRED, actor=actor, reason=reason,
                  operation_verb=ledger_services.operation_expire)


def approval_invalidate(*, approval_id: str, actor: str, reason: str) -> ApprovalRequest:
    """The task moved on (version, tool schema) or the approver lost the right."""
    return _close(approval_id, to=A.INVALIDATED, actor=actor, reason=reason,
                  operation_verb=ledger_services.operation_cancel)


def approval_consume(*, approval_id: str, actor: str) -> ApprovalRequest:
    """The dispatcher used the approval: it cannot authorize anything again."""
    with transaction.atomic():
        request = _locked_request(approval_id)
        transition(request, to=A.CONSUMED, actor=actor, reason="dispatched")
    return request
