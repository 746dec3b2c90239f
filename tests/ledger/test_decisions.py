"""ledger.decisions: a decision on an approval moves its operation in the same transaction —
approve authorizes it, reject rejects it, expire and invalidate close it if it has not left — and
a lease takeover puts the previous holder's in-flight operations in doubt. The rules of the
approval request itself (who may decide, when, how many approvals) are tested in
tests/approvals/test_services.py; edit and approve in test_decisions_edit.py."""

from __future__ import annotations

import pytest
from django.db import transaction

from approvals import services
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from console.lib.errors import Conflict, IllegalTransition, NotFound
from ledger import decisions
from ledger.decisions import lease_acquire
from ledger.models import Operation, OperationStatus
from tests.approvals.test_services import Boom, counts, op_status, status_of
from tests.factories import (
    concurrent_writer,
    event_count,
    events_of,
    make_approval_request,
    make_operation,
    make_task,
)

A = ApprovalStatus
S = OperationStatus


@pytest.fixture
def l3(agent) -> ApprovalRequest:
    """An L3 refund waiting for one approval."""
    return make_approval_request(make_operation(agent, arguments={
        "order_id": "ord-7", "amount": 120, "currency": "EUR", "reason": "damaged"}), risk_tier=3)


# --- approval_approve -----------------------------------------------------------------------------


def test_one_approval_approves_the_request_and_authorizes_the_operation(l3, reviewer, django_capture_on_commit_callbacks):
    approval_events, operation_events = counts(l3)

    with django_capture_on_commit_callbacks() as callbacks:
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer, reason="looks right")

    stored = ApprovalRequest.objects.get(pk=l3.pk)
    assert stored.status == A.APPROVED
    assert stored.decided_at is not None
    assert op_status(l3) == S.AUTHORIZED
    [decision] = stored.decisions.all()
    assert (decision.reviewer, decision.verdict, decision.reason) == (reviewer, "approve", "looks right")
    assert decision.arguments_hash == l3.arguments_hash
    assert counts(l3) == (approval_events + 1, operation_events + 1)
    approved = events_of("approval", l3.approval_id)[-1]
    assert (approved.from_status, approved.to_status, approved.actor) == (A.PENDING, A.APPROVED, "user:reviewer")
    authorized = events_of("operation", l3.operation_id)[-1]
    assert (authorized.from_status, authorized.to_status) == (S.PLANNED, S.AUTHORIZED)
    assert authorized.evidence == {"approval_id": l3.approval_id}
    assert len(callbacks) == 1  # the dispatch, on commit


def test_approve_rolls_back_the_decision_when_the_operation_moved_on(l3, reviewer):
    # The operation was cancelled meanwhile: authorizing it is illegal, so nothing is recorded.
    Operation.objects.filter(pk=l3.operation_id).update(status=S.CANCELLED)
    before = counts(l3)

    with pytest.raises(IllegalTransition):
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)

    assert status_of(l3) == A.PENDING
    assert not ApprovalDecision.objects.filter(request=l3).exists()
    assert counts(l3) == before


def test_a_rolled_back_approval_leaves_neither_decision_status_nor_events(l3, reviewer):
    before = counts(l3)

    with pytest.raises(Boom), transaction.atomic():
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)
        raise Boom

    assert status_of(l3) == A.PENDING
    assert op_status(l3) == S.PLANNED
    assert not ApprovalDecision.objects.filter(request=l3).exists()
    assert counts(l3) == before


# --- approval_reject ------------------------------------------------------------------------------


def test_reject_rejects_the_request_and_the_operation_with_one_event_each(l3, reviewer):
    approval_events, operation_events = counts(l3)

    decisions.approval_reject(approval_id=l3.approval_id, reviewer=reviewer, reason="amount is wrong")

    stored = ApprovalRequest.objects.get(pk=l3.pk)
    assert stored.status == A.REJECTED
    assert stored.decided_at is not None
    assert op_status(l3) == S.REJECTED
    [decision] = stored.decisions.all()
    assert (decision.verdict, decision.reason) == ("reject", "amount is wrong")
    assert counts(l3) == (approval_events + 1, operation_events + 1)
    assert events_of("approval", l3.approval_id)[-1].reason == "amount is wrong"
    assert events_of("operation", l3.operation_id)[-1].to_status == S.REJECTED


def test_a_rolled_back_rejection_leaves_neither_decision_status_nor_events(l3, reviewer):
    before = counts(l3)

    with pytest.raises(Boom), transaction.atomic():
        decisions.approval_reject(approval_id=l3.approval_id, reviewer=reviewer, reason="no")
        raise Boom

    assert status_of(l3) == A.PENDING
    assert op_status(l3) == S.PLANNED
    assert not ApprovalDecision.objects.filter(request=l3).exists()
    assert counts(l3) == before


# --- approval_expire, approval_invalidate ---------------------------------------------------------


CLOSERS = {
    "approval_expire": (A.EXPIRED, S.EXPIRED, lambda apr_id: decisions.approval_expire(approval_id=apr_id)),
    "approval_invalidate": (A.INVALIDATED, S.CANCELLED, lambda apr_id: decisions.approval_invalidate(
        approval_id=apr_id, actor="system:dispatcher", reason="task version changed")),
}


@pytest.mark.parametrize("verb", list(CLOSERS))
def test_closing_a_pending_request_closes_its_planned_operation(l3, verb):
    target, op_target, call = CLOSERS[verb]
    approval_events, operation_events = counts(l3)

    call(l3.approval_id)

    assert status_of(l3) == target
    assert op_status(l3) == op_target
    assert counts(l3) == (approval_events + 1, operation_events + 1)
    event = events_of("approval", l3.approval_id)[-1]
    assert (event.from_status, event.to_status) == (A.PENDING, target)


@pytest.mark.parametrize("verb", list(CLOSERS))
def test_closing_an_approved_request_closes_its_authorized_operation(l3, reviewer, verb):
    target, op_target, call = CLOSERS[verb]
    decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)
    before = counts(l3)

    call(l3.approval_id)

    assert status_of(l3) == target
    assert op_status(l3) == op_target
    assert counts(l3) == (before[0] + 1, before[1] + 1)


@pytest.mark.parametrize("verb", list(CLOSERS))
def test_closing_a_request_leaves_an_operation_that_already_left_authorized_alone(l3, reviewer, verb):
    from ledger import services as ledger_services

    target, _, call = CLOSERS[verb]
    decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)
    ledger_services.operation_dispatch(operation_id=l3.operation_id, worker="w1")
    operation_events = event_count("operation", l3.operation_id)

    call(l3.approval_id)

    assert status_of(l3) == target
    assert op_status(l3) == S.DISPATCHED
    assert event_count("operation", l3.operation_id) == operation_events


@pytest.mark.parametrize("verb", list(CLOSERS))
def test_closing_an_already_closed_request_is_a_no_op_without_an_event(l3, verb):
    _, _, call = CLOSERS[verb]
    call(l3.approval_id)
    before = counts(l3)

    call(l3.approval_id)

    assert counts(l3) == before


@pytest.mark.parametrize("verb", list(CLOSERS))
@pytest.mark.parametrize("closed", [A.REJECTED, A.CONSUMED])
def test_closing_a_finished_request_raises_illegal_transition(l3, reviewer, verb, closed):
    _, _, call = CLOSERS[verb]
    if closed == A.REJECTED:
        decisions.approval_reject(approval_id=l3.approval_id, reviewer=reviewer, reason="no")
    else:
        decisions.approval_approve(approval_id=l3.approval_id, reviewer=reviewer)
        services.approval_consume(approval_id=l3.approval_id, actor="worker:w1")
    before = counts(l3)
    operation_status = op_status(l3)

    with pytest.raises(IllegalTransition):
        call(l3.approval_id)

    assert status_of(l3) == closed
    assert op_status(l3) == operation_status
    assert counts(l3) == before


@pytest.mark.parametrize("verb", list(CLOSERS))
def test_closing_raises_conflict_when_another_writer_moved_the_request_first(l3, verb, monkeypatch):
    _, _, call = CLOSERS[verb]
    concurrent_writer(monkeypatch, services, status=A.APPROVED)
    before = counts(l3)

    with pytest.raises(Conflict) as excinfo:
        call(l3.approval_id)

    assert not isinstance(excinfo.value, IllegalTransition)
    assert status_of(l3) == A.PENDING
    assert op_status(l3) == S.PLANNED
    assert counts(l3) == before


@pytest.mark.parametrize("verb", list(CLOSERS))
def test_a_rolled_back_close_leaves_neither_status_nor_events(l3, verb):
    _, _, call = CLOSERS[verb]
    before = counts(l3)

    with pytest.raises(Boom), transaction.atomic():
        call(l3.approval_id)
        raise Boom

    assert status_of(l3) == A.PENDING
    assert op_status(l3) == S.PLANNED
    assert counts(l3) == before


@pytest.mark.parametrize("verb", [*CLOSERS, "approval_consume"])
def test_closing_an_unknown_request_raises_not_found(db, verb):
    call = (lambda apr_id: services.approval_consume(approval_id=apr_id, actor="worker:w1")) \
        if verb == "approval_consume" else CLOSERS[verb][2]
    with pytest.raises(NotFound):
        call("apr_nope")


# --- lease_acquire: a takeover --------------------------------------------------------------------


def test_a_takeover_puts_the_previous_holders_in_flight_operations_in_doubt(agent):
    from datetime import timedelta

    from django.utils import timezone

    task = make_task(agent)
    lease_acquire(task_id=task.task_id, owner="old", ttl_seconds=1)
    in_flight = make_operation(agent, task=task, status=S.DISPATCHED)
    done = make_operation(agent, task=task, status=S.CONFIRMED)
    lease = lease_acquire(task_id=task.task_id, owner="new", ttl_seconds=60, now=timezone.now() + timedelta(seconds=5))
    assert lease.fencing_token == 2
    assert Operation.objects.get(pk=in_flight.pk).status == S.UNKNOWN
    assert Operation.objects.get(pk=done.pk).status == S.CONFIRMED
