"""Compensation is a new operation, linked, through the gate and with its own approval."""

from __future__ import annotations

import json
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from approvals.models import ApprovalRequest, ApprovalStatus, Tool
from console.lib.errors import IllegalTransition, InvalidInput, NotFound, NotPermitted
from console.models import AgentPrincipal, Event
from ledger import services as ledger_services
from ledger.compensation import compensation_propose
from ledger.decisions import approval_approve
from ledger.dispatcher import run_dispatch
from ledger.models import Fact, Operation
from ledger.models import OperationStatus as S
from runs.models import Task, TaskStatus
from tests.factories import record_outcome
from tests.fixtures.support import make_operation

pytestmark = pytest.mark.django_db

CLARIFY = {"to": ["customer@example.com"], "subject": "About your refund",
           "body": "We refunded your order twice by mistake; the second refund is being reversed."}


def confirmed(agent, tool_name: str = "payments.refund", arguments: dict | None = None) -> Operation:
    operation = make_operation(agent, tool_name=tool_name, arguments=arguments)
    ledger_services.operation_confirm(operation_id=operation.operation_id, receipt={"remote_id": "re_1"},
                                      actor="system:reconciler", reason="found")
    operation.refresh_from_db()
    return operation


def test_a_confirmed_effect_is_compensated_by_a_new_linked_operation_awaiting_approval(agent, support_user):
    original = confirmed(agent, "mail.send")
    compensation, approval = compensation_propose(operation_id=original.operation_id, user=support_user,
                                                  tool_name="mail.send", arguments=CLARIFY, reason="double refund")
    assert compensation.operation_id != original.operation_id
    assert (compensation.compensates_id, compensation.status) == (original.operation_id, S.PLANNED)
    assert (approval.status, approval.operation_id, approval.risk_tier) == (
        ApprovalStatus.PENDING, compensation.operation_id, 2)
    assert "compensates " + original.operation_id in approval.escalation_reasons[0]
    original.refresh_from_db()
    assert original.status == S.CONFIRMED  # the ledger keeps what happened


def test_a_tool_that_would_run_at_once_still_needs_approval_as_a_compensation(agent, support_user):
    original = confirmed(agent)
    _, approval = compensation_propose(
        operation_id=original.operation_id, user=support_user, tool_name="payments.refund",
        arguments={"order_id": "ord-1001", "amount": 5, "currency": "EUR", "reason": "goodwill"}, reason="goodwill")
    assert approval.risk_tier == 2 and approval.approvals_needed == 1


def test_an_operation_in_doubt_moves_to_compensation_required_with_the_proposal(agent, support_user):
    original = make_operation(agent, status=S.UNKNOWN, tool_name="mail.send")
    compensation_propose(operation_id=original.operation_id, user=support_user, tool_name="mail.send",
                         arguments=CLARIFY, reason="may have been sent twice")
    original.refresh_from_db()
    assert original.status == S.COMPENSATION_REQUIRED
    assert original.compensations.count() == 1


def test_an_operation_without_an_effect_cannot_be_compensated(agent, support_user):
    original = make_operation(agent, status=S.PLANNED)
    with pytest.raises(IllegalTransition):
        compensation_propose(operation_id=original.operation_id, user=support_user, tool_name="mail.send",
                             arguments=CLARIFY, reason="r")
    assert not Operation.objects.filter(compensates=original).exists()


def test_bad_arguments_are_refused_and_nothing_is_written(agent, support_user):
    original = confirmed(agent, "mail.send")
    with pytest.raises(InvalidInput):
        compensation_propose(operation_id=original.operation_id, user=support_user, tool_name="mail.send",
                             arguments={"to": "not-a-list"}, reason="r")
    assert not Operation.objects.filter(compensates=original).exists()


def test_a_reviewer_may_not_and_another_tenant_cannot_see(agent, reviewer, outsider):
    original = confirmed(agent, "mail.send")
    with pytest.raises(NotPermitted):
        compensation_propose(operation_id=original.operation_id, user=reviewer, tool_name="mail.send",
                             arguments=CLARIFY, reason="r")
    with pytest.raises(NotFound):
        compensation_propose(operation_id=original.operation_id, user=outsider, tool_name="mail.send",
                             arguments=CLARIFY, reason="r")


def test_an_approved_compensation_runs_even_when_its_task_is_finished(agent, support_user, senior, payments):
    original = confirmed(agent, arguments={"order_id": "ord-comp-1", "amount": 25, "currency": "EUR",
                                           "reason": "damaged"})
    Task.objects.filter(pk=original.task_id).update(status=TaskStatus.SUCCEEDED)
    compensation, approval = compensation_propose(
        operation_id=original.operation_id, user=support_user, tool_name="payments.refund",
        arguments={"order_id": "ord-comp-1", "amount": 5, "currency": "EUR", "reason": "goodwill"},
        reason="goodwill")
    approval_approve(approval_id=approval.approval_id, reviewer=senior)
    assert run_dispatch(compensation.operation_id, worker="test") == S.CONFIRMED
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.CONSUMED


def test_the_detail_page_proposes_and_lists_compensations(client, agent, support_user):
    original = confirmed(agent, "mail.send")
    client.force_login(support_user)
    url = reverse("operations:compensate", args=[original.operation_id])
    response = client.post(url, {"compensate-tool": "mail.send", "compensate-arguments": json.dumps(CLARIFY),
                                 "compensate-reason": "double refund"})
    assert response.status_code == 302
    compensation = Operation.objects.get(compensates=original)
    page = client.get(reverse("operations:detail", args=[original.operation_id])).content.decode()
    assert compensation.operation_id in page and 'id="compensate-form"' in page


# ------------------------------------------------------------------ the same business object


def refund(amount: float | int, order_id: str = "ord-1001", currency: str = "EUR") -> dict:
    return {"order_id": order_id, "amount": amount, "currency": currency, "reason": "refunded twice"}


def test_a_refunds_compensation_for_an_unrelated_order_is_refused(agent, support_user):
    original = confirmed(agent)  # 25 EUR on ord-1001
    with pytest.raises(InvalidInput, match="order_id") as caught:
        compensation_propose(operation_id=original.operation_id, user=support_user, tool_name="payments.refund",
                             arguments=refund(199, order_id="ord-unrelated"), reason="goodwill")
    assert caught.value.details["field"] == "arguments.order_id"
    assert not Operation.objects.filter(compensates=original).exists()


@pytest.mark.parametrize(("arguments", "field"), [
    (refund(26), "amount"), (refund(20, currency="USD"), "currency")])
def test_a_refunds_compensation_keeps_the_currency_and_never_exceeds_the_amount(agent, support_user, arguments,
                                                                                field):
    original = confirmed(agent)
    with pytest.raises(InvalidInput, match=field):
        compensation_propose(operation_id=original.operation_id, user=support_user, tool_name="payments.refund",
                             arguments=arguments, reason="r")
    assert not Operation.objects.filter(compensates=original).exists()


def test_a_tool_the_rule_does_not_name_cannot_compensate(agent, support_user):
    original = confirmed(agent)
    with pytest.raises(InvalidInput, match="mail.send"):
        compensation_propose(operation_id=original.operation_id, user=support_user, tool_name="mail.send",
                             arguments=CLARIFY, reason="r")


def test_a_mails_compensation_goes_to_the_same_recipients(agent, support_user):
    original = confirmed(agent, "mail.send")
    with pytest.raises(InvalidInput, match="to"):
        compensation_propose(operation_id=original.operation_id, user=support_user, tool_name="mail.send",
                             arguments={**CLARIFY, "to": ["someone-else@example.com"]}, reason="r")


def test_the_rule_is_configured_on_the_tool_in_the_admin(admin_client, policy):
    tool = Tool.objects.get(name="payments.refund")
    assert tool.compensation_rule["payments.refund"]["order_id"] == "same"
    tool.compensation_rule = {"payments.refund": {"order_id": "whatever"}}
    with pytest.raises(ValidationError, match="compensation_rule"):
        tool.full_clean()
    page = admin_client.get(reverse("admin:approvals_tool_change", args=[tool.pk])).content.decode()
    assert 'name="compensation_rule"' in page


def test_a_deactivated_agents_effect_is_compensated_by_a_support_person(agent, support_user, reviewer, payments):
    original = confirmed(agent)
    AgentPrincipal.objects.filter(pk=agent.pk).update(is_active=False)
    compensation, approval = compensation_propose(
        operation_id=original.operation_id, user=support_user, tool_name="payments.refund", arguments=refund(20),
        reason="refunded twice")
    assert approval.proposed_by == support_user
    approval_approve(approval_id=approval.approval_id, reviewer=reviewer)
    assert run_dispatch(compensation.operation_id, worker="test") == S.CONFIRMED


# ------------------------------------------------------------------ leaving compensation_required


def in_doubt_refund(agent) -> Operation:
    return make_operation(agent, status=S.UNKNOWN, arguments={"order_id": f"ord-doubt-{uuid.uuid4().hex[:8]}",
                                                              "amount": 40, "currency": "EUR", "reason": "r"})


def test_a_confirmed_compensation_ends_its_originals_compensation_required(agent, support_user, reviewer, payments):
    original = in_doubt_refund(agent)
    compensation, approval = compensation_propose(
        operation_id=original.operation_id, user=support_user, tool_name="payments.refund",
        arguments={**original.arguments, "amount": 40}, reason="may have been refunded twice")
    assert Operation.objects.get(pk=original.pk).status == S.COMPENSATION_REQUIRED
    approval_approve(approval_id=approval.approval_id, reviewer=reviewer)
    assert run_dispatch(compensation.operation_id, worker="test") == S.CONFIRMED
    original.refresh_from_db()
    assert original.status == S.COMPENSATED
    event = Event.objects.filter(entity="operation", entity_id=original.operation_id).order_by("-id")[0]
    assert (event.from_status, event.to_status) == (S.COMPENSATION_REQUIRED, S.COMPENSATED)
    assert event.evidence["compensation"] == compensation.operation_id


def test_a_failed_compensation_leaves_the_original_waiting(agent, support_user, reviewer):
    original = in_doubt_refund(agent)
    compensation, approval = compensation_propose(
        operation_id=original.operation_id, user=support_user, tool_name="payments.refund",
        arguments=original.arguments, reason="r")
    approval_approve(approval_id=approval.approval_id, reviewer=reviewer)
    ledger_services.operation_dispatch(operation_id=compensation.operation_id, worker="w1")
    record_outcome(compensation, fact=Fact.KNOWN_FAILURE, error_class="validation")
    assert Operation.objects.get(pk=original.pk).status == S.COMPENSATION_REQUIRED
