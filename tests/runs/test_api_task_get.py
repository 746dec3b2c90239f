"""GET /api/v1/tasks/{task_id}."""

from __future__ import annotations

from tests.fixtures.api import assert_error


def url(task_id: str) -> str:
    return f"/api/v1/tasks/{task_id}"


def test_it_shows_the_task_its_budget_and_lease(api, running_task):
    response = api.get(url(running_task.task_id))
    assert response.status_code == 200
    body = response.json()
    assert (body["task_id"], body["status"], body["version"]) == (running_task.task_id, "running", 3)
    assert body["budget"] == {"calls_used": 0, "writes_used": 0, "amount_used": 0.0, "limits": {}}
    assert body["lease"]["owner"] == "worker-1" and body["lease"]["live"] is True
    assert "fencing_token" not in body["lease"]  # only the holder learns it, from the lease call


def test_another_tenants_task_is_not_found(outsider_api, running_task):
    assert_error(outsider_api.get(url(running_task.task_id)), 404, "not_found")


def test_an_unknown_task_is_not_found(api):
    assert_error(api.get(url("tsk_nope")), 404, "not_found")


def test_it_needs_a_token(anonymous_api, running_task):
    assert_error(anonymous_api.get(url(running_task.task_id)), 401, "unauthenticated")
