"""The client's other endings, each reached for real on a running server: nobody decides in
time (the sweeper expires the approval: Expired), a person cancels the task while its call waits
(Cancelled, with the reason), and the provider commits but the reply is lost and nothing can be
learned about it (reconciliation gives up: `manual`, OutcomeUnknown). The client waits through
`unknown` (being reconciled) and stops only at `manual`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from countersign import Cancelled, Client, Expired, OutcomeUnknown

from approvals.models import ApprovalRequest
from ledger.control import task_cancel
from ledger.models import Operation
from ledger.sweeper import run_sweep
from sandbox import client as sandbox
from tests.clients.conftest import pending_approval
from tests.conftest import AGENT_TOKEN
from tests.stack import FullStack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

CONTRACT = {"task_type": "refund", "goal": "Refund the broken kettle", "inputs": {"order_id": "ord-42"}}


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    # Beat runs the sweeper, which hands due reconciliations to the worker; reconciliation gives
    # up after 5 s instead of 45, so `manual` comes within the test.
    stack = FullStack(env={"RECONCILE_WINDOW_SECONDS": "5"}, beat=True).start()
    yield stack
    stack.stop()


@pytest.fixture
def client(stack, agent):
    with Client(stack.url, AGENT_TOKEN) as client:
        yield client


def refund(order_id: str, amount: float) -> dict:
    return {"order_id": order_id, "amount": amount, "currency": "EUR", "reason": "broken"}


def held_call(client, key: str, order_id: str):
    """A task whose 80 EUR refund waits for a reviewer, `task.call` waiting on it in a thread."""
    task = client.start_task(key=key, **CONTRACT)
    pool = ThreadPoolExecutor(1)
    waiting = pool.submit(task.call, "payments.refund", refund(order_id, 80), step_id=f"refund-{order_id}")
    return task, waiting, pending_approval(task.call_id("payments.refund", f"refund-{order_id}")), pool


def test_an_approval_nobody_decides_in_time_raises_expired(client):
    task, waiting, approval, pool = held_call(client, "thread-expire", "ord-e1")
    assert not waiting.done()

    assert run_sweep(now=approval.expires_at + timedelta(seconds=1))["expired"] == 1
    with pytest.raises(Expired) as expired:
        waiting.result(timeout=120)
    pool.shutdown()

    assert expired.value.operation_id == approval.operation_id
    assert expired.value.answer["decision"]["outcome"] == "expired"
    assert Operation.objects.get(pk=approval.operation_id).status == "expired"
    task.close()


def test_a_task_cancelled_by_a_person_while_its_call_waits_raises_cancelled(client, support_user):
    task, waiting, approval, pool = held_call(client, "thread-cancel", "ord-c1")

    task_cancel(task_id=task.task_id, user=support_user, reason="customer withdrew the claim")
    with pytest.raises(Cancelled) as cancelled:
        waiting.result(timeout=120)
    pool.shutdown()

    assert "customer withdrew the claim" in cancelled.value.reason
    assert Operation.objects.get(pk=approval.operation_id).status == "cancelled"
    assert ApprovalRequest.objects.get(pk=approval.pk).status != "pending"
    task.close()


def test_an_effect_nobody_can_confirm_raises_outcome_unknown_once_it_is_manual(stack, client):
    task = client.start_task(key="thread-opaque", **CONTRACT)

    with pytest.raises(OutcomeUnknown) as unknown:
        task.call("payments.refund", refund("fault-opaque-c1", 30), step_id="refund-opaque")

    operation = Operation.objects.get(pk=unknown.value.operation_id)
    assert unknown.value.status == "manual" and operation.status == "manual"
    # The provider did commit it, once: the outcome was unknown, not a failure.
    assert len(sandbox.effects(stack.payments.base_url, key=operation.idempotency_key)) == 1
    task.close()
