"""Every write to approval requests and decisions, and only to them.

What a decision does to the operation it is about (authorize, reject, cancel, expire) is a move
of two records; `ledger.decisions` owns those and calls the functions here for the approval's
half.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.notifications import notifications_plan
from approvals.stops import active_stop
from console.access import reviewer_max_tier
from console.lib import audit
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
    proposed_by: AbstractBaseUser | None = None,
) -> ApprovalRequest:
    """`proposed_by`: the person who created the call (a compensation), who may not approve it."""
    now = timezone.now()
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
            proposed_by=proposed_by,
            state_version=state_version,
            risk_tier=risk_tier,
            escalation_reasons=reasons,
            approvals_needed=approvals_needed,
            created_at=now,
            expires_at=now + timedelta(seconds=ttl_seconds),
            remind_at=now + timedelta(seconds=ttl_seconds * settings.APPROVAL_REMIND_SHARE),
            escalate_at=now + timedelta(seconds=ttl_seconds * settings.APPROVAL_ESCALATE_SHARE),
        )
        record_event(
            entity=ApprovalRequest.EVENT_ENTITY, entity_id=request.approval_id, tenant_id=request.tenant_id,
            kind=Event.Kind.CREATED, to_status=request.status, actor=actor,
            reason=f"L{risk_tier} call {call_id} needs {approvals_needed} approval(s)",
            evidence={"operation_id": operation.operation_id, "arguments_hash": request.arguments_hash,
                      "reasons": reasons, "proposed_by": user_ref(proposed_by) if proposed_by else None},
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


def refuse_proposer(request: ApprovalRequest, reviewer: AbstractBaseUser) -> None:
    """The person who proposed a call never approves it (nor edits it, which is approving)."""
    if request.proposed_by_id is not None and request.proposed_by_id == reviewer.pk:
        raise NotPermitted("You proposed this call; another reviewer must approve it.",
                           details={"proposed_by": user_ref(reviewer)})


def approval_propose_edit(*, approval_id: str, editor: AbstractBaseUser, approvals_needed: int) -> ApprovalRequest:
    """An edited call's new request, just filed by the gate, names its editor as proposer and
    needs at least `approvals_needed` approvals (what the edited original needed): an edit by
    one person never lowers the number of people a call needs. Inside the edit's transaction."""
    with transaction.atomic():
        request = _locked_request(approval_id)
        request.proposed_by = editor
        request.approvals_needed = max(request.approvals_needed, approvals_needed)
        request.save(update_fields=["proposed_by", "approvals_needed"])
    return request


def approval_give(*, approval_id: str, reviewer: AbstractBaseUser, reason: str = "",
                  arguments_hash: str | None = None, as_editor: bool = False,
                  now_requires: tuple[int, int] | None = None) -> ApprovalRequest:
    """Record one reviewer's approval; the last one needed moves the request to `approved`
    (the caller, `ledger.decisions.approval_approve`, then authorizes the operation in the same
    transaction). A request still short of approvals stays `pending`.

    `now_requires`: (tier, approvals) the policy asks of the call now. Stricter than what the
    request was filed with, the request is raised to it first (never lowered), and the reviewer
    and the count are checked against the raised request: the approval may then be given
    without authorizing anything.

    The request's proposer is refused, except `as_editor`: the editor's approval of the call they
    just edited (`ledger.decisions.approval_edit_and_approve`), which counts once — the edit is
    their review of the agent's call — and is never enough where the original needed two."""
    with transaction.atomic():
        request = approval_lock_pending(approval_id, reviewer)
        if not as_editor:
            refuse_proposer(request, reviewer)
        elif request.proposed_by_id != reviewer.pk or request.decisions.exists():
            raise NotPermitted("Only the editor's first approval of their own edit counts this way.")
        if arguments_hash is not None and arguments_hash != request.arguments_hash:
            raise Conflict("The arguments changed since you looked; reload the request.")
        refuse_if_frozen(request)
        raised = _raise_requirement(request, reviewer, now_requires) if now_requires else ""
        try:
            with transaction.atomic():
                _decision_create(request, reviewer, ApprovalDecision.Verdict.APPROVE, reason)
        except IntegrityError as exc:
            raise Conflict("You have already approved this request; a second approver is needed.") from exc
        approvals = request.decisions.filter(verdict=ApprovalDecision.Verdict.APPROVE).count()
        if approvals < request.approvals_needed:
            record_event(
                entity=ApprovalRequest.EVENT_ENTITY, entity_id=request.approval_id, tenant_id=request.tenant_id,
                kind=Event.Kind.APPROVAL_GIVEN, to_status=request.status, actor=user_ref(reviewer),
                reason=f"approval {approvals} of {request.approvals_needed}{raised}: {reason}".strip(),
                evidence={"arguments_hash": request.arguments_hash, "raised": bool(raised)},
            )
            return request
        _trace_wait(request, outcome="approved")
        transition(request, to=ApprovalStatus.APPROVED, actor=user_ref(reviewer), reason=reason,
                   evidence={"arguments_hash": request.arguments_hash, "approvals": approvals, "raised": bool(raised)},
                   changes={"decided_at": timezone.now()})
    return request


def _raise_requirement(request: ApprovalRequest, reviewer: AbstractBaseUser, now_requires: tuple[int, int]) -> str:
    """Raise the locked request to what the policy asks now, if that is more (tier or
    approvals), saying so in its reasons; refuse a reviewer below the raised tier. Returns the
    note for the approval's event ("" when nothing was raised)."""
    tier, needed = max(request.risk_tier, now_requires[0]), max(request.approvals_needed, now_requires[1])
    if (tier, needed) == (request.risk_tier, request.approvals_needed):
        return ""
    note = (f"; the policy now requires L{tier}, {needed} approval(s) "
            f"(filed at L{request.risk_tier}, {request.approvals_needed})")
    max_tier = reviewer_max_tier(reviewer, request.tenant_id)
    if max_tier is None or tier > max_tier:
        raise NotPermitted(f"This call is now L{tier} (the policy changed since it was filed); "
                           f"you may approve up to L{max_tier}.", details={"risk_tier": tier})
    request.escalation_reasons = [*request.escalation_reasons,
                                  f"raised when approved by {reviewer.get_username()}{note}"]
    request.risk_tier, request.approvals_needed = tier, needed
    request.save(update_fields=["risk_tier", "approvals_needed", "escalation_reasons"])
    return note


def _decision_create(request: ApprovalRequest, reviewer: AbstractBaseUser, verdict: str,
                     reason: str) -> ApprovalDecision:
    """The decision row with its signed receipt (console/lib/audit.py): what the reviewer decided
    on (call, arguments hash, task version), who, what and when."""
    now = timezone.now()
    signature = audit.sign_decision(call_id=request.call_id, arguments_hash=request.arguments_hash,
                                    state_version=request.state_version, approver=user_ref(reviewer),
                                    decision=verdict, at=now)
    return ApprovalDecision.objects.create(request=request, reviewer=reviewer, verdict=verdict, reason=reason,
                                           arguments_hash=request.arguments_hash, created_at=now,
                                           signature=signature)


def approval_forged_decision(request: ApprovalRequest, *, arguments_hash: str) -> str:
    """Why a request's decisions cannot be trusted, or "": a decision whose receipt does not hold
    for the request's call and version, `arguments_hash` (the operation's: what will run), its
    reviewer, verdict and time — a row written or altered outside the application."""
    for decision in request.decisions.select_related("reviewer"):
        if not audit.decision_signature_holds(
                decision.signature, call_id=request.call_id, arguments_hash=arguments_hash,
                state_version=request.state_version, approver=user_ref(decision.reviewer),
                decision=decision.verdict, at=decision.created_at):
            return f"decision {decision.pk} ({decision.verdict}) does not match its signed receipt"
    return ""


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
                _decision_create(request, reviewer, ApprovalDecision.Verdict.REJECT, reason)
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


def approvals_thaw(*, requests: QuerySet[ApprovalRequest], frozen_since, resumed_at) -> int:
    """A stop that froze these requests ended at `resumed_at`: each still open (pending, or
    approved and not yet dispatched) that was alive when the freeze began gets the time it was
    frozen added to its expiry, so a stop never eats a reviewer's time. Bookkeeping of the
    resume (no status changes, so no events; the resume's own event says when and why).
    Returns how many were given time back."""
    thawed = 0
    with transaction.atomic():
        for request in (requests.select_for_update().filter(
                status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED], expires_at__gt=frozen_since)
                .order_by("pk")):
            frozen = resumed_at - max(frozen_since, request.created_at)
            if frozen.total_seconds() > 0:
                ApprovalRequest.objects.filter(pk=request.pk).update(expires_at=request.expires_at + frozen)
                thawed += 1
    return thawed


def approval_consume(*, approval_id: str, actor: str) -> ApprovalRequest:
    """The dispatcher used the approval: it cannot authorize anything again."""
    with transaction.atomic():
        request = _locked_request(approval_id)
        transition(request, to=ApprovalStatus.CONSUMED, actor=actor, reason="dispatched")
    return request
