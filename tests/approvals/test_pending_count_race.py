"""The pending counts under concurrent writers and readers: real threads, their own PostgreSQL
connections. Requests are filed, decided and expired while readers fold the deltas; at the end
the counts equal a COUNT over the pending requests, and no writer failed (no deadlock, no
serialization error)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from approvals import selectors
from approvals.models import ApprovalRequest, PendingCount
from ledger import decisions
from tests.approvals.test_pending_count import recount
from tests.factories import make_pending_approval
from tests.ledger.test_decisions_race import at_once

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="needs PostgreSQL's concurrency"),
    pytest.mark.timeout(180),
]


def test_concurrent_filing_deciding_and_folding_keep_the_counts_exact(agent, reviewer, senior, senior2, monkeypatch):
    monkeypatch.setattr(selectors, "PENDING_COUNT_COMPACT_AT", 3)
    scope = selectors.reviewer_scope(reviewer)
    waiting = [make_pending_approval(agent, risk_tier=3 + i % 2) for i in range(12)]
    done = threading.Event()

    def file_requests():
        for i in range(12):
            make_pending_approval(agent, risk_tier=2 + i % 3, tool_name="payments.refund")

    def decide(requests, who):
        def job():
            for request in requests:
                if request.risk_tier == 3:
                    decisions.approval_approve(approval_id=request.approval_id, reviewer=who)
                else:
                    decisions.approval_reject(approval_id=request.approval_id, reviewer=who, reason="no")
        return job

    def expire():
        for request in waiting[8:]:
            decisions.approval_expire(approval_id=request.approval_id)

    def read_and_fold():
        while not done.is_set():
            selectors.tier_counts(scope)
            selectors.compact_pending_counts(scope.tenant_ids)

    readers = [threading.Thread(target=lambda: (read_and_fold(), connection.close())) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        outcomes = at_once(file_requests, file_requests, decide(waiting[:4], senior2),
                           decide(waiting[4:8], senior), expire)
    finally:
        done.set()
        for reader in readers:
            reader.join(timeout=60)
    assert outcomes == ["ok"] * 5
    assert ApprovalRequest.objects.filter(status="pending").count() == 24
    assert selectors.tier_counts(scope) == recount(scope)
    assert sum(PendingCount.objects.values_list("delta", flat=True)) == 24
