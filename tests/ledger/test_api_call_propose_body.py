"""The proposal's answer is built without DRF's output serializer (which deep-copies its dozen
fields and the nested decision's on every response), and is exactly what that serializer (the
schema's CallProposeOutput) makes, for every kind of answer."""

from __future__ import annotations

import json

import pytest
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIRequestFactory

from ledger import api as ledger_api
from ledger.models import Operation
from ledger.proposals import call_propose
from tests.fixtures.api import call_body, refund, start_task


def propose(agent, run, *, call_id="call-1", step_id="step-1", arguments=None):
    return call_propose(principal=agent, task_id=run.task_id, call_id=call_id, step_id=step_id,
                        tool_name="payments.refund", arguments=refund() if arguments is None else arguments,
                        expected_version=run.version, fencing_token=run.fencing_token)


def rendered(data) -> dict:
    return json.loads(JSONRenderer().render(data))


def serialized(proposal, request) -> dict:
    return rendered(ledger_api.CallProposeApi.OutputSerializer(proposal, context={"request": request}).data)


@pytest.mark.django_db
def test_every_kind_of_answer_is_what_the_output_serializer_makes(agent, running_task):
    request = APIRequestFactory().post("/api/v1/tasks/x/calls")
    dispatched = propose(agent, running_task)
    operation = Operation.objects.get(pk=dispatched.operation_id)
    operation.result = {"refund_id": "re_1", "amounts": [1.5, 2], "nested": {"none": None}}
    operation.save(update_fields=["result"])
    repeat = propose(agent, running_task)
    held = propose(agent, running_task, call_id="call-2", step_id="step-2", arguments=refund(250))
    held_again = propose(agent, running_task, call_id="call-2", step_id="step-2", arguments=refund(250))
    poor = start_task(agent, constraints={"max_amount": 10})
    refused = propose(agent, poor)
    kinds = {proposal.outcome.outcome for proposal in (dispatched, repeat, held, held_again, refused)}
    assert kinds == {"dispatched", "awaiting_approval", "refused"} and repeat.result and held.approval_id
    for proposal in (dispatched, repeat, held, held_again, refused):
        assert rendered(ledger_api.proposal_body(proposal, request)) == serialized(proposal, request)


@pytest.mark.django_db
def test_the_post_answers_without_the_output_serializer(api, running_task, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the output serializer ran")

    monkeypatch.setattr(ledger_api.CallProposeApi.OutputSerializer, "to_representation", refuse)
    response = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["decision"]["outcome"] == "dispatched"
