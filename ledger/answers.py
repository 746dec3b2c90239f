"""The call answer, in one shape for every way an agent hears it: the API's call and operation
reads (`ledger.api`), the MCP server's tool results (`ledger.mcp_server`) and the decision
webhooks (`ledger.webhooks`) all serialize `ledger.selectors.operation_detail` with these."""

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


def decision_body(outcome, request) -> dict[str, Any]:
    """DecisionSerializer's representation of a CallOutcome, built directly (the proposal's hot
    answer; tests/ledger/test_api_call_propose_body.py holds the two equal)."""
    return {
        "outcome": outcome.outcome,
        "by": outcome.by,
        "at": None if outcome.at is None else _DATETIME.to_representation(outcome.at),
        "reason": outcome.reason,
        "approvals_given": outcome.approvals_given,
        "approvals_needed": outcome.approvals_needed,
        "expires_at": None if outcome.expires_at is None else _DATETIME.to_representation(outcome.expires_at),
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


class BaseUrl:
    """What DecisionSerializer asks of a request, outside one: the approval page's absolute URL."""

    def __init__(self, base: str) -> None:
        self.base = base

    def build_absolute_uri(self, path: str) -> str:
        return urljoin(self.base, path)


def answer_json(detail: dict[str, Any], *, base_url: str) -> dict[str, Any]:
    """A call's detail as the JSON the API answers (datetimes as strings, links absolute)."""
    data = OperationOutputSerializer(detail, context={"request": BaseUrl(base_url)}).data
    return json.loads(JSONRenderer().render(data))
