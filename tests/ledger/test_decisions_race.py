"""Two reviewers deciding one request at the same moment: real threads, their own connections,
PostgreSQL row locks. Exactly one decision counts and at most one dispatch is enqueued."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from approvals.models import ApprovalDecision, ApprovalRequest
from console.lib.errors import Conflict
from ledger.decisions import approval_approve, approval_reject
from ledger.models import Operation
from tests.factories import make_pending_approval

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="needs PostgreSQL row locks"),
    pytest.mark.timeout(120),
]


@pytest.fixture
def dispatches(monkeypatch):
    sent: list[str] = []
    lock = threading.Lock()

    def record(operation_id: str, **kwargs) -> None:
        with lock:
            sent.append(operation_id)

    monkeypatch.setattr("ledger.tasks.enqueue_dispatch", record)
    return sent


def at_once(*jobs) -> list[str]:
    start = threading.Barrier(len(jobs))
    outcomes: list[str] = [""] * len(jobs)

    def run(index, job):
        try:
            start.wait(timeout=30)
            job()
            outcomes[index] = "ok"
        except Conflict:
            outcomes[index] = "conflict"
        except Exception as exc:  # noqa: BLE001 - reported below
            outcomes[index] = f"error: {exc!r}"
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


@pytest.mark.parametrize("trial", range(3))
def test_two_reviewers_approving_at_once_make_one_decision_and_one_dispatch(agent, reviewer, senior, dispatches,
                                                                            trial):
    request = make_pending_approval(agent, risk_tier=3)
    outcomes = at_once(lambda: approval_approve(approval_id=request.approval_id, reviewer=reviewer),
                       lambda: approval_approve(approval_id=request.approval_id, reviewer=senior))
    assert sorted(outcomes) == ["conflict", "ok"]
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert ApprovalRequest.objects.get(pk=request.pk).status == "approved"
    assert Operation.objects.get(pk=request.operation_id).status == "authorized"
    assert dispatches == [request.operation_id]


@pytest.mark.parametrize("trial", range(3))
def test_approve_and_reject_at_once_leave_one_consistent_outcome(agent, reviewer, senior, dispatches, trial):
    request = make_pending_approval(agent, risk_tier=3)
    outcomes = at_once(lambda: approval_approve(approval_id=request.approval_id, reviewer=reviewer),
                       lambda: approval_reject(approval_id=request.approval_id, reviewer=senior, reason="no"))
    assert sorted(outcomes) == ["conflict", "ok"]
    [decision] = ApprovalDecision.objects.filter(request=request)
    request.refresh_from_db()
    operation = Operation.objects.get(pk=request.operation_id)
    if decision.verdict == "approve":
        assert (request.status, operation.status, dispatches) == ("approved", "authorized", [operation.pk])
    else:
        assert (request.status, operation.status, dispatches) == ("rejected", "rejected", [])
