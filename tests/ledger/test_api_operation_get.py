"""GET /api/v1/operations/{operation_id}."""

from __future__ import annotations

from ledger import decisions
from ledger import services as ledger_services
from ledger.models import Fact
from tests.fixtures.api import assert_error, call_body, refund


def propose(api, run, **kwargs):
    response = api.post(f"/api/v1/tasks/{run.task_id}/calls", call_body(run, **kwargs), format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_it_shows_attempts_receipt_and_result(api, running_task):
    proposal = propose(api, running_task)
    operation_id = proposal["operation_id"]
    operation, attempt = ledger_services.operation_dispatch(operation_id=operation_id, worker="w1")
    ledger_services.operation_record_outcome(
        operation_id=operation_id, attempt_number=1, fencing_token=attempt.fencing_token,
        fact=Fact.KNOWN_SUCCESS, receipt={"refund_id": "re_1"}, result={"amount": 30}, latency_ms=12,
    )
    response = api.get(f"/api/v1/operations/{operation_id}")
    assert response.status_code == 200
    body = response.json()
    assert (body["operation_id"], body["call_id"], body["status"]) == (operation_id, "call-1", "confirmed")
    assert (body["receipt"], body["result"], body["approval"]) == ({"refund_id": "re_1"}, {"amount": 30}, None)
    assert [(a["number"], a["fact"], a["latency_ms"], a["stale"]) for a in body["attempts"]] == [
        (1, "known_success", 12, False)]
    assert (body["tool"], body["step_id"], body["decision"]["outcome"]) == ("payments.refund", "step-1", "dispatched")


def test_it_shows_the_approval_and_its_progress(api, running_task, senior):
    proposal = propose(api, running_task, arguments=refund(250))
    decisions.approval_approve(approval_id=proposal["approval_id"], reviewer=senior)
    body = api.get(f"/api/v1/operations/{proposal['operation_id']}").json()
    approval = body["approval"]
    assert (approval["approval_id"], approval["status"], approval["call_id"]) == (
        proposal["approval_id"], "pending", "call-1")
    assert (approval["approvals_needed"], approval["approvals_given"], approval["state_version"]) == (2, 1, 3)
    assert (body["status"], body["decision"]["outcome"], body["attempts"]) == ("planned", "awaiting_approval", [])


def test_another_tenants_operation_is_404(api, outsider_api, running_task):
    proposal = propose(api, running_task)
    assert_error(outsider_api.get(f"/api/v1/operations/{proposal['operation_id']}"), 404, "not_found")


def test_an_unknown_operation_is_404(api):
    assert_error(api.get("/api/v1/operations/op_nope"), 404, "not_found")


def test_it_needs_a_token(api, anonymous_api, running_task):
    proposal = propose(api, running_task)
    assert_error(anonymous_api.get(f"/api/v1/operations/{proposal['operation_id']}"), 401, "unauthenticated")
