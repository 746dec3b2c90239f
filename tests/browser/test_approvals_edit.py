"""Edit and approve in headless Chromium: the schema-generated form, a schema error shown on
its field, then the edited call's own page linking back to the superseded request."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from approvals.models import ApprovalRequest
from ledger.models import Operation
from tests.browser.test_approvals_inbox import log_in
from tests.ledger.test_decisions_edit import propose

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_reviewer_edits_the_amount_and_approves_the_new_call(live_server, page: Page, screenshot, reviewer, agent):
    original = propose(agent, amount=120)
    log_in(page, live_server.url, "reviewer")
    page.goto(f"{live_server.url}/approvals/{original.approval_id}/")
    page.keyboard.press("e")  # the edit form, from the keyboard
    expect(page).to_have_url(f"{live_server.url}/approvals/{original.approval_id}/edit/")
    expect(page.locator("#id_arg__amount")).to_have_value("120")
    expect(page.locator("#id_arg__currency")).to_have_value("EUR")

    page.fill("#id_arg__amount", "-1")
    page.fill("#id_reason", "only the lid was damaged")
    page.click("#edit-approve-button")
    expect(page.locator(".field--error .field__error")).to_contain_text("-1")
    screenshot(page, "approvals-edit-schema-error")
    assert ApprovalRequest.objects.count() == 1

    page.fill("#id_arg__amount", "80")
    page.click("#edit-approve-button")
    expect(page.locator("#edited-from")).to_contain_text(original.call_id)
    new = ApprovalRequest.objects.get(call_id="call-1-edit-1")
    expect(page).to_have_url(f"{live_server.url}/approvals/{new.approval_id}/")
    expect(page.locator("#approval-status .badge")).to_have_text("approved")
    screenshot(page, "approvals-edit-approved")
    assert Operation.objects.get(pk=new.operation_id).arguments["amount"] == 80
    assert ApprovalRequest.objects.get(pk=original.pk).status == "superseded"

    page.click("#edited-from a")
    expect(page.locator("#superseded-note")).to_contain_text(new.approval_id)
