"""The call answer, in one shape for every way an agent hears it: the API's call and operation
reads (`ledger.api`), the MCP server's tool results (`ledger.mcp_server`) and the decision
webhooks (`ledger.webhooks`) all answer `ledger.selectors.operation_detail` with these: built
directly (`operation_body`), in the shape OperationOutputSerializer documents in the schema."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urljoin

from django.urls import reverse
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from ledger.selectors import CALL_STATUSES, Outcome


class DecisionSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(
        choices=Outcome.choices,
        help_text="dispatched (the gate ran it at once), awaiting_approval, approved, rejected (by a reviewer), "
                  "refused (by the gate), expired, cancelled.")
    by = serializers.CharField(allow_null=True, help_text="Who decided: system:gate, user:<name>, system:<part>.")
    at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(allow_null=True, help_text="The reviewer's (or the system's) reason.")
    approvals_given = serializers.IntegerField()
    approvals_needed = serializers.IntegerField()
    expires_at = serializers.DateTimeField(allow_null=True, help_text="When the approval request expires.")
    url = serializers.SerializerMethodField(help_text="The approval page, for a person.")

    class Meta:
        ref_name = "CallDecision"

    def get_url(self, outcome) -> str | None:
        return approval_url(outcome.approval_id, self.context.get("request"))


def approval_url(approval_id: str | None, request) -> str | None:
    """The approval page of a held call, absolute when there is a request to say the host."""
    if approval_id is None:
        return None
    path = reverse("approvals:detail", args=[approval_id])
    return request.build_absolute_uri(path) if request is not None else path


# Unbound, so its representation of a datetime (ISO 8601 in the current time zone, "Z" for UTC)
# is DecisionSerializer's without a serializer's fields deep-copied for each answer.
_DATETIME = serializers.DateTimeField()


def _moment(value) -> str | None:
    return None if value is None else _DATETIME.to_representation(value)


def decision_body(outcome, request) -> dict[str, Any]:
    """DecisionSerializer's representation of a CallOutcome, built directly (the proposal's hot
    answer; tests/ledger/test_api_call_propose_body.py holds the two equal)."""
    return {
        "outcome": outcome.outcome,
        "by": outcome.by,
        "at": _moment(outcome.at),
        "reason": outcome.reason,
        "approvals_given": outcome.approvals_given,
        "approvals_needed": outcome.approvals_needed,
        "expires_at": _moment(outcome.expires_at),
        "url": approval_url(outcome.approval_id, request),
    }


class OperationOutputSerializer(serializers.Serializer):
    class Attempt(serializers.Serializer):
        number = serializers.IntegerField()
        fact = serializers.CharField(allow_null=True, help_text="not_sent, known_failure, unknown, known_success")
        started_at = serializers.DateTimeField()
        finished_at = serializers.DateTimeField(allow_null=True)
        error_class = serializers.CharField(allow_blank=True)
        error_code = serializers.CharField(allow_blank=True)
        latency_ms = serializers.IntegerField(allow_null=True)
        stale = serializers.BooleanField(help_text="A late result of a superseded worker, kept as evidence.")

        class Meta:
            ref_name = "Attempt"

    class Approval(serializers.Serializer):
        approval_id = serializers.CharField()
        status = serializers.CharField()
        call_id = serializers.CharField()
        risk_tier = serializers.IntegerField()
        approvals_needed = serializers.IntegerField()
        approvals_given = serializers.IntegerField()
        reasons = serializers.ListField(child=serializers.CharField())
        arguments_hash = serializers.CharField()
        state_version = serializers.IntegerField()
        expires_at = serializers.DateTimeField()
        decided_at = serializers.DateTimeField(allow_null=True)
        pending = serializers.BooleanField()

        class Meta:
            ref_name = "Approval"

    operation_id = serializers.CharField(allow_null=True, help_text="None for a call the gate refused.")
    call_id = serializers.CharField()
    task_id = serializers.CharField()
    step_id = serializers.CharField()
    tool = serializers.CharField()
    status = serializers.ChoiceField(choices=CALL_STATUSES,
                                     help_text="The operation's status; `refused` for a call the gate refused.")
    decision = DecisionSerializer()
    final = serializers.BooleanField(help_text="Nothing more will happen to this call.")
    task_version = serializers.IntegerField(help_text="The task's version now.")
    reasons = serializers.ListField(child=serializers.CharField())
    risk_tier = serializers.IntegerField(allow_null=True)
    idempotency_key = serializers.CharField()
    arguments_hash = serializers.CharField()
    attempt_count = serializers.IntegerField()
    attempts = Attempt(many=True)
    receipt = serializers.JSONField(allow_null=True)
    result = serializers.JSONField(allow_null=True)
    last_error = serializers.CharField(allow_blank=True)
    approval = Approval(allow_null=True)
    call_ids = serializers.ListField(child=serializers.CharField(),
                                     help_text="Every call ID that maps to this operation.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    class Meta:
        ref_name = "Operation"


def _attempt_body(attempt: dict[str, Any]) -> dict[str, Any]:
    return {
        "number": attempt["number"],
        "fact": attempt["fact"],
        "started_at": _moment(attempt["started_at"]),
        "finished_at": _moment(attempt["finished_at"]),
        "error_class": attempt["error_class"],
        "error_code": attempt["error_code"],
        "latency_ms": attempt["latency_ms"],
        "stale": attempt["stale"],
    }


def _approval_body(approval: dict[str, Any] | None) -> dict[str, Any] | None:
    if approval is None:
        return None
    return {
        "approval_id": approval["approval_id"],
        "status": approval["status"],
        "call_id": approval["call_id"],
        "risk_tier": approval["risk_tier"],
        "approvals_needed": approval["approvals_needed"],
        "approvals_given": approval["approvals_given"],
        "reasons": [str(reason) for reason in approval["reasons"]],
        "arguments_hash": approval["arguments_hash"],
        "state_version": approval["state_version"],
        "expires_at": _moment(approval["expires_at"]),
        "decided_at": _moment(approval["decided_at"]),
        "pending": approval["pending"],
    }


def operation_body(detail: dict[str, Any], request) -> dict[str, Any]:
    """OperationOutputSerializer's representation of `ledger.selectors.operation_detail` (or
    `call_detail`), built directly: the serializer deep-copies its two dozen fields and its nested
    serializers' on every answer, on the request an agent waits on. The detail holds the types
    the fields would output (text, integers, booleans, JSON as stored); datetimes are written as
    the DateTimeField writes them. tests/ledger/test_api_call_answer_body.py holds the two equal
    for every kind of call."""
    return {
        "operation_id": detail["operation_id"],
        "call_id": detail["call_id"],
        "task_id": detail["task_id"],
        "step_id": detail["step_id"],
        "tool": detail["tool"],
        "status": detail["status"],
        "decision": decision_body(detail["decision"], request),
        "final": detail["final"],
        "task_version": detail["task_version"],
        "reasons": [str(reason) for reason in detail["reasons"]],
        "risk_tier": detail["risk_tier"],
        "idempotency_key": detail["idempotency_key"],
        "arguments_hash": detail["arguments_hash"],
        "attempt_count": detail["attempt_count"],
        "attempts": [_attempt_body(attempt) for attempt in detail["attempts"]],
        "receipt": detail["receipt"],
        "result": detail["result"],
        "last_error": detail["last_error"],
        "approval": _approval_body(detail["approval"]),
        "call_ids": list(detail["call_ids"]),
        "created_at": _moment(detail["created_at"]),
        "updated_at": _moment(detail["updated_at"]),
    }


class BaseUrl:
    """What DecisionSerializer asks of a request, outside one: the approval page's absolute URL."""

    def __init__(self, base: str) -> None:
        self.base = base

    def build_absolute_uri(self, path: str) -> str:
        return urljoin(self.base, path)


def answer_json(detail: dict[str, Any], *, base_url: str) -> dict[str, Any]:
    """A call's detail as the JSON the API answers (datetimes as strings, links absolute)."""
    return json.loads(JSONRenderer().render(operation_body(detail, BaseUrl(base_url))))
