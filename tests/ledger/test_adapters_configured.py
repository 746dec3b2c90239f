"""ledger.adapters.configured: an HTTP tool built from its Tool row, against a real server the
test starts — escaping, the key and credential headers, receipt and result picked per
configuration, the four facts as for a built-in tool, and the status query's three answers."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus, Tool
from approvals.tools import tool_save
from ledger.adapters import adapter_for, get_adapter
from ledger.adapters.base import ABSENT, ERROR, FOUND, PROCESSING
from ledger.adapters.configured import HttpToolAdapter
from ledger.decisions import approval_approve
from ledger.dispatcher import run_dispatch
from ledger.models import Fact, Operation, OperationStatus
from ledger.proposals import call_propose
from tests.fixtures.api import start_task
from tests.fixtures.ticketserver import TicketServer
from tests.fixtures.tools import ticket_tool_fields


@pytest.fixture
def server():
    server = TicketServer().start()
    yield server
    server.stop()


@pytest.fixture
def tool(db, server, monkeypatch) -> Tool:
    monkeypatch.setenv("TICKETS_API_TOKEN", "tok-123")
    return tool_save(tool=Tool(**ticket_tool_fields(server.url)))


def test_the_registry_builds_the_adapter_from_the_tool_row(tool):
    adapter = adapter_for(tool)
    assert isinstance(adapter, HttpToolAdapter) and adapter.tool is tool and adapter.can_query
    with pytest.raises(LookupError, match="configured per tool"):
        get_adapter("http")


def test_it_sends_the_configured_request_with_the_key_and_credential_and_picks_receipt_and_result(tool, server):
    outcome = adapter_for(tool).execute({"queue": "billing", "priority": 2, "title": "Refund", "body": "x"},
                                        key="op-1", timeout=5)
    assert outcome.fact == Fact.KNOWN_SUCCESS
    [req] = server.requests
    assert (req.method, req.path_segments, req.query) == ("POST", ["queues", "billing", "tickets"], {"priority": ["2"]})
    assert req.headers["Idempotency-Key"] == "op-1"
    assert req.headers["Authorization"] == "Bearer tok-123"
    assert req.headers["X-Api-Version"] == "2024-06-01"
    assert req.body == {"title": "Refund", "body": "x"}  # what the URL does not name
    assert outcome.receipt == {"provider": "tickets.create", "http_status": 201, "remote_id": "T-1", "queue": "billing"}
    assert outcome.result == {"ticket.id": "T-1", "ticket.status": "open"}
    assert "tok-123" not in repr(outcome.as_evidence())


def test_hostile_arguments_stay_inside_their_segment_and_query_value(tool, server):
    adapter_for(tool).execute({"queue": "../../admin?x=1#", "title": "t"}, key="op-2", timeout=5)
    [req] = server.requests
    assert req.raw_path == "/queues/..%2F..%2Fadmin%3Fx%3D1%23/tickets"
    assert req.path_segments == ["queues", "../../admin?x=1#", "tickets"]
    assert req.query == {}  # an absent optional argument leaves its parameter out


def test_a_dot_dot_segment_cannot_climb_the_path(tool, server):
    adapter_for(tool).execute({"queue": "..", "title": "t"}, key="op-3", timeout=5)
    assert server.requests[0].raw_path == "/queues/%2E%2E/tickets"


def test_a_header_value_cannot_be_injected_through_the_credential_or_arguments(tool, server, monkeypatch):
    monkeypatch.setenv("TICKETS_API_TOKEN", "tok\r\nX-Injected: yes")
    outcome = adapter_for(tool).execute({"queue": "q", "title": "a\r\nX-Injected: yes"}, key="op-4", timeout=5)
    assert outcome.fact == Fact.NOT_SENT  # httpx refuses the header; nothing left
    assert all("X-Injected" not in r.headers for r in server.requests)


def test_a_missing_credential_is_not_sent_and_names_the_variable_only(tool, server, monkeypatch):
    monkeypatch.delenv("TICKETS_API_TOKEN")
    outcome = adapter_for(tool).execute({"queue": "q", "title": "t"}, key="op-5", timeout=5)
    assert (outcome.fact, outcome.error_class) == (Fact.NOT_SENT, "credential_missing")
    assert "TICKETS_API_TOKEN" in outcome.raw["error"] and server.requests == []


def test_a_timeout_after_the_server_committed_is_unknown_like_a_built_in_tool(tool, server):
    outcome = adapter_for(tool).execute({"queue": "q", "title": "hang"}, key="op-6", timeout=0.3)
    assert (outcome.fact, outcome.error_class) == (Fact.UNKNOWN, "timeout")
    server.release()
    answer = adapter_for(tool).query(key="op-6", timeout=5)
    assert answer.state == FOUND
    assert answer.receipt == {"provider": "tickets.create", "http_status": "query", "remote_id": "T-1", "queue": "q",
                              "via": "query"}


def test_a_refused_connection_is_not_sent(tool, free_port):
    tool.http_url = f"http://127.0.0.1:{free_port}/queues/{{queue}}/tickets"
    outcome = HttpToolAdapter(tool).execute({"queue": "q", "title": "t"}, key="op-7", timeout=1)
    assert (outcome.fact, outcome.error_class) == (Fact.NOT_SENT, "connect")


def test_a_4xx_is_a_known_failure(tool, server):
    tool.key_header = "X-Other"  # the server requires Idempotency-Key: 400
    outcome = HttpToolAdapter(tool).execute({"queue": "q", "title": "t"}, key="op-8", timeout=5)
    assert (outcome.fact, outcome.error_class) == (Fact.KNOWN_FAILURE, "validation")


def test_the_status_query_reads_absent_and_processing_per_configuration(tool, server):
    assert adapter_for(tool).query(key="nobody", timeout=5).state == ABSENT
    tool.status_query = {**tool.status_query, "found": {"status": 200, "field": "ticket.status", "equals": "done"},
                         "processing": {"status": 200, "field": "ticket.status", "equals": ["open"]}}
    adapter_for(tool).execute({"queue": "q", "title": "t"}, key="op-9", timeout=5)
    assert HttpToolAdapter(tool).query(key="op-9", timeout=5).state == PROCESSING
    tool.status_query = {**tool.status_query, "absent": {"status": 410}}
    assert HttpToolAdapter(tool).query(key="nobody", timeout=5).state == ERROR  # 404 reads as nothing known


def test_a_get_tool_puts_unnamed_arguments_in_the_query(tool, server):
    tool.http_method = "GET"
    tool.http_url = server.url + "/tickets/by-key/{queue}"
    HttpToolAdapter(tool).execute({"queue": "k", "priority": 2, "title": "a b&c=d"}, key="op-10", timeout=5)
    [req] = server.requests
    assert req.query == {"priority": ["2"], "title": ["a b&c=d"]} and req.body is None


def test_an_approval_given_before_the_tools_url_changed_is_invalidated_and_nothing_is_sent(
        tool, server, agent, reviewer, enqueued):
    tool.base_tier = 2
    tool_save(tool=tool)
    agent.allowed_tools.add(tool)
    run = start_task(agent)
    proposal = call_propose(principal=agent, task_id=run.task_id, call_id="c1", step_id="s1",
                            tool_name="tickets.create", arguments={"queue": "q", "title": "t"},
                            expected_version=run.version, fencing_token=run.fencing_token)
    assert proposal.decision == "awaiting_approval"

    tool.http_url = server.url + "/v2/queues/{queue}/tickets"  # an administrator points it elsewhere
    tool_save(tool=tool)
    approval_approve(approval_id=proposal.approval_id, reviewer=reviewer)  # approving what they saw
    run_dispatch(proposal.operation_id, worker="test")

    assert Operation.objects.get(pk=proposal.operation_id).status == OperationStatus.CANCELLED
    assert ApprovalRequest.objects.get(pk=proposal.approval_id).status == ApprovalStatus.INVALIDATED
    assert server.requests == []
