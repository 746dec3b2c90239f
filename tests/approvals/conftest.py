"""Test data for the reviewer console, built through the services (the proposal pipeline is
someone else's and still moving, so the operation row is created here the way it creates it)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from approvals import services as approval_services
from approvals.models import ApprovalRequest, Tool
from console.lib.canonical import arguments_hash, intent_hash
from console.lib.ids import derive_operation_id
from console.models import AgentPrincipal
from ledger import services as ledger_services
from ledger.models import Call, Operation
from runs import services as run_services
from runs.models import Task

INBOX_ARGUMENTS: dict[str, dict[str, Any]] = {
    "payments.refund": {"order_id": "ord-1001", "amount": 120, "currency": "EUR", "reason": "damaged"},
    "mail.send": {"to": ["customer@example.com"], "subject": "Your refund", "body": "Hello,\n\nIt is on its way."},
    "orders.lookup": {"order_id": "ord-1001"},
}

_seq = itertools.count(1)


def create_task(agent: AgentPrincipal, **fields: Any) -> Task:
    fields.setdefault("task_type", "refund")
    fields.setdefault("goal", "Refund the damaged order")
    fields.setdefault("success_criteria", ["refund confirmed by the provider"])
    fields.setdefault("constraints", {"max_amount": 500})
    return run_services.task_create(principal=agent, **fields)


def create_pending_approval(
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
    """A planned operation (with its call and creation event) and a pending approval for it."""
    n = next(_seq)
    task = task or create_task(agent, task_type=task_type)
    tool = Tool.objects.get(name=tool_name)
    if arguments is None:
        arguments = dict(INBOX_ARGUMENTS[tool_name])
        if tool_name == "payments.refund":
            # Amounts that match the default escalation rules for the tier asked for.
            arguments["amount"] = {4: 250, 3: 120}.get(risk_tier, 40)
    step = run_services.step_get_or_create(task=task, step_id=f"step-{n}")
    call_id = call_id or f"call-{n:04d}"
    operation_id = derive_operation_id(tenant=agent.tenant.slug, task_id=task.task_id, step_id=step.step_id,
                                       tool=tool_name)
    operation = Operation.objects.create(
        operation_id=operation_id, tenant_id=agent.tenant_id, task=task, step=step, tool=tool,
        tool_schema_version=tool.schema_version, principal=agent, call_id=call_id, arguments=arguments,
        arguments_hash=arguments_hash(arguments),
        intent_hash=intent_hash(tool=tool_name, arguments=arguments, principal=agent.ref),
        idempotency_key=operation_id,
        business_key=str(arguments.get(tool.business_key, "")) if tool.business_key else "",
        risk_tier=risk_tier,
    )
    Call.objects.create(task=task, call_id=call_id, operation=operation, arguments_hash=operation.arguments_hash)
    ledger_services.operation_created_event(operation, actor=agent.ref)
    return approval_services.approval_request_create(
        operation=operation, call_id=call_id, state_version=task.version, risk_tier=risk_tier,
        approvals_needed=approvals_needed or (2 if risk_tier >= 4 else 1), ttl_seconds=ttl_seconds,
        reasons=reasons if reasons is not None else ([f"amount > {50 if risk_tier == 3 else 200}"] if tool_name == "payments.refund" else []),
        actor=agent.ref,
    )


@pytest.fixture(autouse=True)
def _fresh_cache():
    """The inbox caches its task-type choices for a minute; each test starts without them."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def make_approval(agent):
    def factory(**kwargs: Any) -> ApprovalRequest:
        return create_pending_approval(kwargs.pop("agent", agent), **kwargs)

    return factory
