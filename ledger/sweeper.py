"""The sweeper (Celery beat; step 9 of dispatch in docs/architecture.md). The ledger, not the broker, is the source of
truth: Celery can duplicate and lose messages, so whatever should be moving is pushed again."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.stops import stopped_operations_q, stopped_requests_q
from console.lib.errors import Conflict
from ledger import decisions, services, tasks
from ledger.models import Operation, OperationStatus
from runs import tasks as run_tasks
from runs.models import Task, TaskStatus

logger = logging.getLogger(__name__)
BATCH = 200


def run_sweep(now=None) -> dict[str, int]:
    now = now or timezone.now()
    counts = {"redispatched": 0, "unknown": 0, "reconcile": 0, "expired": 0, "verify": 0}

    stale = now - timedelta(seconds=settings.REDISPATCH_AFTER_SECONDS)
    due_again = Q(next_redispatch_at__isnull=True) | Q(next_redispatch_at__lte=now)
    waiting = (
        Operation.objects.filter(status__in=[OperationStatus.AUTHORIZED, OperationStatus.RETRY_SAFE], updated_at__lt=stale)
        .filter(Q(not_before__isnull=True) | Q(not_before__lte=now))
        .filter(due_again)
        # Held by a stop: resuming pushes them (ledger.control), not the sweeper.
        .exclude(stopped_operations_q())
        .select_related("tool")[:BATCH]
    )
    for operation in waiting:
        # Claim the slot, so that an operation the dispatcher keeps deferring (circuit open,
        # tenant limit, busy business key) is pushed once per REDISPATCH_AFTER_SECONDS, not
        # by every sweep, and two overlapping sweeps push it once.
        claimed = Operation.objects.filter(pk=operation.pk, status=operation.status).filter(due_again).update(
            next_redispatch_at=now + timedelta(seconds=settings.REDISPATCH_AFTER_SECONDS)
        )
        if claimed:
            tasks.enqueue_dispatch(operation.operation_id, queue=operation.tool.queue)
            counts["redispatched"] += 1

    for operation_id in Operation.objects.filter(status=OperationStatus.DISPATCHED, dispatch_deadline__lt=now).values_list(
        "operation_id", flat=True
    )[:BATCH]:
        try:
            services.operation_mark_unknown(
                operation_id=operation_id, actor="system:sweeper",
                reason="no outcome recorded before the dispatch deadline (worker lost?)",
                evidence={"deadline_passed_at": now.isoformat()},
            )
            counts["unknown"] += 1
        except Conflict:
            pass  # the worker recorded its outcome at the same moment

    due = Operation.objects.filter(status=OperationStatus.UNKNOWN, next_reconcile_at__lte=now).values_list("operation_id", flat=True)
    for operation_id in due[:BATCH]:
        # Claim the slot so the next sweep does not enqueue the same reconcile again.
        claimed = Operation.objects.filter(operation_id=operation_id, status=OperationStatus.UNKNOWN, next_reconcile_at__lte=now).update(
            next_reconcile_at=now + timedelta(seconds=max(5.0, settings.SWEEP_SECONDS * 3))
        )
        if claimed:
            tasks.enqueue_reconcile(operation_id)
            counts["reconcile"] += 1

    overdue = ApprovalRequest.objects.filter(
        status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED], expires_at__lt=now
    ).exclude(
        # Frozen by a stop: the expiry clock stands still (resuming gives the time back).
        stopped_requests_q()
    ).values_list("approval_id", flat=True)
    for approval_id in overdue[:BATCH]:
        try:
            decisions.approval_expire(approval_id=approval_id)
            counts["expired"] += 1
        except Conflict:
            pass
    for task_id in Task.objects.filter(status=TaskStatus.VERIFYING, updated_at__lt=stale).values_list(
            "task_id", flat=True)[:BATCH]:
        run_tasks.enqueue_verification(task_id)  # the verification message was lost (or is still queued)
        counts["verify"] += 1

    if any(counts.values()):
        logger.info("sweep: %s", counts)
    return counts
