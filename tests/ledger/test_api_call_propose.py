"""POST /api/v1/tasks/{task_id}/calls."""

from __future__ import annotations

import pytest

from approvals import stops
from approvals.models import ApprovalRequest, Stop
from console.models import Event, Role
from ledger.models import Attempt, Call, Operation
from tests.conftest import make_user
from tests.fixtures.api import MAIL, assert_error, call_body, refund


def url(task_id: str) -> str:
    return f"/api/v1/tasks/{task_id}/calls"


def test_a_new_call_is_created_and_dispatched(api, running_task):
    response = api.post(url(running_task.task_id), call_body(running_task), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    operation = Operation.objects.get()
    decided_at = body["decision"].pop("at")
    assert decided_at.startswith(operation.created_at.strftime("%Y-%m-%dT%H:%M"))
    assert body == {
        "call_id": "call-1", "operation_id": operation.operation_id,
        "decision": {"outcome": "dispatched", "by": "system:gate", "reason": None, "approvals_given": 0,
                     "approvals_needed": 0, "expires_at": None, "url": None},
        "final": False, "status": "authorized", "approval_id": None, "reasons": ["payments.refund: base tier L1"],
        "risk_tier": 1, "approvals_needed": 0, "task_id": running_task.task_id, "task_version": 3, "result": None,
    }


def test_a_repeat_is_answered_with_200_and_the_same_operation(api, running_task):
    first = api.post(url(running_task.task_id), call_body(running_task), format="json").json()
    response = api.post(url(running_task.task_id), call_body(running_task, expected_version=1, fencing_token=99),
                        format="json")
    assert response.status_code == 200
    assert response.json() == first
    assert (Operation.objects.count(), Call.objects.count()) == (1, 1)


def test_the_same_call_id_with_other_arguments_is_422(api, running_task):
    api.post(url(running_task.task_id), call_body(running_task), format="json")
    events = Event.objects.count()
    response = api.post(url(running_task.task_id), call_body(running_task, arguments=refund(45)), format="json")
    error = assert_error(response, 422, "intent_mismatch")
    assert error["details"]["call_id"] == "call-1"
    assert (Operation.objects.count(), Call.objects.count(), Attempt.objects.count()) == (1, 1, 0)
    assert Event.objects.count() == events


def test_a_regenerated_call_id_for_the_same_step_is_the_same_operation(api, running_task):
    first = api.post(url(running_task.task_id), call_body(running_task), format="json").json()
    response = api.post(url(running_task.task_id), call_body(running_task, call_id="call-regenerated"), format="json")
    assert response.status_code == 200
    assert response.json()["operation_id"] == first["operation_id"]
    assert response.json()["call_id"] == "call-regenerated"
    assert Operation.objects.count() == 1


def test_the_same_step_with_other_arguments_is_422(api, running_task):
    api.post(url(running_task.task_id), call_body(running_task), format="json")
    response = api.post(url(running_task.task_id), call_body(running_task, call_id="call-2", arguments=refund(45)),
                        format="json")
    assert_error(response, 422, "intent_mismatch")
    assert Operation.objects.count() == 1


def test_a_stale_version_is_409(api, running_task):
    response = api.post(url(running_task.task_id), call_body(running_task, expected_version=2), format="json")
    error = assert_error(response, 409, "conflict")
    assert error["details"]["version"] == 3
    assert not Operation.objects.exists()


def test_a_stale_fencing_token_is_409_with_its_own_code(api, running_task):
    response = api.post(url(running_task.task_id), call_body(running_task, fencing_token=41), format="json")
    assert assert_error(response, 409, "stale_fencing_token")["details"]["fencing_token"] == 41


def test_a_call_that_needs_approval_waits(api, running_task):
    response = api.post(url(running_task.task_id), call_body(running_task, arguments=refund(250)), format="json")
    assert response.status_code == 201
    body = response.json()
    approval = ApprovalRequest.objects.get()
    assert (body["decision"]["outcome"], body["status"], body["approval_id"]) == ("awaiting_approval", "planned",
                                                                      approval.approval_id)
    assert (body["risk_tier"], body["approvals_needed"], body["task_version"]) == (4, 2, 3)
    assert "amount 250 > 200 → L4" in body["reasons"]
    assert running_task.task.status == "waiting_approval"


def test_mail_waits_for_one_approval(api, running_task):
    body = call_body(running_task, tool="mail.send", arguments=MAIL)
    response = api.post(url(running_task.task_id), body, format="json")
    assert (response.json()["decision"]["outcome"], response.json()["risk_tier"]) == ("awaiting_approval", 2)


def test_a_refusal_is_200_with_reasons_and_no_operation(api, agent):
    from tests.fixtures.api import start_task

    run = start_task(agent, constraints={"max_amount": 10})
    response = api.post(url(run.task_id), call_body(run), format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["decision"]["outcome"], body["status"], body["operation_id"]) == ("refused", "refused", None)
    assert body["reasons"] == ["amount 30 exceeds what is left of the budget: 10 of 10"]
    assert not Operation.objects.exists()


def test_a_call_refused_by_a_stop_is_200_refused_and_the_same_answer_on_repeat(api, agent, running_task):
    stops.stop_create(tenant_id=agent.tenant_id, scope=Stop.Scope.AGENT, agent=agent,
                      user=make_user("boss", agent.tenant, Role.ADMIN), reason="incident 7")

    first = api.post(url(running_task.task_id), call_body(running_task), format="json")
    again = api.post(url(running_task.task_id), call_body(running_task), format="json")

    assert (first.status_code, again.status_code) == (200, 200)
    body = first.json()
    assert (body["decision"]["outcome"], body["status"], body["operation_id"], body["final"]) == (
        "refused", "refused", None, True)
    assert "Stopped: agent" in body["reasons"][0] and "incident 7" in body["reasons"][0]
    assert again.json() == body
    assert Call.objects.filter(operation__isnull=True).count() == 1


def test_arguments_against_the_schema_are_400_with_the_errors(api, running_task):
    response = api.post(url(running_task.task_id), call_body(running_task, arguments={"order_id": ""}),
                        format="json")
    error = assert_error(response, 400, "invalid")
    assert error["details"]["tool"] == "payments.refund"
    assert {e["validator"] for e in error["details"]["errors"]} >= {"minLength", "required"}


def test_a_tool_the_agent_may_not_use_is_403(api, agent, policy, running_task):
    agent.allowed_tools.remove(policy["payments.refund"])
    assert_error(api.post(url(running_task.task_id), call_body(running_task), format="json"), 403, "forbidden")


@pytest.mark.parametrize(("field", "value"), [
    ("arguments", ["order_id", "ord-42"]),
    ("expected_version", "3"),
    ("fencing_token", 1.5),
    ("call_id", 12),
    ("call_id", "c" * 65),
    ("tool", None),
])
def test_wrong_types_are_400(api, running_task, field, value):
    response = api.post(url(running_task.task_id), {**call_body(running_task), field: value}, format="json")
    error = assert_error(response, 400, "invalid")
    assert field in error["details"]["fields"]


def test_malformed_json_is_400(api, running_task):
    response = api.post(url(running_task.task_id), '{"call_id": "c", "arguments": {"amount": NaN}}',
                        content_type="application/json")
    assert_error(response, 400, "invalid")


def test_another_tenants_task_is_404(outsider_api, running_task):
    assert_error(outsider_api.post(url(running_task.task_id), call_body(running_task), format="json"),
                 404, "not_found")
    assert not Operation.objects.exists()


def test_it_needs_a_token(anonymous_api, running_task):
    assert_error(anonymous_api.post(url(running_task.task_id), call_body(running_task), format="json"),
                 401, "unauthenticated")


def test_arguments_json_cannot_say_exactly_are_400(api, running_task):
    body = call_body(running_task, arguments=refund(2**60))
    error = assert_error(api.post(url(running_task.task_id), body, format="json"), 400, "invalid")
    assert "canonicalized" in error["message"]
