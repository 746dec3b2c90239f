"""The reviewer console in headless Chromium.

The live part needs websockets, so it runs against the shared uvicorn server (`asgi_server`,
tests/asgi.py) on the test database; the rest uses pytest-django's WSGI `live_server`.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from approvals.models import ApprovalRequest
from ledger import decisions
from ledger.models import Operation
from runs.models import Span
from tests.factories import make_pending_approval

pytestmark = pytest.mark.django_db(transaction=True)

@pytest.fixture(autouse=True)
def _fresh_cache():
    """The inbox caches its task-type choices for a minute (per process: the live server's
    too); each test starts without them."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def make_approval(agent):
    def factory(**kwargs):
        return make_pending_approval(agent, **kwargs)

    return factory


def log_in(page: Page, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")
    expect(page.locator(".usermenu__name")).to_have_text(username)


def test_a_new_request_appears_live_and_is_approved_from_the_keyboard(asgi_server, page, screenshot,
                                                                      reviewer, agent, make_approval):
    base = asgi_server.url
    older = make_approval(risk_tier=2, tool_name="mail.send", task_type="notify")
    make_approval(risk_tier=4, ttl_seconds=7200)
    log_in(page, base, "reviewer")
    page.goto(f"{base}/approvals/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    expect(page.locator(f"#approval-{older.approval_id}")).to_be_visible()

    # Committed by the test, outside any request: only the live stream can bring it.
    fresh = make_pending_approval(agent, risk_tier=3, ttl_seconds=600, call_id="call-live-0001")
    row = page.locator(f"#approval-{fresh.approval_id}")
    expect(row).to_be_visible()
    expect(row).to_contain_text("call-live-0001")
    expect(page.locator("#inbox-counts [data-tier='3'] .tier-count__n")).to_have_text("1")
    # The new row went to the top of the table.
    expect(page.locator("#inbox-rows tr").first).to_have_id(f"approval-{fresh.approval_id}")
    expect(row.locator("time[data-countdown]")).to_have_class(re.compile(r"\bcountdown\b"))
    screenshot(page, "approvals-inbox")

    # A request decided elsewhere changes its row in place, without a reload.
    decisions.approval_reject(approval_id=older.approval_id, reviewer=reviewer, reason="not needed")
    decided = page.locator(f"#approval-{older.approval_id}")
    expect(decided.locator(".badge--rejected")).to_have_text("rejected")
    expect(decided.locator("a.btn--primary")).to_have_count(0)
    expect(page.locator("#inbox-total")).to_have_text("2")
    screenshot(page, "approvals-inbox-after-live-decision")

    page.keyboard.press("j")
    expect(row).to_have_class(re.compile(r"\bis-selected\b"))
    page.keyboard.press("j")
    expect(row).not_to_have_class(re.compile(r"\bis-selected\b"))
    expect(page.locator("#inbox-rows tr").nth(1)).to_have_class(re.compile(r"\bis-selected\b"))
    page.keyboard.press("k")
    expect(row).to_have_class(re.compile(r"\bis-selected\b"))
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{base}/approvals/{fresh.approval_id}/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    expect(page.locator("#approve-button")).to_be_visible()
    screenshot(page, "approvals-detail")

    page.keyboard.press("a")
    expect(page.locator("#approval-status .badge")).to_have_text("approved")
    expect(page.locator("#operation-status .badge")).to_have_text("authorized")
    fresh.refresh_from_db()
    assert fresh.status == "approved"
    assert Operation.objects.get(pk=fresh.operation_id).status == "authorized"
    screenshot(page, "approvals-detail-approved")


def test_a_rejection_without_a_reason_is_refused_with_a_visible_message(live_server, page, screenshot,
                                                                          reviewer, make_approval):
    approval = make_approval(risk_tier=3)
    log_in(page, live_server.url, "reviewer")
    page.goto(f"{live_server.url}/approvals/{approval.approval_id}/")
    page.keyboard.press("r")
    expect(page.locator("#reject-reason")).to_be_focused()
    page.click("#reject-button")
    error = page.locator("#reject-reason-error")
    expect(error).to_be_visible()
    expect(error).to_have_text("A rejection needs a reason.")
    expect(page.locator("#reject-reason")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#reject-reason")).to_be_focused()
    screenshot(page, "approvals-detail-reject-refused")
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert ApprovalRequest.objects.get(pk=approval.pk).decisions.count() == 0

    page.fill("#reject-reason", "Wrong order number")
    page.click("#reject-button")
    expect(page.locator("#approval-status .badge")).to_have_text("rejected")


def test_filters_swap_the_table_and_update_the_address(live_server, page, screenshot, reviewer, make_approval):
    refund = make_approval(risk_tier=3)
    mail = make_approval(tool_name="mail.send", risk_tier=2, task_type="notify")
    log_in(page, live_server.url, "reviewer")
    page.goto(f"{live_server.url}/approvals/")
    expect(page.locator(f"#approval-{refund.approval_id}")).to_be_visible()
    page.select_option("#id_tool", "mail.send")
    expect(page.locator(f"#approval-{refund.approval_id}")).to_have_count(0)
    expect(page.locator(f"#approval-{mail.approval_id}")).to_be_visible()
    expect(page).to_have_url(re.compile(r"tool=mail\.send"))
    page.keyboard.press("/")
    expect(page.locator("#id_q")).to_be_focused()

    # The agent's trace so far, drawn read-only by the run page's waterfall.
    now = timezone.now()
    for n, (name, parent, start, end) in enumerate([("agent run", "", 0, 900), ("plan", "1", 20, 300),
                                                     ("chat gpt-x", "2", 40, 280), ("tool call mail.send", "1", 320, 880)],
                                                    start=1):
        Span.objects.create(tenant_id=mail.tenant_id, trace_id="a" * 32, span_id=f"{n:016x}",
                            parent_span_id=f"{int(parent):016x}" if parent else "", name=name,
                            start_time=now + timedelta(milliseconds=start), end_time=now + timedelta(milliseconds=end),
                            duration_ms=end - start, task=mail.task if n == 1 else None)
    page.goto(f"{live_server.url}/approvals/{mail.approval_id}/")
    expect(page.locator("#run-waterfall .waterfall__row")).to_have_count(4)
    expect(page.locator("#run-trace-summary")).to_contain_text("4 spans")
    preview = page.locator("#preview")
    expect(preview).to_contain_text("The email as it will be sent")
    expect(preview).to_contain_text("customer@example.com")
    screenshot(page, "approvals-detail-mail")


def test_the_detail_page_follows_a_decision_made_elsewhere(asgi_server, page, screenshot, reviewer, senior,
                                                           make_approval):
    base = asgi_server.url
    l4 = make_approval(risk_tier=4)
    log_in(page, base, "reviewer")
    page.goto(f"{base}/approvals/{l4.approval_id}/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    expect(page.locator("#needs-higher")).to_contain_text("needs an L4 reviewer")
    expect(page.locator("#approve-button")).to_have_count(0)
    screenshot(page, "approvals-detail-needs-l4")
    # No button, and a hand-made POST from this logged-in page (its session, its CSRF token) is
    # refused as well.
    status = page.evaluate("""(url) => fetch(url, {method: "POST", credentials: "same-origin",
        headers: {"X-CSRFToken": document.querySelector('meta[name=csrf-token]').content,
                  "Content-Type": "application/x-www-form-urlencoded"},
        body: "reason=looks+fine"}).then(r => r.status)""", f"/approvals/{l4.approval_id}/approve/")
    assert status == 403
    l4.refresh_from_db()
    assert (l4.status, l4.decisions.count()) == ("pending", 0)

    decisions.approval_approve(approval_id=l4.approval_id, reviewer=senior, reason="first of two")
    expect(page.locator("#approval-status")).to_contain_text("1 of 2 approvals")
    expect(page.locator("#decisions")).to_contain_text("senior approved")
    decisions.approval_reject(approval_id=l4.approval_id, reviewer=make_senior2(), reason="amount wrong")
    expect(page.locator("#approval-status .badge")).to_have_text("rejected")
    expect(page.locator("#operation-status .badge")).to_have_text("rejected")
    expect(page.locator("#decision-panel")).to_contain_text("nothing left to decide")


def make_senior2():
    from console.models import Role, Tenant
    from tests.conftest import make_user

    return make_user("senior2", Tenant.objects.get(slug="acme"), Role.REVIEWER, max_tier=4)


def test_the_inbox_fits_a_phone(live_server, new_page, screenshot, reviewer, make_approval):
    make_approval(risk_tier=3)
    make_approval(risk_tier=4)
    page = new_page(viewport=(390, 844))
    log_in(page, live_server.url, "reviewer")
    page.goto(f"{live_server.url}/approvals/")
    # Nothing in the page's content but the table's own scroller is wider than the screen
    # (the shared top bar is the shell's business).
    assert wider_than_the_screen(page, ".table-wrap") == []
    screenshot(page, "approvals-inbox-phone")

    detail = ApprovalRequest.objects.filter(risk_tier=3).get()
    page.goto(f"{live_server.url}/approvals/{detail.approval_id}/")
    expect(page.locator("#approve-button")).to_be_visible()
    assert wider_than_the_screen(page, ".table-wrap, .waterfall, pre") == []
    screenshot(page, "approvals-detail-phone")


def wider_than_the_screen(page: Page, scrollers: str) -> list[str]:
    """Elements of the page's content reaching past the viewport's right edge, except inside
    the given scrolling containers."""
    return page.evaluate("""(scrollers) => [...document.querySelectorAll('#main *')]
        .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
        .filter(e => !e.closest(scrollers))
        .map(e => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))""",
                         scrollers)
