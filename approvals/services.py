"""Every write to approval requests and decisions."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.notifications import notifications_plan
from console.access import reviewer_max_tier
from console.lib.errors import Conflict, InvalidInput, NotFound, NotPermitted
from console.lib.ids import new_id
from console.lib.transitions import record_event, transition
from console.models import Event
from console.tracing import tracer
from ledger import services as ledger_services
from ledger.models import Operation, OperationStatus

A = ApprovalStatus


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
    *, operation: Operation, call_id: str, state_version: int, risk_tier: int,
    approvals_needed: int, ttl_seconds: int, reasons: list[str], actor: str,
) -> ApprovalRequest:
    with transaction.atomic():
        request = ApprovalRequest.objects.create(
            approval_id=new_id("apr"),
            tenant_id=operation.tenant_id,
            task_id=operation.task_id,
            operation=operation,
            tool_id=operation.tool_id,
            task_type=operation.task.task_type,
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
                kind=Event.Kind.APPROVAL_GIVEN, to_status=request.status, actor=user_ref(reviewer),
                reason=f"approval {approvals} of {request.approvals_needed}: {reason}".strip(),
                evidence={"arguments_hash": request.arguments_hash},
            )
            return request
        _trace_wait(request, outcome="approved")
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
        _trace_wait(request, outcome="rejected")
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


# ------------------------------------------------------------------------- edit and approve

EDIT_CALL_SUFFIX = re.compile(r"-edit-(\d+)$")
EDIT_STEP_SUFFIX = re.compile(r"~edit(\d+)$")
MAX_CALL_ID = 64  # ledger.proposals.MAX_CALL_ID
MAX_STEP_ID = 128  # ledger.proposals.MAX_STEP_ID


def _with_suffix(base: str, suffix: str, limit: int) -> str:
    return base[: limit - len(suffix)] + suffix


def edit_identifiers(*, task_id: str, call_id: str, step_id: str) -> tuple[str, str]:
    """The edited call's call ID `<call>-edit-N` and step ID `<step>~editN`.

    The operation ID is derived from (tenant, task, step, tool), so the edited call needs a
    step ID of its own to get an operation of its own; an edit of an edit counts on (`-edit-2`).
    N is the first number free for both IDs within the task.
    """
    from ledger.models import Call
    from runs.models import Step

    match = EDIT_CALL_SUFFIX.search(call_id)
    base_call = call_id[: match.start()] if match else call_id
    base_step = EDIT_STEP_SUFFIX.sub("", step_id)
    n = int(match.group(1)) + 1 if match else 1
    while True:
        new_call = _with_suffix(base_call, f"-edit-{n}", MAX_CALL_ID)
        new_step = _with_suffix(base_step, f"~edit{n}", MAX_STEP_ID)
        taken = (Call.objects.filter(task_id=task_id, call_id=new_call).exists()
                 or Step.objects.filter(task_id=task_id, step_id=new_step).exists())
        if not taken:
            return new_call, new_step
        n += 1


@dataclass(frozen=True)
class EditResult:
    old: ApprovalRequest
    new: ApprovalRequest | None  # None: the gate let the edited call run at once
    call_id: str
    step_id: str
    operation_id: str
    decision: str


def approval_edit_and_approve(*, approval_id: str, reviewer: AbstractBaseUser, arguments: dict[str, Any],
                              reason: str, arguments_hash: str | None = None) -> EditResult:
    """A reviewer changes the arguments and approves the changed call.

    Nothing is changed in place: the edited call is a NEW call (`<call>-edit-N`, step
    `<step>~editN`, so a new operation ID) proposed through the same pipeline and gate as the
    agent's (`ledger.proposals.call_propose`, on behalf of the requesting agent and under the
    task's current lease token), so the schema, the budgets and the tier are computed again. The
    old request becomes `superseded` (`superseded_by` → the new one) and its operation
    `cancelled`. The editor's approval is then recorded on the new request through
    `approval_approve`, so the usual rules hold: a tier above the editor's maximum refuses the
    whole edit; at L4 it counts as one of two distinct approvers. If the new tier runs without
    approval, the gate authorizes the new operation at once and there is no new request
    (`superseded_by` stays empty; the supersede event names the new call and operation).

    All in one transaction: a refusal anywhere leaves the old request pending, untouched.
    """
    from approvals import gate
    from ledger.proposals import AWAITING_APPROVAL, REFUSED, call_propose
    from runs.models import Lease

    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("An edit needs a reason: the agent and the next reviewer are told why.",
                           details={"field": "reason"})
    actor = user_ref(reviewer)
    with transaction.atomic():
        old = _pending_for_reviewer(approval_id, reviewer)
        if arguments_hash is not None and arguments_hash != old.arguments_hash:
            raise Conflict("The arguments changed since you looked; reload the request.")
        operation = Operation.objects.select_related("tool", "step", "principal", "task").get(pk=old.operation_id)
        if operation.status != OperationStatus.PLANNED:
            raise Conflict(f"The operation is already {operation.status}.", details={"status": operation.status})
        tool = operation.tool
        new_hash = gate.validate_arguments(tool=tool, arguments=arguments)
        if new_hash == old.arguments_hash:
            raise InvalidInput("The arguments are unchanged; approve the request as it is instead.",
                               details={"field": "arguments"})
        task = operation.task
        new_call, new_step = edit_identifiers(task_id=task.task_id, call_id=old.call_id,
                                              step_id=operation.step.step_id)
        lease = Lease.objects.filter(task_id=task.task_id).first()
        # The old call's reserved budget is given back first, so the gate counts the edited call
        # instead of both (a refund edited down must not exhaust the amount budget). In this
        # transaction: a refused edit restores it.
        ledger_services.operation_release_budget(operation_id=old.operation_id)
        proposal = call_propose(
            principal=operation.principal, task_id=task.task_id, call_id=new_call, step_id=new_step,
            tool_name=tool.name, arguments=arguments, expected_version=task.version,
            # The reviewer acts for the task's current holder, not as a competing worker.
            fencing_token=lease.fencing_token if lease is not None else None,
        )
        if proposal.decision == REFUSED:
            raise Conflict("The gate refused the edited call: " + "; ".join(proposal.reasons),
                           details={"reasons": list(proposal.reasons)})
        new = None
        if proposal.decision == AWAITING_APPROVAL:
            new = approval_approve(approval_id=proposal.approval_id, reviewer=reviewer,
                                   reason=f"edited from {old.call_id}: {reason}", arguments_hash=new_hash)
        transition(
            old, to=A.SUPERSEDED, actor=actor, reason=f"edited: {reason}",
            evidence={"call_id": new_call, "step_id": new_step, "operation_id": proposal.operation_id,
                      "approval_id": new.approval_id if new else None, "arguments_hash": new_hash,
                      "previous_arguments_hash": old.arguments_hash, "risk_tier": proposal.risk_tier,
                      "decision": proposal.decision},
            changes={"superseded_by": new, "decided_at": timezone.now()},
        )
        ledger_services.operation_cancel(
            operation_id=old.operation_id, actor=actor,
            reason=f"superseded by the edited call {new_call} ({proposal.operation_id})",
        )
    return EditResult(old=old, new=new, call_id=new_call, step_id=new_step,
                      operation_id=proposal.operation_id, decision=proposal.decision)
