"""Signed approval receipts: each decision is an HMAC-SHA256 receipt under AUDIT_SIGNING_KEY;
the dispatcher refuses (cancels, never dispatches) an approval whose decision row was forged or
altered behind the application's back; audit_verify names it; the exported key checks a receipt
offline from the documented bytes."""

from __future__ import annotations

import hashlib
import hmac
import io
import json

import pytest
from django.core.management import call_command
from django.db import connection

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from console.models import Event
from ledger.decisions import approval_approve
from ledger.dispatcher import run_dispatch
from ledger.models import Operation, OperationStatus
from tests.fixtures.api import MAIL, call_body, start_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def approved(api, agent, reviewer) -> ApprovalRequest:
    """A mail the reviewer approved; its dispatch not run yet (on-commit work does not run in
    these rolled-back tests)."""
    run = start_task(agent)
    answer = api.post(f"/api/v1/tasks/{run.task_id}/calls", call_body(run, tool="mail.send", arguments=MAIL),
                      format="json").json()
    assert answer["decision"]["outcome"] == "awaiting_approval"
    approval_approve(approval_id=answer["approval_id"], reviewer=reviewer)
    return ApprovalRequest.objects.get(pk=answer["approval_id"])


def verify() -> tuple[int, str]:
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("audit_verify", stdout=out)
    return exited.value.code, out.getvalue()


def assert_refused(approval: ApprovalRequest) -> None:
    result = run_dispatch(approval.operation_id, worker="test")

    assert result == "cancelled:approval_signature"
    operation = Operation.objects.get(pk=approval.operation_id)
    assert operation.status == OperationStatus.CANCELLED
    assert not operation.attempts.exists()  # nothing was sent
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalStatus.INVALIDATED
    cancelled = Event.objects.filter(entity="operation", entity_id=operation.pk, to_status=OperationStatus.CANCELLED)
    assert "forged approval" in cancelled.get().reason


def test_a_receipt_checks_offline_with_the_exported_key_and_the_documented_bytes(approved, reviewer):
    out = io.StringIO()
    call_command("audit_export_key", stdout=out, stderr=io.StringIO())
    key = out.getvalue().strip()
    decision = ApprovalDecision.objects.get(request=approved)
    # docs/security.md, "Signed approval decisions", written out by hand.
    signed = json.dumps(["countersign-decision-v1", approved.call_id, approved.arguments_hash, approved.state_version,
                         f"user:{reviewer.username}", "approve",
                         decision.created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")],
                        separators=(",", ":"), ensure_ascii=False).encode()

    assert decision.signature == hmac.new(key.encode(), signed, hashlib.sha256).hexdigest()
    assert verify()[0] == 0


def test_an_approval_whose_approver_was_changed_in_the_database_is_cancelled_not_dispatched(
        approved, senior):
    with connection.cursor() as cursor:
        cursor.execute("UPDATE approvals_approvaldecision SET reviewer_id = %s WHERE request_id = %s",
                       [senior.pk, approved.pk])

    code, out = verify()
    assert code == 1 and f"FORGED approval {approved.pk}" in out
    assert_refused(approved)


def test_an_approval_whose_decision_was_backdated_is_cancelled(approved):
    with connection.cursor() as cursor:
        cursor.execute("UPDATE approvals_approvaldecision SET created_at = %s WHERE request_id = %s",
                       ["2026-01-01 00:00:00+00:00" if connection.vendor == "postgresql" else "2026-01-01 00:00:00",
                        approved.pk])

    assert_refused(approved)


def test_an_approval_whose_operation_arguments_changed_after_it_is_cancelled(approved):
    Operation.objects.filter(pk=approved.operation_id).update(arguments_hash="0" * 64)

    assert_refused(approved)


def test_a_decision_row_inserted_without_a_receipt_is_cancelled(api, agent, reviewer, senior):
    run = start_task(agent)
    answer = api.post(f"/api/v1/tasks/{run.task_id}/calls", call_body(run, tool="mail.send", arguments=MAIL),
                      format="json").json()
    approval = ApprovalRequest.objects.get(pk=answer["approval_id"])
    # Approved behind the application's back: a decision row and the status, no receipt.
    ApprovalDecision.objects.create(request=approval, reviewer=senior, verdict="approve",
                                    arguments_hash=approval.arguments_hash)
    ApprovalRequest.objects.filter(pk=approval.pk).update(status=ApprovalStatus.APPROVED)
    Operation.objects.filter(pk=approval.operation_id).update(status=OperationStatus.AUTHORIZED)

    assert_refused(approval)
