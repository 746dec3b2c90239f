"""From the agent API to the provider's effect log, with a person in the loop, in a real browser:
the ASGI server, a real Celery worker and the sandbox providers, nothing simulated."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from console.models import Role
from sandbox.client import effects
from tests.conftest import AGENT_TOKEN, make_user
from tests.stack import FullStack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture
def stack(request):
    queues = getattr(request, "param", "fast,slow")
    stack = FullStack(worker_queues=queues).start()
    yield stack
    stack.stop()


class Agent:
    """An agent using the HTTP API with its bearer token, as any agent would."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {AGENT_TOKEN}"}, timeout=30)

    def post(self, path: str, body: dict) -> dict:
        response = self.http.post(path, json=body)
        assert response.status_code < 300, response.text
        return response.json()

    def running_task(self) -> tuple[str, int, int]:
        task = self.post("/api/v1/tasks", {"task_type": "refund", "goal": "Refund the broken kettle"})
        token = self.post(f"/api/v1/tasks/{task['task_id']}/lease", {"owner": "agent-1", "ttl_seconds": 300})[
            "fencing_token"]
        version = task["version"]
        for to in ("planning", "running"):
            version = self.post(f"/api/v1/tasks/{task['task_id']}/transition",
                                {"to": to, "expected_version": version, "fencing_token": token})["version"]
        return task["task_id"], version, token

    def refund(self, task_id: str, version: int, token: int, *, order_id: str, amount: float) -> dict:
        return self.post(f"/api/v1/tasks/{task_id}/calls", {
            "call_id": f"call-{order_id}", "step_id": "refund", "tool": "payments.refund",
            "arguments": {"order_id": order_id, "amount": amount, "currency": "EUR", "reason": "broken"},
            "expected_version": version, "fencing_token": token})

    def wait_for(self, call_id: str, task_id: str, status: str) -> dict:
        answer = {}
        for _ in range(10):
            answer = self.http.get(f"/api/v1/calls/{call_id}", params={"wait": 10, "task_id": task_id}).json()
            if answer["status"] == status:
                return answer
        raise AssertionError(f"{call_id} never became {status}: {answer}")


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

    api = Agent(stack.url)
    task_id, version, token = api.running_task()
    proposal = api.refund(task_id, version, token, order_id="ord-kettle-1", amount=120)
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
    assert api.wait_for(proposal["call_id"], task_id, "confirmed")["receipt"]["amount"] == 120


@pytest.mark.parametrize("stack", ["fast"], indirect=True)  # no reconciler: the person resolves it
def test_support_resolves_a_timeout_after_commit_live_and_the_agent_sees_confirmed(
        stack, page, screenshot, agent, tenant):
    make_user("support", tenant, Role.SUPPORT)
    log_in(page, stack.url, "support")
    page.goto(stack.url + "/operations/unknown/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")

    api = Agent(stack.url)
    task_id, version, token = api.running_task()
    proposal = api.refund(task_id, version, token, order_id="fault-timeout-after-commit-kettle", amount=30)
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
    assert api.wait_for(proposal["call_id"], task_id, "confirmed")["status"] == "confirmed"
