"""The refund imported from the payments sandbox's own OpenAPI document, end to end: imported
from the real sandbox process's /openapi.json, proposed over the API, run by a real worker; a
`fault-timeout-after-commit` ends `unknown`, the reconciler asks the configured status query,
and the operation is confirmed with exactly one effect counted at the sandbox; so it is when the
worker is killed in the middle of the call."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from console.lib.procs import wait_until
from ledger.models import Operation
from sandbox.client import effects
from tests.factories import events_of
from tests.fixtures.tools import confirmed, kill_worker_then_sweep_and_reconcile
from tests.stack import FullStack, HttpAgent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture
def stack():
    stack = FullStack().start()
    yield stack
    stack.stop()


def refund(api: HttpAgent, *, order_id: str, amount: float) -> dict:
    task_id, version, token = api.running_task()
    proposal = api.post(f"/api/v1/tasks/{task_id}/calls", {
        "call_id": f"call-{order_id}", "step_id": "refund", "tool": "pay.createRefund",
        "arguments": {"order_id": order_id, "amount": amount, "currency": "EUR", "reason": "broken"},
        "expected_version": version, "fencing_token": token})
    assert proposal["decision"]["outcome"] == "dispatched", proposal
    return {**proposal, "task_id": task_id}


def test_the_imported_refund_runs_and_a_timeout_after_commit_is_reconciled_to_one_effect(stack, agent, tenant):
    # Tier 1, so the calls run at once; 2 s, shorter than the sandbox's 8 s hang.
    call_command("tools_import", "openapi", stack.payments.base_url + "/openapi.json", "--prefix", "pay",
                 "--enable", "--tier", "1", "--timeout", "2", stdout=StringIO())
    api = HttpAgent(stack.url)

    plain = refund(api, order_id="ord-imported-1", amount=12.5)
    answer = confirmed(api, plain)
    [effect] = effects(stack.payments.base_url, key=plain["operation_id"])  # the key went in Idempotency-Key
    assert answer["receipt"]["remote_id"] == effect["payload"]["id"]
    assert (answer["receipt"]["http_status"], answer["receipt"]["amount"]) == (201, 12.5)

    late = refund(api, order_id="fault-timeout-after-commit-imported", amount=30)
    answer = confirmed(api, late)
    story = [event.to_status for event in events_of(Operation.EVENT_ENTITY, late["operation_id"])]
    assert story[-2:] == ["unknown", "confirmed"], story
    assert answer["receipt"]["via"] == "query"
    [effect] = effects(stack.payments.base_url, key=late["operation_id"])
    assert answer["receipt"]["remote_id"] == effect["payload"]["id"]


def test_a_worker_killed_while_the_imported_refund_hangs_after_commit_leaves_one_effect(stack, agent, tenant):
    # The sandbox holds the request 8 s after committing and the worker gives up after 6 s; the
    # kill follows the commit within one poll, while the worker still waits for the reply.
    call_command("tools_import", "openapi", stack.payments.base_url + "/openapi.json", "--prefix", "pay",
                 "--enable", "--tier", "1", "--timeout", "6", stdout=StringIO())
    api = HttpAgent(stack.url)
    proposal = refund(api, order_id="fault-timeout-after-commit-killed", amount=40)
    operation_id = proposal["operation_id"]
    wait_until(lambda: effects(stack.payments.base_url, key=operation_id), timeout=60,
               what="the refund committed at the sandbox")
    assert kill_worker_then_sweep_and_reconcile(stack, operation_id) == "confirmed"
    [effect] = effects(stack.payments.base_url, key=operation_id)
    assert Operation.objects.get(pk=operation_id).receipt["remote_id"] == effect["payload"]["id"]
