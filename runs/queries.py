"""The runs app's statements written by hand, named from the models' `_meta`.

Each statement's `Shape` (what it reads and writes, by model and field) is in `SHAPES`, by
name; tests/console/test_queries.py checks every statement against it and runs it once.
"""

from __future__ import annotations

from console.lib import sql
from runs.models import Span

# The span fields `runs.spans.spans_ingest` writes on PostgreSQL, by attribute name (the keys of
# its JSON rows), with their types for `jsonb_to_recordset`.
SPAN_FIELDS = (
    ("trace_id", "text"), ("span_id", "text"), ("parent_span_id", "text"), ("name", "text"), ("kind", "text"),
    ("service_name", "text"), ("duration_ms", "float8"), ("status_code", "text"), ("status_message", "text"),
    ("attributes", "jsonb"), ("resource", "jsonb"), ("events", "jsonb"), ("task_id", "text"), ("step_id", "text"),
    ("operation_id", "text"), ("call_id", "text"), ("gen_ai_operation", "text"), ("gen_ai_model", "text"),
    ("gen_ai_response_model", "text"), ("gen_ai_tool", "text"), ("input_tokens", "int"), ("output_tokens", "int"),
    ("dropped_attributes_count", "int"), ("dropped_events_count", "int"), ("dropped_links_count", "int"),
    ("truncated_values_count", "int"),
)


def _span_insert() -> str:
    def col(name: str) -> str:
        return sql.column(Span, name)

    columns = ", ".join(col(name) for name, _ in SPAN_FIELDS)
    selected = ", ".join(f"r.{name}" for name, _ in SPAN_FIELDS)
    typed = ", ".join(f"{name} {kind}" for name, kind in SPAN_FIELDS)
    return (
        f"INSERT INTO {sql.table(Span)} ({col('tenant')}, {col('ingested_at')}, {col('start_time')}, "
        f"{col('end_time')}, {columns}) "
        "SELECT %s, %s, timestamptz 'epoch' + r.start_us * interval '1 microsecond', "
        f"timestamptz 'epoch' + r.end_us * interval '1 microsecond', {selected} "
        f"FROM jsonb_to_recordset(%s::jsonb) AS r(start_us bigint, end_us bigint, {typed}) "
        f"ON CONFLICT ({col('tenant')}, {col('trace_id')}, {col('span_id')}) DO NOTHING"
    )


# A batch of spans in one statement, the rows as one JSON document (PostgreSQL only): the
# tenant, the ingest time, then the rows (keys: SPAN_FIELDS' names, `start_us`, `end_us`).
# Re-sent spans meet the (tenant, trace, span) constraint and are skipped.
SPAN_INSERT = _span_insert()

SHAPES = {
    "SPAN_INSERT": sql.Shape(tables={"": Span}, params=((Span, "tenant"), (Span, "ingested_at"), None),
                             vendors=frozenset({"postgresql"})),
}
