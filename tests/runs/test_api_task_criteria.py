"""POST /api/v1/tasks: success criteria are validated per kind, within bounds, and answered in
normal form; GET /api/v1/tasks/{id} shows each criterion's verdict once judged."""

from __future__ import annotations

import pytest

from runs import criteria
from runs.models import Task, TaskStatus
from runs.verification import run_verification
from tests.fixtures.api import assert_error

URL = "/api/v1/tasks"


def contract(*criteria_list) -> dict:
    return {"task_type": "support", "goal": "Update the customer's address", "success_criteria": list(criteria_list)}


GOOD = [
    {"kind": "operation_confirmed", "tool": "payments.refund", "arguments": {"order_id": "ord-1"}},
    {"kind": "operation_confirmed", "tool": "mail.send"},
    {"kind": "result_matches", "call_id": "toolu_01", "path": "/refund/status", "equals": "succeeded"},
    {"kind": "result_matches", "tool": "orders.lookup", "path": "items.0.sku", "contains": "BLUE"},
    {"kind": "result_matches", "tool": "orders.lookup", "path": "", "equals": None},
    {"kind": "human", "description": "The customer confirmed by phone"},
    {"kind": "verifier", "name": "refund_confirmed", "params": {"order_id": "ord-1", "amount": 30}},
]


@pytest.mark.parametrize("criterion", GOOD)
def test_each_kind_is_accepted_and_stored_as_sent(api, criterion):
    response = api.post(URL, contract(criterion), format="json")
    assert response.status_code == 201, response.content
    stored = Task.objects.get(pk=response.json()["task_id"]).success_criteria
    assert stored == [{**criterion, "path": criterion.get("path", "")} if criterion["kind"] == "result_matches"
                      else {**criterion, "params": criterion.get("params", {})} if criterion["kind"] == "verifier"
                      else criterion]


def test_free_text_and_the_verifier_shorthand_are_stored_in_normal_form(api):
    response = api.post(URL, contract("The customer is happy", {"kind": "mail_delivered", "to": ["a@example.com"]}),
                        format="json")
    assert response.status_code == 201, response.content
    assert Task.objects.get(pk=response.json()["task_id"]).success_criteria == [
        {"kind": "human", "description": "The customer is happy"},
        {"kind": "verifier", "name": "mail_delivered", "params": {"to": ["a@example.com"]}},
    ]


BAD = [
    ("not a kind", {"kind": "vibes"}, "kind"),
    ("no kind", {"tool": "mail.send"}, "kind"),
    ("a number", 5, None),
    ("empty text", "  ", None),
    ("unknown key (a typo)", {"kind": "result_matches", "tool": "t", "path": "a", "equal": 1}, "equal"),
    ("both call and tool", {"kind": "result_matches", "tool": "t", "call_id": "c", "equals": 1}, "call_id"),
    ("neither call nor tool", {"kind": "result_matches", "equals": 1}, "call_id"),
    ("both equals and contains", {"kind": "result_matches", "tool": "t", "equals": 1, "contains": 1}, "equals"),
    ("neither equals nor contains", {"kind": "result_matches", "tool": "t", "path": "a"}, "equals"),
    ("a pointer with a bad escape", {"kind": "result_matches", "tool": "t", "path": "/a~2", "equals": 1}, "path"),
    ("an empty dotted segment", {"kind": "result_matches", "tool": "t", "path": "a..b", "equals": 1}, "path"),
    ("too many segments", {"kind": "result_matches", "tool": "t", "path": ".".join("a" * 17), "equals": 1}, "path"),
    ("a path too long", {"kind": "result_matches", "tool": "t", "path": "a" * 257, "equals": 1}, "path"),
    ("a value too large", {"kind": "result_matches", "tool": "t", "equals": "x" * 5000}, "equals"),
    ("a value too deep", {"kind": "operation_confirmed", "tool": "t",
                          "arguments": {"a": [[[[[[[[[1]]]]]]]]]}}, "arguments"),
    ("arguments not an object", {"kind": "operation_confirmed", "tool": "t", "arguments": [1]}, "arguments"),
    ("a tool that is no string", {"kind": "operation_confirmed", "tool": 7}, "tool"),
    ("a human check without a description", {"kind": "human"}, "description"),
    ("a description too long", {"kind": "human", "description": "x" * 2001}, "description"),
    ("an unregistered verifier", {"kind": "verifier", "name": "nobody"}, "name"),
]


@pytest.mark.parametrize(("why", "criterion", "field"), BAD, ids=[b[0] for b in BAD])
def test_bad_criteria_are_refused_with_400_in_the_error_shape(api, why, criterion, field):
    error = assert_error(api.post(URL, contract(GOOD[0], criterion), format="json"), 400, "invalid")
    problem = error["details"]["fields"]["success_criteria"]["1"]
    if field is not None:
        assert field in problem, problem
    assert Task.objects.count() == 0


def test_more_criteria_than_the_limit_are_refused(api):
    many = [{"kind": "human", "description": f"check {n}"} for n in range(criteria.MAX_CRITERIA + 1)]
    error = assert_error(api.post(URL, contract(*many), format="json"), 400, "invalid")
    assert "success_criteria" in error["details"]["fields"]


def test_a_body_nested_past_the_api_budget_is_refused_before_validation(api):
    deep = "[" * 100 + "]" * 100
    body = ('{"task_type": "t", "goal": "g", "success_criteria": [{"kind": "result_matches", "tool": "t", '
            f'"equals": {deep}}}]}}')
    response = api.post(URL, body, content_type="application/json")
    assert_error(response, 400, "invalid")


def test_the_task_shows_each_criterions_verdict_once_judged(api):
    response = api.post(URL, contract("The customer is happy"), format="json")
    task_id = response.json()["task_id"]
    assert api.get(f"{URL}/{task_id}").json()["verdicts"] == []
    Task.objects.filter(pk=task_id).update(status=TaskStatus.VERIFYING)
    run_verification(task_id)
    body = api.get(f"{URL}/{task_id}").json()
    assert body["status"] == "waiting_review"
    assert body["success_criteria"] == [{"kind": "human", "description": "The customer is happy"}]
    [verdict] = body["verdicts"]
    assert (verdict["result"], verdict["source"], verdict["description"]) == ("review", "contract",
                                                                             "The customer is happy")


def test_the_schema_documents_each_kind(client):
    schema = client.get("/api/schema/", {"format": "json"}).json()["components"]["schemas"]
    union = schema["SuccessCriterion"]
    assert union["discriminator"]["propertyName"] == "kind"
    assert set(union["discriminator"]["mapping"]) == set(criteria.KINDS)
    item = schema["TaskCreateInput"]["properties"]["success_criteria"]["items"]
    assert {"type": "string", "minLength": 1, "maxLength": criteria.MAX_DESCRIPTION,
            "description": "Free text: a `human` criterion with this description."} in item["oneOf"]
    assert schema["TaskCreateInput"]["properties"]["success_criteria"]["maxItems"] == criteria.MAX_CRITERIA
    assert set(schema["ResultMatchesCriterion"]["properties"]) == {"kind", "call_id", "tool", "path", "equals",
                                                                   "contains", "description"}
