"""The run page's live stream: events of one task, its operations and its approvals."""

from __future__ import annotations

from collections.abc import Sequence

from django.template.loader import render_to_string

from approvals.models import ApprovalRequest
from console import live
from console.models import Event
from ledger.models import Operation
from runs.models import Task
from runs.verifiers import criteria_rows


def _render_run(user, events: Sequence, task_id: str) -> str:
    if not task_id:
        return ""
    operation_ids = set(Operation.objects.filter(task_id=task_id).values_list("operation_id", flat=True))
    approval_ids = set(ApprovalRequest.objects.filter(task_id=task_id).values_list("approval_id", flat=True))
    mine = [
        e for e in events
        if (e.entity == Event.Entity.TASK and e.entity_id == task_id)
        or (e.entity == Event.Entity.OPERATION and e.entity_id in operation_ids)
        or (e.entity == Event.Entity.APPROVAL and e.entity_id in approval_ids)
    ]
    if not mine:
        return ""
    task = Task.objects.get(task_id=task_id)
    operations = Operation.objects.filter(task_id=task_id).select_related("tool").order_by("created_at")
    return render_to_string("runs/_live.html", {
        "task": task, "events": mine, "operations": operations, "criteria_rows": criteria_rows(task),
        "approvals": ApprovalRequest.objects.filter(task_id=task_id).select_related("tool").order_by("created_at"),
        "oob": True,
    })


live.register(live.Stream(name="run", entities=("task", "operation", "approval"), render=_render_run))
