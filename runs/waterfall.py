"""A trace as a person reads it: a tree of spans on one time axis, errors marked, and the
critical path (the chain of spans that decided when the run finished)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from runs.models import Span


@dataclass
class Bar:
    span: Span
    depth: int
    offset_pct: float
    width_pct: float
    critical: bool = False
    children: list[Bar] = field(default_factory=list)


@dataclass
class Waterfall:
    bars: list[Bar]
    total_ms: float
    critical_ms: float
    errors: int


def build_waterfall(spans: list[Span]) -> Waterfall:
    if not spans:
        return Waterfall(bars=[], total_ms=0.0, critical_ms=0.0, errors=0)
    t0 = min(s.start_time for s in spans)
    t1 = max(s.end_time for s in spans)
    total_ms = max((t1 - t0).total_seconds() * 1000, 0.001)
    ids = {s.span_id for s in spans}
    children: dict[str, list[Span]] = defaultdict(list)
    roots: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start_time, s.span_id)):
        if span.parent_span_id and span.parent_span_id in ids and span.parent_span_id != span.span_id:
            children[span.parent_span_id].append(span)
        else:
            roots.append(span)  # a root, or an orphan whose parent never arrived

    def bar_for(span: Span, depth: int) -> Bar:
        offset = (span.start_time - t0).total_seconds() * 1000 / total_ms * 100
        width = max(span.duration_ms / total_ms * 100, 0.2)
        return Bar(span=span, depth=depth, offset_pct=round(offset, 3), width_pct=round(min(width, 100 - offset), 3))

    bars: list[Bar] = []
    stack = [(root, 0) for root in reversed(roots)]
    by_id: dict[str, Bar] = {}
    seen: set[str] = set()
    while stack:  # iterative: a 2,000-span trace must not hit the recursion limit
        span, depth = stack.pop()
        if span.span_id in seen:
            continue
        seen.add(span.span_id)
        bar = bar_for(span, depth)
        by_id[span.span_id] = bar
        bars.append(bar)
        stack.extend((child, depth + 1) for child in reversed(children.get(span.span_id, [])))

    # Critical path: from the root that ends last, repeatedly the child that ends last.
    critical_ms = 0.0
    current = max(roots, key=lambda s: s.end_time)
    critical_ms = current.duration_ms
    while current is not None:
        by_id[current.span_id].critical = True
        kids = children.get(current.span_id, [])
        current = max(kids, key=lambda s: s.end_time) if kids else None
    return Waterfall(bars=bars, total_ms=total_ms, critical_ms=critical_ms,
                     errors=sum(1 for s in spans if s.status_code == Span.StatusCode.ERROR))
