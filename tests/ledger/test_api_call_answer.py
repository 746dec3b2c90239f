"""What every call answer says (`POST /tasks/{id}/calls`, `GET /calls/{id}`): `final`, the
task's current `task_version`, and one `decision` object — outcome, who decided and when, the
reviewer's reason as its own field, approvals given and needed, expiry, the approval page.
Refused calls are recorded: a repeat gets the same refusal, and they can be read back."""

from __future__ import annotations

import asyncio

import pytest
from django.test import AsyncClient

from approvals.models import ApprovalRequest
from ledger.decisions import approval_approve, approval_expire, approval_reject
from ledger.models import Call, Operation
from tests.conftest import AGENT_TOKEN
from tests.fixtures.api import MAIL, call_body, refund, start_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

DECISION_KEYS = {"outcome", "by", "at", "reason", "approvals_given", "approvals_needed", "expires_at", "url"}


def get(path: str, **params):
    async def run():
        return await AsyncClient().get(path, params, headers={"Authorization": f"Bearer {AGENT_TOKEN}"})

    return asyncio.run(run())


def propose(api, run, **kwargs):
    return api.post(f"/api/v1/tasks/{run.task_id}/calls", call_body(run, **kwargs), format="json")


def both(api, run, call_id="call-1", **kwargs):
    """The proposal's answer and the call read back."""
    posted = propose(api, run, call_id=call_id, **kwargs).json()
    return posted, get(f"/api/v1/calls/{call_id}", task_id=run.task_id).json()


def test_a_call_the_gate_runs_at_once_is_dispatched_and_not_final(api, running_task):
    for body in both(api, running_task):
        assert set(body["decision"]) == DECISION_KEYS
        assert body["decision"]["outcome"] == "dispatched"
        assert body["decision"]["by"] == "system:gate"
        assert body["decision"]["at"] is not None
        assert (body["decision"]["reason"], body["decision"]["url"]) == (None, None)
        assert body["final"] is False
        assert body["task_version"] == running_task.version


def test_a_held_call_says_what_it_waits_for(api, running_task):
    approval_id = None
    for body in both(api, running_task, arguments=refund(250)):
        decision = body["decision"]
        approval = ApprovalRequest.objects.get()
        approval_id = approval.approval_id
        assert decision["outcome"] == "awaiting_approval"
        assert (decision["by"], decision["at"], decision["reason"]) == (None, None, None)
        assert (decision["approvals_given"], decision["approvals_needed"]) == (0, 2)
        assert decision["expires_at"].startswith(approval.expires_at.strftime("%Y-%m-%dT%H:%M"))
        assert decision["url"] == f"http://testserver/approvals/{approval_id}/"
        assert body["final"] is False
    assert approval_id


def test_a_reviewers_rejection_is_rejected_with_their_reason_not_refused(api, running_task, reviewer):
    posted = propose(api, running_task, arguments=refund(120)).json()
    approval_reject(approval_id=posted["approval_id"], reviewer=reviewer, reason="customer already refunded")
    body = get("/api/v1/calls/call-1").json()
    assert body["decision"]["outcome"] == "rejected"
    assert (body["decision"]["by"], body["decision"]["reason"]) == ("user:reviewer", "customer already refunded")
    assert body["decision"]["at"] is not None
    assert body["final"] is True


def test_an_approved_call_names_its_approvers_count_and_reason(api, running_task, senior, senior2):
    posted = propose(api, running_task, arguments=refund(250)).json()
    approval_approve(approval_id=posted["approval_id"], reviewer=senior, reason="checked")
    assert get("/api/v1/calls/call-1").json()["decision"]["approvals_given"] == 1
    approval_approve(approval_id=posted["approval_id"], reviewer=senior2, reason="checked the receipt")
    decision = get("/api/v1/calls/call-1").json()["decision"]
    assert decision["outcome"] == "approved"
    assert (decision["by"], decision["reason"]) == ("user:senior2", "checked the receipt")
    assert (decision["approvals_given"], decision["approvals_needed"]) == (2, 2)


def test_an_expired_approval_is_expired_and_final(api, running_task):
    posted = propose(api, running_task, tool="mail.send", arguments=MAIL).json()
    approval_expire(approval_id=posted["approval_id"])
    body = get("/api/v1/calls/call-1", wait=5).json()  # final: answered at once
    assert (body["decision"]["outcome"], body["decision"]["by"], body["final"]) == ("expired", "system:sweeper", True)


def test_the_repeat_of_a_held_call_carries_the_same_decision(api, running_task):
    first = propose(api, running_task, arguments=refund(120)).json()
    again = propose(api, running_task, arguments=refund(120)).json()
    assert again["decision"] == first["decision"]
    assert again["final"] is False


# --- refused calls are recorded -----------------------------------------------------------------


def test_trap_a_repeat_of_a_refused_call_gets_the_same_refusal_not_409(api, agent):
    """The refusal spent the last budget and paused the task; the agent retries the call (its
    framework replays the step): it is answered the same refusal, from the ledger."""
    run = start_task(agent, constraints={"max_tool_calls": 1})
    propose(api, run, call_id="lookup", step_id="lookup", tool="orders.lookup", arguments={"order_id": "ord-1"})
    refused = propose(api, run, call_id="refund", step_id="refund")
    assert refused.status_code == 200, refused.content
    assert run.task.status == "paused"
    again = propose(api, run, call_id="refund", step_id="refund", expected_version=3)
    assert again.status_code == 200, again.content
    assert again.json() == {**refused.json(), "task_version": run.version}
    assert again.json()["decision"]["outcome"] == "refused" and again.json()["final"] is True


def test_a_refused_call_can_be_read_back(api, agent):
    run = start_task(agent, constraints={"max_amount": 10})
    posted, read = both(api, run)
    assert read["call_id"] == "call-1"
    assert (read["status"], read["operation_id"], read["final"]) == ("refused", None, True)
    assert read["decision"]["outcome"] == "refused"
    assert read["decision"]["by"] == "system:gate"
    assert read["decision"]["reason"] == "amount 30 exceeds what is left of the budget: 10 of 10"
    assert read["reasons"] == posted["reasons"] == ["amount 30 exceeds what is left of the budget: 10 of 10"]
    assert (read["tool"], read["step_id"], read["task_id"]) == ("payments.refund", "step-1", run.task_id)
    assert posted["decision"] == read["decision"]
    assert not Operation.objects.exists()
    assert Call.objects.get().refusal["reasons"] == read["reasons"]


def test_a_refused_call_with_other_arguments_is_422(api, agent):
    run = start_task(agent, constraints={"max_amount": 10})
    propose(api, run)
    response = propose(api, run, arguments=refund(40))
    assert response.status_code == 422, response.content
