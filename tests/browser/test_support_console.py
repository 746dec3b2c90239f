"""The support console in headless Chromium, against uvicorn (ASGI, websockets) started here on
a free port against the test database, with Celery tasks run eagerly in the server process and a
real payments sandbox as the provider."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from console.models import Event, Role
from ledger import services as ledger_services
from ledger.models import Operation, OperationStatus
from sandbox.process import SandboxProcess
from tests.asgi import AsgiServer
from tests.conftest import make_user
from tests.fixtures.support import (
    age_last_attempt,
    make_operation,
    make_unknown,
    record_answer,
    refund_at_provider,
)

S = OperationStatus
pytestmark = pytest.mark.django_db(transaction=True)

@pytest.fixture(scope="module")
def payments() -> Iterator[SandboxProcess]:
    with SandboxProcess.start("payments", hang_seconds=1, die_with_parent=True) as proc:
        yield proc


@pytest.fixture
def support2(tenant):
    return make_user("support2", tenant, Role.SUPPORT, email="support2@example.com")


@pytest.fixture
def support_server(transactional_db, payments) -> Iterator[str]:
    """uvicorn serving console.asgi against the test database; Celery tasks run eagerly inside
    it (no worker needed), and the payments adapter talks to the test's sandbox."""
    server = AsgiServer(env={
        "CELERY_BROKER_URL": "memory://",
        "CELERY_TASK_ALWAYS_EAGER": "true",
        "SANDBOX_PAYMENTS_URL": payments.base_url,
    }).start()
    try:
        yield server.url
    finally:
        server.stop()


def log_in(page: Page, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("button[type=submit]")
    expect(page.locator(".usermenu__name")).to_have_text(username)


def some_history(agent, support_user) -> None:
    """Yesterday's work, for the figures: two recovered by the reconciler, one by a person."""
    for _ in range(2):
        op = make_operation(agent)
        ledger_services.operation_confirm(operation_id=op.operation_id, receipt={"remote_id": "re_auto"},
                                          actor="system:reconciler", reason="the provider has the effect")
    op = make_operation(agent)
    age_last_attempt(op)
    record_answer(op, "absent")
    ledger_services.operation_fail(operation_id=op.operation_id, actor="user:support", reason="no effect",
                                   evidence={"answer": "absent"})


def test_support_resolves_an_unknown_refund_with_the_providers_receipt_live(
        support_server, new_page, screenshot, agent, support_user, support2, payments):
    some_history(agent, support_user)
    waiting = make_operation(agent, status=S.MANUAL, call_id="call-older-0001")
    queue = new_page()
    log_in(queue, support_server, "support")
    queue.goto(f"{support_server}/operations/unknown/")
    expect(queue.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    expect(queue.locator(f"#op-{waiting.operation_id}")).to_be_visible()
    expect(queue.locator("#figure-recovery [data-figure='automatic']")).to_have_text("2")
    expect(queue.locator("#figure-recovery [data-figure='by-person']")).to_have_text("1")

    # The outcome of a refund becomes unknown outside any request: only the stream can bring it.
    operation = make_operation(agent, status=S.AUTHORIZED, call_id="call-live-0042")
    make_unknown(operation)
    row = queue.locator(f"#op-{operation.operation_id}")
    expect(row).to_be_visible()
    expect(row).to_contain_text("call-live-0042")
    expect(row).to_contain_text("timeout ReadTimeout")
    expect(queue.locator("#unknown-rows tr").last).to_have_id(f"op-{operation.operation_id}")
    expect(queue.locator("#queue-counts [data-status='unknown'] .status-tab__n")).to_have_text("1")
    expect(queue.locator("#figure-unknown-now .stat__value")).to_have_text("1")
    screenshot(queue, "support-queue")

    # The lost attempt had in fact committed at the provider.
    refund = refund_at_provider(payments, operation)

    detail = queue.context.new_page()
    detail.goto(f"{support_server}/operations/{operation.operation_id}/")
    expect(detail.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    expect(detail.locator("#op-status .badge")).to_have_text("unknown")
    expect(detail.locator("#retry-button")).to_be_disabled()
    detail.click("#query-button")
    expect(detail.locator("#query-status")).to_contain_text("Asked the provider")
    expect(detail.locator("#op-provider .answer--latest .answer__state")).to_have_text("found")
    expect(detail.locator("#op-provider")).to_contain_text(refund["id"])
    expect(detail.locator("#op-timeline")).to_contain_text("Provider answered")
    screenshot(detail, "support-detail")

    detail.fill("#id_remote_id", refund["id"])
    detail.fill("#id_reason", "The provider has the refund under our key")
    detail.click("#confirm-button")
    expect(detail.locator("#op-status .badge")).to_have_text("confirmed")
    expect(detail.locator("#resolved-note")).to_contain_text("confirmed by user:support")
    expect(detail.locator("#op-receipt")).to_contain_text(refund["id"])

    # …and it left the queue without a reload.
    expect(row).to_have_count(0)
    expect(queue.locator(f"#op-{waiting.operation_id}")).to_be_visible()
    expect(queue.locator("#figure-recovery [data-figure='by-person']")).to_have_text("2")
    screenshot(detail, "support-detail-confirmed")

    operation.refresh_from_db()
    assert operation.status == S.CONFIRMED
    assert operation.receipt["remote_id"] == refund["id"]
    assert Event.objects.filter(entity="provider_query", entity_id=operation.operation_id, to_status="found").count() == 1
    assert Operation.objects.get(pk=waiting.pk).status == S.MANUAL


def test_a_second_person_acting_on_a_resolved_operation_sees_who_did_it(
        support_server, new_page, screenshot, agent, support_user, support2):
    operation = make_operation(agent)
    age_last_attempt(operation)
    record_answer(operation, "absent")
    page = new_page()
    log_in(page, support_server, "support2")
    page.goto(f"{support_server}/operations/{operation.operation_id}/")
    expect(page.locator("#retry-button")).to_be_enabled()
    page.fill("#id_retry-reason", "The provider has nothing for this key")

    # What the person's browser is about to send (their click is already on its way).
    action = page.get_attribute("#retry-form", "action")
    csrf = page.input_value("#retry-form [name=csrfmiddlewaretoken]")
    ledger_services.operation_fail(operation_id=operation.operation_id, actor="user:support",
                                   reason="no effect", evidence={"answer": "absent"})
    # The live view may already have replaced the form; the submit must still get a plain
    # answer, not a second action. Build it detached from the (possibly swapped) page.
    page.evaluate("""([action, csrf]) => {
        const form = document.createElement("form");
        form.method = "post";
        form.action = action;
        for (const [name, value] of [["csrfmiddlewaretoken", csrf],
                                     ["retry-reason", "The provider has nothing for this key"]]) {
            const input = document.createElement("input");
            input.type = "hidden"; input.name = name; input.value = value;
            form.appendChild(input);
        }
        document.body.appendChild(form);
        form.submit();
    }""", [action, csrf])
    expect(page.locator("#action-error")).to_contain_text("Already resolved by user:support")
    expect(page.locator("#op-status .badge")).to_have_text("failed")
    screenshot(page, "support-detail-conflict")
    assert Operation.objects.get(pk=operation.pk).status == S.FAILED


def test_filters_swap_the_table_and_the_live_stream_follows_them(support_server, new_page, screenshot, agent,
                                                                 support_user):
    refund = make_operation(agent, call_id="call-refund-0001")
    mail = make_operation(agent, tool_name="mail.send", status=S.MANUAL, call_id="call-mail-0001")
    page = new_page()
    log_in(page, support_server, "support")
    page.goto(f"{support_server}/operations/unknown/")
    expect(page.locator(f"#op-{refund.operation_id}")).to_be_visible()
    page.select_option("#id_tool", "mail.send")
    expect(page.locator(f"#op-{refund.operation_id}")).to_have_count(0)
    expect(page.locator(f"#op-{mail.operation_id}")).to_be_visible()
    expect(page).to_have_url(re.compile(r"tool=mail\.send"))
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")

    # New arrivals are inserted only when they match the filters on screen.
    new_refund = make_operation(agent, status=S.AUTHORIZED)
    new_mail = make_operation(agent, tool_name="mail.send", status=S.AUTHORIZED)
    make_unknown(new_refund)
    make_unknown(new_mail)
    expect(page.locator(f"#op-{new_mail.operation_id}")).to_be_visible()
    expect(page.locator(f"#op-{new_refund.operation_id}")).to_have_count(0)
    expect(page.locator("#queue-counts [data-status='unknown'] .status-tab__n")).to_have_text("3")  # all tools
    screenshot(page, "support-queue-filtered")
