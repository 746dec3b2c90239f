"""Test data for the support console, built through the services so that the event log tells the
same story as the status (the queue's "waiting since" and the figures read the events)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.utils import timezone

from approvals.models import Tool
from console.lib.canonical import arguments_hash, intent_hash
from console.lib.ids import derive_operation_id
from console.lib.transitions import record_event
from console.models import AgentPrincipal, Role
from ledger import services as ledger_services
from ledger.models import Attempt, Call, Event, Fact, Operation, OperationStatus
from ledger.sandbox.process import SandboxProcess
from ledger.support import PROVIDER_QUERY_ENTITY
from runs import services as run_services
from tests.conftest import make_user

S = OperationStatus

ARGUMENTS: dict[str, dict[str, Any]] = {
    "payments.refund": {"order_id": "ord-1001", "amount": 25, "currency": "EUR", "reason": "damaged"},
    "mail.send": {"to": ["customer@example.com"], "subject": "Your refund", "body": "It is on its way."},
    "orders.lookup": {"order_id": "ord-1001"},
}

_seq = itertools.count(1)


def make_operation(agent: AgentPrincipal, *, status: str = S.UNKNOWN, tool_name: str = "payments.refund",
                   arguments: dict[str, Any] | None = None, call_id: str | None = None,
                   task_type: str = "refund") -> Operation:
    """A planned operation moved through the services to `status` (dispatched once, outcome
    unknown; then escalated or marked for compensation if asked)."""
    n = next(_seq)
    task = run_services.task_create(principal=agent, task_type=task_type, goal=f"Refund order {n}")
    tool = Tool.objects.get(name=tool_name)
    arguments = dict(ARGUMENTS[tool_name] if arguments is None else arguments)
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
        risk_tier=tool.base_tier,
    )
    Call.objects.create(task=task, call_id=call_id, operation=operation, arguments_hash=operation.arguments_hash)
    ledger_services.operation_created_event(operation, actor=agent.ref)
    if status == S.PLANNED:
        return operation
    ledger_services.operation_authorize(operation_id=operation_id, actor="system:test")
    if status == S.AUTHORIZED:
        return operation
    make_unknown(operation)
    if status == S.MANUAL:
        ledger_services.operation_escalate_manual(operation_id=operation_id, actor="system:reconciler",
                                                  reason="provider could not tell")
    elif status == S.COMPENSATION_REQUIRED:
        ledger_services.operation_require_compensation(operation_id=operation_id, actor="system:test",
                                                       reason="must be undone")
    operation.refresh_from_db()
    assert operation.status == status
    return operation


def make_unknown(operation: Operation) -> Operation:
    """authorized → dispatched → unknown (a timeout), as the dispatcher records it."""
    operation, attempt = ledger_services.operation_dispatch(operation_id=operation.operation_id, worker="w1")
    ledger_services.operation_record_outcome(
        operation_id=operation.operation_id, attempt_number=attempt.number, fencing_token=attempt.fencing_token,
        fact=Fact.UNKNOWN, error_class="timeout", error_code="ReadTimeout",
        raw_response={"error": "timed out after 5.0s"}, latency_ms=5003,
    )
    operation.refresh_from_db()
    return operation


def age_last_attempt(operation: Operation, seconds: float = 120) -> None:
    """The last attempt started long enough ago that it can no longer land."""
    Attempt.objects.filter(operation=operation).update(started_at=timezone.now() - timedelta(seconds=seconds))


def record_answer(operation: Operation, state: str, *, asked_at=None, raw: dict | None = None) -> Event:
    """A provider answer as the query task records it (for tests about the evidence rule only;
    the task itself is tested against the real sandbox)."""
    asked_at = asked_at or timezone.now()
    return record_event(entity=PROVIDER_QUERY_ENTITY, entity_id=operation.operation_id,
                        tenant_id=operation.tenant_id, to_status=state, actor="user:support",
                        evidence={"raw": raw or {"status": 404, "body": {"found": False}},
                                  "asked_at": asked_at.isoformat()})


def leaving_events(operation: Operation) -> list[Event]:
    return list(Event.objects.filter(entity="operation", entity_id=operation.operation_id,
                                     from_status__in=(S.UNKNOWN, S.MANUAL)).exclude(to_status=S.MANUAL)
                .order_by("id"))


@pytest.fixture(scope="session")
def payments_sandbox() -> Iterator[SandboxProcess]:
    with SandboxProcess.start("payments", hang_seconds=1, die_with_parent=True) as proc:
        yield proc


@pytest.fixture
def payments(payments_sandbox: SandboxProcess, settings) -> SandboxProcess:
    settings.SANDBOX_PAYMENTS_URL = payments_sandbox.base_url
    return payments_sandbox


def refund_at_provider(payments: SandboxProcess, operation: Operation) -> dict[str, Any]:
    """Make the effect happen at the provider under the operation's key (as if the lost attempt
    had committed there)."""
    response = httpx.post(f"{payments.base_url}/refunds", json=operation.arguments,
                          headers={"Idempotency-Key": operation.idempotency_key}, timeout=5)
    assert response.status_code == 201, response.text
    return response.json()


@pytest.fixture
def support2(tenant):
    return make_user("support2", tenant, Role.SUPPORT, email="support2@example.com")


@pytest.fixture
def reviewer_and_support(tenant):
    return make_user("both", tenant, Role.REVIEWER, Role.SUPPORT, max_tier=3)

