"""The task's version is the agent's: Countersign's own moves (into and out of
`waiting_approval` while calls wait) never make the agent's `expected_version` stale and never
invalidate a pending approval. LangGraph runs a step's tool calls in parallel, so two held calls
of one task is the normal case."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest, ApprovalStatus
from ledger.decisions import approval_approve, approval_expire, approval_reject
from ledger.dispatcher import run_dispatch
from ledger.models import Operation, OperationStatus
from runs import services as run_services
from runs.models import TaskStatus
from tests.fixtures.api import MAIL, call_body, refund

pytestmark = [pytest.mark.usefixtures("sandbox_settings", "enqueued")]


def held_pair(api, run, unique):
    """A step's two tool calls, both held for a person, both proposed with one version."""
    version = run.version
    url = f"/api/v1/tasks/{run.task_id}/calls"
    first = api.post(url, call_body(run, call_id="call-a", step_id="refund", expected_version=version,
                                    arguments=refund(75, order_id=unique("ord"))), format="json")
    second = api.post(url, call_body(run, call_id="call-b", step_id="mail", tool="mail.send", arguments=MAIL,
                                     expected_version=version), format="json")
    assert (first.status_code, second.status_code) == (201, 201), second.content
    return first.json(), second.json()


def test_parallel_calls_of_one_step_all_propose_with_the_same_version(api, running_task, unique):
    version = running_task.version
    first, second = held_pair(api, running_task, unique)
    assert first["task_version"] == second["task_version"] == version
    assert running_task.version == version
    assert running_task.task.status == TaskStatus.WAITING_APPROVAL


def test_trap_two_held_calls_approving_one_leaves_the_other_approvable_and_both_dispatch(
        api, running_task, reviewer, unique):
    version = running_task.version
    first, second = held_pair(api, running_task, unique)

    approval_approve(approval_id=first["approval_id"], reviewer=reviewer)
    run_dispatch(first["operation_id"], worker="test")
    assert Operation.objects.get(pk=first["operation_id"]).status == OperationStatus.CONFIRMED
    # The other call still waits, so the task does; its version is the agent's, unchanged.
    task = running_task.task
    assert (task.status, task.version) == (TaskStatus.WAITING_APPROVAL, version)

    approval_approve(approval_id=second["approval_id"], reviewer=reviewer)
    run_dispatch(second["operation_id"], worker="test")
    assert Operation.objects.get(pk=second["operation_id"]).status == OperationStatus.CONFIRMED
    assert ApprovalRequest.objects.get(pk=second["approval_id"]).status == ApprovalStatus.CONSUMED
    task = running_task.task
    assert (task.status, task.version) == (TaskStatus.RUNNING, version)


def test_the_task_waits_exactly_while_a_call_waits(api, running_task, reviewer, unique):
    version = running_task.version
    first, second = held_pair(api, running_task, unique)
    approval_reject(approval_id=first["approval_id"], reviewer=reviewer, reason="wrong order")
    assert running_task.task.status == TaskStatus.WAITING_APPROVAL
    approval_expire(approval_id=second["approval_id"])
    task = running_task.task
    assert (task.status, task.version) == (TaskStatus.RUNNING, version)


def test_the_agent_proposes_on_after_the_wait_with_the_version_it_had(api, running_task, reviewer, unique):
    version = running_task.version
    first, _ = held_pair(api, running_task, unique)
    approval_reject(approval_id=first["approval_id"], reviewer=reviewer, reason="no")
    later = api.post(f"/api/v1/tasks/{running_task.task_id}/calls",
                     call_body(running_task, call_id="call-c", step_id="lookup", tool="orders.lookup",
                               arguments={"order_id": "ord-1"}, expected_version=version), format="json")
    assert later.status_code == 201, later.content


def test_an_agent_moving_its_waiting_task_to_running_changes_nothing(api, running_task, reviewer, unique):
    """Older agents move the task back to running themselves: the task keeps waiting for the
    held call, the version stays, and the approval still holds."""
    version = running_task.version
    first, _ = held_pair(api, running_task, unique)
    moved = api.post(f"/api/v1/tasks/{running_task.task_id}/transition",
                     {"to": "running", "expected_version": version, "fencing_token": running_task.fencing_token},
                     format="json")
    assert moved.status_code == 200, moved.content
    assert (moved.json()["status"], moved.json()["version"]) == ("waiting_approval", version)
    approval_approve(approval_id=first["approval_id"], reviewer=reviewer)
    run_dispatch(first["operation_id"], worker="test")
    assert Operation.objects.get(pk=first["operation_id"]).status == OperationStatus.CONFIRMED


def test_the_agents_own_commit_still_invalidates_a_held_approval(api, running_task, reviewer, unique):
    first, _ = held_pair(api, running_task, unique)
    task = running_task.task
    for to in ("paused", "running"):
        task = run_services.task_transition(task_id=task.task_id, to=to, expected_version=task.version,
                                            fencing_token=running_task.fencing_token, actor="agent")
    approval_approve(approval_id=first["approval_id"], reviewer=reviewer)
    run_dispatch(first["operation_id"], worker="test")
    assert Operation.objects.get(pk=first["operation_id"]).status == OperationStatus.CANCELLED
    assert not Operation.objects.get(pk=first["operation_id"]).attempts.exists()
