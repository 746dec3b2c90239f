"""Trace spans in: OTLP spans stored for a tenant and linked to its tasks, steps, calls and
operations by their attributes.

Linking reads the ledger (a span that names a call or an operation belongs to that operation's
task and step), so this module sits above the ledger; nothing below it imports it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from console.models import AgentPrincipal
from ledger.models import Call, Operation
from runs.models import Span, Task, TenantSpanUsage
from runs.queries import SPAN_INSERT


def _link(span, key: str) -> str:
    value = span.attributes.get(key)
    if value is None:
        value = span.resource.get(key)
    return str(value) if value is not None else ""


# Token counts land in a PositiveIntegerField (0 ≤ n < 2**31 on PostgreSQL): a count outside it
# is stored as unknown rather than failing the CHECK and with it the whole batch.
_MAX_TOKENS = 2**31 - 1


def _int_or_none(value) -> int | None:
    try:
        number = int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and 0 <= number <= _MAX_TOKENS else None


DROP_COUNTS = ("dropped_attributes_count", "dropped_events_count", "dropped_links_count", "truncated_values_count")


def _ns_to_us(ns: int) -> int:
    return (ns + 500) // 1000  # to the nearest microsecond, what the column holds


def spans_within_quota(*, principal: AgentPrincipal, spans: list) -> tuple[list, int]:
    """The spans the tenant's quota still has room for, and how many it has not (dropped and
    counted here). A soft quota: two batches ingested at the same moment may both fit where only
    one would, so a tenant can go over by at most what concurrent requests carry."""
    quota = settings.OTLP_TENANT_SPAN_QUOTA
    if not quota or not spans:
        return spans, 0
    used = TenantSpanUsage.objects.filter(tenant_id=principal.tenant_id).values_list("spans", flat=True).first() or 0
    room = max(0, quota - used)
    if len(spans) <= room:
        return spans, 0
    dropped = len(spans) - room
    _count_usage(principal.tenant_id, dropped_over_quota=dropped)
    return spans[:room], dropped


def _count_usage(tenant_id: int, *, spans: int = 0, dropped_over_quota: int = 0) -> None:
    if not spans and not dropped_over_quota:
        return
    changed = TenantSpanUsage.objects.filter(tenant_id=tenant_id).update(
        spans=F("spans") + spans, dropped_over_quota=F("dropped_over_quota") + dropped_over_quota)
    if not changed:
        try:
            with transaction.atomic():
                TenantSpanUsage.objects.create(tenant_id=tenant_id, spans=spans, dropped_over_quota=dropped_over_quota)
        except IntegrityError:  # created meanwhile by another ingest
            _count_usage(tenant_id, spans=spans, dropped_over_quota=dropped_over_quota)


def spans_ingest(*, principal: AgentPrincipal, spans: list) -> int:
    """Store parsed OTLP spans for the principal's tenant, linked to tasks (of that tenant only)
    and operations by their attributes. Re-sent spans are ignored. Committed (or part of the
    caller's transaction) when it returns. Returns the count offered.

    On PostgreSQL the batch is one `INSERT … SELECT FROM jsonb_to_recordset(…) ON CONFLICT DO
    NOTHING` with the rows as one JSON parameter: no model instances, and no per-element escaping
    of the array parameters that `bulk_create` sends, which would dominate the ingest's CPU."""
    if not spans:
        return 0
    rows = []
    for s in spans:
        attrs = s.attributes
        rows.append({
            "trace_id": s.trace_id, "span_id": s.span_id, "parent_span_id": s.parent_span_id,
            "name": s.name[:255], "kind": s.kind, "service_name": str(s.resource.get("service.name", ""))[:255],
            "start_us": _ns_to_us(s.start_ns), "end_us": _ns_to_us(s.end_ns),
            "duration_ms": (s.end_ns - s.start_ns) / 1e6, "status_code": s.status_code,
            "status_message": s.status_message, "attributes": attrs, "resource": s.resource, "events": s.events,
            "task_id": _link(s, "countersign.task_id"), "step_id": _link(s, "countersign.step_id")[:128],
            "operation_id": _link(s, "countersign.operation_id"), "call_id": _link(s, "gen_ai.tool.call.id"),
            "gen_ai_operation": str(attrs.get("gen_ai.operation.name", ""))[:64],
            "gen_ai_model": str(attrs.get("gen_ai.request.model", ""))[:128],
            "gen_ai_response_model": str(attrs.get("gen_ai.response.model", ""))[:128],
            "gen_ai_tool": str(attrs.get("gen_ai.tool.name", ""))[:128],
            "input_tokens": _int_or_none(attrs.get("gen_ai.usage.input_tokens")),
            "output_tokens": _int_or_none(attrs.get("gen_ai.usage.output_tokens")),
            **{name: min(getattr(s, name, 0), _MAX_TOKENS) for name in DROP_COUNTS},
        })
    # Only the tenant's own tasks are linked; a call names an operation within its task.
    task_ids = {r["task_id"] for r in rows} - {""}
    known_tasks = set(Task.objects.filter(tenant_id=principal.tenant_id, task_id__in=task_ids)
                      .values_list("task_id", flat=True)) if task_ids else set()
    call_ids = {r["call_id"] for r in rows if r["task_id"] in known_tasks and not r["operation_id"]} - {""}
    call_ops = {
        (task_id, call_id): op_id
        for task_id, call_id, op_id in Call.objects.filter(task_id__in=known_tasks, call_id__in=call_ids,
                                                           operation__isnull=False)
        .values_list("task_id", "call_id", "operation_id")
    } if call_ids else {}
    for r in rows:
        r["task_id"] = r["task_id"] if r["task_id"] in known_tasks else None
        r["operation_id"] = (r["operation_id"] or call_ops.get((r["task_id"], r["call_id"]), ""))[:64]
        r["call_id"] = r["call_id"][:128]
    _link_operations(principal, rows)
    now = timezone.now()
    if connection.vendor == "postgresql":
        # One statement: atomic on its own, and committed before it returns outside a transaction.
        with connection.cursor() as cursor:
            cursor.execute(SPAN_INSERT, [principal.tenant_id, now, json.dumps(rows, separators=(",", ":"))])
            inserted = cursor.rowcount  # re-sent spans are not counted twice against the quota
        _count_usage(principal.tenant_id, spans=inserted)
        return len(rows)
    instances = []
    for r in rows:
        fields = {k: v for k, v in r.items() if k not in ("start_us", "end_us")}
        instances.append(Span(
            tenant_id=principal.tenant_id, ingested_at=now, start_time=_EPOCH + timedelta(microseconds=r["start_us"]),
            end_time=_EPOCH + timedelta(microseconds=r["end_us"]), **fields,
        ))
    with transaction.atomic():
        before = Span.objects.filter(tenant_id=principal.tenant_id).count()
        Span.objects.bulk_create(instances, batch_size=500, ignore_conflicts=True)
        _count_usage(principal.tenant_id, spans=Span.objects.filter(tenant_id=principal.tenant_id).count() - before)
    return len(rows)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _link_operations(principal: AgentPrincipal, rows: list[dict[str, Any]]) -> None:
    """A span that names an operation of the tenant belongs to that operation's task, step and
    call, whether or not it says so: the console's dispatch and reconcile spans know the
    operation, an agent's tool span often only the call."""
    wanted = {r["operation_id"] for r in rows
              if r["operation_id"] and not (r["task_id"] and r["step_id"] and r["call_id"])}
    if not wanted:
        return
    owners = {
        op_id: (task_id, step_id, call_id)
        for op_id, task_id, step_id, call_id in Operation.objects.filter(
            tenant_id=principal.tenant_id, operation_id__in=wanted,
        ).values_list("operation_id", "task_id", "step__step_id", "call_id")
    }
    for row in rows:
        if row["operation_id"] in owners:
            task_id, step_id, call_id = owners[row["operation_id"]]
            row["task_id"] = row["task_id"] or task_id
            row["step_id"] = row["step_id"] or step_id or ""
            row["call_id"] = row["call_id"] or call_id or ""
