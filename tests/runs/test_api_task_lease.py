"""POST /api/v1/tasks/{task_id}/lease."""

from __future__ import annotations

import pytest

from console.models import Event
from runs.models import Lease
from runs.services import task_create
from tests.fixtures.api import assert_error


@pytest.fixture
def task(agent):
    return task_create(principal=agent, task_type="refund", goal="Refund")


def url(task_id: str) -> str:
    return f"/api/v1/tasks/{task_id}/lease"


def test_it_grants_a_lease_with_a_fencing_token(api, task):
    response = api.post(url(task.task_id), {"owner": "worker-1", "ttl_seconds": 60}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    lease = Lease.objects.get(task=task)
    assert (body["fencing_token"], body["generation"], body["owner"]) == (lease.fencing_token, 1, "worker-1")
    assert body["expires_at"].startswith(lease.expires_at.strftime("%Y-%m-%dT%H:%M"))
    assert Event.objects.filter(entity="lease", entity_id=task.task_id).count() == 1


def test_the_holder_renews_and_keeps_its_token(api, task):
    first = api.post(url(task.task_id), {"owner": "worker-1", "ttl_seconds": 60}, format="json").json()
    again = api.post(url(task.task_id), {"owner": "worker-1", "ttl_seconds": 600}, format="json").json()
    assert again["fencing_token"] == first["fencing_token"]
    assert again["expires_at"] > first["expires_at"]


def test_another_owner_waits_for_a_live_lease(api, task):
    api.post(url(task.task_id), {"owner": "worker-1", "ttl_seconds": 60}, format="json")
    response = api.post(url(task.task_id), {"owner": "worker-2", "ttl_seconds": 60}, format="json")
    error = assert_error(response, 409, "conflict")
    assert error["details"]["owner"] == "worker-1"


@pytest.mark.parametrize("body", [{"owner": "w"}, {"owner": "w", "ttl_seconds": "60"},
                                  {"owner": "w", "ttl_seconds": 0}, {"owner": "w", "ttl_seconds": 3601},
                                  {"owner": 7, "ttl_seconds": 60}])
def test_it_rejects_invalid_input(api, task, body):
    assert_error(api.post(url(task.task_id), body, format="json"), 400, "invalid")
    assert not Lease.objects.exists()


def test_another_tenants_task_is_not_found(outsider_api, task):
    assert_error(outsider_api.post(url(task.task_id), {"owner": "w", "ttl_seconds": 60}, format="json"),
                 404, "not_found")
    assert not Lease.objects.exists()


def test_it_needs_a_token(anonymous_api, task):
    assert_error(anonymous_api.post(url(task.task_id), {"owner": "w", "ttl_seconds": 60}, format="json"),
                 401, "unauthenticated")
