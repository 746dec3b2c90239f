"""The dispatcher's re-check of authority at the moment of effect: every kind of withdrawal
between the approval (or the gate's run-at-once verdict) and the claim, against the real
sandbox providers."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus, EscalationRule, PolicyTier, Tool
from console.models import AgentPrincipal, Event, Membership
from ledger import decisions
from ledger.dispatcher import run_dispatch
from ledger.models import Operation, OperationStatus
from tests.factories import events_of, make_approval_request, make_operation
from tests.fixtures.dispatch import (
    attempts_of,
    authorized_refund,
    effects_of,
    refund_arguments,
    reload,
    status_story,
)

S = OperationStatus
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sandbox_settings", "enqueued")]


@pytest.fixture
def approved_refund(agent, tools, reviewer, unique):
    """An 80 EUR refund (L3 under the default rules) the reviewer approved: authorized."""

    def make(amount: float = 80) -> tuple[Operation, ApprovalRequest]:
        operation = make_operation(agent, "payments.refund", status=S.PLANNED, risk_tier=3,
                                   arguments=refund_arguments(unique("ord"), amount=amount))
        approval = make_approval_request(operation, risk_tier=3)
        decisions.approval_approve(approval_id=approval.approval_id, reviewer=reviewer, reason="ok")
        assert reload(operation).status == S.AUTHORIZED
        return operation, approval

    return make


def assert_not_sent(operation: Operation, payments_url: str) -> None:
    assert attempts_of(operation) == []
    assert effects_of(payments_url, operation) == []
    assert S.DISPATCHED not in status_story(operation)


def last_reason(operation: Operation) -> str:
    return events_of(Operation.EVENT_ENTITY, operation.operation_id)[-1].reason


# -- withdrawn: the operation is cancelled with the reason ------------------------------------

def test_a_tool_disabled_after_the_approval_cancels_the_call(approved_refund, payments_url):
    operation, approval = approved_refund()
    Tool.objects.filter(name="payments.refund").update(enabled=False)

    assert run_dispatch(operation.operation_id, worker="test") == "cancelled:authority_withdrawn"

    assert reload(operation).status == S.CANCELLED
    assert "payments.refund is disabled" in last_reason(operation)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.INVALIDATED
    assert_not_sent(operation, payments_url)


def test_a_tool_no_longer_allowed_to_the_agent_cancels_the_call(approved_refund, agent, payments_url):
    operation, _ = approved_refund()
    agent.allowed_tools.remove(Tool.objects.get(name="payments.refund"))

    assert run_dispatch(operation.operation_id, worker="test") == "cancelled:authority_withdrawn"

    assert reload(operation).status == S.CANCELLED
    assert "may not use payments.refund" in last_reason(operation)
    assert_not_sent(operation, payments_url)


def test_a_deactivated_agent_cancels_its_approved_call(approved_refund, agent, payments_url):
    operation, _ = approved_refund()
    AgentPrincipal.objects.filter(pk=agent.pk).update(is_active=False)

    assert run_dispatch(operation.operation_id, worker="test") == "cancelled:authority_withdrawn"

    assert reload(operation).status == S.CANCELLED
    assert "may not act" in last_reason(operation)
    assert_not_sent(operation, payments_url)


def test_a_tier_now_forbidden_cancels_the_approved_call_with_the_reason(approved_refund, payments_url):
    operation, approval = approved_refund()
    PolicyTier.objects.filter(level=3).update(requirement=PolicyTier.Requirement.FORBIDDEN)

    assert run_dispatch(operation.operation_id, worker="test") == "cancelled:authority_withdrawn"

    assert reload(operation).status == S.CANCELLED
    assert "L3 is forbidden by policy" in last_reason(operation)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.INVALIDATED
    assert_not_sent(operation, payments_url)


def test_a_call_the_gate_ran_at_once_is_cancelled_when_its_tool_is_disabled(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("ord"))
    Tool.objects.filter(name="payments.refund").update(enabled=False)

    assert run_dispatch(operation.operation_id, worker="test") == "cancelled:authority_withdrawn"

    assert reload(operation).status == S.CANCELLED
    assert_not_sent(operation, payments_url)


def test_a_retry_after_the_agent_was_deactivated_fails_without_a_second_attempt(agent, tools, payments_url, unique):
    operation = make_operation(agent, "payments.refund", status=S.RETRY_SAFE,
                               arguments=refund_arguments(unique("ord")))
    AgentPrincipal.objects.filter(pk=agent.pk).update(is_active=False)

    assert run_dispatch(operation.operation_id, worker="test") == "failed:authority_withdrawn"

    assert reload(operation).status == S.FAILED
    assert len(attempts_of(operation)) == 1  # the earlier attempt only
    assert effects_of(payments_url, operation) == []


# -- the approvers ------------------------------------------------------------------------------

def test_an_approver_deactivated_after_approving_invalidates_the_approval(approved_refund, reviewer, payments_url):
    operation, approval = approved_refund()
    type(reviewer).objects.filter(pk=reviewer.pk).update(is_active=False)

    assert run_dispatch(operation.operation_id, worker="test") == "invalidated:approver"

    assert reload(operation).status == S.CANCELLED
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.INVALIDATED
    assert_not_sent(operation, payments_url)


def test_an_approver_no_longer_allowed_the_tier_invalidates_the_approval(approved_refund, reviewer, payments_url):
    operation, _ = approved_refund()
    Membership.objects.filter(user=reviewer).update(max_tier=2)

    assert run_dispatch(operation.operation_id, worker="test") == "invalidated:approver"

    assert reload(operation).status == S.CANCELLED
    assert "may no longer approve L3" in last_reason(operation)
    assert_not_sent(operation, payments_url)


# -- stricter now: back to waiting for the approvals now required -----------------------------

def assert_waits_again(operation: Operation, old: ApprovalRequest | None, *, tier: int, needed: int) -> ApprovalRequest:
    operation = reload(operation)
    assert operation.status == S.PLANNED
    assert (operation.risk_tier, operation.needs_approval) == (tier, True)
    new = ApprovalRequest.objects.get(operation=operation, status=ApprovalStatus.PENDING)
    assert (new.risk_tier, new.approvals_needed) == (tier, needed)
    assert any("asked again" in reason for reason in new.escalation_reasons)
    if old is not None:
        old.refresh_from_db()
        assert old.status == ApprovalStatus.INVALIDATED
        assert old.superseded_by_id == new.approval_id
        # The approvals given under the old policy stay on record.
        assert old.decisions.filter(verdict="approve").count() == 1
    assert status_story(operation)[-2:] == [S.AUTHORIZED, S.PLANNED]
    return new


def test_a_raised_tool_tier_sends_the_approved_call_back_for_the_approvals_now_required(approved_refund,
                                                                                        payments_url):
    operation, approval = approved_refund()
    Tool.objects.filter(name="payments.refund").update(base_tier=4)

    assert run_dispatch(operation.operation_id, worker="test") == "held:approval_required_again"

    assert_waits_again(operation, approval, tier=4, needed=2)
    assert_not_sent(operation, payments_url)


def test_a_new_escalation_rule_sends_the_approved_call_back_for_approval(approved_refund, payments_url):
    operation, approval = approved_refund(amount=80)
    EscalationRule.objects.create(tool=Tool.objects.get(name="payments.refund"), argument_path="amount",
                                  comparison=EscalationRule.Comparison.GT, value=75, tier=4)

    assert run_dispatch(operation.operation_id, worker="test") == "held:approval_required_again"

    new = assert_waits_again(operation, approval, tier=4, needed=2)
    assert any("amount 80 > 75" in reason for reason in new.escalation_reasons)
    assert_not_sent(operation, payments_url)


def test_a_tier_that_now_needs_two_approvers_sends_the_call_back(approved_refund, payments_url):
    operation, approval = approved_refund()
    PolicyTier.objects.filter(level=3).update(requirement=PolicyTier.Requirement.TWO_APPROVALS)

    assert run_dispatch(operation.operation_id, worker="test") == "held:approval_required_again"

    assert_waits_again(operation, approval, tier=3, needed=2)
    assert_not_sent(operation, payments_url)


def test_a_call_the_gate_ran_at_once_waits_for_approval_once_its_tier_needs_one(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("ord"))
    Operation.objects.filter(pk=operation.pk).update(needs_approval=False)
    Tool.objects.filter(name="payments.refund").update(base_tier=3)

    assert run_dispatch(operation.operation_id, worker="test") == "held:approval_required_again"

    assert_waits_again(operation, None, tier=3, needed=1)
    assert_not_sent(operation, payments_url)


def test_the_call_sent_back_runs_once_the_approvals_now_required_are_given(approved_refund, senior, senior2,
                                                                         payments_url):
    operation, _ = approved_refund()
    Tool.objects.filter(name="payments.refund").update(base_tier=4)
    run_dispatch(operation.operation_id, worker="test")
    new = ApprovalRequest.objects.get(operation=operation, status=ApprovalStatus.PENDING)

    decisions.approval_approve(approval_id=new.approval_id, reviewer=senior, reason="ok")
    decisions.approval_approve(approval_id=new.approval_id, reviewer=senior2, reason="ok")

    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, operation)) == 1


def test_a_lower_tier_now_does_not_hold_an_approved_call(approved_refund, payments_url):
    operation, _ = approved_refund()
    EscalationRule.objects.filter(tool__name="payments.refund", tier=3).delete()

    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, operation)) == 1


def test_every_withdrawal_is_an_event_by_the_dispatcher(approved_refund):
    operation, _ = approved_refund()
    Tool.objects.filter(name="payments.refund").update(enabled=False)

    run_dispatch(operation.operation_id, worker="test")

    event = Event.objects.filter(entity="operation", entity_id=operation.operation_id).order_by("-id").first()
    assert (event.to_status, event.actor) == (S.CANCELLED, "system:dispatcher")
    assert event.reason.startswith("authority withdrawn:")


def test_the_new_request_shows_the_old_approval_as_given_under_the_old_policy(approved_refund, client, senior):
    operation, old = approved_refund()
    Tool.objects.filter(name="payments.refund").update(base_tier=4)
    run_dispatch(operation.operation_id, worker="test")
    new = ApprovalRequest.objects.get(operation=operation, status=ApprovalStatus.PENDING)
    client.force_login(senior)

    page = client.get(f"/approvals/{new.approval_id}/").content.decode()

    assert "reviewer approved" in page
    assert f"given under the old policy (L3, 1 approval) on <span class=\"mono\">{old.approval_id}</span>" in page


def test_the_agent_is_told_its_call_waits_for_the_approvals_now_required(approved_refund, api):
    operation, _ = approved_refund()
    Tool.objects.filter(name="payments.refund").update(base_tier=4)
    run_dispatch(operation.operation_id, worker="test")
    new = ApprovalRequest.objects.get(operation=operation, status=ApprovalStatus.PENDING)

    body = api.get(f"/api/v1/operations/{operation.operation_id}").json()

    assert (body["status"], body["decision"]["outcome"], body["risk_tier"]) == ("planned", "awaiting_approval", 4)
    assert (body["approval"]["approval_id"], body["approval"]["approvals_needed"]) == (new.approval_id, 2)
    assert any("asked again" in reason for reason in body["reasons"])


def test_a_retry_after_the_tier_was_raised_to_need_an_approval_fails_without_a_second_attempt(agent, tools,
                                                                                            payments_url, unique):
    """A retry is a new dispatch: the policy it would run under now asks for an approval the
    call never had. The earlier attempt provably had no effect, so the retry fails with the
    reason (propose again, under the new policy) rather than run on the old authority."""
    operation = make_operation(agent, "payments.refund", status=S.RETRY_SAFE,
                               arguments=refund_arguments(unique("ord")))
    Tool.objects.filter(name="payments.refund").update(base_tier=3)

    assert run_dispatch(operation.operation_id, worker="test") == "failed:approval_required_again"

    assert reload(operation).status == S.FAILED
    assert "the policy now requires L3" in events_of(Event.Entity.OPERATION, operation.operation_id)[-1].reason
    assert len(attempts_of(operation)) == 1  # the earlier attempt only
    assert effects_of(payments_url, operation) == []
