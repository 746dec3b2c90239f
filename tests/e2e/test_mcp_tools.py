"""Tools of an MCP server, imported with `tools_import mcp` from a real MCP server (the SDK's own
server in a subprocess) and followed end to end through the API, the gate, a real Celery worker
and `tools/call`: the read runs at once; the write waits for its approval and then has exactly
one effect at the server; the write that hangs past its timeout ends `unknown` and goes to a
person (`manual`), with its one effect and no second call."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from console.lib.procs import wait_until
from ledger.decisions import approval_approve
from ledger.models import Operation, OperationStatus
from tests.factories import events_of
from tests.fixtures.mcp_upstream import McpToolsServer, dispatch_on_stack
from tests.stack import FullStack, HttpAgent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture
def notes():
    server = McpToolsServer().start()
    yield server
    server.stop()


@pytest.fixture
def stack():
    stack = FullStack().start()
    yield stack
    stack.stop()


@pytest.fixture
def imported(notes, agent) -> str:
    out = StringIO()
    call_command("tools_import", "mcp", notes.url, "--prefix", "notes", "--enable", "--timeout", "2", stdout=out)
    return out.getvalue()


def propose(api: HttpAgent, tool: str, arguments: dict, *, call_id: str) -> dict:
    task_id, version, token = api.running_task()
    proposal = api.post(f"/api/v1/tasks/{task_id}/calls", {
        "call_id": call_id, "step_id": call_id, "tool": tool, "arguments": arguments,
        "expected_version": version, "fencing_token": token})
    return {**proposal, "task_id": task_id}


def test_the_read_runs_at_once(stack, notes, imported):
    api = HttpAgent(stack.url)
    proposal = propose(api, "notes.lookup", {"order_id": "A-1"}, call_id="call-lookup")
    assert proposal["decision"]["outcome"] == "dispatched", proposal
    answer = api.final(proposal["call_id"], proposal["task_id"])
    assert answer["status"] == "confirmed", answer
    operation = Operation.objects.get(pk=proposal["operation_id"])
    assert operation.result == {"order_id": "A-1", "state": "shipped"}
    assert operation.receipt["mcp_tool"] == "lookup"
    assert notes.effects() == []


def test_the_write_waits_for_its_approval_then_has_exactly_one_effect(stack, notes, imported, reviewer):
    api = HttpAgent(stack.url)
    proposal = propose(api, "notes.create_note", {"text": "Refund approved"}, call_id="call-note")
    assert proposal["decision"]["outcome"] != "dispatched" and proposal["approval_id"], proposal
    assert proposal["risk_tier"] == 2
    assert Operation.objects.get(pk=proposal["operation_id"]).attempts.count() == 0
    assert notes.effects() == []

    approval_approve(approval_id=proposal["approval_id"], reviewer=reviewer, reason="looks right")
    dispatch_on_stack(stack, proposal["operation_id"])
    answer = api.final(proposal["call_id"], proposal["task_id"])
    assert answer["status"] == "confirmed", answer
    assert notes.effects() == [{"tool": "create_note", "text": "Refund approved"}]
    operation = Operation.objects.get(pk=proposal["operation_id"])
    assert operation.attempts.count() == 1 and operation.result["text"] == "Refund approved"


def test_the_write_that_hangs_ends_unknown_and_with_a_person_never_sent_twice(stack, notes, imported, reviewer):
    api = HttpAgent(stack.url)
    proposal = propose(api, "notes.slow_write", {"text": "hang"}, call_id="call-hang")
    approval_approve(approval_id=proposal["approval_id"], reviewer=reviewer)
    dispatch_on_stack(stack, proposal["operation_id"])
    answer = api.final(proposal["call_id"], proposal["task_id"])
    assert answer["status"] == OperationStatus.MANUAL, answer

    operation_id = proposal["operation_id"]
    story = [e.to_status for e in events_of(Operation.EVENT_ENTITY, operation_id)]
    assert story[-2:] == ["unknown", "manual"], story
    operation = Operation.objects.get(pk=operation_id)
    [attempt] = operation.attempts.all()
    assert attempt.fact == "unknown"
    # The server did it once; nothing called it again (the server's tool is still sleeping on
    # the first call, so a second call would show as a second line at once).
    wait_until(lambda: len(notes.effects()) >= 1, timeout=30, what="the effect at the server")
    assert notes.effects() == [{"tool": "slow_write", "text": "hang"}]
