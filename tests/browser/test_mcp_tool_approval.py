"""A write tool of an MCP server, imported with `tools_import mcp` and gated by Countersign, with a
reviewer in a real browser: the agent's call waits, the reviewer sees where it goes and approves
it on the approval page, a real Celery worker calls `tools/call`, and the MCP server (the SDK's own
server in a subprocess) counts exactly one effect."""

from __future__ import annotations

import threading
from io import StringIO

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from approvals.models import Tool
from console.models import Role
from runs.models import Task
from tests.browser.test_full_stack import log_in
from tests.conftest import make_user
from tests.fixtures.mcp_upstream import McpToolsServer
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


def test_a_reviewer_approves_an_mcp_write_in_the_browser_and_it_runs_once(
        stack, notes, page, screenshot, agent, tenant):
    # The import runs its own event loop; Playwright's sync API holds one in this thread.
    importer = threading.Thread(target=call_command, args=(
        "tools_import", "mcp", notes.url, "--prefix", "notes", "--enable"), kwargs={"stdout": StringIO()})
    importer.start()
    importer.join()
    assert Tool.objects.filter(name="notes.create_note", enabled=True).exists()
    make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)
    api = HttpAgent(stack.url)
    task_id, version, token = api.running_task()
    proposal = api.post(f"/api/v1/tasks/{task_id}/calls", {
        "call_id": "call-note", "step_id": "call-note", "tool": "notes.create_note",
        "arguments": {"text": "Refund approved"}, "expected_version": version, "fencing_token": token})
    assert proposal["decision"]["outcome"] == "awaiting_approval", proposal
    assert notes.effects() == []

    log_in(page, stack.url, "reviewer")
    page.goto(f"{stack.url}/approvals/{proposal['approval_id']}/")
    expect(page.get_by_text(notes.url).first).to_be_visible()  # the page names the upstream
    page.click("#approve-button")
    expect(page.locator("#operation-status .badge")).to_have_text("confirmed", timeout=30_000)
    screenshot(page, "mcp-write-approved-confirmed")

    assert api.final("call-note", task_id)["status"] == "confirmed"
    assert notes.effects() == [{"tool": "create_note", "text": "Refund approved"}]
    assert Task.objects.get(pk=task_id).status == "running"  # no call of it waits any more
