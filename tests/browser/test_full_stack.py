"""From the agent API to the provider's effect log, with a person in the loop, in a real browser:
the ASGI server, a real Celery worker and the sandbox providers, nothing simulated."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from console.models import Role
from sandbox.client import effects
from tests.conftest import make_user
from tests.stack import FullStack, HttpAgent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture
def stack(request):
    queues = getattr(request, "param", "fast,slow")
    stack = FullStack(worker_queues=queues).start()
    yield stack
    stack.stop()


def log_in(page, base_url: str, username: str) -> None:
    page.goto(base_url + "/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()


def test_a_reviewer_approves_a_live_request_by_keyboard_and_the_refund_happens_once(
        stack, page, screenshot, agent, tenant):
    make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)
    log_in(page, stack.url, "reviewer")
    page.goto(stack.url + "/approvals/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")

    api = HttpAgent(stack.url)
    task = api.running_task()
    proposal = api.refund(task, order_id="ord-kettle-1", amount=120)
    assert proposal["decision"]["outcome"] == "awaiting_approval"
    row = page.locator(f"#approval-{proposal['approval_id']}")
    expect(row).to_be_visible()  # arrived live, no reload

    page.keyboard.press("j")
    expect(row).to_have_class(re.compile(r"\bis-selected\b"))
    page.keyboard.press("Enter")
    expect(page.locator("#approve-button")).to_be_visible()
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    page.keyboard.press("a")
    expect(page.locator("#operation-status .badge")).to_have_text("confirmed", timeout=30_000)
    screenshot(page, "full-stack-approved-confirmed")

    assert len(effects(stack.payments.base_url, key=proposal["operation_id"])) == 1
    assert api.final(proposal["call_id"], task[0])["receipt"]["amount"] == 120


@pytest.mark.parametrize("stack", ["fast"], indirect=True)  # no reconciler: the person resolves it
def test_support_resolves_a_timeout_after_commit_live_and_the_agent_sees_confirmed(
        stack, page, screenshot, agent, tenant):
    make_user("support", tenant, Role.SUPPORT)
    log_in(page, stack.url, "support")
    page.goto(stack.url + "/operations/unknown/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")

    api = HttpAgent(stack.url)
    task = api.running_task()
    proposal = api.refund(task, order_id="fault-timeout-after-commit-kettle", amount=30)
    assert proposal["decision"]["outcome"] == "dispatched"
    row = page.locator(f"#op-{proposal['operation_id']}")
    expect(row).to_be_visible(timeout=30_000)  # the timeout made it unknown; it arrived live

    row.get_by_role("link").first.click()
    expect(page.locator("#op-status .badge")).to_have_text("unknown")
    page.click("#query-button")
    expect(page.locator("#op-provider")).to_contain_text("found", timeout=20_000)
    [effect] = effects(stack.payments.base_url, key=proposal["operation_id"])
    page.fill("#id_remote_id", effect["payload"]["id"])
    page.fill("#id_reason", "The provider has the refund")
    page.click("#confirm-button")
    expect(page.locator("#op-status .badge")).to_have_text("confirmed")
    screenshot(page, "full-stack-support-confirmed")

    page.goto(stack.url + "/operations/unknown/")
    expect(page.locator(f"#op-{proposal['operation_id']}")).to_have_count(0)
    assert len(effects(stack.payments.base_url, key=proposal["operation_id"])) == 1
    assert api.final(proposal["call_id"], task[0])["status"] == "confirmed"
