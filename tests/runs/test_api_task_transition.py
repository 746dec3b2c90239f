"""POST /api/v1/tasks/{task_id}/transition."""

from __future__ import annotations

import pytest

from console.models import Event
from ledger.decisions import lease_acquire
from runs.models import Task
from runs.services import task_create
from tests.fixtures.api import assert_error


@pytest.fixture
def leased(agent):
    task = task_create(principal=agent, task_type="refund", goal="Refund")
    lease = lease_acquire(task_id=task.task_id, owner="worker-1", ttl_seconds=60)
    return task, lease.fencing_token


def url(task_id: str) -> str:
    return f"/api/v1/tasks/{task_id}/transition"


def test_it_moves_the_task_and_bumps_the_version(api, agent, leased):
    task, token = leased
    response = api.post(url(task.task_id), {"to": "planning", "expected_version": 1, "fencing_token": token,
                                           "evidence": {"plan": "refund"}}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"task_id": task.task_id, "status": "planning", "version": 2}
    event = Event.objects.get(entity="task", entity_id=task.task_id, to_status="planning")
    assert (event.from_status, event.actor, event.evidence) == ("queued", agent.ref, {"plan": "refund"})


def test_a_stale_version_is_a_conflict(api, leased):
    task, token = leased
    response = api.post(url(task.task_id), {"to": "planning", "expected_version": 7, "fencing_token": token},
                        format="json")
    assert_error(response, 409, "conflict")
    assert Task.objects.get(pk=task.pk).status == "queued"


def test_a_stale_fencing_token_is_a_conflict_with_its_own_code(api, leased):
    task, token = leased
    response = api.post(url(task.task_id), {"to": "planning", "expected_version": 1, "fencing_token": token + 1},
                        format="json")
    error = assert_error(response, 409, "stale_fencing_token")
    assert "fencing token" in error["message"]
    assert error["details"] == {"task_id": task.task_id, "fencing_token": token + 1, "current": token}


def test_an_illegal_move_is_a_conflict(api, leased):
    task, token = leased
    response = api.post(url(task.task_id), {"to": "verifying", "expected_version": 1, "fencing_token": token},
                        format="json")
    assert_error(response, 409, "illegal_transition")


def test_an_agent_cannot_declare_success(api, leased):
    task, token = leased
    response = api.post(url(task.task_id), {"to": "succeeded", "expected_version": 1, "fencing_token": token},
                        format="json")
    assert_error(response, 403, "forbidden")


@pytest.mark.parametrize("body", [
    {"to": "done", "expected_version": 1, "fencing_token": 1},
    {"to": "planning", "expected_version": "1", "fencing_token": 1},
    {"to": "planning", "expected_version": 1},
    {"to": "planning", "expected_version": 1, "fencing_token": 1, "evidence": "trust me"},
])
def test_it_rejects_invalid_input(api, leased, body):
    task, _ = leased
    assert_error(api.post(url(task.task_id), body, format="json"), 400, "invalid")


def test_another_tenants_task_is_not_found(outsider_api, leased):
    task, token = leased
    response = outsider_api.post(url(task.task_id), {"to": "planning", "expected_version": 1,
                                                    "fencing_token": token}, format="json")
    assert_error(response, 404, "not_found")
    assert Task.objects.get(pk=task.pk).status == "queued"


def test_it_needs_a_token(anonymous_api, leased):
    task, token = leased
    response = anonymous_api.post(url(task.task_id), {"to": "planning", "expected_version": 1,
                                                     "fencing_token": token}, format="json")
    assert_error(response, 401, "unauthenticated")


def test_a_task_cancelled_as_superseded_names_its_successor(api, agent):
    old = task_create(principal=agent, task_type="refund", goal="first plan")
    new = task_create(principal=agent, task_type="refund", goal="second plan")
    token = lease_acquire(task_id=old.task_id, owner="w", ttl_seconds=60).fencing_token
    response = api.post(f"/api/v1/tasks/{old.task_id}/transition",
                        {"to": "cancelled", "expected_version": 1, "fencing_token": token,
                         "superseded_by": new.task_id}, format="json")
    assert response.status_code == 200, response.content
    assert Task.objects.get(pk=old.pk).superseded_by_id == new.task_id
    assert api.get(f"/api/v1/tasks/{old.task_id}").json()["superseded_by"] == new.task_id


def test_superseded_by_must_be_another_task_of_the_tenant_and_only_with_cancel(api, agent, outsider_agent):
    old = task_create(principal=agent, task_type="refund", goal="g")
    foreign = task_create(principal=outsider_agent, task_type="refund", goal="g")
    token = lease_acquire(task_id=old.task_id, owner="w", ttl_seconds=60).fencing_token
    for body in ({"to": "cancelled", "superseded_by": foreign.task_id},
                 {"to": "cancelled", "superseded_by": old.task_id},
                 {"to": "planning", "superseded_by": foreign.task_id}):
        response = api.post(f"/api/v1/tasks/{old.task_id}/transition",
                            {**body, "expected_version": 1, "fencing_token": token}, format="json")
        assert response.status_code == 400, body
        assert response.json()["error"]["code"] == "invalid"
