"""Races on the proposal endpoint, with real threads (one database connection each) against
PostgreSQL, where row locks are real."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest, ApprovalStatus
from ledger import decisions
from ledger.models import Attempt, Call, Operation
from tests.conftest import AGENT_TOKEN
from tests.fixtures.api import call_body, post_all_at_once, refund, start_task

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="needs PostgreSQL row locks"),
    pytest.mark.timeout(120),
]


def race(bodies: list[dict], task_id: str) -> list[tuple[int, dict]]:
    """POST every body at once, each from its own thread and connection."""
    return post_all_at_once([(f"/api/v1/tasks/{task_id}/calls", body) for body in bodies])


def test_fifty_identical_proposals_at_once_make_one_operation(agent):
    run = start_task(agent)
    body = call_body(run)
    results = race([body] * 50, run.task_id)

    assert [status for status, _ in results if status not in (200, 201)] == []
    assert sorted(status for status, _ in results).count(201) == 1
    assert {answer["operation_id"] for _, answer in results} == {Operation.objects.get().operation_id}
    assert {answer["decision"]["outcome"] for _, answer in results} == {"dispatched"}
    assert Call.objects.count() == 1
    assert Attempt.objects.count() == 0
    assert run.task.calls_used == 1


def test_fifty_identical_proposals_that_need_approval_make_one_approval(agent):
    run = start_task(agent)
    body = call_body(run, arguments=refund(120))
    results = race([body] * 50, run.task_id)

    assert sorted(status for status, _ in results) == [200] * 49 + [201]
    assert len({answer["approval_id"] for _, answer in results}) == 1
    assert Operation.objects.count() == 1
    assert run.task.status == "waiting_approval"


def test_twenty_proposals_with_one_call_id_and_other_arguments_make_one_operation(agent):
    run = start_task(agent)
    bodies = [call_body(run, arguments=refund(10 + i)) for i in range(20)]
    results = race(bodies, run.task_id)

    statuses = sorted(status for status, _ in results)
    assert statuses == [201] + [422] * 19
    assert {answer["error"]["code"] for status, answer in results if status == 422} == {"intent_mismatch"}
    operation = Operation.objects.get()
    winner = next(answer for status, answer in results if status == 201)
    assert operation.operation_id == winner["operation_id"]
    assert Call.objects.count() == 1


def together(*actions) -> list[BaseException]:
    """Run each action in its own thread and connection, all released at once; their errors."""
    start = threading.Barrier(len(actions))
    errors: list[BaseException] = []

    def worker(action) -> None:
        try:
            start.wait(timeout=30)
            action()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(action,)) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return errors


@pytest.mark.parametrize("round_", range(10))
def test_a_held_call_proposed_while_the_last_one_is_decided_keeps_the_task_waiting(agent, reviewer, round_):
    """A reviewer decides the task's only held call while the agent proposes another that needs
    approval: whichever commits first, the task ends `waiting_approval` (a call waits), with
    the agent's version unchanged."""
    run = start_task(agent)
    version = run.version
    held = race([call_body(run, call_id="held", step_id="held", arguments=refund(120))], run.task_id)[0][1]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")
    body = call_body(run, call_id="next", step_id="next", arguments=refund(130, order_id="ord-43"),
                     expected_version=version)

    def propose() -> None:
        response = client.post(f"/api/v1/tasks/{run.task_id}/calls", body, format="json")
        assert response.status_code == 201, response.content

    errors = together(
        lambda: decisions.approval_reject(approval_id=held["approval_id"], reviewer=reviewer, reason="no"),
        propose,
    )
    assert errors == []
    task = run.task
    assert (task.status, task.version) == ("waiting_approval", version)
    assert ApprovalRequest.objects.filter(task_id=run.task_id, status=ApprovalStatus.PENDING).count() == 1
