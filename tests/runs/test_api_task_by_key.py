"""GET /api/v1/tasks?idempotency_key=K: a restarted agent reads the task it registered under its
key without taking a lease, so it learns that the task is finished (a finished task takes no
lease: the start with `lease` is 409)."""

from __future__ import annotations

import pytest

from tests.fixtures.api import assert_error

URL = "/api/v1/tasks"
CONTRACT = {"task_type": "refund", "goal": "Refund order ord-42", "inputs": {"order_id": "ord-42"}}
LEASE = {"owner": "thread-7f3a", "ttl_seconds": 300}

pytestmark = pytest.mark.django_db


def start(api, key="thread-7f3a") -> dict:
    answer = api.post(URL, {**CONTRACT, "lease": LEASE}, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert answer.status_code == 201, answer.content
    return answer.json()


def test_a_finished_task_is_read_by_its_key_where_a_restart_is_refused(api):
    task = start(api)
    done = api.post(f"{URL}/{task['task_id']}/transition", {
        "to": "failed", "expected_version": task["version"], "fencing_token": task["fencing_token"],
        "reason": "gave up"}, format="json")
    assert done.status_code == 200, done.content
    assert_error(api.post(URL, {**CONTRACT, "lease": LEASE}, format="json", HTTP_IDEMPOTENCY_KEY="thread-7f3a"),
                 409, "conflict")

    found = api.get(URL, {"idempotency_key": "thread-7f3a"})
    assert found.status_code == 200, found.content
    body = found.json()
    assert (body["task_id"], body["status"], body["version"]) == (task["task_id"], "failed", done.json()["version"])
    assert body["goal"] == CONTRACT["goal"]


def test_a_key_never_used_is_404(api):
    start(api)
    assert_error(api.get(URL, {"idempotency_key": "thread-other"}), 404, "not_found")


def test_another_agents_key_is_404(api, outsider_api):
    start(api)
    assert_error(outsider_api.get(URL, {"idempotency_key": "thread-7f3a"}), 404, "not_found")


@pytest.mark.parametrize("query", [{}, {"idempotency_key": ""}, {"idempotency_key": "tab\there"},
                                   {"idempotency_key": "k" * 256}])
def test_a_missing_or_malformed_key_is_400(api, query):
    assert_error(api.get(URL, query), 400, "invalid")


def test_it_needs_the_agents_token(client):
    assert client.get(URL, {"idempotency_key": "thread-7f3a"}).status_code == 401
