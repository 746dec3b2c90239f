"""approvals.services: approval requests and the rules of deciding them (who may decide, when, how
many approvals are needed), reached through ledger.decisions as the views reach them. The
operation moves those decisions cause are tested in tests/ledger/test_decisions.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from approvals import services
from approvals.models import APPROVAL_TRANSITIONS, ApprovalDecision, ApprovalRequest, ApprovalStatus
from console.lib.errors import Conflict, IllegalTransition, InvalidInput, NotFound, NotPermitted
from console.models import Event
from ledger import decisions
from ledger.models import Operation, OperationStatus
from tests.conftest import make_user
from tests.factories import (
    concurrent_writer,
    event_count,
    events_of,
    make_approval_request,
    make_operation,
)

A = ApprovalStatus
S = OperationStatus


class Boom(Exception):
    pass


def status_of(request: ApprovalRequest) -> str:
    return ApprovalRequest.objects.values_list("status", flat=True).get(pk=request.pk)


def op_status(request: ApprovalRequest) -> str:
    return Operation.objects.values_list("status", flat=True).get(pk=request.operation_id)


def counts(request: ApprovalRequest) -> tuple[int, int]:
    return event_count("approval", request.approval_id), event_count("operation", request.operation_id)


@pytest.fixture
def l3(agent) -> ApprovalRequest:
    """An L3 refund waiting for one approval."""
    return make_approval_request(make_operation(agent, arguments={
        "order_id": "ord-7", "amount": 120, "currency": "EUR", "reason": "damaged"}), risk_tier=3)


@pytest.fixture
def l4(agent) -> ApprovalRequest:
    """An L4 refund waiting for two distinct approvers."""
    return make_approval_request(make_operation(agent, arguments={
        "order_id": "ord-8", "amount": 500, "currency": "EUR", "reason": "damaged"}),
        risk_tier=4, approvals_needed=2)


def expire_clock(request: ApprovalRequest) -> None:
    """Time passes: the request's expiry is now behind us (no status change yet)."""
    ApprovalRequest.objects.filter(pk=request.pk).update(expires_at=timezone.now() - timedelta(seconds=1))


# --- approval_request_create -------------------------------------------------------------------


def test_request_create_binds_the_call_hash_version_and_expiry_with_one_event(agent):
    operation = make_operation(agent)
    before = timezone.now()

    request = services.approval_request_create(
        operation=operation, task_type=operation.task.task_type, call_id=operation.call_id, state_version=3, risk_tier=3,
        approvals_needed=1, ttl_seconds=600, reasons=["amount > 50"], actor="system:gate",
    )

    stored = ApprovalRequest.objects.get(pk=request.pk)
    assert stored.status == A.PENDING
    assert stored.call_id == operation.call_id
    assert stored.operation_id == operation.operation_id
    assert stored.task_id == operation.task_id
    assert stored.tenant_id == operation.tenant_id
    assert stored.arguments_hash == operation.arguments_hash
    assert stored.tool_schema_version == operation.tool_schema_version
    assert stored.requested_by_id == operation.principal_id
    assert (stored.state_version, stored.risk_tier, stored.approvals_needed) == (3, 3, 1)
    assert stored.escalation_reasons == ["amount > 50"]
    assert before + timedelta(seconds=600) <= stored.expires_at <= timezone.now() + timedelta(seconds=600)
    [event] = events_of("approval", request.approval_id)
    assert (event.from_status, event.to_status, event.actor) == ("", A.PENDING, "system:gate")
    assert event.evidence["operation_id"] == operation.operation_id
    assert event.evidence["arguments_hash"] == operation.arguments_hash
    assert Operation.objects.get(pk=operation.pk).status == S.PLANNED


def test_a_rolled_back_request_create_leaves_neither_request_nor_event(agent):
    operation = make_operation(agent)

    with pytest.raises(Boom), transaction.atomic():
        request = make_approval_request(operation)
        raise Boom

    assert not ApprovalRequest.objects.filter(pk=request.pk).exists()
    assert event_count("approval", request.approval_id) == 0


# --- approval_approve --------------------------------------------------------------------------


def test_two_approvals_from_distinct_reviewers_are_needed_at_l4(l4, senior, senior2):
    decisions.approval_approve(approval_id=l4.approval_id, reviewer=senior, reason="first")

    assert status_of(l4) == A.PENDING
    assert op_status(l4) == S.PLANNED
    interim = events_of("approval", l4.approval_id)[-1]
    assert (interim.kind, interim.from_status, interim.to_status) == (Event.Kind.APPROVAL_GIVEN, "", A.PENDING)
    assert "approval 1 of 2" in interim.reason
    operation_events = event_count("operation", l4.operation_id)

    decisions.approval_approve(approval_id=l4.approval_id, reviewer=senior2, reason="second")

    assert status_of(l4) == A.APPROVED
    assert op_status(l4) == S.AUTHORIZED
    assert set(ApprovalDecision.objects.filter(request=l4).values_list("reviewer__username", flat=True)) == {
        "senior", "senior2"}
    assert event_count("operation", l4.operation_id) == operation_events + 1


def test_the_same_reviewer_cannot_give_both_approvals(l4, senior):
    decisions.approval_approve(approval_id=l4.approval_id, reviewer=senior)
    before = counts(l4)

    with pytest.raises(Conflict):
        decisions.approval_approve(approval_id=l4.approval_id, reviewer=senior)

    assert status_of(l4) == A.PENDING
    assert op_status(l4) == S.PLANNED
    assert ApprovalDecision.objects.filter(request=l4).count() == 1
    assert counts(l4) == before


def test_a_reviewer_cannot_approve_above_their_max_tier(l4, reviewer):
    before = counts(l4)

    with pytest.raises(NotPermitted):
        decisions.approval_approve(approval_id=l4.approval_id, reviewer=reviewer)

    assert status_of(l4) == A.PENDING
    assert not ApprovalDecision.objects.filter(request=l4).exists()
    assert counts(l4) == before


def test_a_reviewer_of_another_tenant_cannot_approve(l3, outsider):
    before = counts(l3)

    with pytest.raises(NotPermitted):
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=outsider)

    assert status_of(l3) == A.PENDING
    assert op_status(l3) == S.PLANNED
    assert counts(l3) == before


def test_support_staff_without_the_reviewer_role_cannot_approve(l3, support_user):
    with pytest.raises(NotPermitted):
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=support_user)
    assert status_of(l3) == A.PENDING


def test_an_inactive_reviewer_cannot_approve(l3, tenant):
    former = make_user("former", tenant, "reviewer", max_tier=4, is_active=False)

    with pytest.raises(NotPermitted):
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=former)
    assert status_of(l3) == A.PENDING


def test_an_expired_request_cannot_be_approved(l3, reviewer):
    expire_clock(l3)
    before = counts(l3)

    with pytest.raises(Conflict):
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)

    assert status_of(l3) == A.PENDING
    assert op_status(l3) == S.PLANNED
    assert not ApprovalDecision.objects.filter(request=l3).exists()
    assert counts(l3) == before


def test_it_refuses_an_approval_of_arguments_the_reviewer_did_not_see(l3, reviewer):
    with pytest.raises(Conflict):
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer, arguments_hash="0" * 64)

    assert status_of(l3) == A.PENDING
    assert not ApprovalDecision.objects.filter(request=l3).exists()


def test_it_accepts_an_approval_of_the_arguments_the_reviewer_saw(l3, reviewer):
    decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer, arguments_hash=l3.arguments_hash)
    assert status_of(l3) == A.APPROVED


@pytest.mark.parametrize("closed", [A.APPROVED, A.REJECTED])
def test_a_decided_request_cannot_be_approved_again(l3, reviewer, senior, closed):
    if closed == A.APPROVED:
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)
    else:
        decisions.approval_reject(approval_id=l3.approval_id, reviewer=reviewer, reason="no")
    before = counts(l3)

    with pytest.raises(Conflict):
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=senior)

    assert status_of(l3) == closed
    assert ApprovalDecision.objects.filter(request=l3).count() == 1
    assert counts(l3) == before


def test_an_unknown_request_cannot_be_approved(db, reviewer):
    with pytest.raises(NotFound):
        decisions.approval_approve(approval_id="apr_nope", reviewer=reviewer)


def test_approve_raises_conflict_when_another_writer_closed_the_request_first(l3, reviewer, monkeypatch):
    concurrent_writer(monkeypatch, services, status=A.EXPIRED)
    before = counts(l3)

    with pytest.raises(Conflict) as excinfo:
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)

    assert not isinstance(excinfo.value, IllegalTransition)
    assert status_of(l3) == A.PENDING
    assert op_status(l3) == S.PLANNED
    assert not ApprovalDecision.objects.filter(request=l3).exists()
    assert counts(l3) == before


# --- approval_reject ---------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["", "   "])
def test_reject_needs_a_reason(l3, reviewer, reason):
    before = counts(l3)

    with pytest.raises(InvalidInput):
        decisions.approval_reject(approval_id=l3.approval_id, reviewer=reviewer, reason=reason)

    assert status_of(l3) == A.PENDING
    assert counts(l3) == before


def test_one_rejection_ends_a_two_approval_request(l4, senior, senior2):
    decisions.approval_approve(approval_id=l4.approval_id, reviewer=senior)

    decisions.approval_reject(approval_id=l4.approval_id, reviewer=senior2, reason="not this one")

    assert status_of(l4) == A.REJECTED
    assert op_status(l4) == S.REJECTED


def test_a_reviewer_who_already_approved_cannot_also_reject(l4, senior):
    decisions.approval_approve(approval_id=l4.approval_id, reviewer=senior)
    before = counts(l4)

    with pytest.raises(Conflict):
        decisions.approval_reject(approval_id=l4.approval_id, reviewer=senior, reason="changed my mind")

    assert status_of(l4) == A.PENDING
    assert counts(l4) == before


def test_reject_is_refused_above_the_reviewers_tier_and_in_another_tenant(l4, reviewer, outsider):
    for person in (reviewer, outsider):
        with pytest.raises(NotPermitted):
            decisions.approval_reject(approval_id=l4.approval_id, reviewer=person, reason="no")
    assert status_of(l4) == A.PENDING
    assert op_status(l4) == S.PLANNED


def test_an_expired_request_cannot_be_rejected(l3, reviewer):
    expire_clock(l3)

    with pytest.raises(Conflict):
        decisions.approval_reject(approval_id=l3.approval_id, reviewer=reviewer, reason="no")
    assert status_of(l3) == A.PENDING


def test_reject_raises_conflict_when_another_writer_closed_the_request_first(l3, reviewer, monkeypatch):
    concurrent_writer(monkeypatch, services, status=A.APPROVED)
    before = counts(l3)

    with pytest.raises(Conflict):
        decisions.approval_reject(approval_id=l3.approval_id, reviewer=reviewer, reason="no")

    assert status_of(l3) == A.PENDING
    assert not ApprovalDecision.objects.filter(request=l3).exists()
    assert counts(l3) == before


# --- approval_consume --------------------------------------------------------------------------


def test_consume_uses_up_an_approved_request_with_one_event(l3, reviewer):
    decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)
    approval_events, operation_events = counts(l3)

    services.approval_consume(approval_id=l3.approval_id, actor="worker:w1")

    assert status_of(l3) == A.CONSUMED
    assert counts(l3) == (approval_events + 1, operation_events)
    event = events_of("approval", l3.approval_id)[-1]
    assert (event.from_status, event.to_status, event.actor) == (A.APPROVED, A.CONSUMED, "worker:w1")


def test_a_consumed_request_cannot_authorize_anything_again(l3, reviewer, senior):
    decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)
    services.approval_consume(approval_id=l3.approval_id, actor="worker:w1")

    with pytest.raises(Conflict):
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=senior)
    assert status_of(l3) == A.CONSUMED


def test_consuming_twice_is_a_no_op_without_an_event(l3, reviewer):
    decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)
    services.approval_consume(approval_id=l3.approval_id, actor="worker:w1")
    before = counts(l3)

    services.approval_consume(approval_id=l3.approval_id, actor="worker:w1")

    assert counts(l3) == before


@pytest.mark.parametrize("source", [A.PENDING, A.REJECTED, A.EXPIRED, A.INVALIDATED])
def test_only_an_approved_request_can_be_consumed(l3, reviewer, source):
    assert A.CONSUMED not in APPROVAL_TRANSITIONS[source]
    if source == A.REJECTED:
        decisions.approval_reject(approval_id=l3.approval_id, reviewer=reviewer, reason="no")
    elif source == A.EXPIRED:
        decisions.approval_expire(approval_id=l3.approval_id)
    elif source == A.INVALIDATED:
        decisions.approval_invalidate(approval_id=l3.approval_id, actor="system", reason="moved on")
    before = counts(l3)

    with pytest.raises(IllegalTransition):
        services.approval_consume(approval_id=l3.approval_id, actor="worker:w1")

    assert status_of(l3) == source
    assert counts(l3) == before


def test_consume_raises_conflict_when_another_writer_invalidated_it_first(l3, reviewer, monkeypatch):
    decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)
    concurrent_writer(monkeypatch, services, status=A.INVALIDATED)
    before = counts(l3)

    with pytest.raises(Conflict) as excinfo:
        services.approval_consume(approval_id=l3.approval_id, actor="worker:w1")

    assert not isinstance(excinfo.value, IllegalTransition)
    assert status_of(l3) == A.APPROVED
    assert counts(l3) == before


def test_a_rolled_back_consume_leaves_neither_status_nor_event(l3, reviewer):
    decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)
    before = counts(l3)

    with pytest.raises(Boom), transaction.atomic():
        services.approval_consume(approval_id=l3.approval_id, actor="worker:w1")
        raise Boom

    assert status_of(l3) == A.APPROVED
    assert counts(l3) == before
