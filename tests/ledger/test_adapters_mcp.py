"""The MCP adapter against a real MCP server (the SDK's own server, in a subprocess): each
exchange classified into the four facts, effects counted at the server."""

from __future__ import annotations

import signal
import socket
import threading

import pytest

from approvals.models import Tool
from approvals.tools import tool_config_errors
from console.lib.procs import wait_until
from ledger.adapters import adapter_for
from ledger.adapters.base import ABSENT, ERROR
from ledger.adapters.mcp import McpToolAdapter
from ledger.models import Fact
from tests.asgi import free_port
from tests.fixtures.mcp_upstream import McpToolsServer, mcp_tool

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    server = McpToolsServer().start()
    yield server
    server.stop()


def call(server_or_command: str, name: str, arguments: dict, *, timeout: float = 5.0, **fields):
    return adapter_for(mcp_tool(server_or_command, name, **fields)).execute(arguments, key="op-1", timeout=timeout)


def test_adapter_for_builds_the_mcp_adapter_from_the_row(server):
    assert isinstance(adapter_for(mcp_tool(server.url, "lookup")), McpToolAdapter)


def test_a_read_tool_is_a_known_success_with_its_answer_as_result_and_picked_receipt(server):
    outcome = call(server.url, "lookup", {"order_id": "A-1"}, receipt_fields={"state": "state"})
    assert outcome.fact == Fact.KNOWN_SUCCESS
    assert outcome.result == {"order_id": "A-1", "state": "shipped"}
    assert outcome.receipt == {"provider": "notes.lookup", "mcp_tool": "lookup", "state": "shipped"}


def test_a_write_tool_has_one_effect_at_the_server(server):
    before = len(server.effects("create_note"))
    outcome = call(server.url, "create_note", {"text": "hello"}, result_fields=["note_id"])
    assert outcome.fact == Fact.KNOWN_SUCCESS and outcome.side_effect == "committed"
    assert server.effects("create_note")[before:] == [{"tool": "create_note", "text": "hello"}]
    assert list(outcome.result) == ["note_id"]


def test_a_result_with_is_error_is_a_known_failure(server):
    outcome = call(server.url, "refuse", {"reason": "no"})
    assert outcome.fact == Fact.KNOWN_FAILURE and outcome.error_class == "tool_error"
    assert "refused: no" in outcome.raw["result"]["text"]


def test_a_call_past_the_timeout_is_unknown_and_sent_once(server):
    before = len(server.effects("slow_write"))
    outcome = call(server.url, "slow_write", {"text": "late"}, timeout=1.0)
    assert outcome.fact == Fact.UNKNOWN and outcome.error_class == "timeout"
    assert len(server.effects("slow_write")) == before + 1


def test_a_session_dropped_during_the_call_is_unknown():
    server = McpToolsServer().start()
    outcomes = []
    caller = threading.Thread(target=lambda: outcomes.append(call(server.url, "slow_write", {"text": "x"}, timeout=60)))
    caller.start()
    try:
        wait_until(lambda: len(server.effects("slow_write")) == 1, timeout=30, what="the effect at the server")
        server.child.signal(signal.SIGKILL)
        caller.join(timeout=60)
    finally:
        server.stop()
    [outcome] = outcomes
    assert outcome.fact == Fact.UNKNOWN, outcome
    assert len(server.effects("slow_write")) == 1


def test_no_server_listening_is_not_sent():
    outcome = call(f"http://127.0.0.1:{free_port()}/mcp", "lookup", {"order_id": "A"})
    assert outcome.fact == Fact.NOT_SENT and outcome.error_class == "connect"


def test_a_server_that_never_answers_the_handshake_is_not_sent():
    # Listening, never accepting: the TCP connection opens, the initialize request gets no answer.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        outcome = call(f"http://127.0.0.1:{silent.getsockname()[1]}/mcp", "create_note", {"text": "x"}, timeout=1.0)
    assert outcome.fact == Fact.NOT_SENT and outcome.error_class == "connect", outcome


def test_a_stdio_command_runs_the_tool_and_gets_the_credential_by_name(server, monkeypatch):
    monkeypatch.setenv("NOTES_TOKEN", "secret-value")
    outcome = call(server.stdio_command(), "credential_seen", {}, timeout=20, credential_ref="NOTES_TOKEN")
    assert outcome.fact == Fact.KNOWN_SUCCESS and outcome.result == {"seen": True}
    assert "secret-value" not in repr(outcome.as_evidence())


def test_a_command_that_does_not_start_is_not_sent():
    outcome = call("/nonexistent/mcp-server --stdio", "lookup", {"order_id": "A"})
    assert outcome.fact == Fact.NOT_SENT


def test_a_missing_credential_is_not_sent(server, monkeypatch):
    monkeypatch.delenv("NOTES_TOKEN", raising=False)
    outcome = call(server.url, "lookup", {"order_id": "A"}, credential_ref="NOTES_TOKEN")
    assert outcome.fact == Fact.NOT_SENT and outcome.error_class == "credential_missing"


def test_only_an_idempotent_tool_may_be_called_again_after_an_unknown(server):
    plain = McpToolAdapter(mcp_tool(server.url, "create_note"))
    idempotent = McpToolAdapter(mcp_tool(server.url, "set_label", idempotency=Tool.Idempotency.NATIVE))
    assert not plain.can_query and plain.query(key="k", timeout=1).state == ERROR
    assert idempotent.can_query and idempotent.query(key="k", timeout=1).state == ABSENT


@pytest.mark.parametrize(("fields", "field"), [
    ({"mcp_server": ""}, "mcp_server"),
    ({"mcp_server": "python 'unclosed"}, "mcp_server"),
    ({"mcp_tool": ""}, "mcp_tool"),
    ({"http_url": "https://api.example.com/x", "http_method": "POST"}, "mcp_server"),
    ({"credential_ref": "sk-live-123"}, "credential_ref"),
    ({"receipt_fields": {"id": "not a path"}}, "receipt_fields"),
])
def test_the_configuration_check_refuses_what_cannot_work(fields, field):
    assert field in tool_config_errors(mcp_tool("http://127.0.0.1:1/mcp", "lookup", **fields))


def test_a_well_formed_mcp_tool_passes_the_check_and_others_cannot_name_a_server():
    assert tool_config_errors(mcp_tool("uvx notes-server --stdio", "lookup", credential_ref="NOTES_TOKEN")) == {}
    assert "mcp_server" in tool_config_errors(mcp_tool("http://127.0.0.1:1/mcp", "lookup", adapter="noop"))
