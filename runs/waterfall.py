"""A run's trace for the run page.

The server reads the spans of the run's traces as plain tuples and sends them to the browser as
compact rows; static/runs/waterfall.js lays out the tree and the time axis, marks errors and the
critical path, and collapses large subtrees. While the run is active the page asks only for
spans it has not seen (`after` = the highest span row id it holds) and appends them, so a
2,000-span trace is neither re-rendered nor re-sent every few seconds.

Row ids are a cursor with one gap: two ingest transactions may commit out of id order, so a
span may appear below the cursor after the client moved past it. The client therefore compares
the count it holds with `total` and asks for everything again when they differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import NamedTuple

from django.db.models import Count, FloatField, Func, Max

from runs.models import Span, Task
from runs.pricing import PriceBook, Usage

MAX_SPANS = 5000


class EpochMs(Func):
    """A timestamp as float milliseconds since 1970, computed by the database: decoding 2,000
    timestamps into Python datetimes took about half of the page's read."""

    output_field = FloatField()

    def as_sql(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection,
                              template="CAST(EXTRACT(EPOCH FROM %(expressions)s) * 1000 AS double precision)", **extra)

    def as_sqlite(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection,
                              template="((julianday(%(expressions)s) - 2440587.5) * 86400000.0)", **extra)


class Row(NamedTuple):
    id: int
    span_id: str
    parent_span_id: str
    name: str
    start_ms: float
    duration_ms: float
    status_code: str
    gen_ai_model: str
    gen_ai_response_model: str
    step_id: str
    task_id: str | None
    input_tokens: int | None
    output_tokens: int | None

    @property
    def started_at(self) -> datetime:
        return datetime.fromtimestamp(self.start_ms / 1000, tz=UTC)


def trace_spans(task: Task):
    """Every span of every trace the run has a span in: an agent's child spans often carry no
    `countersign.task_id` of their own."""
    return Span.objects.filter(tenant_id=task.tenant_id,
                               trace_id__in=Span.objects.filter(task=task).values("trace_id"))


def trace_state(task: Task) -> tuple[int, int]:
    """(spans, highest row id): changes whenever a span of the run's traces arrives."""
    stats = trace_spans(task).aggregate(n=Count("id"), last=Max("id"))
    return stats["n"], stats["last"] or 0


def trace_rows(task: Task, *, after: int = 0) -> list[Row]:
    spans = trace_spans(task)
    if after:
        spans = spans.filter(id__gt=after).order_by("id")
    else:
        spans = spans.order_by("start_time", "id")
    columns = [EpochMs("start_time") if name == "start_ms" else name for name in Row._fields]
    return [Row(*values) for values in spans.values_list(*columns)[:MAX_SPANS]]


@dataclass
class TraceSummary:
    steps: list[tuple[str, Usage]]
    total: Usage


def summarize(task: Task, rows: list[Row], book: PriceBook) -> tuple[TraceSummary, list[tuple[str, Decimal] | None]]:
    """Per step (the run's own spans that name a step) and for the whole trace: spans, errors,
    tokens, cost and wall-clock latency. Also each row's cost, in the order of `rows`."""
    steps: dict[str, Usage] = {}
    total = Usage()
    costs = []
    for row in rows:
        cost = None
        if row.input_tokens is not None or row.output_tokens is not None:
            cost = book.cost(tenant_id=task.tenant_id, request_model=row.gen_ai_model,
                             response_model=row.gen_ai_response_model, at=row.started_at,
                             input_tokens=row.input_tokens, output_tokens=row.output_tokens)
        costs.append(cost)
        usage = dict(start=row.start_ms, end=row.start_ms + row.duration_ms,
                     error=row.status_code == Span.StatusCode.ERROR,
                     input_tokens=row.input_tokens, output_tokens=row.output_tokens, cost=cost)
        total.add(**usage)
        if row.step_id and row.task_id == task.task_id:
            steps.setdefault(row.step_id, Usage()).add(**usage)
    ordered = sorted(steps.items(), key=lambda item: (item[1].start, item[0]))
    return TraceSummary(steps=ordered, total=total), costs


def payload(rows: list[Row], costs: list[tuple[str, Decimal] | None]) -> list[list]:
    """One short array per span (see FIELDS in waterfall.js): about a quarter of the HTML a
    server-rendered row took."""
    out = []
    for row, cost in zip(rows, costs, strict=True):
        out.append([
            row.id, row.span_id, row.parent_span_id, row.name,
            round(row.start_ms, 3), round(row.duration_ms, 3),
            1 if row.status_code == Span.StatusCode.ERROR else 0,
            row.gen_ai_response_model or row.gen_ai_model, row.step_id,
            row.input_tokens, row.output_tokens,
            f"{cost[0]} {cost[1]:.6f}" if cost else None,
        ])
    return out
