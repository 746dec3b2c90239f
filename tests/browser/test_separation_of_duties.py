"""Separation of duties in headless Chromium: support staff who are also L4 reviewers propose a
compensation from the operation's page, find they cannot approve it, and a second reviewer does."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from console.models import Role
from ledger import services as ledger_services
from ledger.models import Operation
from tests.browser.test_approvals_inbox import log_in
from tests.conftest import make_user
from tests.fixtures.support import make_operation

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_proposer_cannot_approve_their_compensation_and_a_second_reviewer_can(
        live_server, new_page, screenshot, agent, tenant, reviewer):
    make_user("admin", tenant, Role.SUPPORT, Role.REVIEWER, max_tier=4)
    original = make_operation(agent)  # 25 EUR on ord-1001, in doubt
    ledger_services.operation_confirm(operation_id=original.operation_id, receipt={"remote_id": "re_1"},
                                      actor="system:reconciler", reason="found")
    base = live_server.url

    admin = new_page()
    log_in(admin, base, "admin")
    admin.goto(f"{base}/operations/{original.operation_id}/")
    admin.select_option("#id_compensate-tool", "payments.refund")
    unrelated = {"order_id": "ord-unrelated", "amount": 199, "currency": "EUR", "reason": "goodwill"}
    admin.fill("#id_compensate-arguments", json.dumps(unrelated))
    admin.fill("#id_compensate-reason", "refunded twice")
    admin.click("#compensate-button")
    expect(admin.get_by_role("alert").first).to_contain_text("same order_id")
    assert not Operation.objects.filter(compensates=original).exists()

    admin.fill("#id_compensate-arguments", json.dumps({**unrelated, "order_id": "ord-1001", "amount": 20}))
    admin.fill("#id_compensate-reason", "refunded twice")
    admin.click("#compensate-button")
    compensation = Operation.objects.get(compensates=original)
    admin.click(f"a[href='/operations/{compensation.operation_id}/']")
    admin.click(".approval-link")
    approval = ApprovalRequest.objects.get(operation=compensation)
    expect(admin).to_have_url(f"{base}/approvals/{approval.approval_id}/")
    expect(admin.locator("#proposed-by")).to_contain_text("admin")
    expect(admin.locator("#proposed-by-me")).to_contain_text("You proposed this call")
    expect(admin.locator("#approve-button")).to_have_count(0)
    screenshot(admin, "duties-proposer-cannot-approve")

    second = new_page()
    log_in(second, base, "reviewer")
    second.goto(f"{base}/approvals/{approval.approval_id}/")
    expect(second.locator("#proposed-by")).to_contain_text("admin")
    second.click("#approve-button")
    expect(second.locator("#approval-status .badge")).to_have_text("approved")
    screenshot(second, "duties-second-reviewer-approved")
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "approved"
    assert list(ApprovalRequest.objects.get(pk=approval.pk).decisions.values_list("reviewer__username", flat=True)) \
        == ["reviewer"]


def test_support_settles_a_compensation_case_with_evidence(live_server, page, screenshot, agent, support_user):
    operation = make_operation(agent, status="compensation_required")
    log_in(page, live_server.url, "support")
    page.goto(f"{live_server.url}/operations/{operation.operation_id}/")
    expect(page.locator("#compensate-form")).to_be_visible()
    screenshot(page, "duties-compensation-required-exits")
    page.fill("#id_compensated-evidence", "bank reversal TR-4411")
    page.fill("#id_compensated-reason", "settled with the customer")
    page.click("#compensated-button")
    expect(page.locator("#resolved-note .badge")).to_have_text("compensated")
    assert Operation.objects.get(pk=operation.pk).status == "compensated"
