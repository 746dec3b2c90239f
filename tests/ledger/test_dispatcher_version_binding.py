"""Bound versions through the agent API: a tool's schema changes while the task waits on an
approval; the approval is invalidated, nothing is sent, and the call is proposed again under
the new version."""

from __future__ import annotations

import pytest
from django.db.models import F
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, ApprovalStatus, Tool
from ledger.decisions import approval_approve
from ledger.dispatcher import run_dispatch
from ledger.models import Operation, OperationStatus
from tests.conftest import AGENT_TOKEN
from tests.fixtures.api import MAIL, call_body, start_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def api() -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")
    return client


def test_a_schema_change_while_waiting_invalidates_the_approval_and_the_call_is_proposed_again(
        api, agent, reviewer):
    running_task = start_task(agent)
    url = f"/api/v1/tasks/{running_task.task_id}/calls"
    first = api.post(url, call_body(running_task, tool="mail.send", arguments=MAIL), format="json").json()
    assert first["decision"]["outcome"] == "awaiting_approval"
    Tool.objects.filter(name="mail.send").update(schema_version=F("schema_version") + 1)

    approval_approve(approval_id=first["approval_id"], reviewer=reviewer)  # the person did not notice
    run_dispatch(first["operation_id"], worker="test")  # a no-op if the in-process broker already ran it

    # (What GET /api/v1/calls/{call_id} reports; that async view is tested in tests/ledger/test_api_call_get.py.)
    assert Operation.objects.get(pk=first["operation_id"]).status == OperationStatus.CANCELLED
    assert ApprovalRequest.objects.get(pk=first["approval_id"]).status == ApprovalStatus.INVALIDATED
    assert not Operation.objects.get(pk=first["operation_id"]).attempts.exists()  # nothing was sent

    task = api.get(f"/api/v1/tasks/{running_task.task_id}").json()
    again = api.post(url, call_body(running_task, tool="mail.send", arguments=MAIL, call_id="call-2",
                                    step_id="step-2", expected_version=task["version"]), format="json")
    assert again.status_code == 201, again.content
    assert again.json()["decision"]["outcome"] == "awaiting_approval"
    renewed = ApprovalRequest.objects.get(pk=again.json()["approval_id"])
    assert renewed.tool_schema_version == Tool.objects.get(name="mail.send").schema_version == 2
