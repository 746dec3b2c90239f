"""Every write to tasks, steps and leases."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from console.lib.errors import Conflict, InvalidInput, NotFound, NotPermitted
from console.lib.ids import new_id
from console.lib.transitions import record_event, transition
from console.models import AgentPrincipal
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
            to_status=task.status, actor=principal.ref, reason="task contract registered",
        )
    return task


def _locked_lease(task: Task) -> Lease | None:
    # Locks the lease row so a takeover and a commit under the old token serialize (PostgreSQL);
    # on SQLite the IMMEDIATE transaction already serializes writers.
    return Lease.objects.select_for_update().filter(task_id=task.task_id).first()


def check_fencing_token(task: Task, fencing_token: int | None) -> None:
    """Only the current lease holder may change a task. Call inside a transaction."""
    lease = _locked_lease(task)
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
) -> Task:
    """An agent moves its task. `succeeded` is never the agent's word: it needs a verifier."""
    if to not in TaskStatus.values:
        raise InvalidInput(f"Unknown task status {to!r}.", details={"to": to})
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
        transition(
            task, to=to, actor=actor, reason=reason, evidence=evidence,
            guard={"version": expected_version}, changes={"version": F("version") + 1},
        )
    return task


def task_cancel(*, task_id: str, actor: str, reason: str) -> Task:
    with transaction.atomic():
        task = Task.objects.select_for_update().get(task_id=task_id)
        if task.status in TASK_TERMINAL and task.status != TaskStatus.CANCELLED:
            raise Conflict(f"Task {task_id} is already {task.status}.")
        transition(
            task, to=TaskStatus.CANCELLED, actor=actor, reason=reason,
            guard={"version": task.version}, changes={"version": F("version") + 1},
        )
    return task


def step_get_or_create(*, task: Task, step_id: str) -> Step:
    step, _ = Step.objects.get_or_create(task=task, step_id=step_id)
    return step


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
            action = "acquired"
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
            action = "taken over"
        record_event(
            entity="lease", entity_id=task_id, tenant_id=task.tenant_id,
            from_status="", to_status=f"token:{lease.fencing_token}", actor=f"worker:{owner}",
            reason=f"lease {action}", evidence={"generation": lease.generation, "expires_at": expires_at.isoformat()},
        )
    return lease
