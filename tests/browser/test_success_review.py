"""A success review in a real browser: the verdicts arrive live on the run page, the reviewer
finds the task in the review list and confirms it with evidence; the evidence stays on the page."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.models import Role
from ledger.models import Fact
from ledger.models import OperationStatus as S
from runs.models import Task, TaskStatus
from runs.services import task_create
from runs.verification import run_verification
from tests.browser.test_runs import log_in
from tests.conftest import make_user
from tests.factories import make_operation, record_outcome

pytestmark = pytest.mark.django_db(transaction=True)

HUMAN = "The customer confirmed the new delivery address by phone"


def test_a_reviewer_confirms_a_tasks_success_with_evidence(asgi_server, page, screenshot, agent, tenant):
    make_user("checker", tenant, Role.REVIEWER, max_tier=3)
    task = task_create(principal=agent, task_type="address_change", goal="Change the delivery address of ord-7",
                       success_criteria=[{"kind": "human", "description": HUMAN},
                                         {"kind": "result_matches", "tool": "orders.lookup", "path": "/order/status",
                                          "equals": "address_changed"}])
    lookup = make_operation(agent, "orders.lookup", task=task, status=S.DISPATCHED)
    record_outcome(lookup, fact=Fact.KNOWN_SUCCESS, result={"order": {"id": "ord-7", "status": "address_changed"}})
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.VERIFYING)

    log_in(page, asgi_server.url, "checker")
    page.goto(f"{asgi_server.url}/runs/{task.task_id}/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    expect(page.locator("#run-criteria")).to_contain_text("not judged yet")

    assert run_verification(task.task_id) == "review"
    expect(page.locator("#run-status")).to_contain_text("waiting_review")
    expect(page.locator("#run-criteria")).to_contain_text("waiting for a reviewer")
    expect(page.locator("#run-criteria .badge--met")).to_have_count(1)

    page.get_by_role("link", name="Success reviews").click()
    row = page.locator(f"#review-{task.task_id}")
    expect(row).to_contain_text(HUMAN)
    screenshot(page, "success-review-list")
    row.get_by_role("link", name=task.task_id).click()

    form = page.locator("#run-review-form")
    expect(form).to_be_visible()
    page.get_by_role("button", name="Confirm success").click()  # no evidence: the browser refuses
    expect(page.locator("#run-status")).to_contain_text("waiting_review")
    page.get_by_label("Evidence").fill("Called the customer on +1 555 0100 at 14:05; ticket CS-4471.")
    screenshot(page, "success-review-form")
    page.get_by_role("button", name="Confirm success").click()

    expect(page.get_by_role("status")).to_contain_text("Success confirmed")
    expect(page.locator("#run-status")).to_contain_text("succeeded")
    expect(page.locator("#run-criteria")).to_contain_text("Confirmed by user:checker")
    expect(page.locator("#run-criteria")).to_contain_text("ticket CS-4471")
    expect(page.locator("#run-review-form")).to_have_count(0)
    screenshot(page, "success-review-confirmed")
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
