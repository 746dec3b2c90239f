"""ledger.reconcile.run_reconcile: unknown outcomes settled by asking the real provider (step 8)."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from approvals.models import Tool
from console.models import Event
from ledger.adapters import get_adapter
from ledger.adapters.base import ABSENT
from ledger.dispatcher import run_dispatch
from ledger.models import Fact, Operation, OperationStatus
from ledger.reconcile import run_reconcile
from sandbox.client import wait_for
from tests.factories import make_operation
from tests.fixtures.dispatch import (
    HANG_SECONDS,
    attempts_of,
    authorized_mail,
    authorized_refund,
    effects_of,
    reload,
    status_story,
)

S = OperationStatus
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sandbox_settings", "enqueued")]


def unknown_refund(agent, order_id: str) -> Operation:
    operation = authorized_refund(agent, order_id)
    assert run_dispatch(operation.operation_id, worker="test") == S.UNKNOWN
    return reload(operation)


def last_event(operation: Operation) -> Event:
    return Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id).order_by("-id")[0]


def later(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


@pytest.mark.parametrize("fault", ["fault-timeout-after-commit", "fault-lost-reply", "fault-5xx-after-commit"])
def test_an_effect_the_provider_committed_is_confirmed_by_query(agent, tools, payments_url, unique, fault):
    operation = unknown_refund(agent, unique(fault))

    assert run_reconcile(operation.operation_id, worker="test") == S.CONFIRMED

    operation = reload(operation)
    [effect] = effects_of(payments_url, operation)
    assert operation.status == S.CONFIRMED
    assert operation.receipt["remote_id"] == effect["payload"]["id"]
    assert operation.receipt["via"] == "query"
    assert operation.next_reconcile_at is None
    event = last_event(operation)
    assert (event.from_status, event.to_status, event.actor) == (S.UNKNOWN, S.CONFIRMED, "system:reconciler")
    assert event.evidence["query"] == "found"
    # Confirmed without a second request: still one attempt, one effect.
    assert len(attempts_of(operation)) == 1


def test_a_provider_crash_after_commit_is_confirmed_once_it_is_back(agent, tools, payments_url, unique):
    from sandbox.client import wait_healthy

    operation = unknown_refund(agent, unique("fault-crash"))
    wait_healthy(payments_url)

    assert run_reconcile(operation.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, operation)) == 1


def test_nothing_committed_waits_for_the_horizon_then_is_retried_once(agent, tools, payments_url, unique, settings):
    # A long grace puts the horizon (when the old request has surely stopped) well ahead.
    settings.DISPATCH_GRACE_SECONDS = 10.0
    operation = unknown_refund(agent, unique("fault-timeout-before-commit"))
    [first] = attempts_of(operation)
    assert (first.fact, first.error_class) == (Fact.UNKNOWN, "timeout")
    # The later of: the dispatch deadline (claim + timeout + grace), the attempt's timeout + grace/2.
    horizon = max(operation.dispatch_deadline,
                  first.started_at + timedelta(seconds=operation.tool.timeout_seconds + 5.0))

    # The provider still holds the request: it may yet commit.
    assert run_reconcile(operation.operation_id, worker="test") in ("waiting:processing", "waiting:absent")

    adapter = get_adapter("payments.refund")
    wait_for(lambda: adapter.query(key=operation.idempotency_key, timeout=1.0).state == ABSENT,
             timeout=HANG_SECONDS + 5, what="the provider to drop the hung request")
    # Absent, but before the horizon an old request could still land: wait, do not retry.
    assert run_reconcile(operation.operation_id, worker="test") == "waiting:absent"
    operation = reload(operation)
    assert operation.status == S.UNKNOWN
    assert operation.next_reconcile_at == horizon
    assert operation.reconcile_attempts == 2

    assert run_reconcile(operation.operation_id, worker="test", now=horizon + timedelta(milliseconds=1)) == (
        S.RETRY_SAFE
    )
    operation = reload(operation)
    assert operation.status == S.RETRY_SAFE
    event = last_event(operation)
    assert event.evidence["query"] == "absent"
    assert event.evidence["old_request_stopped_by"] == horizon.isoformat()
    assert effects_of(payments_url, operation) == []

    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    operation = reload(operation)
    assert operation.attempt_count == 2
    assert len(effects_of(payments_url, operation)) == 1
    assert status_story(operation) == [S.PLANNED, S.AUTHORIZED, S.DISPATCHED, S.UNKNOWN, S.RETRY_SAFE,
                                       S.DISPATCHED, S.CONFIRMED]


@pytest.mark.django_db(transaction=True)
def test_declaring_retry_safe_enqueues_the_dispatch_on_commit(agent, tools, payments_url, unique, enqueued):
    operation = unknown_refund(agent, unique("fault-timeout-before-commit"))
    adapter = get_adapter("payments.refund")
    wait_for(lambda: adapter.query(key=operation.idempotency_key, timeout=1.0).state == ABSENT,
             timeout=HANG_SECONDS + 5, what="the provider to drop the hung request")
    enqueued.clear()

    assert run_reconcile(operation.operation_id, worker="test", now=later(60)) == S.RETRY_SAFE

    assert enqueued.dispatched_ids() == [operation.operation_id]


def test_an_opaque_provider_keeps_it_waiting_then_hands_it_to_a_person(agent, tools, payments_url, unique, settings):
    operation = unknown_refund(agent, unique("fault-opaque"))

    assert run_reconcile(operation.operation_id, worker="test") == "waiting:error"
    operation = reload(operation)
    assert operation.status == S.UNKNOWN
    assert operation.next_reconcile_at > timezone.now()
    assert run_reconcile(operation.operation_id, worker="test", now=later(5)) == "waiting:error"
    assert reload(operation).reconcile_attempts == 2

    window = settings.RECONCILE_WINDOW_SECONDS
    assert run_reconcile(operation.operation_id, worker="test", now=later(window + 1)) == S.MANUAL

    operation = reload(operation)
    assert operation.status == S.MANUAL
    assert operation.next_reconcile_at is None
    event = last_event(operation)
    assert event.to_status == S.MANUAL and "could not tell" in event.reason
    assert event.evidence["query"] == "error"
    # The provider did commit; only a person with other evidence may say so.
    assert len(effects_of(payments_url, operation)) == 1


def test_a_tool_without_idempotency_goes_to_a_person_at_once(agent, tools, payments_url, unique):
    Tool.objects.filter(name="payments.refund").update(idempotency=Tool.Idempotency.NONE)
    operation = unknown_refund(agent, unique("fault-lost-reply"))

    assert run_reconcile(operation.operation_id, worker="test") == S.MANUAL

    operation = reload(operation)
    assert operation.status == S.MANUAL
    assert "no blind retry" in last_event(operation).reason
    assert len(attempts_of(operation)) == 1
    assert len(effects_of(payments_url, operation)) == 1


def test_an_unknown_mail_is_confirmed_by_its_message_id(agent, tools, mail_url, unique):
    operation = authorized_mail(agent, f"{unique('fault-lost-reply')}@example.com")
    assert run_dispatch(operation.operation_id, worker="test") == S.UNKNOWN

    assert run_reconcile(operation.operation_id, worker="test") == S.CONFIRMED

    operation = reload(operation)
    assert operation.receipt["message_id"] == f"<{operation.idempotency_key}@countersign.local>"
    assert len(effects_of(mail_url, operation)) == 1


@pytest.mark.parametrize("status", [S.AUTHORIZED, S.DISPATCHED, S.CONFIRMED, S.RETRY_SAFE, S.MANUAL, S.FAILED])
def test_reconciling_an_operation_that_is_not_unknown_is_a_no_op(agent, tools, status):
    operation = make_operation(agent, "payments.refund", status=status)
    events_before = status_story(operation)

    assert run_reconcile(operation.operation_id, worker="test", now=later(3600)) == f"noop:{status}"

    assert reload(operation).status == status
    assert status_story(operation) == events_before


def test_reconciling_a_missing_operation_reports_it(db):
    assert run_reconcile("op_does_not_exist", worker="test") == "missing"


def test_a_reconcile_that_loses_the_race_to_support_staff_keeps_their_decision(
    agent, tools, payments_url, unique, monkeypatch
):
    from ledger import reconcile, services

    operation = unknown_refund(agent, unique("fault-lost-reply"))
    real_confirm = services.operation_confirm

    def support_was_faster(**kwargs):
        services.operation_require_compensation(operation_id=operation.operation_id, actor="user:support",
                                                reason="customer was refunded by hand")
        return real_confirm(**kwargs)

    monkeypatch.setattr(reconcile.services, "operation_confirm", support_was_faster)

    assert run_reconcile(operation.operation_id, worker="test") == "raced"
    assert reload(operation).status == S.COMPENSATION_REQUIRED


def test_an_unknown_read_is_simply_asked_again(agent, tools):
    operation = make_operation(agent, "orders.lookup", status=S.UNKNOWN)

    assert run_reconcile(operation.operation_id, worker="test") == S.RETRY_SAFE

    event = last_event(reload(operation))
    assert (event.to_status, event.evidence["read_only"]) == (S.RETRY_SAFE, True)


def test_a_reconcile_decided_on_an_earlier_attempt_does_not_land_on_a_later_one(agent, tools, payments_url, unique,
                                                                               monkeypatch):
    operation = unknown_refund(agent, unique("fault-timeout-before-commit-always"))
    stale_token = operation.fencing_token
    # Meanwhile the operation was retried and went unknown again under a newer token.
    Operation.objects.filter(pk=operation.pk).update(fencing_token=stale_token + 1)
    from ledger import services

    with pytest.raises(services.Conflict):
        services.operation_mark_retry_safe(operation_id=operation.operation_id, actor="system:reconciler",
                                           reason="absent", evidence={"query": "absent"},
                                           fencing_token=stale_token)
    assert reload(operation).status == S.UNKNOWN


def test_a_second_refund_for_an_order_in_doubt_waits(agent, tools, payments_url, unique):
    order = unique("fault-timeout-after-commit")
    in_doubt = unknown_refund(agent, order)
    second = authorized_refund(agent, order, amount=10)

    assert run_dispatch(second.operation_id, worker="test") == "deferred:business_key_busy"
    assert reload(second).status == S.AUTHORIZED
    assert reload(in_doubt).status == S.UNKNOWN


@pytest.mark.parametrize(("found", "differences"), [
    ({"amount": 30}, {"amount": {"intent": 25, "found": 30}}),
    ({"currency": "USD"}, {"currency": {"intent": "EUR", "found": "USD"}}),
    ({"order_id": "ord-other"}, {"order_id": {"intent": "ord-intent", "found": "ord-other"}}),
])
def test_a_found_effect_that_differs_from_the_intent_needs_compensation(agent, tools, payments_url, unique, found,
                                                                        differences):
    intent = {"order_id": "ord-intent", "amount": 25, "currency": "EUR", "reason": "damaged"}
    operation = make_operation(agent, status=S.UNKNOWN, arguments=intent)
    # The provider holds an effect under the operation's key, but not the one that was approved.
    response = httpx.post(f"{payments_url}/refunds", json={**intent, **found},
                          headers={"Idempotency-Key": operation.idempotency_key}, timeout=5)
    assert response.status_code == 201, response.text

    assert run_reconcile(operation.operation_id, worker="test") == S.COMPENSATION_REQUIRED

    operation = reload(operation)
    assert operation.status == S.COMPENSATION_REQUIRED
    event = last_event(operation)
    assert (event.from_status, event.to_status, event.actor) == (S.UNKNOWN, S.COMPENSATION_REQUIRED,
                                                                 "system:reconciler")
    assert event.evidence["differences"] == differences
    assert event.evidence["receipt"]["remote_id"] == response.json()["id"]
