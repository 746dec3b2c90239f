"""POST /api/v1/tasks: register a task contract."""

from __future__ import annotations

import pytest

from console.models import Event
from runs.models import Task
from tests.fixtures.api import assert_error

URL = "/api/v1/tasks"

CONTRACT = {
    "task_type": "refund",
    "goal": "Refund order ord-42, damaged in transit",
    "inputs": {"order_id": "ord-42"},
    "success_criteria": ["the customer was told", {"kind": "operation_confirmed", "tool": "payments.refund",
                                                   "arguments": {"order_id": "ord-42"}}],
    "constraints": {"max_tool_calls": 10, "max_writes": 3, "max_amount": 250.5,
                    "deadline": "2030-01-31T17:00:00Z"},
    "versions": {"workflow": "refund-v3", "model": "m-2025-01", "prompt": "p7", "tool_schemas": {"payments.refund": 1}},
}


def test_it_registers_a_contract(api, agent):
    response = api.post(URL, CONTRACT, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    task = Task.objects.get(pk=body["task_id"])
    assert (body["status"], body["version"]) == ("queued", 1)
    assert body["unenforced_constraints"] == []
    assert (task.tenant_id, task.actor, task.goal, task.inputs) == (agent.tenant_id, agent, CONTRACT["goal"],
                                                                   {"order_id": "ord-42"})
    assert task.constraints == CONTRACT["constraints"] and task.versions == CONTRACT["versions"]
    # Free text is a human criterion, in normal form.
    assert task.success_criteria == [{"kind": "human", "description": "the customer was told"},
                                     CONTRACT["success_criteria"][1]]
    assert Event.objects.filter(entity="task", entity_id=task.task_id, to_status="queued").exists()


def test_only_type_and_goal_are_required(api):
    response = api.post(URL, {"task_type": "lookup", "goal": "Find the order"}, format="json")
    assert response.status_code == 201
    task = Task.objects.get(pk=response.json()["task_id"])
    assert (task.inputs, task.success_criteria, task.constraints, task.versions) == ({}, [], {}, {})


def test_it_requires_type_and_goal(api):
    error = assert_error(api.post(URL, {"inputs": {}}, format="json"), 400, "invalid")
    assert set(error["details"]["fields"]) == {"task_type", "goal"}
    assert Task.objects.count() == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("goal", 5),
        ("task_type", ["refund"]),
        ("inputs", ["not", "an", "object"]),
        ("success_criteria", "done when done"),
        ("constraints", "cheap"),
        ("versions", 3),
    ],
)
def test_it_rejects_wrong_types(api, field, value):
    error = assert_error(api.post(URL, {**CONTRACT, field: value}, format="json"), 400, "invalid")
    assert field in error["details"]["fields"]
    assert Task.objects.count() == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_tool_calls", "ten"),
        ("max_tool_calls", 2.5),
        ("max_writes", -1),
        ("max_writes", True),
        ("max_amount", "250"),
        ("deadline", "tomorrow"),
        ("deadline", 1767225600),
        ("approval_threshold", [50]),
    ],
)
def test_it_rejects_constraints_of_the_wrong_type(api, key, value):
    response = api.post(URL, {**CONTRACT, "constraints": {key: value}}, format="json")
    error = assert_error(response, 400, "invalid")
    assert key in error["details"]["fields"]["constraints"]


def test_it_keeps_unknown_constraints_and_says_they_are_not_enforced(api):
    response = api.post(URL, {**CONTRACT, "constraints": {"max_amount": 10, "tone": "polite"}}, format="json")
    assert response.status_code == 201
    assert response.json()["unenforced_constraints"] == ["tone"]


def test_it_rejects_malformed_json(api):
    response = api.post(URL, '{"task_type": "refund", "goal": ', content_type="application/json")
    assert_error(response, 400, "invalid")


def test_it_rejects_a_body_that_is_not_an_object(api):
    assert_error(api.post(URL, [CONTRACT], format="json"), 400, "invalid")


def test_it_needs_a_token(anonymous_api):
    response = anonymous_api.post(URL, CONTRACT, format="json")
    assert_error(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"] == "Bearer"


def test_it_rejects_an_unknown_token(anonymous_api):
    anonymous_api.credentials(HTTP_AUTHORIZATION="Bearer not-a-token")
    assert_error(anonymous_api.post(URL, CONTRACT, format="json"), 401, "unauthenticated")
    assert Task.objects.count() == 0


def test_it_rejects_an_inactive_agent(api, agent):
    agent.is_active = False
    agent.save()
    assert_error(api.post(URL, CONTRACT, format="json"), 401, "unauthenticated")
