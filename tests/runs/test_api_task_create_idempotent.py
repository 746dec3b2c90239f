"""POST /api/v1/tasks with an Idempotency-Key and a `lease` body: an agent that dies after
creating its task, before its framework saved the step, finds the same task on restart."""

from __future__ import annotations

import pytest

from console.models import Event
from runs.models import Lease, Task
from tests.fixtures.api import assert_error

URL = "/api/v1/tasks"
CONTRACT = {"task_type": "refund", "goal": "Refund order ord-42", "inputs": {"order_id": "ord-42"}}
LEASE = {"owner": "thread-7f3a", "ttl_seconds": 300}


def create(api, body, key=None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return api.post(URL, body, format="json", **headers)


def test_the_same_key_and_contract_answers_the_same_task_with_200(api):
    first = create(api, CONTRACT, key="thread-7f3a")
    again = create(api, CONTRACT, key="thread-7f3a")
    assert (first.status_code, again.status_code) == (201, 200), again.content
    assert again.json()["task_id"] == first.json()["task_id"]
    assert Task.objects.count() == 1


def test_the_same_key_with_another_contract_is_422_and_creates_nothing(api):
    create(api, CONTRACT, key="thread-7f3a")
    error = assert_error(create(api, {**CONTRACT, "goal": "Refund order ord-43"}, key="thread-7f3a"),
                         422, "intent_mismatch")
    assert error["details"]["idempotency_key"] == "thread-7f3a"
    assert Task.objects.count() == 1


def test_without_a_key_every_post_is_a_new_task(api):
    create(api, CONTRACT)
    create(api, CONTRACT)
    assert Task.objects.count() == 2


def test_keys_belong_to_their_agent(api, outsider_api):
    mine = create(api, CONTRACT, key="thread-1").json()["task_id"]
    theirs = create(outsider_api, {**CONTRACT, "goal": "another"}, key="thread-1")
    assert theirs.status_code == 201
    assert theirs.json()["task_id"] != mine


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there"])
def test_a_bad_key_is_400(api, key):
    assert_error(create(api, CONTRACT, key=key), 400, "invalid")
    assert Task.objects.count() == 0


def test_a_lease_body_creates_leases_and_runs_the_task_in_one_call(api):
    response = create(api, {**CONTRACT, "lease": LEASE}, key="thread-7f3a")
    assert response.status_code == 201, response.content
    body = response.json()
    task = Task.objects.get(pk=body["task_id"])
    lease = Lease.objects.get(task=task)
    assert (body["status"], body["version"]) == ("running", task.version) == ("running", 3)
    assert body["fencing_token"] == lease.fencing_token
    assert body["lease"]["owner"] == "thread-7f3a"
    # The agent proposes at once with what it was answered.
    call = api.post(f"/api/v1/tasks/{task.task_id}/calls", {
        "call_id": "c1", "step_id": "s1", "tool": "orders.lookup", "arguments": {"order_id": "ord-42"},
        "expected_version": body["version"], "fencing_token": body["fencing_token"]}, format="json")
    assert call.status_code == 201, call.content


def test_trap_the_restarted_agent_gets_its_task_back_leased_with_a_new_token(api):
    """The same owner re-taking its own live lease gets it, with a new fencing token: the
    process that died cannot commit with the old one."""
    first = create(api, {**CONTRACT, "lease": LEASE}, key="thread-7f3a").json()
    again = create(api, {**CONTRACT, "lease": LEASE}, key="thread-7f3a")
    assert again.status_code == 200, again.content
    body = again.json()
    assert body["task_id"] == first["task_id"]
    assert (body["status"], body["version"]) == ("running", first["version"])
    assert body["fencing_token"] > first["fencing_token"]
    stale = api.post(f"/api/v1/tasks/{body['task_id']}/transition", {
        "to": "failed", "expected_version": body["version"], "fencing_token": first["fencing_token"]}, format="json")
    assert_error(stale, 409, "stale_fencing_token")
    assert Task.objects.count() == 1


def test_another_owner_waits_for_the_live_lease(api):
    create(api, {**CONTRACT, "lease": LEASE}, key="thread-7f3a")
    other = create(api, {**CONTRACT, "lease": {**LEASE, "owner": "someone-else"}}, key="thread-7f3a")
    assert_error(other, 409, "conflict")
    assert Lease.objects.get().owner == "thread-7f3a"


@pytest.mark.parametrize("lease", [{"owner": "w"}, {"owner": 5, "ttl_seconds": 60}, {"owner": "w", "ttl_seconds": 0},
                                   "w"])
def test_a_bad_lease_body_is_400_and_creates_nothing(api, lease):
    assert_error(create(api, {**CONTRACT, "lease": lease}, key="k"), 400, "invalid")
    assert Task.objects.count() == 0


def test_the_start_leaves_one_event_per_move(api):
    task_id = create(api, {**CONTRACT, "lease": LEASE}).json()["task_id"]
    moves = list(Event.objects.filter(entity="task", entity_id=task_id).order_by("id")
                 .values_list("to_status", flat=True))
    assert moves == ["queued", "planning", "running"]


def test_a_finished_task_found_by_its_key_takes_no_lease(api):
    body = create(api, {**CONTRACT, "lease": LEASE}, key="thread-7f3a").json()
    api.post(f"/api/v1/tasks/{body['task_id']}/transition", {
        "to": "cancelled", "expected_version": body["version"], "fencing_token": body["fencing_token"]}, format="json")
    assert_error(create(api, {**CONTRACT, "lease": LEASE}, key="thread-7f3a"), 409, "conflict")
    again = create(api, CONTRACT, key="thread-7f3a")
    assert (again.status_code, again.json()["status"]) == (200, "cancelled")


# Found by tests/test_api_schema_fuzz.py: a key's contract is hashed canonically (RFC 8785), which
# has no form for an integer beyond 2^53; such a contract was a 500.
@pytest.mark.parametrize("key", [None, "thread-7f3a"])
def test_a_contract_canonical_json_cannot_hold_is_400_with_or_without_a_key(api, key):
    body = {**CONTRACT, "constraints": {"n": -171994511416989950510341554176}}

    error = assert_error(create(api, body, key=key), 400, "invalid")

    assert "constraints" in error["details"]["fields"]
    assert Task.objects.count() == 0
