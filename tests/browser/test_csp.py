"""Every main page under the Content-Security-Policy: the header is sent with a nonce, and the
browser reports no violation (htmx, the live socket, the waterfall, the charts, the API docs)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.models import Role
from ledger.models import OperationStatus
from runs.defaults import ensure_release_gates
from runs.services import task_create
from tests.browser.test_runs import bulk_trace
from tests.conftest import AGENT_TOKEN, make_user
from tests.factories import make_approval_request, make_operation, make_pending_approval

pytestmark = pytest.mark.django_db(transaction=True)


def watch_csp(page) -> list[str]:
    """Violations as the browser reports them: the console line and the DOM event."""
    seen: list[str] = []
    page.on("console", lambda msg: seen.append(msg.text) if "Content Security Policy" in msg.text else None)
    page.expose_function("__cspViolation", lambda text: seen.append(text))
    page.add_init_script(
        "document.addEventListener('securitypolicyviolation', function (e) {"
        " window.__cspViolation(e.violatedDirective + ' ' + e.blockedURI); });")
    return seen


def test_the_main_pages_run_under_the_policy_without_a_violation(asgi_server, page, screenshot, agent, tenant):
    make_user("admin", tenant, Role.REVIEWER, Role.SUPPORT, max_tier=4, is_staff=True, is_superuser=True)
    ensure_release_gates()
    task = task_create(principal=agent, task_type="refund", goal="Refund 30 EUR", inputs={"order_id": "ord-1"})
    bulk_trace(task, steps=2, per_step=2)
    operation = make_operation(agent, task=task)
    approval = make_approval_request(operation)
    unknown = make_operation(agent, status=OperationStatus.UNKNOWN)
    violations = watch_csp(page)

    response = page.goto(asgi_server.url + "/accounts/login/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self' 'nonce-" in policy and "unsafe-inline" not in policy
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    expect(page.locator("#ops-chart")).to_have_attribute("data-rendered", "true")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")

    page.goto(asgi_server.url + "/approvals/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    page.get_by_role("searchbox").fill("refund")  # an htmx request swaps the table
    page.goto(f"{asgi_server.url}/approvals/{approval.approval_id}/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    page.goto(f"{asgi_server.url}/runs/{task.task_id}/")
    expect(page.locator(".waterfall__bar").first).to_be_visible()
    bar = page.locator(".waterfall__bar").first
    assert bar.evaluate("el => el.style.width") not in ("", "0px")
    screenshot(page, "csp-run-waterfall")
    page.goto(asgi_server.url + "/operations/unknown/")
    expect(page.locator(f"#op-{unknown.operation_id}")).to_be_attached()
    page.goto(f"{asgi_server.url}/operations/{unknown.operation_id}/")
    page.goto(asgi_server.url + "/runs/")
    page.goto(asgi_server.url + "/audit/?status=all")
    expect(page.get_by_role("heading", name="Audit review")).to_be_visible()
    page.goto(asgi_server.url + "/admin/")
    expect(page.get_by_role("heading", name="Site administration")).to_be_visible()
    for path in (f"/admin/console/agentprincipal/{agent.pk}/change/", f"/admin/console/tenant/{tenant.pk}/change/",
                 "/admin/approvals/tool/", "/admin/console/event/", "/admin/approvals/budgetcap/add/"):
        page.goto(asgi_server.url + path)
        expect(page.locator("#content")).to_be_visible()
    page.goto(asgi_server.url + "/does-not-exist/")

    docs = page.context.new_page()
    docs_violations = watch_csp(docs)
    docs.set_extra_http_headers({"Authorization": f"Bearer {AGENT_TOKEN}"})
    docs.goto(asgi_server.url + "/api/docs/")
    expect(docs.locator("#redoc-container h1").first).to_be_visible()
    screenshot(docs, "csp-api-docs")
    assert violations == []
    # Redoc's footer links a logo on its CDN: the policy refuses it, which is the point.
    assert [v for v in docs_violations if "cdn.redoc.ly" not in v] == []


def test_a_reviewer_sees_hidden_characters_marked_and_the_pages_own_errors(asgi_server, page, screenshot, agent,
                                                                           tenant):
    make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)
    approval = make_pending_approval(agent, tool_name="mail.send", risk_tier=2, arguments={
        "to": ["ceo@acme.test\u202emoc.live@", "bob@bücher.example"], "subject": "Pay\u200bment due",
        "body": "Hello,\nplease pay."})
    page.goto(asgi_server.url + "/accounts/login/")
    page.get_by_label("Username").fill("reviewer")
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    page.goto(f"{asgi_server.url}/approvals/{approval.approval_id}/")
    expect(page.locator("#hidden-chars-warning")).to_be_visible()
    expect(page.locator("#arguments mark.hidden-char").first).to_be_visible()
    expect(page.locator("#preview")).to_contain_text("xn--bcher-kva.example")
    screenshot(page, "approval-hidden-characters")
    page.goto(asgi_server.url + "/no-such-page/")
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    screenshot(page, "error-404")
