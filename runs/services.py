"""Every write to tasks, steps and leases."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from console.lib.errors import Conflict, InvalidInput, NotFound, NotPermitted
from console.lib.ids import new_id
from console.lib.transitions import record_event, transition
from console.models import AgentPrincipal, Event
from runs.models import TASK_TERMINAL, Lease, Step, Task, TaskStatus


def task_create(
    *,
    principal: AgentPrincipal,
    task_type: str,
    goal: str,
    inputs: dict[str, Any] | None = None,
    success_criteria: list[Any] | None = None,
    constraints: dict[str, Any] | None = None,
    versions: dict[str, Any] | None = None,
) -> Task:
    with transaction.atomic():
        task = Task.objects.create(
            task_id=new_id("tsk"),
            tenant_id=principal.tenant_id,
            actor=principal,
            task_type=task_type,
            goal=goal,
            inputs=inputs or {},
            success_criteria=success_criteria or [],
            constraints=constraints or {},
            versions=versions or {},
        )
        record_event(
            entity=Task.EVENT_ENTITY, entity_id=task.task_id, tenant_id=task.tenant_id,
            kind=Event.Kind.CREATED, to_status=task.status, actor=principal.ref, reason="task contract registered",
        )
    return task


def _locked_lease(task: Task) -> Lease | None:
    # Locks the lease row so a takeover and a commit under the old token serialize (PostgreSQL);
    # on SQLite the IMMEDIATE transaction already serializes writers.
    return Lease.objects.select_for_update().filter(task_id=task.task_id).first()


_READ = object()


def check_fencing_token(task: Task, fencing_token: int | None, *, locked_lease: Lease | None | object = _READ) -> None:
    """Only the current lease holder may change a task. Call inside a transaction. A caller
    that already locked the task's lease row in this transaction passes it (None: no lease)."""
    lease = _locked_lease(task) if locked_lease is _READ else locked_lease
    if lease is None:
        raise Conflict("The task has no lease; acquire one first.", details={"task_id": task.task_id})
    if fencing_token != lease.fencing_token:
        raise Conflict(
            "Stale fencing token: another worker holds the task now.",
            details={"task_id": task.task_id, "fencing_token": fencing_token, "current": lease.fencing_token},
        )


def task_transition(
    *,
    task_id: str,
    to: str,
    expected_version: int,
    fencing_token: int | None,
    actor: str,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    superseded_by: str = "",
) -> Task:
    """An agent moves its task. `succeeded` is never the agent's word: it needs a verifier.
    Cancelling with `superseded_by` names the task (same tenant) that replaces this one."""
    if to not in TaskStatus.values:
        raise InvalidInput(f"Unknown task status {to!r}.", details={"to": to})
    if superseded_by and to != TaskStatus.CANCELLED:
        raise InvalidInput("superseded_by goes with to=cancelled.", details={"to": to})
    if to == TaskStatus.SUCCEEDED:
        raise NotPermitted(
            "A task succeeds only through its verifier; move it to 'verifying' with evidence.",
            details={"to": to},
        )
    with transaction.atomic():
        task = Task.objects.filter(task_id=task_id).first()
        if task is None:
            raise NotFound(f"No task {task_id}.")
        check_fencing_token(task, fencing_token)
        if task.version != expected_version:
            raise Conflict(
                "Stale expected_version.",
                details={"task_id": task_id, "expected_version": expected_version, "version": task.version},
            )
        changes: dict[str, Any] = {"version": F("version") + 1}
        if superseded_by:
            if superseded_by == task_id or not Task.objects.filter(task_id=superseded_by,
                                                                   tenant_id=task.tenant_id).exists():
                raise InvalidInput("superseded_by must name another task of this tenant.",
                                   details={"superseded_by": superseded_by})
            changes["superseded_by_id"] = superseded_by
            evidence = {**(evidence or {}), "superseded_by": superseded_by}
        transition(
            task, to=to, actor=actor, reason=reason, evidence=evidence,
            guard={"version": expected_version}, changes=changes,
        )
        if to == TaskStatus.VERIFYING:
            from runs.tasks import enqueue_verification

            transaction.on_commit(lambda: enqueue_verification(task_id))
    return task


def task_cancel(*, task_id: str, actor: str, reason: str) -> Task:
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(task_id=task_id).first()
        if task is None:
            raise NotFound(f"No task {task_id}.")
        transition(
            task, to=TaskStatus.CANCELLED, actor=actor, reason=reason,
            guard={"version": task.version}, changes={"version": F("version") + 1},
        )
    return task


def step_get_or_create(*, task: Task, step_id: str) -> Step:
    step, _ = Step.objects.get_or_create(task=task, step_id=step_id)
    return step


def _doubt_in_flight_operations(task: Task, *, reason: str) -> None:
    """Seed 000 §04: before the new holder acts, the previous holder's in-flight attempts are
    `unknown` and reconciled — never assumed failed, never sent again blindly."""
    from ledger.models import Operation, OperationStatus
    from ledger.services import operation_mark_unknown

    for operation_id in Operation.objects.filter(task=task, status=OperationStatus.DISPATCHED).values_list(
            "operation_id", flat=True):
        operation_mark_unknown(operation_id=operation_id, actor="system:lease", reason=reason)


def lease_acquire(*, task_id: str, owner: str, ttl_seconds: int, now=None) -> Lease:
    """Take or renew the task's lease. The same owner renews and keeps its token; a new owner
    may take over only an expired lease, with generation and fencing token + 1."""
    if not 1 <= ttl_seconds <= 3600:
        raise InvalidInput("ttl_seconds must be between 1 and 3600.", details={"ttl_seconds": ttl_seconds})
    now = now or timezone.now()
    expires_at = now + timedelta(seconds=ttl_seconds)
    with transaction.atomic():
        task = Task.objects.filter(task_id=task_id).first()
        if task is None:
            raise NotFound(f"No task {task_id}.")
        if task.status in TASK_TERMINAL:
            raise Conflict(f"Task {task_id} is {task.status}; it takes no lease.")
        lease = _locked_lease(task)
        if lease is None:
            try:
                with transaction.atomic():
                    lease = Lease.objects.create(task=task, owner=owner, expires_at=expires_at, acquired_at=now)
            except IntegrityError as exc:
                raise Conflict("Another worker took the lease at the same moment.") from exc
            kind = Event.Kind.LEASE_ACQUIRED
        elif lease.owner == owner and lease.is_live(now):
            updated = Lease.objects.filter(
                task_id=task_id, owner=owner, fencing_token=lease.fencing_token
            ).update(expires_at=expires_at)
            if updated != 1:
                raise Conflict("The lease changed while renewing it.")
            lease.expires_at = expires_at
            return lease  # a renewal is not a state change: no event
        elif lease.is_live(now):
            raise Conflict(
                f"Task {task_id} is leased to another worker until {lease.expires_at.isoformat()}.",
                details={"owner": lease.owner, "expires_at": lease.expires_at.isoformat()},
            )
        else:
            updated = Lease.objects.filter(
                task_id=task_id, fencing_token=lease.fencing_token
            ).update(
                owner=owner, expires_at=expires_at, acquired_at=now,
                generation=F("generation") + 1, fencing_token=F("fencing_token") + 1,
            )
            if updated != 1:
                raise Conflict("Another worker took the lease at the same moment.")
            lease.refresh_from_db()
            kind = Event.Kind.LEASE_TAKEN_OVER
            _doubt_in_flight_operations(task, reason=f"lease taken over by {owner} (token {lease.fencing_token})")
        record_event(
            entity=Event.Entity.LEASE, entity_id=task_id, tenant_id=task.tenant_id, kind=kind,
            actor=f"worker:{owner}", reason=f"{Event.Kind(kind).label} by {owner}",
            evidence={"fencing_token": lease.fencing_token, "generation": lease.generation,
                      "expires_at": expires_at.isoformat()},
        )
    return lease


def task_wait_for_approval(*, task: Task, actor: str, reason: str, evidence: dict[str, Any] | None = None) -> Task:
    """running → waiting_approval (compare-and-set on version, version + 1). Already waiting:
    a no-op, the version stays. Called by the proposal pipeline with the task row locked."""
    if task.status == TaskStatus.WAITING_APPROVAL:
        return task
    transition(
        task, to=TaskStatus.WAITING_APPROVAL, actor=actor, reason=reason, evidence=evidence,
        guard={"version": task.version}, changes={"version": F("version") + 1},
    )
    return task


def task_pause(*, task: Task, actor: str, reason: str, evidence: dict[str, Any] | None = None) -> Task:
    """→ paused (a budget ran out), compare-and-set on version, version + 1. Already paused: no-op."""
    transition(
        task, to=TaskStatus.PAUSED, actor=actor, reason=reason, evidence=evidence,
        guard={"version": task.version}, changes={"version": F("version") + 1},
    )
    return task


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


def _ns_to_us(ns: int) -> int:
    return (ns + 500) // 1000  # to the nearest microsecond, what the column holds


# The columns `spans_ingest` writes on PostgreSQL, with their types for `jsonb_to_recordset`.
_SPAN_COLUMNS = (
    ("trace_id", "text"), ("span_id", "text"), ("parent_span_id", "text"), ("name", "text"), ("kind", "text"),
    ("service_name", "text"), ("duration_ms", "float8"), ("status_code", "text"), ("status_message", "text"),
    ("attributes", "jsonb"), ("resource", "jsonb"), ("events", "jsonb"), ("task_id", "text"), ("step_id", "text"),
    ("operation_id", "text"), ("call_id", "text"), ("gen_ai_operation", "text"), ("gen_ai_model", "text"),
    ("gen_ai_response_model", "text"), ("gen_ai_tool", "text"), ("input_tokens", "int"), ("output_tokens", "int"),
)
_PG_INSERT = (
    "INSERT INTO runs_span (tenant_id, ingested_at, start_time, end_time, {columns}) "
    "SELECT %s, %s, timestamptz 'epoch' + r.start_us * interval '1 microsecond', "
    "timestamptz 'epoch' + r.end_us * interval '1 microsecond', {selected} "
    "FROM jsonb_to_recordset(%s::jsonb) AS r(start_us bigint, end_us bigint, {typed}) "
    "ON CONFLICT (tenant_id, trace_id, span_id) DO NOTHING"
).format(
    columns=", ".join(name for name, _ in _SPAN_COLUMNS),
    selected=", ".join(f"r.{name}" for name, _ in _SPAN_COLUMNS),
    typed=", ".join(f"{name} {kind}" for name, kind in _SPAN_COLUMNS),
)


def spans_ingest(*, principal: AgentPrincipal, spans: list) -> int:
    """Store parsed OTLP spans for the principal's tenant, linked to tasks (of that tenant only)
    and operations by their attributes. Re-sent spans are ignored. Committed (or part of the
    caller's transaction) when it returns. Returns the count offered.

    On PostgreSQL the batch is one `INSERT … SELECT FROM jsonb_to_recordset(…) ON CONFLICT DO
    NOTHING` with the rows as one JSON parameter: no model instances, and no per-element escaping
    of the array parameters that `bulk_create` sends (most of the ingest CPU before)."""
    from django.db import connection

    from ledger.models import Call
    from runs.models import Span

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
        })
    # Only the tenant's own tasks are linked; a call names an operation within its task.
    task_ids = {r["task_id"] for r in rows} - {""}
    known_tasks = set(Task.objects.filter(tenant_id=principal.tenant_id, task_id__in=task_ids)
                      .values_list("task_id", flat=True)) if task_ids else set()
    call_ids = {r["call_id"] for r in rows if r["task_id"] in known_tasks and not r["operation_id"]} - {""}
    call_ops = {
        (task_id, call_id): op_id
        for task_id, call_id, op_id in Call.objects.filter(task_id__in=known_tasks, call_id__in=call_ids)
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
            cursor.execute(_PG_INSERT, [principal.tenant_id, now, json.dumps(rows, separators=(",", ":"))])
        return len(rows)
    instances = []
    for r in rows:
        fields = {k: v for k, v in r.items() if k not in ("start_us", "end_us")}
        instances.append(Span(
            tenant_id=principal.tenant_id, ingested_at=now, start_time=_EPOCH + timedelta(microseconds=r["start_us"]),
            end_time=_EPOCH + timedelta(microseconds=r["end_us"]), **fields,
        ))
    with transaction.atomic():
        Span.objects.bulk_create(instances, batch_size=500, ignore_conflicts=True)
    return len(rows)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _link_operations(principal: AgentPrincipal, rows: list[dict[str, Any]]) -> None:
    """A span that names an operation of the tenant belongs to that operation's task, step and
    call, whether or not it says so: the console's dispatch and reconcile spans know the
    operation, an agent's tool span often only the call."""
    from ledger.models import Operation

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


def task_record_verification(*, task_id: str, expected_version: int, result: str,
                             evidence: dict[str, Any]) -> Task:
    """The verifier's verdict on a `verifying` task: met → succeeded; contradicted → failed;
    not yet → back to running (the agent may continue). Compare-and-set on the version the
    verifier read, so a task that moved meanwhile is not judged on stale evidence."""
    to = {"met": TaskStatus.SUCCEEDED, "failed": TaskStatus.FAILED, "pending": TaskStatus.RUNNING}[result]
    with transaction.atomic():
        task = Task.objects.filter(task_id=task_id).first()
        if task is None:
            raise NotFound(f"No task {task_id}.")
        if task.status != TaskStatus.VERIFYING or task.version != expected_version:
            raise Conflict("The task moved while it was being verified.",
                           details={"status": task.status, "version": task.version})
        transition(task, to=to, actor="system:verifier", reason=f"verification {result}", evidence=evidence,
                   guard={"version": expected_version}, changes={"version": F("version") + 1})
    return task
