"""Run the verifiers for one task and record the verdict (network I/O outside transactions)."""

from __future__ import annotations

from console.lib.errors import Conflict
from console.tracing import tracer
from runs.models import Task, TaskStatus
from runs.services import task_record_verification
from runs.verifiers import verify


def run_verification(task_id: str) -> str:
    task = Task.objects.filter(task_id=task_id).first()
    if task is None or task.status != TaskStatus.VERIFYING:
        return f"noop:{task.status if task else 'missing'}"
    with tracer.start_as_current_span("verify", attributes={"countersign.task_id": task_id}):
        verdict = verify(task)
    try:
        task_record_verification(task_id=task_id, expected_version=task.version, result=verdict.result,
                                 evidence=verdict.evidence)
    except Conflict:
        return "raced"
    return verdict.result
