"""Links the agent's own spans to Countersign's records. The span ingest reads
`countersign.task_id`, `countersign.step_id`, `countersign.operation_id` and the GenAI
convention's `gen_ai.tool.call.id` (the call ID); `countersign.call_id` is set too, for readers
of the agent's own traces."""

from __future__ import annotations

from typing import Any


def link_span(*, task_id: str, step_id: str | None = None, call_id: str | None = None,
              operation_id: str | None = None, tool: str | None = None, span: Any = None) -> Any:
    """Sets the link attributes on `span` (default: the current span). Returns the span; None
    when no span is given and OpenTelemetry is not installed (nothing traces, nothing to link)."""
    if span is None:
        try:
            from opentelemetry import trace
        except ImportError:
            return None
        span = trace.get_current_span()
    attributes = {"countersign.task_id": task_id, "countersign.step_id": step_id,
                  "countersign.call_id": call_id, "gen_ai.tool.call.id": call_id,
                  "countersign.operation_id": operation_id, "gen_ai.tool.name": tool}
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(key, value)
    return span
