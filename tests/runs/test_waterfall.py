"""The waterfall: tree order, depth, positions on one axis, the critical path."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from runs.models import Span
from runs.waterfall import build_waterfall

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def span(span_id: str, parent: str, start_ms: float, end_ms: float, status: str = "unset") -> Span:
    return Span(trace_id="t" * 32, span_id=span_id, parent_span_id=parent, name=span_id,
                start_time=T0 + timedelta(milliseconds=start_ms), end_time=T0 + timedelta(milliseconds=end_ms),
                duration_ms=end_ms - start_ms, status_code=status)


def test_it_orders_spans_as_a_tree_with_depths():
    wf = build_waterfall([span("c", "a", 10, 20), span("a", "", 0, 100), span("b", "a", 5, 90),
                          span("d", "b", 6, 80)])
    assert [(b.span.span_id, b.depth) for b in wf.bars] == [("a", 0), ("b", 1), ("d", 2), ("c", 1)]


def test_positions_share_one_time_axis():
    wf = build_waterfall([span("a", "", 0, 100), span("b", "a", 50, 100)])
    b = wf.bars[1]
    assert (b.offset_pct, b.width_pct) == (50.0, 50.0)
    assert wf.total_ms == 100


def test_the_critical_path_follows_the_child_that_ends_last():
    wf = build_waterfall([span("a", "", 0, 100), span("fast", "a", 1, 10), span("slow", "a", 2, 95),
                          span("leaf", "slow", 3, 94, status="error")])
    assert {b.span.span_id for b in wf.bars if b.critical} == {"a", "slow", "leaf"}
    assert wf.errors == 1 and wf.critical_ms == 100


def test_orphans_are_shown_as_roots_and_a_deep_trace_does_not_recurse():
    chain = [span(f"{i:016x}", f"{i - 1:016x}" if i else "", i, 5000 - i) for i in range(2000)]
    wf = build_waterfall([*chain, span("orphan", "missing", 0, 1)])
    assert len(wf.bars) == 2001
    assert max(b.depth for b in wf.bars) == 1999


def test_an_empty_trace_is_empty():
    assert build_waterfall([]).bars == []
