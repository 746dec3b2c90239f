"""The stop buttons and a task's cancel in a real browser, served over ASGI so the live views
work: a stop pressed by one admin appears live on another's page, the agent's next call is
refused and a pending approval is frozen; resume is one click; a run is cancelled from its page."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals import stops
from approvals.models import ApprovalRequest, Stop, StopStatus
from console.models import Role
from ledger.proposals import call_propose
from runs.models import Task
from tests.conftest import make_user
from tests.factories import make_pending_approval
from tests.fixtures.api import start_task

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(page, base_url: str, username: str) -> None:
    page.goto(base_url + "/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()


def test_an_admin_stops_an_agent_another_sees_it_live_and_resumes_it(asgi_server, new_page, screenshot, agent,
                                                                      tenant):
    make_user("boss", tenant, Role.ADMIN)
    make_user("deputy", tenant, Role.ADMIN)
    run = start_task(agent)
    watcher = new_page()
    log_in(watcher, asgi_server.url, "deputy")
    watcher.goto(asgi_server.url + "/stops/")
    expect(watcher.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    expect(watcher.locator("#nothing-stopped")).to_be_visible()

    page = new_page()
    log_in(page, asgi_server.url, "boss")
    page.get_by_role("link", name="Stops").click()
    page.get_by_label("one agent:").check()
    page.get_by_label("Why").fill("runaway refunds")
    page.get_by_role("button", name="Stop now").click()
    expect(page.locator(".message")).to_contain_text("Stopped agent acme/agent")
    screenshot(page, "stops-in-force")

    # The other admin's page shows it without a reload.
    expect(watcher.locator("#stops-in-force")).to_contain_text("Agent acme/agent is stopped")
    expect(watcher.locator("#stops-in-force")).to_contain_text("runaway refunds")
    # The agent's next call is refused (and recorded as a refused call).
    refused = call_propose(principal=agent, task_id=run.task_id, call_id="c1", step_id="s1", tool_name="orders.lookup",
                           arguments={"order_id": "ord-1"}, expected_version=run.version,
                           fencing_token=run.fencing_token)
    assert refused.decision == "refused" and refused.reasons[0].startswith("Stopped")

    watcher.get_by_role("button", name="Resume").click()
    expect(watcher.locator("#nothing-stopped")).to_be_visible()
    expect(page.locator("#nothing-stopped")).to_be_visible()  # live, on the first admin's page too
    assert Stop.objects.get().status == StopStatus.RESUMED
    screenshot(watcher, "stops-resumed")


def test_a_request_freezes_live_when_a_stop_comes_and_says_so_when_a_reviewer_tries(asgi_server, page, screenshot,
                                                                                    agent, tenant):
    admin = make_user("boss", tenant, Role.ADMIN)
    make_user("rita", tenant, Role.REVIEWER, max_tier=3)
    request = make_pending_approval(agent, risk_tier=3)
    log_in(page, asgi_server.url, "rita")
    page.goto(f"{asgi_server.url}/approvals/{request.approval_id}/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    expect(page.locator("#frozen-notice")).to_have_count(0)

    stops.stop_create(tenant_id=tenant.pk, scope="tenant", user=admin, reason="incident drill")

    expect(page.locator("#frozen-notice")).to_contain_text("Frozen: tenant acme is stopped by boss (incident drill)")

    page.get_by_role("button", name="Approve").first.click()

    expect(page.get_by_text("Frozen: tenant acme is stopped (incident drill)")).to_be_visible()
    screenshot(page, "approval-frozen")
    assert ApprovalRequest.objects.get(pk=request.pk).status == "pending"


def test_support_cancels_a_run_from_its_page(asgi_server, page, screenshot, agent, tenant):
    make_user("sam", tenant, Role.SUPPORT)
    run = start_task(agent)
    request = make_pending_approval(agent, risk_tier=3, task=run.task)
    log_in(page, asgi_server.url, "sam")
    page.goto(f"{asgi_server.url}/runs/{run.task_id}/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")

    page.get_by_label("Why").fill("customer withdrew the request")
    screenshot(page, "run-controls", full_page=False)
    page.get_by_role("button", name="Cancel the task").click()

    expect(page.locator("#run-status")).to_contain_text("cancelled")
    expect(page.locator(f"#run-approval-{request.approval_id}")).to_contain_text("invalidated")
    expect(page.locator("#run-timeline")).to_contain_text("customer withdrew the request")
    expect(page.locator("#run-controls")).to_have_count(0)
    screenshot(page, "run-cancelled")
    assert Task.objects.get(pk=run.task_id).status == "cancelled"
