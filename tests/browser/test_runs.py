"""Runs and dashboard in a real browser, served over ASGI so the live views work."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.models import Role
from ledger.models import OperationStatus as S
from runs.defaults import ensure_release_gates
from runs.services import lease_acquire, task_create, task_transition
from tests.conftest import make_user
from tests.factories import make_operation

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(page, base_url: str, username: str) -> None:
    page.goto(base_url + "/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()


def test_a_run_page_follows_the_run_live(asgi_server, page, screenshot, agent, tenant):
    make_user("watcher", tenant, Role.REVIEWER, max_tier=3)
    task = task_create(principal=agent, task_type="refund", goal="Refund 30 EUR on ord-7")
    lease = lease_acquire(task_id=task.task_id, owner="w1", ttl_seconds=300)
    log_in(page, asgi_server.url, "watcher")
    page.goto(f"{asgi_server.url}/runs/{task.task_id}/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    expect(page.locator("#run-status")).to_contain_text("queued")

    task = task_transition(task_id=task.task_id, to="planning", expected_version=1,
                           fencing_token=lease.fencing_token, actor="agent")
    task_transition(task_id=task.task_id, to="running", expected_version=2,
                    fencing_token=lease.fencing_token, actor="agent")
    expect(page.locator("#run-status")).to_contain_text("running")
    expect(page.locator("#run-status")).to_contain_text("version 3")
    expect(page.locator("#run-timeline li")).to_have_count(3)

    operation = make_operation(agent, task=task, status=S.CONFIRMED)
    expect(page.locator(f"#run-op-{operation.operation_id}")).to_contain_text("confirmed")
    screenshot(page, "run-detail")


def test_the_dashboard_draws_its_chart_and_gates(asgi_server, page, screenshot, agent, tenant):
    make_user("watcher", tenant, Role.REVIEWER, max_tier=3)
    ensure_release_gates()
    make_operation(agent, status=S.CONFIRMED)
    make_operation(agent, status=S.UNKNOWN)
    log_in(page, asgi_server.url, "watcher")
    expect(page.locator("#ops-chart")).to_have_attribute("data-rendered", "true")
    expect(page.locator("#ops-chart canvas")).to_have_count(1)
    expect(page.get_by_text("Zero duplicate side effects")).to_be_visible()
    screenshot(page, "dashboard")
