"""A database error in the agent API's plain Django views (the long-poll, the proposal that
waits, OTLP ingest) is answered as the DRF views answer it (console.api.exception_handler):
503 `unavailable` with Retry-After, in the one error shape. The pages for people are not."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError, connections
from django.test import AsyncClient

from console import views
from console.middleware import asgi_handler
from ledger import api as ledger_api
from ledger.models import Operation
from runs import otlp
from runs.models import Span
from tests.conftest import AGENT_TOKEN
from tests.console.asgi_driver import call
from tests.fixtures.api import assert_error, call_body

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}


def send(method: str, path: str, *args, **kwargs):
    async def run():
        try:
            return await getattr(AsyncClient(), method)(path, *args, headers=AUTH, **kwargs)
        finally:
            # The test client runs a view's sync part in asgiref's one shared thread: close its
            # connection there, or the test database could not be dropped.
            await sync_to_async(connections.close_all)()

    return asyncio.run(run())


def database_gone(*args, **kwargs):
    raise OperationalError("the connection was lost")


def assert_unavailable(response) -> None:
    assert_error(response, 503, "unavailable")
    assert response["Retry-After"] == "1"
    assert response["Content-Type"] == "application/json"


def test_a_poll_whose_read_fails_on_the_database_is_a_503(agent, monkeypatch):
    monkeypatch.setattr(ledger_api, "call_for_principal", database_gone)

    assert_unavailable(send("get", "/api/v1/calls/call-1"))


def test_a_waiting_poll_whose_read_fails_on_the_database_is_a_503(agent, monkeypatch):
    monkeypatch.setattr(ledger_api, "call_for_principal", database_gone)

    assert_unavailable(send("get", "/api/v1/calls/call-1", {"wait": "20", "until": "final"}))


def test_the_web_servers_own_handler_answers_it_too(agent, monkeypatch):
    monkeypatch.setattr(ledger_api, "call_for_principal", database_gone)

    answer = asyncio.run(call(asgi_handler(), "/api/v1/calls/call-1",
                              headers=[(b"authorization", f"Bearer {AGENT_TOKEN}".encode())]))

    assert answer.status == 503
    assert {(name.lower(), value) for name, value in answer.headers} >= {(b"retry-after", b"1")}
    assert json.loads(answer.body)["error"]["code"] == "unavailable"


def test_a_proposal_whose_answer_fails_on_the_database_after_the_wait_is_a_503(
        running_task, monkeypatch, settings):
    settings.DISPATCH_IN_REQUEST = False  # a worker's call: the proposal waits for it

    async def the_wait_ran_out(self, *args, **kwargs):
        return None

    monkeypatch.setattr(ledger_api.Doorbell, "watch", the_wait_ran_out)
    monkeypatch.setattr(ledger_api, "_as_now", database_gone)

    def propose(query: str = ""):
        return send("post", f"/api/v1/tasks/{running_task.task_id}/calls{query}",
                    json.dumps(call_body(running_task)), content_type="application/json")

    assert_unavailable(propose("?wait=20"))
    # The proposal had committed: the same request sent again is answered from the ledger.
    monkeypatch.undo()
    again = propose()
    assert again.status_code == 200, again.content
    assert again.json()["operation_id"] == Operation.objects.get().operation_id


def test_an_otlp_export_that_fails_on_the_database_is_a_503(client, agent, monkeypatch):
    monkeypatch.setattr(otlp, "spans_within_quota", database_gone)
    span = {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "051581bf3cb55c13", "name": "chat",
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000250000000"}
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}

    response = client.post("/v1/traces", json.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")

    assert_unavailable(response)
    assert not Span.objects.exists()


class DatabaseGone:
    cursor = staticmethod(database_gone)


def test_a_page_for_people_still_fails_as_a_server_error(client, monkeypatch):
    monkeypatch.setattr(views, "connection", DatabaseGone())

    with pytest.raises(OperationalError):  # the test client re-raises what would be a 500
        client.get("/healthz")
