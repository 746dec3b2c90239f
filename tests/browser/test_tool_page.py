"""The tool page in a real browser: reached from the run page's operations, it shows where the
tool's calls go, its configuration without secret values, its tier rules and its recent
operations, each linking to its page."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import Tool
from approvals.tools import tool_save
from console.models import Role
from ledger.models import OperationStatus as S
from tests.browser.test_runs import log_in
from tests.conftest import make_user
from tests.factories import make_operation
from tests.fixtures.tools import ticket_tool_fields

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "browser-secret-never-shown"


def test_the_tool_page_is_reached_from_a_run_and_shows_the_tool_without_its_secrets(
        asgi_server, page, screenshot, agent, tenant, monkeypatch):
    monkeypatch.setenv("TICKETS_API_TOKEN", SECRET)
    tool = tool_save(tool=Tool(**ticket_tool_fields(
        "https://tickets.example.com", http_headers={"Accept": "application/json", "X-Team-Key": SECRET})))
    agent.allowed_tools.add(tool)
    operation = make_operation(agent, "tickets.create", arguments={"queue": "billing", "title": "Refund"},
                               status=S.CONFIRMED)
    make_user("watcher", tenant, Role.SUPPORT)
    log_in(page, asgi_server.url, "watcher")

    page.goto(f"{asgi_server.url}/runs/{operation.task_id}/")
    row = page.locator(f"#run-op-{operation.operation_id}")
    expect(row.locator("[data-upstream]")).to_have_text("tickets.example.com")
    row.get_by_role("link", name="tickets.create").click()

    expect(page.get_by_role("heading", name="Tool tickets.create")).to_be_visible()
    configuration = page.locator("#tool-configuration")
    expect(configuration).to_contain_text("https://tickets.example.com/queues/{queue}/tickets?priority={priority}")
    expect(configuration).to_contain_text("$TICKETS_API_TOKEN")
    expect(configuration).to_contain_text("application/json")
    expect(configuration).to_contain_text("(value not shown)")
    expect(page.locator("#tool-tenants")).to_contain_text("agent")
    assert SECRET not in page.content()
    screenshot(page, "tool-page")

    page.locator("#tool-operations").get_by_role("link", name=operation.operation_id).click()
    expect(page.locator("#upstream")).to_contain_text("tickets.example.com")
