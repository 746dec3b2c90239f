"""An HTTP tool defined only in the admin — no Python — from the admin's add form to the
provider: proposed by an agent over the API, dispatched by a real Celery worker against a real
server the test starts, with the operation's key and the credential in their headers and the
receipt and result picked per configuration; a timeout after the server committed, and a worker
killed in the middle of the call, both end confirmed by the configured status query with one
effect at the provider."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from approvals.models import Tool
from console.lib.procs import wait_until
from ledger.models import Operation, OperationStatus
from tests.factories import events_of
from tests.fixtures.ticketserver import TicketServer
from tests.fixtures.tools import (
    admin_form_data,
    confirmed,
    kill_worker_then_sweep_and_reconcile,
    ticket_tool_fields,
)
from tests.stack import FullStack, HttpAgent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

TOKEN = "tok-e2e-not-in-the-database"


@pytest.fixture
def tickets():
    server = TicketServer().start()
    yield server
    server.stop()


@pytest.fixture
def stack():
    stack = FullStack(env={"TICKETS_API_TOKEN": TOKEN}).start()
    yield stack
    stack.stop()


@pytest.fixture
def admin_defined_tool(client, tickets, agent) -> Tool:
    """`tickets.create`, typed into the admin's add form by an administrator."""
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    response = client.post("/admin/approvals/tool/add/",
                           admin_form_data(ticket_tool_fields(tickets.url, timeout_seconds=1.0)))
    assert response.status_code == 302, response.context["adminform"].form.errors
    tool = Tool.objects.get(name="tickets.create")
    agent.allowed_tools.add(tool)
    return tool


def open_ticket(api: HttpAgent, *, call_id: str, title: str) -> dict:
    task_id, version, token = api.running_task()
    proposal = api.post(f"/api/v1/tasks/{task_id}/calls", {
        "call_id": call_id, "step_id": "ticket", "tool": "tickets.create",
        "arguments": {"queue": "billing/eu", "priority": 2, "title": title, "body": "Customer asks for a refund."},
        "expected_version": version, "fencing_token": token})
    assert proposal["decision"]["outcome"] == "dispatched", proposal
    return {**proposal, "task_id": task_id}


def test_a_tool_defined_only_in_the_admin_runs_through_a_real_worker(stack, tickets, admin_defined_tool):
    api = HttpAgent(stack.url)
    proposal = open_ticket(api, call_id="call-ticket-1", title="Kettle broken")
    answer = confirmed(api, proposal)

    [request] = tickets.created()
    assert request.raw_path == "/queues/billing%2Feu/tickets" and request.query == {"priority": ["2"]}
    assert request.headers["Idempotency-Key"] == proposal["operation_id"]
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["X-Api-Version"] == "2024-06-01"
    assert request.body == {"title": "Kettle broken", "body": "Customer asks for a refund."}
    assert answer["receipt"] == {"provider": "tickets.create", "http_status": 201, "remote_id": "T-1", "queue": "billing/eu"}
    operation = Operation.objects.get(pk=proposal["operation_id"])
    assert operation.result == {"ticket.id": "T-1", "ticket.status": "open"}
    # The credential lived in the worker's environment only.
    assert TOKEN not in repr(Tool.objects.filter(pk=admin_defined_tool.pk).values().get())
    assert TOKEN not in repr(operation.attempts.values_list("raw_response", flat=True))


def test_a_timeout_after_the_server_committed_is_reconciled_by_the_status_query(stack, tickets, admin_defined_tool):
    api = HttpAgent(stack.url)
    proposal = open_ticket(api, call_id="call-ticket-hang", title="hang: the reply never comes")
    answer = confirmed(api, proposal)

    assert answer["receipt"]["via"] == "query" and answer["receipt"]["remote_id"] == "T-1"
    story = [e.to_status for e in events_of(Operation.EVENT_ENTITY, proposal["operation_id"])]
    assert story[-2:] == ["unknown", "confirmed"], story
    assert len(tickets.created()) == 1 and len(tickets.tickets) == 1


def test_a_worker_killed_during_the_call_ends_unknown_then_confirmed_with_one_effect(stack, tickets, admin_defined_tool,
                                                                                  monkeypatch):
    monkeypatch.setenv("TICKETS_API_TOKEN", TOKEN)  # this process sweeps and reconciles, as the worker would
    api = HttpAgent(stack.url)
    proposal = open_ticket(api, call_id="call-ticket-kill", title="hang: the worker dies meanwhile")
    operation_id = proposal["operation_id"]
    wait_until(lambda: len(tickets.created()) == 1, timeout=60, what="the worker's request at the server")
    # Mid-call: the server has committed, nobody will hear the reply.
    assert kill_worker_then_sweep_and_reconcile(stack, operation_id) == "confirmed"
    operation = Operation.objects.get(pk=operation_id)
    assert operation.status == OperationStatus.CONFIRMED and operation.receipt["via"] == "query"
    assert len(tickets.created()) == 1 and len(tickets.tickets) == 1
