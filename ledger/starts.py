"""An agent starts (or restarts) a task in one call: the contract registered or found by its
Idempotency-Key, the lease taken, and the task moved on to `running`.

Several records move together (the task, its lease, and on a takeover the previous holder's
operations in flight, `ledger.decisions.lease_acquire`), in one transaction: a start that fails
half-way leaves nothing behind, and a restart after a crash at any point finds the same task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from console.models import AgentPrincipal
from ledger import decisions
from runs import services as run_services
from runs.models import Lease, Task, TaskStatus

# The moves a start makes from where the task stands; any other status is left as it is (a
# waiting or paused task is the agent's to resume, a finished one takes no lease).
START_MOVES: dict[str, tuple[str, ...]] = {
    TaskStatus.QUEUED: (TaskStatus.PLANNING, TaskStatus.RUNNING),
    TaskStatus.PLANNING: (TaskStatus.RUNNING,),
}


@dataclass(frozen=True)
class Start:
    task: Task
    created: bool
    lease: Lease | None


def task_start(*, principal: AgentPrincipal, contract: dict[str, Any], idempotency_key: str = "",
               lease: dict[str, Any] | None = None) -> Start:
    """Register the contract (or find the one registered under this key); with `lease`
    (`{owner, ttl_seconds}`) also lease it — the same owner re-takes its own live lease with a
    new fencing token — and move it to `running`."""
    with transaction.atomic():
        if idempotency_key:
            task, created = run_services.task_create_or_get(principal=principal, idempotency_key=idempotency_key,
                                                            **contract)
        else:
            task, created = run_services.task_create(principal=principal, **contract), True
        if lease is None:
            return Start(task=task, created=created, lease=None)
        held = decisions.lease_acquire(task_id=task.task_id, owner=lease["owner"],
                                       ttl_seconds=lease["ttl_seconds"], retake=True)
        for to in START_MOVES.get(task.status, ()):
            task = run_services.task_transition(
                task_id=task.task_id, to=to, expected_version=task.version, fencing_token=held.fencing_token,
                actor=principal.ref, reason="started by the agent",
            )
    return Start(task=task, created=created, lease=held)
