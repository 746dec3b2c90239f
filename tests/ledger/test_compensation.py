"""Compensation is a new operation, linked, through the gate and with its own approval."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from approvals.models import ApprovalRequest, ApprovalStatus
from console.lib.errors import IllegalTransition, InvalidInput, NotFound, NotPermitted
from ledger import services as ledger_services
from ledger.compensation import compensation_propose
from ledger.decisions import approval_approve
from ledger.dispatcher import run_dispatch
from ledger.models import Operation
from ledger.models import OperationStatus as S
from runs.models import Task, TaskStatus
from tests.fixtures.support import make_operation

pytestmark = pytest.mark.django_db

CLARIFY = {"to": ["customer@example.com"], "subject": "About your refund",
           "body": "We refunded your order twice by mistake; the second refund is being reversed."}


def confirmed(agent) -> Operation:
    operation = make_operation(agent)
    ledger_services.operation_confirm(operation_id=operation.operation_id, receipt={"remote_id": "re_1"},
                                      actor="system:reconciler", reason="found")
    operation.refresh_from_db()
    return operation


def test_a_confirmed_effect_is_compensated_by_a_new_linked_operation_awaiting_approval(agent, support_user):
    original = confirmed(agent)
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
        arguments={"order_id": "ord-1", "amount": 5, "currency": "EUR", "reason": "goodwill"}, reason="goodwill")
    assert approval.risk_tier == 2 and approval.approvals_needed == 1


def test_an_operation_in_doubt_moves_to_compensation_required_with_the_proposal(agent, support_user):
    original = make_operation(agent, status=S.UNKNOWN)
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
    original = confirmed(agent)
    with pytest.raises(InvalidInput):
        compensation_propose(operation_id=original.operation_id, user=support_user, tool_name="mail.send",
                             arguments={"to": "not-a-list"}, reason="r")
    assert not Operation.objects.filter(compensates=original).exists()


def test_a_reviewer_may_not_and_another_tenant_cannot_see(agent, reviewer, outsider):
    original = confirmed(agent)
    with pytest.raises(NotPermitted):
        compensation_propose(operation_id=original.operation_id, user=reviewer, tool_name="mail.send",
                             arguments=CLARIFY, reason="r")
    with pytest.raises(NotFound):
        compensation_propose(operation_id=original.operation_id, user=outsider, tool_name="mail.send",
                             arguments=CLARIFY, reason="r")


def test_an_approved_compensation_runs_even_when_its_task_is_finished(agent, support_user, senior, payments):
    original = confirmed(agent)
    Task.objects.filter(pk=original.task_id).update(status=TaskStatus.SUCCEEDED)
    compensation, approval = compensation_propose(
        operation_id=original.operation_id, user=support_user, tool_name="payments.refund",
        arguments={"order_id": "ord-comp-1", "amount": 5, "currency": "EUR", "reason": "goodwill"},
        reason="goodwill")
    approval_approve(approval_id=approval.approval_id, reviewer=senior)
    assert run_dispatch(compensation.operation_id, worker="test") == S.CONFIRMED
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.CONSUMED


def test_the_detail_page_proposes_and_lists_compensations(client, agent, support_user):
    original = confirmed(agent)
    client.force_login(support_user)
    url = reverse("operations:compensate", args=[original.operation_id])
    response = client.post(url, {"compensate-tool": "mail.send", "compensate-arguments": json.dumps(CLARIFY),
                                 "compensate-reason": "double refund"})
    assert response.status_code == 302
    compensation = Operation.objects.get(compensates=original)
    page = client.get(reverse("operations:detail", args=[original.operation_id])).content.decode()
    assert compensation.operation_id in page and 'id="compensate-form"' in page
