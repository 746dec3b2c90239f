"""The trace the run page reads: every span of the run's traces, per-step usage and cost, and
the compact rows the browser draws (static/runs/waterfall.js; its layout is tested in
tests/browser/test_runs.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from runs.models import ModelPrice, Span
from runs.pricing import PriceBook
from runs.services import task_create
from runs.waterfall import payload, summarize, trace_rows, trace_state

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def span(task, span_id: str, parent: str, start_ms: float, end_ms: float, *, tenant_id=None, trace: str = "a" * 32,
         linked: bool = True, **fields) -> Span:
    return Span.objects.create(
        tenant_id=tenant_id or task.tenant_id, trace_id=trace, span_id=span_id, parent_span_id=parent,
        name=f"span {span_id}", start_time=T0 + timedelta(milliseconds=start_ms),
        end_time=T0 + timedelta(milliseconds=end_ms), duration_ms=end_ms - start_ms,
        task=task if linked else None, **fields)


@pytest.fixture
def run(agent):
    ModelPrice.objects.create(model="gpt-x", input_per_million=Decimal("2"), output_per_million=Decimal("8"),
                              valid_from=T0 - timedelta(days=1))
    task = task_create(principal=agent, task_type="refund", goal="g")
    span(task, "0000000000000001", "", 0, 1000)
    span(task, "0000000000000002", "0000000000000001", 10, 400, step_id="plan")
    span(task, "0000000000000003", "0000000000000002", 20, 300, step_id="plan", gen_ai_model="gpt-x",
         input_tokens=1000, output_tokens=100)
    span(task, "0000000000000004", "0000000000000002", 310, 390, step_id="plan", status_code="error")
    span(task, "0000000000000005", "0000000000000001", 500, 900, step_id="refund", gen_ai_model="gpt-x",
         gen_ai_response_model="gpt-x-unpriced", input_tokens=500, output_tokens=50)
    # A child the agent did not tag: in the trace and the run's total, but in no step.
    span(task, "0000000000000006", "0000000000000005", 600, 950, linked=False, gen_ai_model="other-model",
         input_tokens=10, output_tokens=10)
    return task


def test_the_trace_holds_untagged_children_but_not_another_tenants_spans(run, outsider_agent):
    other = task_create(principal=outsider_agent, task_type="refund", goal="g")
    span(other, "0000000000000099", "", 0, 5, tenant_id=other.tenant_id)  # same trace id, other tenant
    rows = trace_rows(run)
    assert [r.span_id[-1] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    assert trace_state(run) == (6, max(r.id for r in rows))
    assert [r.span_id[-1] for r in trace_rows(run, after=rows[3].id)] == ["5", "6"]


def test_usage_cost_and_latency_per_step_and_for_the_run(run):
    summary, costs = summarize(run, trace_rows(run), PriceBook.for_tenants([run.tenant_id]))
    steps = dict(summary.steps)
    assert list(steps) == ["plan", "refund"]
    plan, refund = steps["plan"], steps["refund"]
    assert (plan.spans, plan.errors, plan.input_tokens, plan.output_tokens) == (3, 1, 1000, 100)
    assert plan.cost == {"USD": Decimal("0.0028")}  # 1,000 × 2/1M + 100 × 8/1M
    assert plan.latency_ms == pytest.approx(390)  # 10 ms to 400 ms: the step's wall clock
    # The answering model has no price, the requested one has: priced as requested.
    assert refund.cost == {"USD": Decimal("0.0014")} and refund.latency_ms == pytest.approx(400)
    total = summary.total
    assert (total.spans, total.errors, total.input_tokens, total.output_tokens) == (6, 1, 1510, 160)
    assert total.cost == {"USD": Decimal("0.0042")} and total.unpriced_tokens == 20
    assert total.latency_ms == pytest.approx(1000)
    assert [c and c[1] for c in costs] == [None, None, Decimal("0.0028"), None, Decimal("0.0014"), None]


def test_the_compact_rows_carry_what_the_waterfall_draws(run):
    rows = trace_rows(run)
    _, costs = summarize(run, rows, PriceBook.for_tenants([run.tenant_id]))
    third = payload(rows, costs)[2]
    assert third == [rows[2].id, "0000000000000003", "0000000000000002", "span 0000000000000003",
                     pytest.approx(T0.timestamp() * 1000 + 20, abs=0.05), 280.0, 0, "gpt-x", "plan", 1000, 100,
                     "USD 0.002800"]
    assert payload(rows, costs)[3][6] == 1  # the error
    assert payload(rows, costs)[4][7] == "gpt-x-unpriced"  # the model that answered is shown
