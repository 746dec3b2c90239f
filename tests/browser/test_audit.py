"""The audit review list in a real browser: a reviewer marks one audited call reviewed, flags
another with a note, finds the flag on the operation's page, and the dashboard counts both."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import AuditReview
from console.models import Role
from ledger.proposals import call_propose
from tests.browser.test_stops import log_in
from tests.conftest import make_user
from tests.fixtures.api import refund, start_task

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_reviewer_reviews_and_flags_audited_calls(asgi_server, new_page, screenshot, agent, tenant):
    make_user("auditor", tenant, Role.REVIEWER, max_tier=3)
    run = start_task(agent)
    ids = [call_propose(principal=agent, task_id=run.task_id, call_id=f"refund-{n}", step_id=f"step-{n}",
                        tool_name="payments.refund", arguments=refund(10 + n, order_id=f"ord-{n}"),
                        expected_version=run.version, fencing_token=run.fencing_token).operation_id
           for n in range(3)]

    page = new_page()
    log_in(page, asgi_server.url, "auditor")
    page.get_by_role("link", name="Audit", exact=True).click()
    expect(page.get_by_role("heading", name="Audit review")).to_be_visible()
    expect(page.locator("#audit-rows tbody tr")).to_have_count(3)
    screenshot(page, "audit-list-unreviewed")

    page.locator(f"#audit-{ids[0]}").get_by_role("button", name="Mark reviewed").click()
    expect(page.locator(".message")).to_contain_text("Call refund-0 is reviewed")
    expect(page.locator("#audit-rows tbody tr")).to_have_count(2)

    row = page.locator(f"#audit-{ids[1]}")
    row.get_by_label("Note").fill("refunded the wrong order")
    row.get_by_role("button", name="Flag").click()
    expect(page.locator(".message")).to_contain_text("Call refund-1 is flagged")

    page.locator("#audit-tabs").get_by_role("link", name="All").click()
    expect(page.locator("#audit-rows tbody tr")).to_have_count(3)
    expect(page.locator(f"#audit-{ids[1]}")).to_contain_text("refunded the wrong order")
    screenshot(page, "audit-list-all")

    page.locator(f"#audit-{ids[1]}").get_by_role("link", name="refund-1").click()
    expect(page.locator("#audit-flag")).to_contain_text("refunded the wrong order")

    page.goto(asgi_server.url + "/dashboard/")
    expect(page.locator("#audit-today-audited")).to_have_text("3")
    expect(page.locator("#audit-today-reviewed")).to_have_text("1")
    expect(page.locator("#audit-today-flagged")).to_have_text("1")
    screenshot(page.locator("#audit-today").page, "audit-dashboard")
    assert AuditReview.objects.filter(status="unreviewed").count() == 1
