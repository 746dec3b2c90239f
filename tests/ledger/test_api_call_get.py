"""GET /api/v1/calls/{call_id}?wait=SECONDS: the async long-poll.

The view reads the database from pool threads, so these tests commit (transaction=True) and
change the ledger from a thread of their own, started by a signal from the view — no sleeps."""

from __future__ import annotations

import asyncio
import threading
from urllib.parse import quote

import httpx
import pytest
from django.core.asgi import get_asgi_application
from django.db import connection
from django.test import AsyncClient

from ledger import api as ledger_api
from ledger import longpoll
from ledger import services as ledger_services
from ledger.models import Operation
from tests.conftest import AGENT_TOKEN, OUTSIDER_TOKEN
from tests.fixtures.api import assert_error, call_body, refund, start_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}


def get(path: str, *, headers: dict[str, str] | None = None, **params):
    async def run():
        return await AsyncClient().get(path, params, headers=AUTH if headers is None else headers)

    return asyncio.run(run())


@pytest.fixture
def proposed(api, running_task) -> dict:
    response = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task), format="json")
    assert response.status_code == 201
    return response.json()


@pytest.fixture
def poll_started(monkeypatch) -> threading.Event:
    """Set once the view has read the status it will compare against."""
    started = threading.Event()
    real = ledger_api.call_status

    def spy(*args, **kwargs):
        status = real(*args, **kwargs)
        started.set()
        return status

    monkeypatch.setattr(ledger_api, "call_status", spy)
    return started


def dispatch_when(started: threading.Event, operation_id: str) -> threading.Thread:
    """From another thread: once the request has started, move the operation on."""
    def run():
        try:
            if started.wait(timeout=20):
                ledger_services.operation_dispatch(operation_id=operation_id, worker="test-worker")
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_it_answers_at_once_with_wait_zero(proposed, waits):
    response = get("/api/v1/calls/call-1", wait=0)
    assert waits == []
    assert response.status_code == 200
    body = response.json()
    assert (body["call_id"], body["operation_id"], body["status"]) == ("call-1", proposed["operation_id"], "authorized")
    assert (body["decision"]["outcome"], body["attempts"], body["approval"]) == ("dispatched", [], None)


def test_it_answers_when_the_status_changes(proposed, poll_started, waits):
    changer = dispatch_when(poll_started, proposed["operation_id"])
    response = get("/api/v1/calls/call-1", wait=20)
    changer.join(timeout=20)
    assert waits == [(20.0, "dispatched")]  # the change ended the wait, not its 20 s
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "dispatched"
    assert [a["number"] for a in body["attempts"]] == [1]


def test_a_waiting_poll_wakes_on_the_committed_event_not_on_a_timer(proposed, poll_started, monkeypatch, waits):
    """The fallback poll is pushed past the wait: the wait can only end with the new status if
    the commit woke the poll (else it runs out, and the answer reads the status then) — through
    Redis's doorbell, or, with an in-memory layer that reaches no other thread or process,
    through the event table's tail."""
    monkeypatch.setattr(longpoll, "FALLBACK_POLL_SECONDS", 3600)
    changer = dispatch_when(poll_started, proposed["operation_id"])
    response = get("/api/v1/calls/call-1", wait=30)
    changer.join(timeout=30)
    assert response.json()["status"] == "dispatched"
    assert waits == [(30.0, "dispatched")], "the commit did not wake the poll"


def test_it_times_out_with_the_unchanged_status(proposed, waits):
    response = get("/api/v1/calls/call-1", wait=0.3)
    assert waits == [(0.3, None)]
    assert response.status_code == 200
    assert response.json()["status"] == "authorized"
    assert Operation.objects.get().status == "authorized"


def test_a_regenerated_call_id_reads_the_same_operation(api, running_task, proposed):
    api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task, call_id="call-2"), format="json")
    body = get("/api/v1/calls/call-2").json()
    assert (body["call_id"], body["operation_id"]) == ("call-2", proposed["operation_id"])
    assert body["call_ids"] == ["call-1", "call-2"]


def test_task_id_picks_the_call_when_two_tasks_use_one_call_id(api, agent, running_task, proposed):
    other = start_task(agent, owner="worker-2")
    newer = api.post(f"/api/v1/tasks/{other.task_id}/calls", call_body(other, arguments=refund(40)),
                     format="json").json()
    assert get("/api/v1/calls/call-1", task_id=other.task_id).json()["operation_id"] == newer["operation_id"]
    older = get("/api/v1/calls/call-1", task_id=running_task.task_id).json()
    assert older["operation_id"] == proposed["operation_id"]


def test_it_shows_a_pending_approval(api, running_task):
    api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task, arguments=refund(120)),
             format="json")
    body = get("/api/v1/calls/call-1", wait=0).json()
    assert (body["status"], body["decision"]["outcome"]) == ("planned", "awaiting_approval")
    assert body["approval"]["pending"] is True and body["approval"]["call_id"] == "call-1"


@pytest.mark.parametrize("wait", ["soon", "-1", "nan", "inf"])
def test_a_bad_wait_is_400(proposed, wait):
    error = assert_error(get("/api/v1/calls/call-1", wait=wait), 400, "invalid")
    assert "wait" in error["details"]["fields"]


def test_another_tenants_call_is_404(proposed, outsider_agent):
    assert_error(get("/api/v1/calls/call-1", headers={"Authorization": f"Bearer {OUTSIDER_TOKEN}"}),
                 404, "not_found")


def test_an_unknown_call_is_404(agent):
    assert_error(get("/api/v1/calls/call-nope"), 404, "not_found")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}])
def test_it_needs_a_valid_token(proposed, headers):
    response = get("/api/v1/calls/call-1", headers=headers)
    assert_error(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"] == "Bearer"


def test_other_methods_are_405(proposed):
    async def run():
        return await AsyncClient().post("/api/v1/calls/call-1", {}, headers=AUTH)

    assert_error(asyncio.run(run()), 405, "method_not_allowed")


def test_a_waiting_poll_does_not_hold_up_other_requests(proposed, running_task, poll_started):
    """Through the real ASGI handler: while one client waits, another is served."""
    application = get_asgi_application()

    async def scenario():
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", headers=AUTH) as client:
            waiting = asyncio.create_task(client.get("/api/v1/calls/call-1", params={"wait": 20}))
            assert await asyncio.to_thread(poll_started.wait, 20)
            other = await client.get(f"/api/v1/tasks/{running_task.task_id}")
            assert not waiting.done()
            changer = dispatch_when(poll_started, proposed["operation_id"])
            answered = await waiting
            await asyncio.to_thread(changer.join, 20)
            return other, answered

    other, answered = asyncio.run(scenario())
    assert other.status_code == 200 and other.json()["task_id"] == running_task.task_id
    assert answered.status_code == 200 and answered.json()["status"] == "dispatched"


@pytest.mark.parametrize("call_id", ["toolu/01A", "call 7?x=1#frag", "a%2Fb", "ünïcode/ключ", "/lead"])
def test_call_ids_with_any_printable_character_are_read_back_url_encoded(asgi_server, running_task, call_id):
    """Through uvicorn, as agents reach it: the test client's own URL decoding is not the point."""
    with httpx.Client(base_url=asgi_server.url, headers=AUTH, timeout=30) as client:
        posted = client.post(f"/api/v1/tasks/{running_task.task_id}/calls", json=call_body(running_task, call_id=call_id))
        assert posted.status_code == 201, posted.content
        assert posted.json()["call_id"] == call_id
        read = client.get(f"/api/v1/calls/{quote(call_id, safe='')}", params={"task_id": running_task.task_id})
    assert read.status_code == 200, read.content
    assert (read.json()["call_id"], read.json()["operation_id"]) == (call_id, posted.json()["operation_id"])


@pytest.mark.parametrize("call_id", ["tab\there", "new\nline", "nul\x00"])
def test_call_ids_with_control_characters_are_400(api, running_task, call_id):
    response = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task, call_id=call_id),
                        format="json")
    assert_error(response, 400, "invalid")


def test_leading_and_trailing_spaces_are_part_of_the_call_id(api, running_task):
    posted = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task, call_id=" c1 "),
                      format="json")
    assert posted.json()["call_id"] == " c1 "


def test_trap_a_call_id_in_two_tasks_without_task_id_is_409_naming_them(api, agent, running_task, proposed):
    other = start_task(agent, owner="worker-2")
    api.post(f"/api/v1/tasks/{other.task_id}/calls", call_body(other, arguments=refund(40)), format="json")
    error = assert_error(get("/api/v1/calls/call-1"), 409, "conflict")
    assert sorted(error["details"]["task_ids"]) == sorted([running_task.task_id, other.task_id])
