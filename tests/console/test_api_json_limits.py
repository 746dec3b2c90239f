"""Bodies nested deep enough to exhaust recursion are refused before any recursive code reads
them: a 400 in the error shape, never a 500 (probes: arguments nested 600 deep, a task contract
nested 50,000 deep, a `kvlistValue` 250 deep in OTLP)."""

from __future__ import annotations

import json

import pytest

from runs.models import Task
from tests.conftest import AGENT_TOKEN
from tests.fixtures.api import assert_error, call_body

pytestmark = pytest.mark.django_db


def nested(depth: int, leaf: object = 1) -> str:
    return "[" * depth + json.dumps(leaf) + "]" * depth


def post_raw(client, path: str, body: str):
    return client.post(path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")


def test_arguments_nested_600_deep_are_a_400(client, running_task):
    body = json.dumps(call_body(running_task, arguments={"order_id": "ord-1"}))
    body = body.replace('{"order_id": "ord-1"}', '{"order_id": ' + nested(600, "ord-1") + "}")

    response = post_raw(client, f"/api/v1/tasks/{running_task.task_id}/calls", body)

    error = assert_error(response, 400, "invalid")
    assert "deep" in error["message"]


def test_a_task_contract_nested_50000_deep_is_a_400_and_creates_nothing(client, agent):
    before = Task.objects.count()
    body = '{"task_type": "refund", "goal": "g", "inputs": {"x": ' + nested(50_000) + "}}"

    response = post_raw(client, "/api/v1/tasks", body)

    assert_error(response, 400, "invalid")
    assert Task.objects.count() == before


def test_a_body_within_the_limits_still_works(client, agent):
    body = json.dumps({"task_type": "refund", "goal": "g", "inputs": {"x": json.loads(nested(20))}})
    assert post_raw(client, "/api/v1/tasks", body).status_code == 201


def test_brackets_inside_strings_do_not_count_as_depth(client, agent):
    body = json.dumps({"task_type": "refund", "goal": "[" * 5000 + '\\"{' * 100, "inputs": {}})
    assert post_raw(client, "/api/v1/tasks", body).status_code == 201


def test_otlp_json_nested_too_deep_is_a_400(client, agent):
    value = "1"
    for _ in range(3000):
        value = '{"kvlistValue": {"values": [{"key": "k", "value": ' + value + "}]}}"
    body = ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "' + "a" * 32 + '", "spanId": "'
            + "b" * 16 + '", "name": "s", "attributes": [{"key": "deep", "value": ' + value + "}]}]}]}]}")

    response = post_raw(client, "/v1/traces", body)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"


@pytest.mark.parametrize("text", ['"x\\u0000y"', '"\\ud846"', '"\\udc00 alone"'],
                         ids=["nul", "lone-high-surrogate", "lone-low-surrogate"])
@pytest.mark.parametrize("where", ["value", "key"])
def test_a_string_no_database_can_store_is_a_400_and_creates_nothing(client, agent, text, where):
    """PostgreSQL's text and jsonb cannot hold U+0000, and an unpaired surrogate is no UTF-8:
    found by schemathesis as a 500 on PostgreSQL (SQLite stored them)."""
    before = Task.objects.count()
    inputs = '{"note": ' + text + '}' if where == "value" else '{' + text + ': 1}'
    body = '{"task_type": "refund", "goal": "g", "inputs": ' + inputs + '}'

    response = post_raw(client, "/api/v1/tasks", body)

    error = assert_error(response, 400, "invalid")
    assert "U+0000" in error["message"] or "surrogate" in error["message"]
    assert Task.objects.count() == before


def test_escaped_backslashes_before_u0000_text_are_an_ordinary_string(client, agent):
    body = '{"task_type": "refund", "goal": "g", "inputs": {"path": "C:\\\\u0000"}}'
    response = post_raw(client, "/api/v1/tasks", body)
    assert response.status_code == 201, response.content
