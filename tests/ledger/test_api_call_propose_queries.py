"""What POST /api/v1/tasks/{task_id}/calls costs the database for a call the gate runs at once:
the agent (authentication), then one transaction — the lease and the task locked (the task's
statement also says whether the call and the operation are known and which policy generation
holds), and the budgets, step, call, operation, audit entry and events in one statement on
PostgreSQL (one each on SQLite) — and its commit. Nothing is read twice."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.fixtures.api import call_body


def expected() -> int:
    # PostgreSQL: agent, BEGIN, lease, task, the one writing statement, COMMIT.
    # SQLite: the writing statement is seven (task budgets, step, call, operation, audit entry,
    # two events).
    return 6 if connection.vendor == "postgresql" else 12


def warm(api, running_task) -> None:
    """The gate's configuration is read once per policy generation and process, not per call."""
    api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task, call_id="warm", step_id="warm"),
             format="json")


@pytest.mark.django_db
def test_a_proposal_the_gate_runs_at_once_reads_nothing_twice(api, running_task, django_assert_num_queries):
    warm(api, running_task)
    body = call_body(running_task)
    with django_assert_num_queries(expected()):
        response = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["status"] == "authorized"


@pytest.mark.django_db
def test_a_repeat_is_answered_from_the_ledger_with_one_read_more(api, running_task, django_assert_num_queries):
    body = call_body(running_task)
    api.post(f"/api/v1/tasks/{running_task.task_id}/calls", body, format="json")
    # Agent, BEGIN, lease, task (the call is known), the call with its operation, COMMIT; no
    # approval lookup for a call the gate ran at once.
    with django_assert_num_queries(6):
        response = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", body, format="json")
    assert response.status_code == 200


@pytest.mark.django_db
def test_a_regenerated_call_id_is_mapped_without_a_savepoint(api, running_task, django_assert_num_queries):
    api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task), format="json")
    # Agent, BEGIN, lease, task (the operation is known), the operation, the call (ON CONFLICT
    # DO NOTHING instead of a savepoint), its event, COMMIT.
    body = call_body(running_task, call_id="call-2")
    with django_assert_num_queries(8) as captured:
        response = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["operation_id"] is not None
    # The one savepoint is the test's own transaction standing in for BEGIN … COMMIT.
    assert sum("SAVEPOINT" in query["sql"] for query in captured.captured_queries) <= 2


@pytest.mark.django_db
def test_a_call_on_a_step_that_is_already_there_is_written_on_that_step(api, running_task):
    """A step the task already has (another tool's call under the same step ID): the new
    operation is written on it, and no second step appears."""
    from ledger.models import Operation
    from runs.models import Step

    first = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task), format="json")
    second = api.post(f"/api/v1/tasks/{running_task.task_id}/calls",
                      call_body(running_task, call_id="call-2", tool="orders.lookup",
                                arguments={"order_id": "ord-1"}), format="json")

    assert (first.status_code, second.status_code) == (201, 201), second.content
    (step,) = Step.objects.filter(task_id=running_task.task_id, step_id="step-1")
    operations = Operation.objects.filter(pk__in=[first.json()["operation_id"], second.json()["operation_id"]])
    assert sorted(op.step_id for op in operations) == [step.pk, step.pk]


# A task contract's free-form documents: an agent may make them large, and no proposal reads them.
CONTRACT_DOCUMENTS = ("inputs", "success_criteria", "versions", "verdicts")


@pytest.mark.django_db
@pytest.mark.parametrize("dispatch_here", [False, True], ids=["published", "dispatched in the request"])
def test_a_proposal_neither_selects_nor_parses_the_tasks_contract_documents(agent, running_task, dispatch_here):
    from django.test.utils import CaptureQueriesContext

    from console.lib import sql
    from ledger.proposals import call_propose
    from runs.models import Task

    Task.objects.filter(pk=running_task.task_id).update(inputs={"thread": ["Hello, a refund please. " * 40] * 100})
    with CaptureQueriesContext(connection) as captured:
        proposal = call_propose(principal=agent, task_id=running_task.task_id, call_id="call-1", step_id="step-1",
                                tool_name="payments.refund", arguments=call_body(running_task)["arguments"],
                                expected_version=running_task.version, fencing_token=running_task.fencing_token,
                                dispatch_here=dispatch_here)
    assert proposal.operation_id is not None
    statements = [query["sql"] for query in captured.captured_queries]

    def selected(name: str) -> bool:  # the column as sql.columns and sql.column spell it
        column = Task._meta.get_field(name).column
        return any(f't."{column}"' in text or sql.column(Task, name, "t") in text for text in statements)

    assert [name for name in CONTRACT_DOCUMENTS if selected(name)] == []
    assert selected("constraints")  # what the gate reads
