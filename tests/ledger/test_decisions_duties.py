"""Separation of duties: the person who proposes a call (a compensation, an edit) is recorded as
its proposer and never approves it; two-person tiers need two approvers who did not propose it;
an edit by one person needs a second approver whenever the original needed two."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus
from console.lib.errors import NotPermitted
from console.models import Role
from ledger import decisions
from ledger import services as ledger_services
from ledger.compensation import compensation_propose
from ledger.models import Operation, OperationStatus
from ledger.proposals import call_propose
from tests.conftest import make_user
from tests.fixtures.api import start_task
from tests.fixtures.support import make_operation

pytestmark = pytest.mark.django_db

A = ApprovalStatus
S = OperationStatus


def refund(amount: float | int, order_id: str = "ord-1001", **changes: Any) -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount, "currency": "EUR", "reason": "damaged", **changes}


def fresh(request: ApprovalRequest) -> ApprovalRequest:
    return ApprovalRequest.objects.get(pk=request.pk)


def confirmed_refund(agent, amount: float | int = 25) -> Operation:
    operation = make_operation(agent, arguments=refund(amount))
    ledger_services.operation_confirm(operation_id=operation.operation_id, receipt={"remote_id": "re_1"},
                                      actor="system:reconciler", reason="found")
    operation.refresh_from_db()
    return operation


@pytest.fixture
def admin(tenant):
    """Support staff and an L4 reviewer in one person, as `make run`'s admin."""
    return make_user("admin", tenant, Role.SUPPORT, Role.REVIEWER, max_tier=4)


def test_the_proposer_of_a_compensation_may_not_approve_it_alone(agent, admin):
    original = confirmed_refund(agent)
    compensation, approval = compensation_propose(
        operation_id=original.operation_id, user=admin, tool_name="payments.refund",
        arguments=refund(20), reason="refunded twice")
    assert fresh(approval).proposed_by == admin
    with pytest.raises(NotPermitted, match="You proposed this call"):
        decisions.approval_approve(approval_id=approval.approval_id, reviewer=admin)
    assert fresh(approval).status == A.PENDING and not fresh(approval).decisions.exists()
    assert Operation.objects.get(pk=compensation.pk).status == S.PLANNED


def test_another_reviewer_approves_the_compensation(agent, admin, reviewer):
    original = confirmed_refund(agent)
    compensation, approval = compensation_propose(
        operation_id=original.operation_id, user=admin, tool_name="payments.refund",
        arguments=refund(20), reason="refunded twice")
    decisions.approval_approve(approval_id=approval.approval_id, reviewer=reviewer)
    assert fresh(approval).status == A.APPROVED
    assert Operation.objects.get(pk=compensation.pk).status == S.AUTHORIZED


def test_a_two_person_compensation_needs_two_approvers_neither_of_whom_proposed_it(agent, admin, senior, senior2):
    original = confirmed_refund(agent, amount=300)
    compensation, approval = compensation_propose(
        operation_id=original.operation_id, user=admin, tool_name="payments.refund",
        arguments=refund(250), reason="refunded twice")
    assert (approval.risk_tier, approval.approvals_needed) == (4, 2)
    decisions.approval_approve(approval_id=approval.approval_id, reviewer=senior)
    with pytest.raises(NotPermitted):
        decisions.approval_approve(approval_id=approval.approval_id, reviewer=admin)
    assert fresh(approval).status == A.PENDING
    decisions.approval_approve(approval_id=approval.approval_id, reviewer=senior2)
    assert fresh(approval).status == A.APPROVED
    assert sorted(fresh(approval).decisions.values_list("reviewer__username", flat=True)) == ["senior", "senior2"]


def test_an_agents_call_records_no_person_as_proposer(agent, reviewer):
    run = start_task(agent, constraints={"max_amount": 2000})
    proposal = call_propose(principal=agent, task_id=run.task_id, call_id="c1", step_id="s1",
                            tool_name="payments.refund", arguments=refund(120), expected_version=run.version,
                            fencing_token=run.fencing_token)
    assert ApprovalRequest.objects.get(pk=proposal.approval_id).proposed_by is None


# ------------------------------------------------------------------------------ edit and approve


def propose_l4(agent, amount: float | int = 250) -> ApprovalRequest:
    run = start_task(agent, constraints={"max_amount": 2000})
    proposal = call_propose(principal=agent, task_id=run.task_id, call_id="call-1", step_id="step-1",
                            tool_name="payments.refund", arguments=refund(amount), expected_version=run.version,
                            fencing_token=run.fencing_token)
    request = ApprovalRequest.objects.get(pk=proposal.approval_id)
    assert (request.risk_tier, request.approvals_needed) == (4, 2)
    return request


def test_an_edit_down_from_l4_to_l3_by_one_senior_still_needs_a_second_person(agent, senior, reviewer):
    l4 = propose_l4(agent)
    result = decisions.approval_edit_and_approve(approval_id=l4.approval_id, reviewer=senior,
                                                arguments=refund(120), reason="only part was damaged")
    new = fresh(result.new)
    assert new.proposed_by == senior
    assert (new.risk_tier, new.approvals_needed, new.status) == (3, 2, A.PENDING)
    assert Operation.objects.get(pk=new.operation_id).status == S.PLANNED
    with pytest.raises(NotPermitted, match="You proposed this call"):
        decisions.approval_approve(approval_id=new.approval_id, reviewer=senior)
    decisions.approval_approve(approval_id=new.approval_id, reviewer=reviewer)
    assert fresh(new).status == A.APPROVED
    assert Operation.objects.get(pk=new.operation_id).status == S.AUTHORIZED


def test_an_edit_of_a_two_person_call_down_to_a_tier_that_runs_at_once_is_refused(agent, senior):
    l4 = propose_l4(agent)
    with pytest.raises(NotPermitted, match="second"):
        decisions.approval_edit_and_approve(approval_id=l4.approval_id, reviewer=senior,
                                           arguments=refund(10), reason="a token refund")
    assert fresh(l4).status == A.PENDING
    assert Operation.objects.filter(task_id=l4.task_id).count() == 1


def test_an_edit_of_a_one_person_call_is_approved_by_its_editor_alone(agent, reviewer):
    run = start_task(agent, constraints={"max_amount": 2000})
    proposal = call_propose(principal=agent, task_id=run.task_id, call_id="c1", step_id="s1",
                            tool_name="payments.refund", arguments=refund(120), expected_version=run.version,
                            fencing_token=run.fencing_token)
    result = decisions.approval_edit_and_approve(approval_id=proposal.approval_id, reviewer=reviewer,
                                                arguments=refund(80), reason="partial")
    new = fresh(result.new)
    assert (new.proposed_by, new.approvals_needed, new.status) == (reviewer, 1, A.APPROVED)


def test_the_proposer_of_an_edited_call_may_not_edit_it_again_to_approve_it(agent, senior, senior2):
    l4 = propose_l4(agent)
    result = decisions.approval_edit_and_approve(approval_id=l4.approval_id, reviewer=senior,
                                                arguments=refund(260), reason="shipping too")
    with pytest.raises(NotPermitted, match="You proposed this call"):
        decisions.approval_edit_and_approve(approval_id=result.new.approval_id, reviewer=senior,
                                           arguments=refund(270), reason="and the wrapping")
    assert fresh(result.new).status == A.PENDING
