"""Fixtures for the agent API: a task driven to `running` through the services, with its
lease's fencing token, and a client that authenticates as the tenant's agent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger import decisions
from runs import services as run_services
from runs.models import Task
from tests.conftest import AGENT_TOKEN, OUTSIDER_TOKEN

REFUND = {"order_id": "ord-42", "amount": 30, "currency": "EUR", "reason": "damaged in transit"}
MAIL = {"to": ["customer@example.com"], "subject": "Your refund", "body": "It is on its way."}


def refund(amount: float | int = 30, **changes: Any) -> dict[str, Any]:
    return {**REFUND, "amount": amount, **changes}


@dataclass
class RunningTask:
    task_id: str
    fencing_token: int

    @property
    def task(self) -> Task:
        return Task.objects.get(pk=self.task_id)

    @property
    def version(self) -> int:
        return self.task.version


def start_task(agent, *, constraints: dict[str, Any] | None = None, owner: str = "worker-1") -> RunningTask:
    task = run_services.task_create(
        principal=agent, task_type="refund", goal="Refund the damaged order", constraints=constraints or {}
    )
    lease = decisions.lease_acquire(task_id=task.task_id, owner=owner, ttl_seconds=600)
    for to in ("planning", "running"):
        task = run_services.task_transition(
            task_id=task.task_id, to=to, expected_version=task.version,
            fencing_token=lease.fencing_token, actor=agent.ref,
        )
    return RunningTask(task_id=task.task_id, fencing_token=lease.fencing_token)


@pytest.fixture
def running_task(agent) -> RunningTask:
    return start_task(agent)


@pytest.fixture
def api(agent) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")
    return client


@pytest.fixture
def outsider_api(outsider_agent) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {OUTSIDER_TOKEN}")
    return client


@pytest.fixture
def anonymous_api(db) -> APIClient:
    return APIClient()


def call_body(run: RunningTask, *, call_id: str = "call-1", step_id: str = "step-1", tool: str = "payments.refund",
              arguments: dict[str, Any] | None = None, expected_version: int | None = None,
              fencing_token: int | None = None) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "step_id": step_id,
        "tool": tool,
        "arguments": refund() if arguments is None else arguments,
        "expected_version": run.version if expected_version is None else expected_version,
        "fencing_token": run.fencing_token if fencing_token is None else fencing_token,
    }


def assert_error(response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    return body["error"]
