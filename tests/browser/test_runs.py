"""Runs and dashboard in a real browser, served over ASGI so the live views work."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.models import Role
from ledger.decisions import lease_acquire
from ledger.models import OperationStatus as S
from runs.defaults import ensure_release_gates
from runs.services import task_create, task_transition
from tests.conftest import make_user
from tests.factories import make_operation

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(page, base_url: str, username: str) -> None:
    page.goto(base_url + "/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()


def test_a_run_page_follows_the_run_live(asgi_server, page, screenshot, agent, tenant):
    make_user("watcher", tenant, Role.REVIEWER, max_tier=3)
    task = task_create(principal=agent, task_type="refund", goal="Refund 30 EUR on ord-7")
    lease = lease_acquire(task_id=task.task_id, owner="w1", ttl_seconds=300)
    log_in(page, asgi_server.url, "watcher")
    page.goto(f"{asgi_server.url}/runs/{task.task_id}/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")
    expect(page.locator("#run-status")).to_contain_text("queued")

    task = task_transition(task_id=task.task_id, to="planning", expected_version=1,
                           fencing_token=lease.fencing_token, actor="agent")
    task_transition(task_id=task.task_id, to="running", expected_version=2,
                    fencing_token=lease.fencing_token, actor="agent")
    expect(page.locator("#run-status")).to_contain_text("running")
    expect(page.locator("#run-status")).to_contain_text("version 3")
    expect(page.locator("#run-timeline li")).to_have_count(3)

    operation = make_operation(agent, task=task, status=S.CONFIRMED)
    expect(page.locator(f"#run-op-{operation.operation_id}")).to_contain_text("confirmed")

    from ledger.decisions import approval_invalidate
    from tests.factories import make_approval_request

    approval = make_approval_request(make_operation(agent, task=task))
    expect(page.locator(f"#run-approval-{approval.approval_id}")).to_contain_text("pending")
    approval_invalidate(approval_id=approval.approval_id, actor="system", reason="the task moved on")
    expect(page.locator(f"#run-approval-{approval.approval_id}")).to_contain_text("invalidated")
    screenshot(page, "run-detail")


def test_the_dashboard_draws_its_chart_and_gates(asgi_server, page, screenshot, agent, tenant):
    make_user("watcher", tenant, Role.REVIEWER, max_tier=3)
    ensure_release_gates()
    make_operation(agent, status=S.CONFIRMED)
    make_operation(agent, status=S.UNKNOWN)
    from runs.models import Task, TaskStatus

    for status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.SUCCEEDED):  # one task, three trials
        trial = task_create(principal=agent, task_type="refund", goal="Refund ord-9", inputs={"order_id": "ord-9"})
        Task.objects.filter(pk=trial.pk).update(status=status)
    log_in(page, asgi_server.url, "watcher")
    for chart in ("#ops-chart", "#rates-chart", "#trials-chart"):
        expect(page.locator(chart)).to_have_attribute("data-rendered", "true")
        expect(page.locator(f"{chart} canvas")).to_have_count(1)
    expect(page.locator("#rates-chart")).to_contain_text("terminal success")
    expect(page.locator("#trials-chart")).to_contain_text("pass^k")
    expect(page.get_by_text("Zero duplicate side effects")).to_be_visible()
    screenshot(page, "dashboard")


def bulk_trace(task, *, steps: int, per_step: int, first: int = 1, t0=None) -> None:
    """A root, `steps` step spans under it and `per_step` spans under each step."""
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Span

    t0 = t0 or timezone.now() - timedelta(minutes=5)
    rows, n = [], first

    def add(parent: str, start_ms: float, length_ms: float, name: str, **fields) -> str:
        nonlocal n
        span_id = f"{n:016x}"
        n += 1
        rows.append(Span(tenant_id=task.tenant_id, trace_id="e" * 32, span_id=span_id, parent_span_id=parent,
                         name=name, start_time=t0 + timedelta(milliseconds=start_ms),
                         end_time=t0 + timedelta(milliseconds=start_ms + length_ms), duration_ms=length_ms,
                         task=task, **fields))
        return span_id

    root = add("", 0, steps * 1000 + 10, "invoke_agent")
    for s in range(steps):
        step = add(root, s * 1000, 990, f"step {s}", step_id=f"step-{s}")
        for c in range(per_step):
            add(step, s * 1000 + c * 9, 8, f"chat {s}.{c}", step_id=f"step-{s}", gen_ai_model="gpt-x",
                input_tokens=100, output_tokens=10, status_code="error" if (s, c) == (3, 7) else "unset")
    Span.objects.bulk_create(rows)


def test_a_2000_span_run_page_loads_collapsed_and_appends_live_spans(asgi_server, page, screenshot, agent, tenant):
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Span

    make_user("watcher", tenant, Role.REVIEWER, max_tier=3)
    task = task_create(principal=agent, task_type="refund", goal="A long run")
    bulk_trace(task, steps=20, per_step=99)  # 1 + 20 + 1,980 = 2,001 spans
    log_in(page, asgi_server.url, "watcher")
    page.goto(f"{asgi_server.url}/runs/{task.task_id}/")
    waterfall = page.locator("#run-waterfall")
    expect(waterfall).to_have_attribute("data-rendered", "2001")
    rows = page.locator("#run-waterfall .waterfall__row")
    expect(rows).to_have_count(21)  # the root open, each 99-span step closed
    step3 = page.locator(f'.waterfall__row[data-span="{2 + 3 * 100:016x}"]')  # root 1, step s at 2 + 100 s
    expect(step3).to_contain_text("+99")
    expect(step3.locator(".badge--failed")).to_contain_text("1")  # it hides an error
    expect(page.locator("#run-trace-summary tfoot")).to_contain_text("2001")

    # Spans arrive while the page is open: one more step with two children.
    now = timezone.now()
    Span.objects.bulk_create([
        Span(tenant_id=task.tenant_id, trace_id="e" * 32, span_id=f"{9000 + i:016x}", name=f"late {i}",
             parent_span_id="0000000000000001" if i == 0 else f"{9000:016x}",
             start_time=now + timedelta(milliseconds=i), end_time=now + timedelta(milliseconds=50),
             duration_ms=50 - i, task=task, step_id="late")
        for i in range(3)
    ])
    expect(waterfall).to_have_attribute("data-rendered", "2004", timeout=15_000)
    expect(rows).to_have_count(24)  # a small new subtree is shown open
    expect(page.locator("#run-trace-summary")).to_contain_text("late")
    # Expanding a step shows its 99 spans, and only those.
    page.locator('button[data-span="0000000000000002"]').click()
    expect(rows).to_have_count(24 + 99)
    expect(page.locator('button[data-span="0000000000000002"]')).to_be_focused()
    screenshot(page, "run-2000-spans")


def test_the_waterfall_marks_the_critical_path_errors_and_orphans(asgi_server, page, agent, tenant):
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Span

    make_user("watcher", tenant, Role.REVIEWER, max_tier=3)
    task = task_create(principal=agent, task_type="refund", goal="Shape")
    t0 = timezone.now() - timedelta(minutes=1)
    shape = [("a", "", 0, 100, "unset"), ("fast", "a", 1, 10, "unset"), ("slow", "a", 2, 95, "unset"),
             ("leaf", "slow", 3, 94, "error"), ("orphan", "missing", 0, 1, "unset")]
    Span.objects.bulk_create([
        Span(tenant_id=task.tenant_id, trace_id="f" * 32, span_id=f"{name:0>16}", name=name,
             parent_span_id=f"{parent:0>16}" if parent else "", start_time=t0 + timedelta(milliseconds=start),
             end_time=t0 + timedelta(milliseconds=end), duration_ms=end - start, status_code=status, task=task)
        for name, parent, start, end, status in shape
    ])
    log_in(page, asgi_server.url, "watcher")
    page.goto(f"{asgi_server.url}/runs/{task.task_id}/")
    rows = page.locator("#run-waterfall .waterfall__row")
    expect(rows).to_have_count(5)
    names = [n.strip() for n in rows.locator(".waterfall__name").all_inner_texts()]
    assert names == ["▾a", "fast", "▾slow", "leaf", "orphan"]
    assert rows.evaluate_all("rs => rs.filter(r => r.classList.contains('is-critical')).map(r => r.dataset.span)") == [
        f"{'a':0>16}", f"{'slow':0>16}", f"{'leaf':0>16}"]
    expect(page.locator(f'.waterfall__row[data-span="{"leaf":0>16}"]')).to_have_class("waterfall__row is-critical is-error")
    expect(page.locator(f'.waterfall__row[data-span="{"orphan":0>16}"]')).to_have_attribute("aria-level", "1")
    expect(page.locator("#run-waterfall-meta")).to_contain_text("critical path 100.0 ms")
