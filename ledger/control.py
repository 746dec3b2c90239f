"""People's brakes: an emergency stop resumed, a task cancelled, paused or resumed from its run
page, and what the pages say about authority withdrawn while an attempt was in flight.

A stop itself writes only its own row (`approvals.stops`); what it holds back is read where
each move is decided. Resuming (a stop or a task) is a move of two records: the stop or task,
and the operations held meanwhile, which are pushed to the dispatcher again on commit (the
sweeper would find them too, later). Cancelling a task closes its pending and approved
requests (their operations cancelled with them), cancels its authorized operations and fails
its due retries (their last attempt provably had no effect). Attempts in flight finish and are
recorded; reconciliation goes on.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet

from approvals import gate, stops
from approvals import services as approval_services
from approvals.models import ApprovalRequest, ApprovalStatus, Stop
from console.lib.errors import NotFound, NotPermitted
from console.models import AgentPrincipal, Membership, Role
from ledger import decisions, services, tasks
from ledger.dispatcher import paused_by_person
from ledger.models import Operation, OperationStatus
from runs import services as run_services
from runs.models import Task, TaskStatus

user_ref = stops.user_ref
HELD = (OperationStatus.AUTHORIZED, OperationStatus.RETRY_SAFE)
IN_FLIGHT = (OperationStatus.DISPATCHED, OperationStatus.UNKNOWN)


def _push_again_on_commit(operations: QuerySet[Operation]) -> int:
    """Enqueue the dispatch of each held operation once this transaction commits."""
    pending = list(operations.filter(status__in=HELD).values_list("operation_id", "tool__queue"))

    def push() -> None:
        for operation_id, queue in pending:
            tasks.enqueue_dispatch(operation_id, queue=queue)

    transaction.on_commit(push)
    return len(pending)


# ----------------------------------------------------------------------------------- stops

def stop_resume(*, stop_id: str, user: AbstractBaseUser, reason: str = "") -> Stop:
    """Resume a stop with one click: the stop ends and what it held is dispatched again (the
    claim holds anything another stop still covers)."""
    with transaction.atomic():
        stop = stops.stop_resume(stop_id=stop_id, user=user, reason=reason)
        # The expiry clock stood still while the requests were frozen: they get that time back.
        approval_services.approvals_thaw(
            requests=ApprovalRequest.objects.filter(stops.in_scope_q(stop, agent_field="requested_by_id")),
            frozen_since=stop.created_at, resumed_at=stop.resumed_at)
        _push_again_on_commit(Operation.objects.filter(stops.in_scope_q(stop, agent_field="principal_id")))
    return stop


# ------------------------------------------------------------------------------------ tasks

def may_control_task(user: AbstractBaseUser, tenant_id: int) -> bool:
    """Admins and support staff of the task's tenant cancel, pause and resume it."""
    if not user.is_authenticated or not user.is_active:
        return False
    return user.is_superuser or Membership.objects.filter(
        user=user, tenant_id=tenant_id, role__in=[Role.ADMIN, Role.SUPPORT]).exists()


def _check(user: AbstractBaseUser, task_id: str) -> None:
    tenant_id = Task.objects.filter(pk=task_id).values_list("tenant_id", flat=True).first()
    if tenant_id is None:
        raise NotFound(f"No task {task_id}.")
    if not may_control_task(user, tenant_id):
        raise NotPermitted("Only the tenant's admins and support staff cancel, pause or resume a task.")


def task_cancel(*, task_id: str, user: AbstractBaseUser, reason: str) -> Task:
    """Cancel the task, close its waiting requests and cancel what was authorized but not sent."""
    _check(user, task_id)
    actor = user_ref(user)
    why = f"task cancelled by {user.get_username()}: {(reason or '').strip()}"
    with transaction.atomic():
        task = run_services.task_cancel_by_person(task_id=task_id, actor=actor, reason=reason)
        open_requests = ApprovalRequest.objects.filter(
            task_id=task_id, status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED]).order_by("pk")
        for approval_id in open_requests.values_list("approval_id", flat=True):
            decisions.approval_invalidate(approval_id=approval_id, actor=actor, reason=why)
        held = Operation.objects.filter(task_id=task_id).order_by("pk")
        for operation_id in held.filter(status=OperationStatus.AUTHORIZED).values_list("operation_id", flat=True):
            services.operation_cancel(operation_id=operation_id, actor=actor, reason=why)
        for operation_id in held.filter(status=OperationStatus.RETRY_SAFE).values_list("operation_id", flat=True):
            services.operation_fail(operation_id=operation_id, actor=actor, reason=why,
                                    evidence={"task": TaskStatus.CANCELLED, "last_attempt": "not sent"})
    return task


def task_pause(*, task_id: str, user: AbstractBaseUser, reason: str) -> Task:
    """Pause the task: the dispatcher holds its operations until it is resumed."""
    _check(user, task_id)
    return run_services.task_pause_by_person(task_id=task_id, actor=user_ref(user), reason=reason)


def task_resume(*, task_id: str, user: AbstractBaseUser, reason: str) -> Task:
    """paused → running, and what the pause held is dispatched again."""
    _check(user, task_id)
    with transaction.atomic():
        task = run_services.task_resume(task_id=task_id, actor=user_ref(user), reason=reason)
        _push_again_on_commit(Operation.objects.filter(task_id=task_id))
    return task


# ------------------------------------------------------------------------------- the pages

def authority_notice(operation: Operation) -> str:
    """What the operation page says when authority was withdrawn around this operation: an
    attempt claimed before the withdrawal finishes and is recorded, nothing new is sent; held
    work waits for the resume. Empty when nothing was withdrawn."""
    stop = stops.active_stop(tenant_id=operation.tenant_id, agent_id=operation.principal_id,
                             tool_id=operation.tool_id)
    task = operation.task
    if operation.status in IN_FLIGHT:
        claimed = f"Attempt {operation.attempt_count} was claimed before "
        finish = ": it is allowed to finish and is recorded; no further attempt is made"
        if stop is not None:
            return (f"{claimed}{stop.describe()} was stopped by {stop.stopped_by.get_username()} "
                    f"({stop.reason}){finish} while the stop holds.")
        if task.status == TaskStatus.PAUSED and paused_by_person(task.task_id):
            return f"{claimed}the task was paused{finish} while it is paused."
        principal = (None if operation.compensates_id is not None
                     else AgentPrincipal.objects.select_related("tenant").get(pk=operation.principal_id))
        verdict = gate.reevaluate(principal=principal, task=task, tool=operation.tool,
                                  arguments=operation.arguments, args_hash=operation.arguments_hash)
        if verdict.refused:
            return f"{claimed}its authority was withdrawn ({'; '.join(verdict.reasons)}){finish}."
        return ""
    if operation.status in HELD:
        if stop is not None:
            return (f"Held: {stop.describe()} was stopped by {stop.stopped_by.get_username()} ({stop.reason}). "
                    "Nothing is sent until it is resumed.")
        if task.status == TaskStatus.PAUSED and paused_by_person(task.task_id):
            return "Held: the task is paused. Nothing is sent until it is resumed."
    return ""
