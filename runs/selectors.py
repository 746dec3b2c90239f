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


def task_lease(task: Task) -> Lease | None:
    return Lease.objects.filter(task_id=task.task_id).first()
