"""The moves that change records of more than one app, each in one place.

Each app's services write only their own tables: `approvals.services` the approval requests,
`ledger.services` the operations, `runs.services` the tasks and leases. A person's decision on
an approval, the sweeper's expiry, the dispatcher's re-check and a lease takeover each change
two of them at once; the functions here hold both halves in one transaction, so the approval
and its operation (or the lease and the operations in flight) never disagree. Views, the API,
the sweeper and the dispatcher call these, never the halves.

The other multi-record moves have homes of their own: a proposal (`ledger.proposals`), the
dispatcher's claim (`ledger.dispatcher`), a compensation (`ledger.compensation`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from approvals import audit, gate
from approvals import services as approval_services
from approvals.catalog import held as held_catalog
from approvals.gate import Decision
from approvals.models import ApprovalRequest, ApprovalStatus, Tool
from console.lib.errors import Conflict, InvalidInput, NotPermitted
from console.models import AgentPrincipal
from ledger import services as ledger_services
from ledger.models import Call, Operation, OperationStatus
from ledger.proposals import MAX_CALL_ID, MAX_STEP_ID, call_propose, task_settle_waiting
from runs import services as run_services
from runs.models import Lease, Step

user_ref = approval_services.user_ref

# ----------------------------------------------------------------------- a reviewer decides


def approval_approve(*, approval_id: str, reviewer: AbstractBaseUser, reason: str = "",
                     arguments_hash: str | None = None) -> ApprovalRequest:
    """Record one approval; the last one needed authorizes the operation in the same
    transaction, and the dispatch is enqueued on commit. The call's proposer is refused."""
    return _approve(approval_id=approval_id, reviewer=reviewer, reason=reason, arguments_hash=arguments_hash)


def _approve(*, approval_id: str, reviewer: AbstractBaseUser, reason: str, arguments_hash: str | None,
             as_editor: bool = False) -> ApprovalRequest:
    with transaction.atomic():
        verdict = _verdict_now(approval_id)
        if verdict is not None and verdict.refused:
            raise Conflict("This call is refused now, so it cannot be approved: " + "; ".join(verdict.reasons),
                           details={"reasons": list(verdict.reasons), "status": "refused"})
        now_requires = (verdict.risk_tier, verdict.approvals_needed) if verdict is not None and verdict.needs_approval else None
        request = approval_services.approval_give(approval_id=approval_id, reviewer=reviewer, reason=reason,
                                                  arguments_hash=arguments_hash, as_editor=as_editor,
                                                  now_requires=now_requires)
        if now_requires is not None:
            ledger_services.operation_raise_tier(operation_id=request.operation_id, risk_tier=request.risk_tier)
        if request.status == ApprovalStatus.APPROVED:
            ledger_services.operation_authorize(
                operation_id=request.operation_id, actor=user_ref(reviewer),
                reason=f"approved ({request.approval_id})", evidence={"approval_id": request.approval_id},
            )
            task_settle_waiting(task_id=request.task_id, actor=user_ref(reviewer), reason="no call waits any more")
    return request


def _verdict_now(approval_id: str) -> gate.GateResult | None:
    """The gate's verdict now on the request's call (the agent, the tool and the policy as they
    are, the configuration held still until the approval commits), or None for no such request
    (the approval then answers 404). What the dispatcher checks again at the claim, checked
    where a person decides, so a reviewer never authorizes on a policy that changed since."""
    catalog = held_catalog()
    operation = (Operation.objects.select_related("tool", "task")
                 .filter(approval_requests__approval_id=approval_id).first())
    if operation is None:
        return None
    principal = (None if operation.compensates_id is not None
                 else AgentPrincipal.objects.select_related("tenant").get(pk=operation.principal_id))
    return gate.reevaluate(principal=principal, task=operation.task, tool=operation.tool,
                           arguments=operation.arguments, args_hash=operation.arguments_hash, catalog=catalog)


def approval_reject(*, approval_id: str, reviewer: AbstractBaseUser, reason: str) -> ApprovalRequest:
    """A reviewer's rejection rejects the operation with it."""
    with transaction.atomic():
        request = approval_services.approval_decline(approval_id=approval_id, reviewer=reviewer, reason=reason)
        ledger_services.operation_reject(operation_id=request.operation_id, actor=user_ref(reviewer), reason=reason)
        task_settle_waiting(task_id=request.task_id, actor=user_ref(reviewer), reason="no call waits any more")
    return request


# ------------------------------------------------------------- time or the task moves on


def _close_with_operation(approval_id: str, *, to: str, actor: str, reason: str,
                          operation_verb: Callable[..., Operation]) -> ApprovalRequest:
    with transaction.atomic():
        request, moved = approval_services.approval_close(approval_id=approval_id, to=to, actor=actor, reason=reason)
        if moved:
            status = Operation.objects.filter(pk=request.operation_id).values_list("status", flat=True).get()
            if status in (OperationStatus.PLANNED, OperationStatus.AUTHORIZED):
                operation_verb(operation_id=request.operation_id, actor=actor, reason=reason)
            task_settle_waiting(task_id=request.task_id, actor=actor, reason="no call waits any more")
    return request


def approval_expire(*, approval_id: str, actor: str = "system:sweeper",
                    reason: str = "approval expired") -> ApprovalRequest:
    """The request ran out of time: it and its operation (if not yet dispatched) expire."""
    return _close_with_operation(approval_id, to=ApprovalStatus.EXPIRED, actor=actor, reason=reason,
                                 operation_verb=ledger_services.operation_expire)


def approval_invalidate(*, approval_id: str, actor: str, reason: str) -> ApprovalRequest:
    """The task moved on (version, tool schema) or the approver lost the right: the approval no
    longer holds and its operation is cancelled."""
    return _close_with_operation(approval_id, to=ApprovalStatus.INVALIDATED, actor=actor, reason=reason,
                                 operation_verb=ledger_services.operation_cancel)


def approval_require_again(*, operation: Operation, approval: ApprovalRequest | None, verdict: gate.GateResult,
                           actor: str) -> ApprovalRequest:
    """The policy now asks more of an authorized call than it was authorized with (a higher
    tier, more approvers, or an approval where none was needed): the operation goes back to
    `planned` and a new request asks for the approvals now required. The old request, if any,
    is invalidated and points to the new one, so its decisions stay on record as given under
    the old policy."""
    was = f"L{approval.risk_tier}, {approval.approvals_needed} approval(s)" if approval else f"L{operation.risk_tier}, run at once"
    now = f"L{verdict.risk_tier}, {verdict.approvals_needed} approval(s)"
    why = f"the policy now requires {now}; the call was authorized under {was}"
    with transaction.atomic():
        ledger_services.operation_hold_for_approval(
            operation_id=operation.operation_id, actor=actor, reason=why, risk_tier=verdict.risk_tier,
            evidence={"reasons": list(verdict.reasons), "previous_approval_id": approval.approval_id if approval else None})
        task = operation.task
        new = approval_services.approval_request_create(
            operation=operation, task_type=task.task_type, call_id=operation.call_id, state_version=task.version,
            risk_tier=verdict.risk_tier, approvals_needed=verdict.approvals_needed,
            ttl_seconds=verdict.approval_ttl_seconds, reasons=[*verdict.reasons, f"asked again: {why}"], actor=actor,
        )
        if approval is not None:
            approval_services.approval_close(
                approval_id=approval.approval_id, to=ApprovalStatus.INVALIDATED, actor=actor,
                reason=f"no longer suffices: {why}", evidence={"approval_id": new.approval_id},
                changes={"superseded_by": new})
    return new


# ------------------------------------------------------------------------- edit and approve

EDIT_CALL_SUFFIX = re.compile(r"-edit-(\d+)$")
EDIT_STEP_SUFFIX = re.compile(r"~edit(\d+)$")


def _with_suffix(base: str, suffix: str, limit: int) -> str:
    return base[: limit - len(suffix)] + suffix


def edit_identifiers(*, task_id: str, call_id: str, step_id: str) -> tuple[str, str]:
    """The edited call's call ID `<call>-edit-N` and step ID `<step>~editN`.

    The operation ID is derived from (tenant, task, step, tool), so the edited call needs a
    step ID of its own to get an operation of its own; an edit of an edit counts on (`-edit-2`).
    N is the first number free for both IDs within the task.
    """
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


def _release_budget(operation: Operation) -> None:
    """Give back what a still-planned operation reserved of its task's budgets (one call, one
    write, its amount): the edited call reserves its own share, and the replaced one must not be
    counted as well."""
    if operation.status != OperationStatus.PLANNED:
        raise Conflict(f"Only a planned operation gives its budget back; this one is {operation.status}.",
                       details={"status": operation.status})
    tool = operation.tool
    run_services.task_release_budget(task_id=operation.task_id, calls=1,
                                     writes=1 if tool.kind == Tool.Kind.WRITE else 0,
                                     amount=gate.call_amount(tool, operation.arguments))


def approval_edit_and_approve(*, approval_id: str, reviewer: AbstractBaseUser, arguments: dict[str, Any],
                              reason: str, arguments_hash: str | None = None) -> EditResult:
    """A reviewer changes the arguments and approves the changed call.

    Nothing is changed in place: the edited call is a NEW call (`<call>-edit-N`, step
    `<step>~editN`, so a new operation ID) proposed through the same pipeline and gate as the
    agent's (`call_propose`, on behalf of the requesting agent and under the task's current
    lease token), so the schema, the budgets and the tier are computed again. The old request
    becomes `superseded` (`superseded_by` → the new one) and its operation `cancelled`. The
    editor's approval is then recorded on the new request through `approval_approve`, so the
    usual rules hold: a tier above the editor's maximum refuses the whole edit; at L4 it counts
    as one of two distinct approvers. If the new tier runs without approval, the gate
    authorizes the new operation at once and there is no new request (`superseded_by` stays
    empty; the supersede event names the new call and operation).

    Separation of duties: the editor is the new request's proposer (`proposed_by`); their
    approval counts once, and the new request needs at least as many approvers as the old one,
    so an edit down from a two-person tier still waits for a second person — and an edit down
    to a tier that runs at once is refused when the original needed two. The proposer of a
    request (the editor of an earlier edit) may not edit it.

    All in one transaction: a refusal anywhere leaves the old request pending, untouched.
    """
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("An edit needs a reason: the agent and the next reviewer are told why.",
                           details={"field": "reason"})
    actor = user_ref(reviewer)
    with transaction.atomic():
        old = approval_services.approval_lock_pending(approval_id, reviewer)
        approval_services.refuse_proposer(old, reviewer)
        if arguments_hash is not None and arguments_hash != old.arguments_hash:
            raise Conflict("The arguments changed since you looked; reload the request.")
        operation = (Operation.objects.select_for_update(of=("self",))
                     .select_related("tool", "step", "principal", "task").get(pk=old.operation_id))
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
        _release_budget(operation)
        proposal = call_propose(
            principal=operation.principal, task_id=task.task_id, call_id=new_call, step_id=new_step,
            tool_name=tool.name, arguments=arguments, expected_version=task.version,
            # The reviewer acts for the task's current holder, not as a competing worker.
            fencing_token=lease.fencing_token if lease is not None else None,
        )
        if proposal.decision == Decision.REFUSED:
            raise Conflict("The gate refused the edited call: " + "; ".join(proposal.reasons),
                           details={"reasons": list(proposal.reasons)})
        new = None
        if proposal.decision == Decision.AWAITING_APPROVAL:
            approval_services.approval_propose_edit(approval_id=proposal.approval_id, editor=reviewer,
                                                    approvals_needed=old.approvals_needed)
            new = _approve(approval_id=proposal.approval_id, reviewer=reviewer, as_editor=True,
                           reason=f"edited from {old.call_id}: {reason}", arguments_hash=new_hash)
        elif old.approvals_needed > 1:
            raise NotPermitted(
                f"The original call needed {old.approvals_needed} people; an edit to a tier that runs at once "
                "would run it on one person's word. Reject it, or edit it to a tier that a second reviewer approves.",
                details={"approvals_needed": old.approvals_needed, "risk_tier": proposal.risk_tier})
        else:
            # The edit ran at once: if its tier is audited, the editor proposed it and may not review it.
            audit.audit_set_proposer(operation_id=proposal.operation_id, user=reviewer)
        old, _ = approval_services.approval_close(
            approval_id=old.approval_id, to=ApprovalStatus.SUPERSEDED, actor=actor, reason=f"edited: {reason}",
            evidence={"call_id": new_call, "step_id": new_step, "operation_id": proposal.operation_id,
                      "approval_id": new.approval_id if new else None, "arguments_hash": new_hash,
                      "previous_arguments_hash": old.arguments_hash, "risk_tier": proposal.risk_tier,
                      "decision": proposal.decision, "proposed_by": actor,
                      "approvals_needed": new.approvals_needed if new else 0},
            changes={"superseded_by": new, "decided_at": timezone.now()},
        )
        ledger_services.operation_cancel(
            operation_id=old.operation_id, actor=actor,
            reason=f"superseded by the edited call {new_call} ({proposal.operation_id})",
        )
        task_settle_waiting(task_id=task.task_id, actor=actor, reason="no call waits any more")
    return EditResult(old=old, new=new, call_id=new_call, step_id=new_step,
                      operation_id=proposal.operation_id, decision=proposal.decision)


# ---------------------------------------------------------------------------- lease takeover


def lease_acquire(*, task_id: str, owner: str, ttl_seconds: int, now=None, retake: bool = False) -> Lease:
    """Take or renew the task's lease (`runs.services.lease_acquire`). A takeover makes the
    previous holder's in-flight operations `unknown` before the new holder acts: they are
    reconciled, never assumed failed, never sent again blindly."""
    with transaction.atomic():
        lease = run_services.lease_acquire(task_id=task_id, owner=owner, ttl_seconds=ttl_seconds, now=now,
                                           retake=retake)
        if lease.taken_over:
            in_flight = Operation.objects.filter(task_id=task_id, status=OperationStatus.DISPATCHED)
            for operation_id in in_flight.values_list("operation_id", flat=True):
                ledger_services.operation_mark_unknown(
                    operation_id=operation_id, actor="system:lease",
                    reason=f"lease taken over by {owner} (token {lease.fencing_token})")
    return lease
