"""Approving re-reads the policy: a request filed under a laxer policy is raised to what the
policy asks now before the approval is counted; a call the gate would refuse now cannot be
approved (the reason is said); an unchanged policy approves as before."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus, Tool
from console.lib.errors import Conflict, NotPermitted
from console.models import AgentPrincipal
from ledger import decisions
from ledger.models import Operation, OperationStatus
from tests.factories import events_of, make_pending_approval

A = ApprovalStatus
S = OperationStatus


def fresh(request: ApprovalRequest) -> tuple[ApprovalRequest, Operation]:
    return ApprovalRequest.objects.get(pk=request.pk), Operation.objects.get(pk=request.operation_id)


def test_an_approval_under_a_raised_tier_is_counted_but_does_not_authorize(agent, senior, senior2):
    request = make_pending_approval(agent, risk_tier=3)
    Tool.objects.filter(name="payments.refund").update(base_tier=4)  # L4: two approvers

    decisions.approval_approve(approval_id=request.approval_id, reviewer=senior, reason="ok")

    stored, operation = fresh(request)
    assert (stored.status, stored.risk_tier, stored.approvals_needed) == (A.PENDING, 4, 2)
    assert (operation.status, operation.risk_tier) == (S.PLANNED, 4)  # the operation's tier follows
    assert stored.decisions.count() == 1
    assert any("the policy now requires L4, 2 approval(s)" in reason for reason in stored.escalation_reasons)
    given = events_of("approval", request.approval_id)[-1]
    assert given.kind == "approval_given" and "the policy now requires L4" in given.reason

    decisions.approval_approve(approval_id=request.approval_id, reviewer=senior2, reason="ok too")

    stored, operation = fresh(request)
    assert (stored.status, operation.status) == (A.APPROVED, S.AUTHORIZED)


def test_a_reviewer_below_the_raised_tier_may_no_longer_approve(agent, reviewer):
    request = make_pending_approval(agent, risk_tier=3)
    Tool.objects.filter(name="payments.refund").update(base_tier=4)

    with pytest.raises(NotPermitted, match="now L4.*you may approve up to L3"):
        decisions.approval_approve(approval_id=request.approval_id, reviewer=reviewer, reason="ok")

    stored, operation = fresh(request)
    assert (stored.status, operation.status, stored.decisions.count()) == (A.PENDING, S.PLANNED, 0)


@pytest.mark.parametrize("withdrawal", ["tool_disabled", "agent_deactivated", "not_allowed"])
def test_a_call_refused_now_cannot_be_approved_and_the_reason_is_said(agent, reviewer, withdrawal):
    request = make_pending_approval(agent, risk_tier=3)
    refund = Tool.objects.get(name="payments.refund")
    if withdrawal == "tool_disabled":
        Tool.objects.filter(pk=refund.pk).update(enabled=False)
        said = "The tool payments.refund is disabled"
    elif withdrawal == "agent_deactivated":
        AgentPrincipal.objects.filter(pk=agent.pk).update(is_active=False)
        said = "may not act on this task"
    else:
        agent.allowed_tools.remove(refund)
        said = "may not use payments.refund"

    with pytest.raises(Conflict, match=f"refused now.*{said}"):
        decisions.approval_approve(approval_id=request.approval_id, reviewer=reviewer, reason="ok")

    stored, operation = fresh(request)
    assert (stored.status, operation.status, stored.decisions.count()) == (A.PENDING, S.PLANNED, 0)
    # Rejecting it stays possible.
    decisions.approval_reject(approval_id=request.approval_id, reviewer=reviewer, reason="withdrawn")
    assert fresh(request)[0].status == A.REJECTED


def test_an_unchanged_policy_approves_as_before(agent, reviewer):
    request = make_pending_approval(agent, risk_tier=3)

    decisions.approval_approve(approval_id=request.approval_id, reviewer=reviewer, reason="ok")

    stored, operation = fresh(request)
    assert (stored.status, stored.risk_tier, stored.approvals_needed, operation.status) == (A.APPROVED, 3, 1,
                                                                                            S.AUTHORIZED)
