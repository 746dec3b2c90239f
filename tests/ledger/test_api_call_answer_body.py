"""A call's answer is built without DRF's output serializer (`ledger.answers.operation_body`)
and read with hand-written statements (`ledger.selectors.call_detail`), and is exactly, to the
byte, what the serializer (the schema's Operation) made of the detail the ORM read, for every
kind of call: run at once (authorized, confirmed, failed, unknown, manual, retried, with a stale
attempt), a regenerated call ID sharing the operation, held, approved, rejected, expired,
cancelled, and refused by the gate."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.utils import timezone
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIRequestFactory

from ledger import answers, selectors
from ledger import api as ledger_api
from ledger import services as ledger_services
from ledger.decisions import approval_approve, approval_expire, approval_reject
from ledger.models import Attempt, Call, Fact, Operation
from ledger.proposals import call_propose
from tests.fixtures.api import refund, start_task

ATTEMPT_KEYS = ("number", "fact", "started_at", "finished_at", "error_class", "error_code", "latency_ms", "stale")


def reference_detail(call: Call) -> dict:
    """The detail as the ORM reads it: the operation with its tool, step and task, then its
    attempts and its call IDs in queries of their own (the answer's reads before the statements
    written by hand)."""
    if call.operation_id is None:
        return selectors.refused_call_detail(call)
    operation = Operation.objects.select_related("tool", "step", "task").get(pk=call.operation_id)
    approval = selectors.operation_approval(operation, call_id=call.call_id)
    outcome = selectors.operation_outcome(operation, approval)
    return {
        "operation_id": operation.operation_id, "call_id": call.call_id, "task_id": operation.task_id,
        "step_id": operation.step.step_id, "tool": operation.tool.name, "status": operation.status,
        "decision": outcome, "final": outcome.final, "task_version": operation.task.version,
        "reasons": selectors.operation_decision(operation, approval)[1], "risk_tier": operation.risk_tier,
        "idempotency_key": operation.idempotency_key, "arguments_hash": operation.arguments_hash,
        "attempt_count": operation.attempt_count,
        "attempts": [{**row, "fact": row["fact"] or None}
                     for row in operation.attempts.order_by("number").values(*ATTEMPT_KEYS)],
        "receipt": operation.receipt, "result": operation.result, "last_error": operation.last_error,
        "approval": selectors.approval_detail(approval, approvals_given=outcome.approvals_given),
        "call_ids": list(operation.calls.order_by("created_at", "id").values_list("call_id", flat=True)),
        "created_at": operation.created_at, "updated_at": operation.updated_at,
    }


def serialized(detail: dict, request) -> bytes:
    return JSONRenderer().render(answers.OperationOutputSerializer(detail, context={"request": request}).data)


def built(detail: dict, request) -> bytes:
    return JSONRenderer().render(answers.operation_body(detail, request))


def propose(agent, run, call_id: str, *, step_id: str | None = None, amount: float = 30):
    return call_propose(principal=agent, task_id=run.task_id, call_id=call_id, step_id=step_id or call_id,
                        tool_name="payments.refund", arguments=refund(amount),
                        expected_version=run.version, fencing_token=run.fencing_token)


def dispatched(operation_id: str):
    return ledger_services.operation_dispatch(operation_id=operation_id, worker="test-worker")[1]


def outcome(operation_id: str, attempt, fact: str, **fields) -> None:
    ledger_services.operation_record_outcome(operation_id=operation_id, attempt_number=attempt.number,
                                             fencing_token=attempt.fencing_token, fact=fact, **fields)


def every_kind_of_call(agent, run, reviewer, senior, senior2) -> dict[str, Call]:
    """One call of each kind, by name."""
    propose(agent, run, "authorized")

    confirmed = propose(agent, run, "confirmed").operation_id
    outcome(confirmed, dispatched(confirmed), Fact.KNOWN_SUCCESS, receipt={"refund_id": "re_1"},
            result={"amount": 30.5, "items": [1, "two", None], "nested": {"ok": True}}, latency_ms=12)
    # A regenerated call ID for the same step shares the operation.
    propose(agent, run, "confirmed-again", step_id="confirmed")
    # A timestamp with no fraction of a second (SQLite stores it without one).
    Operation.objects.filter(pk=confirmed).update(updated_at=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))

    failed = propose(agent, run, "failed").operation_id
    outcome(failed, dispatched(failed), Fact.KNOWN_FAILURE, error_class="http_4xx", error_code="400",
            result={"error": "bad"})

    unknown = propose(agent, run, "unknown").operation_id
    outcome(unknown, dispatched(unknown), Fact.UNKNOWN, error_class="timeout")

    manual = propose(agent, run, "manual").operation_id
    outcome(manual, dispatched(manual), Fact.UNKNOWN, error_class="timeout")
    ledger_services.operation_escalate_manual(operation_id=manual, actor="system:reconciler", reason="no answer")

    retried = propose(agent, run, "retried").operation_id
    outcome(retried, dispatched(retried), Fact.NOT_SENT, error_class="http_5xx", error_code="503")
    second = dispatched(retried)
    outcome(retried, second, Fact.KNOWN_SUCCESS, receipt={"refund_id": "re_2"})
    Attempt.objects.filter(operation_id=retried, number=1).update(stale=True)

    held = propose(agent, run, "held", amount=250)
    approval_approve(approval_id=held.approval_id, reviewer=senior, reason="one of two")
    propose(agent, run, "held-again", step_id="held", amount=250)

    approved = propose(agent, run, "approved", amount=250)
    approval_approve(approval_id=approved.approval_id, reviewer=senior, reason="checked")
    approval_approve(approval_id=approved.approval_id, reviewer=senior2, reason="")
    approved_and_run = propose(agent, run, "approved-and-run", amount=120)
    approval_approve(approval_id=approved_and_run.approval_id, reviewer=reviewer, reason="fine")
    outcome(approved_and_run.operation_id, dispatched(approved_and_run.operation_id), Fact.KNOWN_SUCCESS,
            receipt={"refund_id": "re_3"})

    rejected = propose(agent, run, "rejected", amount=120)
    approval_reject(approval_id=rejected.approval_id, reviewer=reviewer, reason="customer already refunded")
    expired = propose(agent, run, "expired", amount=120)
    approval_expire(approval_id=expired.approval_id)
    cancelled = propose(agent, run, "cancelled").operation_id
    ledger_services.operation_cancel(operation_id=cancelled, actor="system:dispatcher", reason="tool disabled")

    poor = start_task(agent, constraints={"max_amount": 10}, owner="worker-2")
    refused = propose(agent, poor, "refused")
    assert refused.operation_id is None

    calls = {call.call_id: call for call in Call.objects.all()}
    statuses = {name: selectors.call_status(call) for name, call in calls.items()}
    assert statuses == {
        "authorized": "authorized", "confirmed": "confirmed", "confirmed-again": "confirmed", "failed": "failed",
        "unknown": "unknown", "manual": "manual", "retried": "confirmed", "held": "planned",
        "held-again": "planned", "approved": "authorized", "approved-and-run": "confirmed",
        "rejected": "rejected", "expired": "expired", "cancelled": "cancelled", "refused": "refused"}
    return calls


@pytest.fixture
def calls(agent, running_task, reviewer, senior, senior2) -> dict[str, Call]:
    return every_kind_of_call(agent, running_task, reviewer, senior, senior2)


@pytest.mark.django_db
@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris"])
def test_every_kind_of_call_is_answered_as_the_serializer_answered_the_orms_detail(agent, calls, zone):
    request = APIRequestFactory().get("/api/v1/calls/x")
    outcomes = set()
    with timezone.override(zone):
        for name, call in calls.items():
            expected = serialized(reference_detail(call), request)
            # Read again (the long-poll's answer after a change) ...
            assert built(selectors.call_detail(call), request) == expected, name
            # ... and from the operation read with the call (an answer that needed no waiting).
            read = selectors.call_for_principal(principal=agent, call_id=name, task_id=call.task_id)
            assert built(selectors.call_detail(read, fresh=False), request) == expected, name
            outcomes.add(selectors.call_detail(call)["decision"].outcome)
    assert outcomes == {"dispatched", "awaiting_approval", "approved", "rejected", "refused", "expired", "cancelled"}


@pytest.mark.django_db
def test_an_operation_and_the_json_of_mcp_and_webhooks_are_the_serializers(calls):
    request = APIRequestFactory().get("/api/v1/operations/x")
    for name, call in calls.items():
        if call.operation_id is None:
            continue
        operation = Operation.objects.select_related("tool", "step", "task").get(pk=call.operation_id)
        expected = serialized(reference_detail(operation.calls.get(call_id=operation.call_id)), request)
        assert built(selectors.operation_detail(operation), request) == expected, name
    base = answers.BaseUrl("https://countersign.example/")
    for name, call in calls.items():
        expected = json.loads(serialized(reference_detail(call), base))
        assert answers.answer_json(selectors.call_detail(call), base_url=base.base) == expected, name


@pytest.mark.django_db
def test_the_call_and_operation_reads_answer_without_the_output_serializer(api, agent, calls, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the output serializer ran")

    monkeypatch.setattr(answers.OperationOutputSerializer, "to_representation", refuse)
    request = APIRequestFactory().get("/api/v1/calls/x")
    for call in calls.values():
        assert ledger_api._call_body(call, request)["call_id"] == call.call_id
    response = api.get(f"/api/v1/operations/{calls['confirmed'].operation_id}")
    assert response.status_code == 200, response.content
    assert answers.answer_json(selectors.call_detail(calls["held"]), base_url="https://x.example/")["status"] == "planned"
