"""`manage.py tools_import mcp`: tools from a real MCP server (the test server in a subprocess,
over streamable HTTP and over stdio) — named <prefix>.<tool>, disabled until enabled, kinds,
tiers and idempotency from the tools' annotations, the input schema as the JSON schema."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from mcp_types import Tool as McpTool

from approvals.mcp_import import tools_from_listing
from approvals.models import Tool
from tests.asgi import free_port
from tests.conftest import make_agent
from tests.fixtures.mcp_upstream import McpToolsServer

pytestmark = pytest.mark.timeout(120)

NAMES = {"notes.lookup", "notes.create_note", "notes.set_label", "notes.purge", "notes.refuse",
         "notes.slow_write", "notes.slow_label", "notes.credential_seen"}


@pytest.fixture(scope="module")
def server():
    server = McpToolsServer().start()
    yield server
    server.stop()


def run(*args: str) -> str:
    out = StringIO()
    call_command("tools_import", *args, stdout=out, stderr=out)
    return out.getvalue()


def imported() -> dict[str, Tool]:
    return {tool.name: tool for tool in Tool.objects.filter(name__startswith="notes.")}


def test_it_creates_one_disabled_tool_per_server_tool_as_the_annotations_say(db, server):
    output = run("mcp", server.url, "--prefix", "notes", "--timeout", "3")
    tools = imported()
    assert set(tools) == NAMES
    assert not any(tool.enabled for tool in tools.values())
    assert "disabled until an administrator enables them" in output
    shape = {name: (t.kind, t.base_tier, t.idempotency) for name, t in tools.items()}
    assert shape["notes.lookup"] == ("read", 1, "none")  # readOnlyHint
    assert shape["notes.create_note"] == ("write", 2, "none")  # destructiveHint false
    assert shape["notes.set_label"] == ("write", 2, "native")  # idempotentHint
    assert shape["notes.purge"] == ("write", 3, "none")  # destructiveHint
    lookup = tools["notes.lookup"]
    assert (lookup.adapter, lookup.mcp_server, lookup.mcp_tool, lookup.timeout_seconds) == (
        "mcp", server.url, "lookup", 3.0)
    assert lookup.json_schema["required"] == ["order_id"]
    assert lookup.json_schema["properties"]["order_id"]["type"] == "string"
    assert lookup.description == "Look up an order."


def test_a_write_without_a_destructive_hint_is_l3_as_the_specification_defaults(server):
    listed = [McpTool(name="unannotated", input_schema={"type": "object"})]
    [spec] = tools_from_listing(listed, prefix="x", server=server.url).tools
    assert (spec["kind"], spec["base_tier"], spec["idempotency"]) == ("write", 3, "none")


def test_a_stdio_command_is_imported_the_same_way_with_the_credential_by_name(db, server, monkeypatch):
    monkeypatch.setenv("NOTES_TOKEN", "token-value")
    command = server.stdio_command()
    run("mcp", "--command", command, "--prefix", "notes", "--credential-ref", "NOTES_TOKEN", "--timeout", "20")
    tools = imported()
    assert set(tools) == NAMES
    assert {t.mcp_server for t in tools.values()} == {command}
    assert {t.credential_ref for t in tools.values()} == {"NOTES_TOKEN"}
    assert "token-value" not in repr(list(Tool.objects.values()))


def test_enable_allows_them_for_the_only_tenants_agents(policy, tenant, server):
    agent = make_agent(tenant, "a2", "tok-a2")
    run("mcp", server.url, "--prefix", "notes", "--enable")
    tools = imported()
    assert all(tool.enabled for tool in tools.values())
    assert set(agent.allowed_tools.filter(name__startswith="notes.").values_list("name", flat=True)) == NAMES


def test_importing_again_keeps_the_versions_and_enabled(db, server):
    run("mcp", server.url, "--prefix", "notes")
    Tool.objects.filter(name="notes.lookup").update(enabled=True)
    output = run("mcp", server.url, "--prefix", "notes")
    tools = imported()
    assert tools["notes.lookup"].enabled and tools["notes.lookup"].schema_version == 1
    assert "updated notes.lookup" in output


@pytest.mark.parametrize("args", [
    ["mcp", "--prefix", "notes"],
    ["mcp", "http://127.0.0.1:1/mcp", "--command", "x", "--prefix", "notes"],
    ["mcp", "./server.py", "--prefix", "notes"],
    ["mcp", "--command", "x", "--prefix", "notes", "--credential-ref", "sk-live-1"],
])
def test_it_refuses_an_unclear_source_or_a_secret_for_a_reference(db, args):
    with pytest.raises(CommandError):
        run(*args)


def test_a_server_that_does_not_answer_is_an_error_and_creates_nothing(db):
    with pytest.raises(CommandError, match="cannot list"):
        run("mcp", f"http://127.0.0.1:{free_port()}/mcp", "--prefix", "notes", "--timeout", "2")
    assert not imported()
