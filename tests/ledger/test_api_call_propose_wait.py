"""POST /api/v1/tasks/{id}/calls?wait=SECONDS: the proposal of a call the gate runs at once is
answered when the call is final (or when the wait runs out), so an agent that proposes and
waits sends one request, not a proposal and a poll. A call held for people is answered at once.

The view waits on the event loop, reading the database from pool threads, so these tests commit
(transaction=True) and move the ledger from a thread of their own, once the proposal committed.
They wait for a worker (dispatch in the request off): the request's own dispatch is
test_request_dispatch.py's."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application
from django.db import connection, connections
from django.test import AsyncClient

from ledger import api as ledger_api
from ledger import services as ledger_services
from ledger.models import Fact, Operation
from tests.conftest import AGENT_TOKEN
from tests.fixtures.api import assert_error, call_body, refund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}


def post(path: str, body: dict, *, headers: dict[str, str] | None = None):
    async def run():
        try:
            return await AsyncClient().post(path, json.dumps(body), content_type="application/json",
                                            headers=AUTH if headers is None else headers)
        finally:
            # The test client runs the view's sync part in asgiref's one shared thread (a server
            # gives each request a thread of its own, whose connection Django closes): close it
            # there, or the test database could not be dropped.
            await sync_to_async(connections.close_all)()

    return asyncio.run(run())


@pytest.fixture(autouse=True)
def dispatched_by_workers(settings):
    settings.DISPATCH_IN_REQUEST = False


@pytest.fixture
def proposed_signal(monkeypatch) -> threading.Event:
    """Set once the proposal has committed (the view is about to wait)."""
    committed = threading.Event()
    real = ledger_api.call_propose

    def spy(**kwargs):
        proposal = real(**kwargs)
        committed.set()
        return proposal

    monkeypatch.setattr(ledger_api, "call_propose", spy)
    return committed


def confirm_when(committed: threading.Event, result: dict) -> threading.Thread:
    """From another thread, once the proposal committed: run the operation to `confirmed`, as a
    worker would (claim, then the provider's answer)."""
    return dispatch_when(committed, lambda operation_id, attempt: ledger_services.operation_record_outcome(
        operation_id=operation_id, attempt_number=attempt.number, fencing_token=attempt.fencing_token,
        fact=Fact.KNOWN_SUCCESS, receipt={"id": "re_1"}, result=result))


def dispatch_when(committed: threading.Event, then) -> threading.Thread:
    """From another thread, once the proposal committed: claim the operation as a worker would,
    then `then(operation_id, attempt)`."""
    def run():
        try:
            if committed.wait(timeout=20):
                operation = Operation.objects.get()
                _, attempt = ledger_services.operation_dispatch(operation_id=operation.operation_id,
                                                                worker="test-worker")
                then(operation.operation_id, attempt)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_call_the_gate_runs_at_once_is_answered_final_in_the_proposals_answer(running_task, proposed_signal):
    worker = confirm_when(proposed_signal, {"refund_id": "re_1"})
    response = post(f"/api/v1/tasks/{running_task.task_id}/calls?wait=20", call_body(running_task))
    worker.join(timeout=20)

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["status"], body["final"], body["result"]) == ("confirmed", True, {"refund_id": "re_1"})
    assert body["decision"]["outcome"] == "dispatched" and body["call_id"] == "call-1"
    # The proposal's shape, every field of it, as without a wait.
    assert set(body) == set(ledger_api.CallProposeApi.OutputSerializer().fields)


def test_a_call_held_for_approval_is_answered_at_once(running_task, waits):
    response = post(f"/api/v1/tasks/{running_task.task_id}/calls?wait=20",
                    call_body(running_task, arguments=refund(250)))

    assert waits == []  # not the 20 s asked for: people decide, not the worker
    assert response.status_code == 201
    body = response.json()
    assert (body["status"], body["final"], body["decision"]["outcome"]) == ("planned", False, "awaiting_approval")


def test_when_the_wait_runs_out_it_answers_with_the_status_then(running_task, waits):
    response = post(f"/api/v1/tasks/{running_task.task_id}/calls?wait=0.3", call_body(running_task))

    assert waits == [(0.3, None)]  # it waited, and the wait ran out
    assert response.status_code == 201
    assert (response.json()["status"], response.json()["final"]) == ("authorized", False)


def test_a_repeat_of_a_final_call_is_answered_at_once_with_200(running_task, proposed_signal, waits):
    worker = confirm_when(proposed_signal, {"refund_id": "re_1"})
    first = post(f"/api/v1/tasks/{running_task.task_id}/calls?wait=20", call_body(running_task))
    worker.join(timeout=20)
    again = post(f"/api/v1/tasks/{running_task.task_id}/calls?wait=20", call_body(running_task))

    assert waits == [(20.0, "confirmed")]  # the first waited until confirmed; the repeat not at all
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()


@pytest.mark.parametrize("wait", ["-1", "soon", "nan", "inf"])
def test_a_bad_wait_is_400_and_proposes_nothing(running_task, wait):
    error = assert_error(post(f"/api/v1/tasks/{running_task.task_id}/calls?wait={wait}", call_body(running_task)),
                         400, "invalid")
    assert "wait" in error["details"]["fields"]
    assert not Operation.objects.exists()


def test_the_token_is_checked_before_the_wait(running_task):
    assert_error(post(f"/api/v1/tasks/{running_task.task_id}/calls?wait=soon", call_body(running_task),
                      headers={}), 401, "unauthenticated")


def test_a_waiting_proposal_does_not_hold_up_other_requests(running_task, proposed_signal):
    """Through the real ASGI handler: while one proposal waits, another request is served."""
    application = get_asgi_application()
    body = call_body(running_task)

    async def scenario():
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", headers=AUTH) as client:
            waiting = asyncio.create_task(client.post(f"/api/v1/tasks/{running_task.task_id}/calls",
                                                      params={"wait": 20}, json=body))
            assert await asyncio.to_thread(proposed_signal.wait, 20)
            other = await client.get(f"/api/v1/tasks/{running_task.task_id}")
            assert not waiting.done()
            worker = confirm_when(proposed_signal, {"refund_id": "re_1"})
            answered = await waiting
            await asyncio.to_thread(worker.join, 20)
            return other, answered

    other, answered = asyncio.run(scenario())
    assert other.status_code == 200 and other.json()["task_id"] == running_task.task_id
    assert answered.status_code == 201 and answered.json()["status"] == "confirmed"


def test_a_waiting_proposal_holds_no_database_connection_while_it_waits(running_task, monkeypatch):
    """The server's connections are a pool of a few: proposals that each held theirs while they
    waited would leave none for the reads that answer them (16 agents: 30 s, the pool's timeout)."""
    if connection.settings_dict.get("CONN_MAX_AGE"):
        pytest.skip("connections kept per thread (embedded SQLite), not a pool's")
    held = []
    real_watch = ledger_api.Doorbell.watch

    async def watch(self, *args, **kwargs):
        # In the request's thread, where the proposal ran: is its connection still open?
        held.append(await sync_to_async(lambda: connection.connection is not None)())
        return await real_watch(self, *args, **kwargs)

    monkeypatch.setattr(ledger_api.Doorbell, "watch", watch)
    response = post(f"/api/v1/tasks/{running_task.task_id}/calls?wait=0.2", call_body(running_task))

    assert response.status_code == 201
    assert held == [False]


def test_a_call_that_ends_waiting_for_a_person_is_answered_then(running_task, proposed_signal, waits):
    """dispatched → unknown (the reply was lost) → manual (nobody can tell): not final, but only a
    person moves it on, perhaps hours later. The proposal answers then, not at the wait's end."""
    def lost_then_manual(operation_id, attempt):
        ledger_services.operation_record_outcome(operation_id=operation_id, attempt_number=attempt.number,
                                                 fencing_token=attempt.fencing_token, fact=Fact.UNKNOWN,
                                                 error_class="timeout")
        ledger_services.operation_escalate_manual(operation_id=operation_id, actor="system:reconciler",
                                                  reason="provider could not tell")

    worker = dispatch_when(proposed_signal, lost_then_manual)
    response = post(f"/api/v1/tasks/{running_task.task_id}/calls?wait=30", call_body(running_task))
    worker.join(timeout=30)

    assert waits == [(30.0, "manual")]  # ended by `manual`, not by the 30 s asked for
    assert (response.json()["status"], response.json()["final"]) == ("manual", False)
