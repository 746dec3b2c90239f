"""The release gates on the dashboard in a real browser: every split with its bar against the
threshold, failing splits marked, and the misexecution it found one click away."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import Role
from ledger import services as ledger_services
from ledger.models import OperationStatus as S
from runs.defaults import ensure_release_gates
from runs.models import ReleaseGate, Task, TaskStatus
from tests.browser.test_runs import log_in
from tests.conftest import make_user
from tests.factories import make_operation, make_task

pytestmark = pytest.mark.django_db(transaction=True)


def finished(agent, release: str, seconds: float, task_type: str) -> Task:
    task = make_task(agent, task_type=task_type, versions={"release": release})
    start = timezone.now() - timedelta(minutes=20)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.SUCCEEDED, created_at=start,
                                           updated_at=start + timedelta(seconds=seconds))
    return task


def test_the_gates_show_each_split_against_its_threshold(asgi_server, page, screenshot, agent, tenant):
    make_user("watcher", tenant, Role.REVIEWER, max_tier=3)
    ensure_release_gates()
    for i in range(1, 11):
        finished(agent, "2026.11", 60 + i, "refund")
        finished(agent, "2026.11", 30 + i, "contract_email")
    for i in range(1, 11):
        refund = finished(agent, "2026.12", (60 + i) * 1.3, "refund")  # 30% slower
        finished(agent, "2026.12", 30 + i, "contract_email")
        make_operation(agent, status=S.CONFIRMED, task=refund)
    unapproved = make_operation(agent, status=S.CONFIRMED, risk_tier=3)  # ran at L3 with no approval
    manual = make_operation(agent, "mail.send", status=S.MANUAL)
    ledger_services.operation_fail(operation_id=manual.operation_id, actor="user:support", reason="no effect",
                                   evidence={"query": "absent"})
    Task.objects.filter(pk=manual.task_id).update(status=TaskStatus.SUCCEEDED, updated_at=timezone.now())

    log_in(page, asgi_server.url, "watcher")
    gates = page.locator("#release-gates")
    expect(gates.locator("#release-current")).to_have_text("2026.12")
    expect(gates.locator("#release-previous")).to_have_text("2026.11")
    time_gate = ReleaseGate.objects.get(indicator="task_time_p95_change")
    rows = page.locator(f"#gate-{time_gate.pk} tr.gate__split")
    expect(rows).to_have_count(2)
    expect(rows.filter(has_text="refund")).to_have_attribute("data-passed", "fail")
    expect(rows.filter(has_text="refund")).to_contain_text("+30.0%")
    expect(rows.filter(has_text="contract_email")).to_have_attribute("data-passed", "pass")
    expect(page.locator(f"#gate-{time_gate.pk} svg.gate-bar")).to_have_count(2)
    expect(page.locator(f"#gate-{time_gate.pk} .gate-bar__value--fail")).to_have_count(1)

    misexecution = ReleaseGate.objects.get(indicator="high_risk_misexecutions")
    found = page.locator(f"#gate-{misexecution.pk}")
    expect(found.locator("tr.gate__split")).to_have_attribute("data-passed", "fail")
    expect(found).to_contain_text("no consumed approval")
    gates.scroll_into_view_if_needed()
    screenshot(page, "release-gates")
    found.get_by_role("link", name=unapproved.operation_id).click()
    expect(page).to_have_url(f"{asgi_server.url}/operations/{unapproved.operation_id}/")
