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

from console.lib.transitions import record_event
from console.models import AgentPrincipal, Event, Role
from ledger import services as ledger_services
from ledger.models import Attempt, Fact, Operation, OperationStatus
from ledger.support import PROVIDER_QUERY_ENTITY
from sandbox.process import SandboxProcess
from tests import factories
from tests.conftest import make_user

S = OperationStatus

_seq = itertools.count(1)


def make_operation(agent: AgentPrincipal, *, status: str = S.UNKNOWN, tool_name: str = "payments.refund",
                   arguments: dict[str, Any] | None = None, call_id: str | None = None,
                   task_type: str = "refund") -> Operation:
    """An operation in a task of its own, moved through the services to `status`; the way into
    `unknown` is a timeout as the dispatcher records it (the queue shows that error), then
    escalated or marked for compensation if asked."""
    n = next(_seq)
    task = factories.make_task(agent, task_type=task_type, goal=f"Refund order {n}")
    early = status in (S.PLANNED, S.AUTHORIZED)
    operation = factories.make_operation(agent, tool_name, status=status if early else S.AUTHORIZED,
                                         arguments=arguments, task=task, step_id=f"step-{n}",
                                         call_id=call_id or f"call-{n:04d}")
    if early:
        return operation
    make_unknown(operation)
    if status == S.MANUAL:
        ledger_services.operation_escalate_manual(operation_id=operation.operation_id, actor="system:reconciler",
                                                  reason="provider could not tell")
    elif status == S.COMPENSATION_REQUIRED:
        ledger_services.operation_require_compensation(operation_id=operation.operation_id, actor="system:test",
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
                        tenant_id=operation.tenant_id, kind=Event.Kind.PROVIDER_ANSWER, to_status=state, actor="user:support",
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

