"""Edit and approve (ledger.decisions.approval_edit_and_approve): a reviewer's changed arguments
become a new call, operation and request through the same gate; the old request is superseded and
its operation cancelled. The page that does it is tested in tests/approvals/test_views_edit.py."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from console.lib.canonical import arguments_hash
from console.lib.errors import Conflict, InvalidInput, NotPermitted
from console.lib.ids import derive_operation_id
from console.models import Event
from ledger import decisions
from ledger.models import Call, Operation, OperationStatus
from ledger.proposals import call_propose
from tests.fixtures.api import start_task

pytestmark = pytest.mark.django_db

A = ApprovalStatus
S = OperationStatus


def refund(amount: float | int, **changes: Any) -> dict[str, Any]:
    return {"order_id": "ord-42", "amount": amount, "currency": "EUR", "reason": "damaged", **changes}


def propose(agent, *, amount: float | int = 120, call_id: str = "call-1", step_id: str = "step-1",
            constraints: dict | None = None) -> ApprovalRequest:
    run = start_task(agent, constraints=constraints or {"max_amount": 2000})
    proposal = call_propose(principal=agent, task_id=run.task_id, call_id=call_id, step_id=step_id,
                            tool_name="payments.refund", arguments=refund(amount),
                            expected_version=run.version, fencing_token=run.fencing_token)
    assert proposal.decision == "awaiting_approval"
    return ApprovalRequest.objects.get(pk=proposal.approval_id)


def fresh(request: ApprovalRequest) -> ApprovalRequest:
    return ApprovalRequest.objects.get(pk=request.pk)


def op(operation_id: str) -> Operation:
    return Operation.objects.get(pk=operation_id)


def snapshot() -> tuple[int, int, int, int, int]:
    return (Operation.objects.count(), Call.objects.count(), ApprovalRequest.objects.count(),
            ApprovalDecision.objects.count(), Event.objects.count())


@pytest.fixture
def l3(agent) -> ApprovalRequest:
    return propose(agent, amount=120)


# ------------------------------------------------------------------------------------ service


def test_an_edit_is_a_new_call_operation_and_request_and_the_old_one_is_superseded(
        l3, reviewer, django_capture_on_commit_callbacks):
    old_operation = op(l3.operation_id)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        result = decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=reviewer,
                                                    arguments=refund(80), reason="only part was damaged")
    new = fresh(result.new)
    assert (result.call_id, result.step_id) == ("call-1-edit-1", "step-1~edit1")
    # The step ID is what makes the operation ID distinct: (tenant, task, step, tool).
    assert result.operation_id == new.operation_id == derive_operation_id(
        tenant="acme", task_id=l3.task_id, step_id="step-1~edit1", tool="payments.refund")
    assert new.operation_id != l3.operation_id and new.approval_id != l3.approval_id
    assert new.call_id == "call-1-edit-1"
    assert new.arguments_hash == arguments_hash(refund(80)) != l3.arguments_hash
    # The gate recomputed the tier (80 > 50: still L3) and the editor's approval was enough.
    assert (new.risk_tier, new.approvals_needed, new.status) == (3, 1, A.APPROVED)
    decision = new.decisions.get()
    assert (decision.reviewer, decision.verdict, decision.arguments_hash) == (reviewer, "approve", new.arguments_hash)
    assert "only part was damaged" in decision.reason
    new_operation = op(new.operation_id)
    assert (new_operation.status, new_operation.arguments, new_operation.call_id) == (
        S.AUTHORIZED, refund(80), "call-1-edit-1")
    assert Call.objects.get(call_id="call-1-edit-1").operation == new_operation
    # The old request and operation: closed, never changed in place.
    old = fresh(l3)
    assert (old.status, old.superseded_by_id, old.arguments_hash) == (A.SUPERSEDED, new.approval_id, l3.arguments_hash)
    assert old.decided_at is not None and not old.decisions.exists()
    closed = op(l3.operation_id)
    assert (closed.status, closed.arguments, closed.arguments_hash) == (
        S.CANCELLED, old_operation.arguments, old_operation.arguments_hash)
    supersede = Event.objects.get(entity="approval", entity_id=l3.approval_id, to_status=A.SUPERSEDED)
    assert supersede.actor == "user:reviewer"
    assert supersede.evidence["approval_id"] == new.approval_id
    assert supersede.evidence["previous_arguments_hash"] == l3.arguments_hash
    assert Event.objects.filter(entity="operation", entity_id=l3.operation_id, to_status=S.CANCELLED).exists()
    # Exactly one dispatch of the new operation is published, and only on commit.
    assert len(callbacks) == 1


def test_an_edit_gives_back_the_replaced_calls_budget_before_the_gate_counts_the_new_one(agent, reviewer):
    from runs.models import Task

    # 120 of 200 reserved, one call of one: without the release, the edited 100 would be refused
    # (120 + 100 > 200, and the call budget spent).
    request = propose(agent, amount=120, constraints={"max_amount": 200, "max_tool_calls": 1})
    result = decisions.approval_edit_and_approve(approval_id=request.approval_id, reviewer=reviewer,
                                                arguments=refund(100), reason="partial refund")
    assert fresh(result.new).status == A.APPROVED
    task = Task.objects.get(pk=request.task_id)
    assert (task.calls_used, task.writes_used, task.amount_used) == (1, 1, 100)


def test_a_refused_edit_keeps_the_replaced_calls_budget_reserved(agent, reviewer):
    from runs.models import Task

    request = propose(agent, amount=120, constraints={"max_amount": 200})
    with pytest.raises(Conflict, match="exceeds what is left"):
        decisions.approval_edit_and_approve(approval_id=request.approval_id, reviewer=reviewer,
                                           arguments=refund(201),
                                           reason="more")
    task = Task.objects.get(pk=request.task_id)
    assert (task.calls_used, task.amount_used) == (1, 120)
    assert fresh(request).status == A.PENDING


def test_an_edit_that_raises_the_tier_to_l4_still_needs_a_second_distinct_approver(l3, senior, senior2):
    result = decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=senior,
                                                arguments=refund(250), reason="the full order")
    new = fresh(result.new)
    assert (new.risk_tier, new.approvals_needed, new.status) == (4, 2, A.PENDING)
    assert any("250" in r and "L4" in r for r in new.escalation_reasons)
    assert list(new.decisions.values_list("reviewer__username", flat=True)) == ["senior"]
    assert op(new.operation_id).status == S.PLANNED
    assert fresh(l3).status == A.SUPERSEDED
    with pytest.raises(NotPermitted):  # the editor proposed the edited call
        decisions.approval_approve(approval_id=new.approval_id, reviewer=senior)
    decisions.approval_approve(approval_id=new.approval_id, reviewer=senior2, arguments_hash=new.arguments_hash)
    assert fresh(new).status == A.APPROVED
    assert op(new.operation_id).status == S.AUTHORIZED


def test_an_editor_may_not_raise_a_call_above_their_own_tier(l3, reviewer):
    before = snapshot()
    with pytest.raises(NotPermitted):
        decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=reviewer,
                                           arguments=refund(250), reason="the full order")
    assert snapshot() == before
    assert fresh(l3).status == A.PENDING and op(l3.operation_id).status == S.PLANNED


def test_a_reviewer_may_not_edit_a_request_above_their_tier(agent, reviewer):
    l4 = propose(agent, amount=300)
    before = snapshot()
    with pytest.raises(NotPermitted):
        decisions.approval_edit_and_approve(approval_id=l4.approval_id, reviewer=reviewer,
                                           arguments=refund(40), reason="smaller")
    assert snapshot() == before


def test_an_edit_down_to_a_tier_that_runs_at_once_is_authorized_by_the_gate(l3, reviewer):
    result = decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=reviewer,
                                                arguments=refund(30), reason="goodwill only")
    assert result.new is None and result.decision == "dispatched"
    operation = op(result.operation_id)
    assert (operation.status, operation.risk_tier) == (S.AUTHORIZED, 1)
    old = fresh(l3)
    assert (old.status, old.superseded_by_id) == (A.SUPERSEDED, None)
    event = Event.objects.get(entity="approval", entity_id=l3.approval_id, to_status=A.SUPERSEDED)
    assert event.evidence["operation_id"] == result.operation_id
    assert op(l3.operation_id).status == S.CANCELLED


def test_arguments_that_break_the_schema_change_nothing(l3, reviewer):
    before = snapshot()
    with pytest.raises(InvalidInput) as info:
        decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=reviewer,
                                           arguments=refund(-5, currency="XXX"), reason="typo")
    paths = {e["path"] for e in info.value.details["errors"]}
    assert paths == {"amount", "currency"}
    assert snapshot() == before


def test_unchanged_arguments_a_stale_hash_and_a_missing_reason_are_refused(l3, reviewer):
    before = snapshot()
    with pytest.raises(InvalidInput):
        decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=reviewer,
                                           arguments=refund(120), reason="same")
    with pytest.raises(Conflict):
        decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=reviewer,
                                           arguments=refund(80), reason="x", arguments_hash="0" * 64)
    with pytest.raises(InvalidInput) as info:
        decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=reviewer,
                                           arguments=refund(80), reason="  ")
    assert info.value.details == {"field": "reason"}
    assert snapshot() == before


def test_a_decided_request_cannot_be_edited(l3, reviewer, senior):
    decisions.approval_approve(approval_id=l3.approval_id, reviewer=senior)
    with pytest.raises(Conflict):
        decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=reviewer,
                                           arguments=refund(80), reason="late")


def test_an_edit_of_an_edit_counts_on(l3, senior, senior2):
    first = decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=senior,
                                               arguments=refund(250), reason="full order")
    second = decisions.approval_edit_and_approve(approval_id=first.new.approval_id, reviewer=senior2,
                                                arguments=refund(220), reason="minus shipping")
    assert (second.call_id, second.step_id) == ("call-1-edit-2", "step-1~edit2")
    assert fresh(first.new).superseded_by_id == second.new.approval_id
    assert op(first.operation_id).status == S.CANCELLED
    # senior2's approval is one of two on the newest request; senior's was on the superseded one.
    assert fresh(second.new).status == A.PENDING
    assert list(second.new.decisions.values_list("reviewer__username", flat=True)) == ["senior2"]


def test_edit_identifiers_fit_the_ledgers_limits(agent):
    long_call = "c" * 64
    call_id, step_id = decisions.edit_identifiers(task_id="none", call_id=long_call, step_id="s" * 128)
    assert call_id.endswith("-edit-1") and len(call_id) == 64
    assert step_id.endswith("~edit1") and len(step_id) == 128

