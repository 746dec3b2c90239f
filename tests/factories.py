"""Plain factory functions for the records every service test needs.

Records in a state other than the first are driven there through the services themselves, so
their event rows tell the same story as their status (the replay tests rely on it).
"""

from __future__ import annotations

import itertools
from typing import Any

from approvals import services as approval_services
from approvals.models import ApprovalRequest, Tool
from console.lib.canonical import arguments_hash, intent_hash
from console.lib.ids import derive_operation_id
from console.models import AgentPrincipal, Event
from ledger import decisions
from ledger import services as ledger_services
from ledger.models import Attempt, Call, Fact, Operation, OperationStatus
from runs import services as run_services
from runs.models import Lease, Task, TaskStatus

S = OperationStatus

DEFAULT_ARGUMENTS: dict[str, dict[str, Any]] = {
    "payments.refund": {"order_id": "ord-1001", "amount": 25, "currency": "EUR", "reason": "damaged"},
    "mail.send": {"to": ["customer@example.com"], "subject": "Your refund", "body": "It is on its way."},
    "orders.lookup": {"order_id": "ord-1001"},
}

_steps = itertools.count(1)

# How each operation status is reached from `planned`, one service call per move.
_PATHS: dict[str, list[str]] = {
    S.PLANNED: [],
    S.AUTHORIZED: [S.AUTHORIZED],
    S.DISPATCHED: [S.AUTHORIZED, S.DISPATCHED],
    S.CONFIRMED: [S.AUTHORIZED, S.DISPATCHED, S.CONFIRMED],
    S.FAILED: [S.AUTHORIZED, S.DISPATCHED, S.FAILED],
    S.UNKNOWN: [S.AUTHORIZED, S.DISPATCHED, S.UNKNOWN],
    S.RETRY_SAFE: [S.AUTHORIZED, S.DISPATCHED, S.RETRY_SAFE],
    S.MANUAL: [S.AUTHORIZED, S.DISPATCHED, S.UNKNOWN, S.MANUAL],
    S.COMPENSATION_REQUIRED: [S.AUTHORIZED, S.DISPATCHED, S.UNKNOWN, S.COMPENSATION_REQUIRED],
    S.COMPENSATED: [S.AUTHORIZED, S.DISPATCHED, S.UNKNOWN, S.COMPENSATION_REQUIRED, S.COMPENSATED],
    S.REJECTED: [S.REJECTED],
    S.EXPIRED: [S.EXPIRED],
    S.CANCELLED: [S.CANCELLED],
}


def make_task(agent: AgentPrincipal, **fields: Any) -> Task:
    fields.setdefault("task_type", "refund")
    fields.setdefault("goal", "Refund the damaged order")
    return run_services.task_create(principal=agent, **fields)


def make_lease(task: Task, owner: str = "worker-1", ttl_seconds: int = 600, now=None) -> Lease:
    return decisions.lease_acquire(task_id=task.task_id, owner=owner, ttl_seconds=ttl_seconds, now=now)


def cancel_task(task_id: str, *, reason: str = "cancelled") -> Task:
    """The agent cancels its task under its lease (taking one if the task has none)."""
    task = Task.objects.get(pk=task_id)
    lease = Lease.objects.filter(task_id=task_id).first() or make_lease(task, owner="canceller")
    return run_services.task_transition(task_id=task_id, to=TaskStatus.CANCELLED, expected_version=task.version,
                                        fencing_token=lease.fencing_token, actor="agent", reason=reason)


def make_operation(
    agent: AgentPrincipal,
    tool_name: str = "payments.refund",
    *,
    status: str = S.PLANNED,
    arguments: dict[str, Any] | None = None,
    task: Task | None = None,
    step_id: str | None = None,
    call_id: str | None = None,
    risk_tier: int | None = None,
) -> Operation:
    """A planned operation (with its call and creation event), then moved to `status`."""
    task = task or make_task(agent)
    tool = Tool.objects.get(name=tool_name)
    arguments = dict(DEFAULT_ARGUMENTS[tool_name] if arguments is None else arguments)
    step_id = step_id or f"step-{next(_steps)}"
    call_id = call_id or f"call-{step_id}"
    step = run_services.step_get_or_create(task=task, step_id=step_id)
    operation_id = derive_operation_id(
        tenant=agent.tenant.slug, task_id=task.task_id, step_id=step_id, tool=tool_name
    )
    operation = Operation.objects.create(
        operation_id=operation_id,
        tenant_id=agent.tenant_id,
        task=task,
        step=step,
        tool=tool,
        tool_schema_version=tool.schema_version,
        principal=agent,
        call_id=call_id,
        arguments=arguments,
        arguments_hash=arguments_hash(arguments),
        intent_hash=intent_hash(tool=tool_name, arguments=arguments, principal=agent.ref),
        idempotency_key=operation_id,
        business_key=str(arguments.get(tool.business_key, "")) if tool.business_key else "",
        risk_tier=tool.base_tier if risk_tier is None else risk_tier,
    )
    Call.objects.create(task=task, call_id=call_id, operation=operation, arguments_hash=operation.arguments_hash)
    ledger_services.operation_created_event(operation, actor=agent.ref)
    for to in _PATHS[status]:
        _move(operation, to)
    operation.refresh_from_db()
    assert operation.status == status
    return operation


def _move(operation: Operation, to: str) -> None:
    op_id = operation.operation_id
    if to == S.AUTHORIZED:
        ledger_services.operation_authorize(operation_id=op_id, actor="system:test")
    elif to == S.DISPATCHED:
        ledger_services.operation_dispatch(operation_id=op_id, worker="w1")
    elif to in (S.CONFIRMED, S.FAILED, S.UNKNOWN, S.RETRY_SAFE):
        fact = {
            S.CONFIRMED: Fact.KNOWN_SUCCESS,
            S.FAILED: Fact.KNOWN_FAILURE,
            S.UNKNOWN: Fact.UNKNOWN,
            S.RETRY_SAFE: Fact.NOT_SENT,
        }[to]
        record_outcome(operation, fact=fact)
    elif to == S.MANUAL:
        ledger_services.operation_escalate_manual(operation_id=op_id, actor="system:test", reason="cannot tell")
    elif to == S.COMPENSATION_REQUIRED:
        ledger_services.operation_require_compensation(
            operation_id=op_id, actor="system:test", reason="effect must be undone"
        )
    elif to == S.COMPENSATED:
        ledger_services.operation_mark_compensated(operation_id=op_id, actor="system:test", reason="settled",
                                                   evidence={"evidence": "reversed at the bank"})
    elif to == S.REJECTED:
        ledger_services.operation_reject(operation_id=op_id, actor="system:test", reason="no")
    elif to == S.EXPIRED:
        ledger_services.operation_expire(operation_id=op_id, actor="system:test", reason="too late")
    elif to == S.CANCELLED:
        ledger_services.operation_cancel(operation_id=op_id, actor="system:test", reason="task moved on")
    else:  # pragma: no cover - a typo in _PATHS
        raise AssertionError(to)


def current_attempt(operation: Operation) -> Attempt:
    return Attempt.objects.get(operation_id=operation.operation_id, number=operation.attempt_count)


def record_outcome(operation: Operation, *, fact: str, fencing_token: int | None = None,
                   attempt_number: int | None = None, **kwargs: Any) -> tuple[Operation, bool]:
    """Record an outcome for the operation's current attempt (or the one given)."""
    operation.refresh_from_db()
    if fact == Fact.KNOWN_SUCCESS:
        kwargs.setdefault("receipt", {"provider_id": f"re_{operation.operation_id[-8:]}"})
    return ledger_services.operation_record_outcome(
        operation_id=operation.operation_id,
        attempt_number=operation.attempt_count if attempt_number is None else attempt_number,
        fencing_token=operation.fencing_token if fencing_token is None else fencing_token,
        fact=fact,
        **kwargs,
    )


def make_pending_approval(
    agent: AgentPrincipal,
    *,
    tool_name: str = "payments.refund",
    arguments: dict[str, Any] | None = None,
    risk_tier: int = 3,
    approvals_needed: int | None = None,
    ttl_seconds: int = 3600,
    reasons: list[str] | None = None,
    task: Task | None = None,
    task_type: str = "refund",
    call_id: str | None = None,
) -> ApprovalRequest:
    """A planned operation and a pending approval request for it, as the gate files one: a task
    with a contract, a refund amount that matches the default escalation rules for the tier
    asked for, two approvers at L4."""
    task = task or make_task(agent, task_type=task_type, success_criteria=["refund confirmed by the provider"],
                             constraints={"max_amount": 500})
    if arguments is None:
        arguments = dict(DEFAULT_ARGUMENTS[tool_name])
        if tool_name == "payments.refund":
            arguments["amount"] = {4: 250, 3: 120}.get(risk_tier, 40)
    operation = make_operation(agent, tool_name, arguments=arguments, task=task, call_id=call_id,
                               risk_tier=risk_tier)
    if reasons is None:
        reasons = [f"amount > {50 if risk_tier == 3 else 200}"] if tool_name == "payments.refund" else []
    return approval_services.approval_request_create(
        operation=operation, task_type=operation.task.task_type, call_id=operation.call_id, state_version=task.version, risk_tier=risk_tier,
        approvals_needed=approvals_needed or (2 if risk_tier >= 4 else 1), ttl_seconds=ttl_seconds,
        reasons=reasons, actor=agent.ref,
    )


def make_approval_request(
    operation: Operation,
    *,
    risk_tier: int = 3,
    approvals_needed: int = 1,
    ttl_seconds: int = 3600,
    state_version: int | None = None,
) -> ApprovalRequest:
    return approval_services.approval_request_create(
        operation=operation, task_type=operation.task.task_type,
        call_id=operation.call_id,
        state_version=operation.task.version if state_version is None else state_version,
        risk_tier=risk_tier,
        approvals_needed=approvals_needed,
        ttl_seconds=ttl_seconds,
        reasons=[f"L{risk_tier} by policy"],
        actor="system:gate",
    )


def events_of(entity: str, entity_id: str) -> list[Event]:
    return list(Event.objects.filter(entity=entity, entity_id=str(entity_id)).order_by("id"))


def event_count(entity: str, entity_id: str) -> int:
    return Event.objects.filter(entity=entity, entity_id=str(entity_id)).count()


def replayed_status(entity: str, entity_id: str) -> str | None:
    """The status the event log says the record has: the last event's `to_status`."""
    last = Event.objects.filter(entity=entity, entity_id=str(entity_id)).order_by("-id").first()
    return last.to_status if last else None


def concurrent_writer(monkeypatch, module, **changes: Any) -> None:
    """Make another writer change the row between the service's read and its compare-and-set:
    the service's `transition()` runs after the row was updated behind its back."""
    real = module.transition

    def racing(obj, **kwargs):
        type(obj).objects.filter(pk=obj.pk).update(**changes)
        return real(obj, **kwargs)

    monkeypatch.setattr(module, "transition", racing)
