"""Reads of workflow state for the agent API."""

from __future__ import annotations

from console.lib.errors import NotFound
from console.models import AgentPrincipal
from runs.models import Lease, Task


def task_for_principal(*, principal: AgentPrincipal, task_id: str) -> Task:
    """Another tenant's task does not exist (404), it is not forbidden."""
    task = Task.objects.filter(task_id=task_id, tenant_id=principal.tenant_id).first()
    if task is None:
        raise NotFound(f"No task {task_id}.", details={"task_id": task_id})
    return task


def task_by_idempotency_key(*, principal: AgentPrincipal, idempotency_key: str) -> Task:
    """The task this agent registered under its key, whatever its status (no lease needed): a
    restarted agent learns from it that its task is already finished."""
    task = Task.objects.filter(actor=principal, idempotency_key=idempotency_key).first()
    if task is None:
        raise NotFound("No task under this Idempotency-Key.", details={"idempotency_key": idempotency_key})
    return task


def task_lease(task: Task) -> Lease | None:
    return Lease.objects.filter(task_id=task.task_id).first()
