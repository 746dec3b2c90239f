"""ledger.sweeper.run_sweep: the ledger, not the broker, keeps operations moving (step 9)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from ledger import decisions, dispatcher
from ledger.dispatcher import run_dispatch
from ledger.models import Fact, Operation, OperationStatus
from ledger.reconcile import run_reconcile
from ledger.sweeper import run_sweep
from tests.factories import make_approval_request, make_operation
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


class WorkerLost(BaseException):
    """The worker process died between committing `dispatched` and calling the provider."""


def dispatch_and_lose_the_worker(operation: Operation, monkeypatch) -> Operation:
    real_call = dispatcher._call_provider

    def die(op, attempt, let_go=None):
        raise WorkerLost

    monkeypatch.setattr(dispatcher, "_call_provider", die)
    with pytest.raises(WorkerLost):
        run_dispatch(operation.operation_id, worker="doomed")
    monkeypatch.setattr(dispatcher, "_call_provider", real_call)
    return reload(operation)


def test_a_dispatched_operation_past_its_deadline_becomes_unknown(agent, tools, unique, monkeypatch):
    operation = dispatch_and_lose_the_worker(authorized_refund(agent, unique("ord")), monkeypatch)
    assert operation.status == S.DISPATCHED
    deadline = operation.dispatch_deadline
    assert deadline is not None

    assert run_sweep(now=deadline - timedelta(milliseconds=1))["unknown"] == 0
    assert reload(operation).status == S.DISPATCHED

    assert run_sweep(now=deadline + timedelta(milliseconds=1))["unknown"] == 1

    operation = reload(operation)
    assert operation.status == S.UNKNOWN
    assert operation.next_reconcile_at is not None
    assert status_story(operation)[-2:] == [S.DISPATCHED, S.UNKNOWN]
    [attempt] = attempts_of(operation)
    assert attempt.finished_at is None and attempt.fact == ""


def test_a_lost_worker_is_recovered_with_exactly_one_effect(agent, tools, payments_url, unique, monkeypatch, enqueued):
    operation = dispatch_and_lose_the_worker(authorized_refund(agent, unique("ord")), monkeypatch)
    later = operation.dispatch_deadline + timedelta(seconds=1)

    counts = run_sweep(now=later)
    assert (counts["unknown"], counts["reconcile"]) == (1, 1)
    assert enqueued.reconciles == [operation.operation_id]
    # The provider never saw the request, and the old worker is gone past the horizon.
    assert run_reconcile(operation.operation_id, worker="test", now=later) == S.RETRY_SAFE
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED

    operation = reload(operation)
    assert (operation.attempt_count, operation.fencing_token) == (2, 2)
    assert len(effects_of(payments_url, operation)) == 1


def test_it_leaves_a_dispatch_within_its_deadline_alone(agent, tools, unique, monkeypatch):
    operation = dispatch_and_lose_the_worker(authorized_refund(agent, unique("ord")), monkeypatch)

    counts = run_sweep(now=timezone.now())

    assert counts["unknown"] == 0
    assert reload(operation).status == S.DISPATCHED


def test_an_authorized_operation_nobody_dispatched_is_enqueued_again(agent, tools, payments_url, unique,
                                                                     settings, enqueued):
    operation = authorized_refund(agent, unique("ord"))
    enqueued.clear()

    assert run_sweep(now=timezone.now())["redispatched"] == 0
    assert enqueued.dispatches == []

    counts = run_sweep(now=timezone.now() + timedelta(seconds=settings.REDISPATCH_AFTER_SECONDS + 1))

    assert counts["redispatched"] == 1
    assert enqueued.dispatches == [(operation.operation_id, {"queue": "fast", "countdown": None})]
    # The re-sent message does what the lost one would have done.
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, operation)) == 1


def test_an_authorized_operation_is_pushed_again_only_when_its_redispatch_is_due(agent, tools, unique, settings,
                                                                                 enqueued):
    operation = authorized_refund(agent, unique("ord"))
    enqueued.clear()
    first = timezone.now() + timedelta(seconds=settings.REDISPATCH_AFTER_SECONDS + 1)

    assert run_sweep(now=first)["redispatched"] == 1
    # The next sweeps (every SWEEP_SECONDS) leave it alone while that message may still arrive.
    assert run_sweep(now=first)["redispatched"] == 0
    assert run_sweep(now=first + timedelta(seconds=settings.REDISPATCH_AFTER_SECONDS - 1))["redispatched"] == 0
    assert enqueued.dispatched_ids() == [operation.operation_id]
    # Still not dispatched once the slot has passed: that message was lost too, push again.
    assert run_sweep(now=first + timedelta(seconds=settings.REDISPATCH_AFTER_SECONDS))["redispatched"] == 1
    assert enqueued.dispatched_ids() == [operation.operation_id] * 2


def test_a_deferred_dispatch_is_not_pushed_again_by_the_sweeper_meanwhile(agent, tools, payments_url, unique,
                                                                          settings, enqueued):
    order = unique("fault-timeout-after-commit")
    in_doubt = make_operation(agent, "payments.refund", status=S.UNKNOWN, arguments=refund_arguments(order))
    waiting = authorized_refund(agent, order, amount=10)
    enqueued.clear()

    assert run_dispatch(waiting.operation_id, worker="test") == "deferred:business_key_busy"
    assert enqueued.dispatched_ids() == [waiting.operation_id]  # the dispatcher's own retry, in 0.5 s
    later = timezone.now() + timedelta(seconds=settings.REDISPATCH_AFTER_SECONDS)

    assert run_sweep(now=later)["redispatched"] == 0
    assert run_sweep(now=later + timedelta(seconds=1))["redispatched"] == 1
    assert reload(in_doubt).status == S.UNKNOWN


def test_a_retry_in_backoff_is_not_enqueued_before_its_time(agent, tools, unique, settings, enqueued):
    operation = authorized_refund(agent, unique("fault-429"))
    assert run_dispatch(operation.operation_id, worker="test") == S.RETRY_SAFE
    operation = reload(operation)
    Operation.objects.filter(pk=operation.pk).update(
        not_before=timezone.now() + timedelta(seconds=3600)
    )
    enqueued.clear()
    stale = timezone.now() + timedelta(seconds=settings.REDISPATCH_AFTER_SECONDS + 1)

    assert run_sweep(now=stale)["redispatched"] == 0
    assert run_sweep(now=stale + timedelta(seconds=3600))["redispatched"] == 1
    assert enqueued.dispatched_ids() == [operation.operation_id]


def test_a_pending_approval_past_its_expiry_expires_with_its_operation(agent, tools):
    operation = make_operation(agent, "payments.refund", status=S.PLANNED, risk_tier=3)
    approval = make_approval_request(operation, ttl_seconds=60)

    assert run_sweep(now=approval.expires_at - timedelta(seconds=1))["expired"] == 0
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING

    assert run_sweep(now=approval.expires_at + timedelta(seconds=1))["expired"] == 1

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.EXPIRED
    assert reload(operation).status == S.EXPIRED
    assert status_story(operation) == [S.PLANNED, S.EXPIRED]


def test_an_approved_but_undispatched_approval_past_its_expiry_expires_the_operation(agent, tools, reviewer):

    operation = make_operation(agent, "payments.refund", status=S.PLANNED, risk_tier=3)
    approval = make_approval_request(operation, ttl_seconds=60)
    decisions.approval_approve(approval_id=approval.approval_id, reviewer=reviewer)

    assert run_sweep(now=approval.expires_at + timedelta(seconds=1))["expired"] == 1

    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.EXPIRED
    assert reload(operation).status == S.EXPIRED
    assert run_dispatch(operation.operation_id, worker="test") == "noop:expired"


def test_a_due_reconcile_is_enqueued_once_not_on_every_sweep(agent, tools, enqueued):
    operation = make_operation(agent, "payments.refund", status=S.UNKNOWN)
    assert operation.next_reconcile_at is not None
    now = timezone.now() + timedelta(seconds=1)

    first = run_sweep(now=now)
    second = run_sweep(now=now)

    assert (first["reconcile"], second["reconcile"]) == (1, 0)
    assert enqueued.reconciles == [operation.operation_id]
    operation = reload(operation)
    assert operation.next_reconcile_at > now
    # Once the claimed slot passes (the reconcile message was lost), it is enqueued again.
    assert run_sweep(now=operation.next_reconcile_at + timedelta(milliseconds=1))["reconcile"] == 1
    assert enqueued.reconciles == [operation.operation_id] * 2


def test_a_reconcile_scheduled_for_later_is_not_enqueued_early(agent, tools, enqueued):
    operation = make_operation(agent, "payments.refund", status=S.UNKNOWN)
    Operation.objects.filter(pk=operation.pk).update(next_reconcile_at=timezone.now() + timedelta(seconds=30))

    assert run_sweep(now=timezone.now())["reconcile"] == 0
    assert enqueued.reconciles == []


def test_a_sweep_with_nothing_to_do_changes_nothing(agent, tools):
    confirmed = make_operation(agent, "payments.refund", status=S.CONFIRMED)
    story = status_story(confirmed)

    counts = run_sweep(now=timezone.now() + timedelta(days=1))

    assert counts == {"redispatched": 0, "unknown": 0, "reconcile": 0, "expired": 0, "verify": 0}
    assert status_story(confirmed) == story
    assert attempts_of(confirmed)[0].fact == Fact.KNOWN_SUCCESS
