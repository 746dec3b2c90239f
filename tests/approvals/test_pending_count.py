"""The inbox's per-tier counts come from `PendingCount` deltas kept by a trigger on the requests
table (migration 0018): after every move that changes a pending request's state, tier or
tenant, the counts equal a COUNT over the pending, unexpired requests."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import Count, Sum
from django.utils import timezone

from approvals import selectors
from approvals.models import ApprovalRequest, PendingCount, Tool
from approvals.stops import stop_create, stop_resume
from ledger import decisions
from ledger.control import task_cancel
from ledger.proposals import call_propose
from ledger.sweeper import run_sweep
from tests.conftest import make_user
from tests.factories import make_pending_approval
from tests.fixtures.api import start_task

pytestmark = pytest.mark.django_db


def recount(scope) -> dict[int, int]:
    """The counts as the inbox read them before: a GROUP BY over every pending request."""
    counts = dict.fromkeys(range(5), 0)
    for row in selectors.pending_in_scope(scope).order_by().values("risk_tier").annotate(n=Count("pk")):
        counts[row["risk_tier"]] = row["n"]
    return counts


@pytest.fixture
def counts(reviewer):
    def read() -> dict[int, int]:
        scope = selectors.reviewer_scope(reviewer)
        got = selectors.tier_counts(scope)
        assert got == recount(scope)
        return got

    return read


def test_a_new_pending_request_counts_in_its_tier(agent, counts):
    assert counts() == {0: 0, 1: 0, 2: 0, 3: 0, 4: 0}
    make_pending_approval(agent, risk_tier=3)
    make_pending_approval(agent, risk_tier=4)
    make_pending_approval(agent, risk_tier=2, tool_name="mail.send")
    assert counts() == {0: 0, 1: 0, 2: 1, 3: 1, 4: 1}


def test_approving_and_rejecting_take_a_request_out(agent, reviewer, counts):
    first, second = make_pending_approval(agent, risk_tier=3), make_pending_approval(agent, risk_tier=3)
    decisions.approval_approve(approval_id=first.approval_id, reviewer=reviewer)
    assert counts()[3] == 1
    decisions.approval_reject(approval_id=second.approval_id, reviewer=reviewer, reason="no")
    assert counts()[3] == 0


def test_the_first_of_two_approvals_keeps_an_l4_request_pending(agent, senior, senior2, counts):
    request = make_pending_approval(agent, risk_tier=4)
    decisions.approval_approve(approval_id=request.approval_id, reviewer=senior)
    assert counts()[4] == 1
    decisions.approval_approve(approval_id=request.approval_id, reviewer=senior2)
    assert counts()[4] == 0


def test_an_expired_request_leaves_the_counts_before_and_after_the_sweeper_moves_it(agent, counts):
    request = make_pending_approval(agent, risk_tier=3)
    make_pending_approval(agent, risk_tier=3)
    ApprovalRequest.objects.filter(pk=request.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert counts()[3] == 1  # still pending in the table, past its expiry
    run_sweep()
    assert ApprovalRequest.objects.get(pk=request.pk).status == "expired"
    assert counts()[3] == 1


def test_expire_and_invalidate_take_a_request_out(agent, counts):
    first, second = make_pending_approval(agent, risk_tier=3), make_pending_approval(agent, risk_tier=4)
    decisions.approval_expire(approval_id=first.approval_id)
    decisions.approval_invalidate(approval_id=second.approval_id, actor="system:test", reason="test")
    assert counts() == dict.fromkeys(range(5), 0)


def test_cancelling_the_task_takes_its_requests_out(agent, tenant, counts):
    request = make_pending_approval(agent, risk_tier=3)
    make_pending_approval(agent, risk_tier=4, task=request.task)
    make_pending_approval(agent, risk_tier=3)
    admin = make_user("admin-pc", tenant, "admin")
    task_cancel(task_id=request.task_id, user=admin, reason="wrong customer")
    assert counts() == {0: 0, 1: 0, 2: 0, 3: 1, 4: 0}


def test_a_stop_and_its_resume_change_no_count(agent, tenant, counts):
    make_pending_approval(agent, risk_tier=3)
    admin = make_user("admin-pc", tenant, "admin")
    stop = stop_create(tenant_id=tenant.pk, scope="tenant", user=admin, reason="incident")
    assert counts()[3] == 1
    stop_resume(stop_id=stop.stop_id, user=admin)
    assert counts()[3] == 1


def test_edit_and_approve_supersedes_the_old_request_and_files_the_new_one_where_it_belongs(agent, senior, counts):
    run = start_task(agent, constraints={"max_amount": 2000})
    arguments = {"order_id": "ord-42", "amount": 120, "currency": "EUR", "reason": "damaged"}
    proposal = call_propose(principal=agent, task_id=run.task_id, call_id="call-1", step_id="step-1",
                            tool_name="payments.refund", arguments=arguments,
                            expected_version=run.version, fencing_token=run.fencing_token)
    assert counts()[3] == 1
    # Edited up to L4: the editor's approval is one of two, the new request waits for another.
    result = decisions.approval_edit_and_approve(approval_id=proposal.approval_id, reviewer=senior,
                                                arguments={**arguments, "amount": 250}, reason="more")
    assert (result.new.risk_tier, result.new.status) == (4, "pending")
    assert counts() == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1}


def test_a_policy_raise_on_approval_moves_the_request_to_its_new_tier(agent, senior, counts):
    l3 = make_pending_approval(agent, risk_tier=3)
    Tool.objects.filter(name="payments.refund").update(base_tier=4)
    decisions.approval_approve(approval_id=l3.approval_id, reviewer=senior)
    assert ApprovalRequest.objects.get(pk=l3.pk).risk_tier == 4
    assert counts() == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1}


def test_bulk_updates_and_deletes_are_counted_too(agent, counts):
    requests = [make_pending_approval(agent, risk_tier=3) for _ in range(3)]
    ApprovalRequest.objects.filter(pk=requests[0].pk).update(risk_tier=2)
    assert counts() == {0: 0, 1: 0, 2: 1, 3: 2, 4: 0}
    ApprovalRequest.objects.filter(pk__in=[r.pk for r in requests[1:]]).update(status="expired")
    assert counts() == {0: 0, 1: 0, 2: 1, 3: 0, 4: 0}
    ApprovalRequest.objects.filter(pk=requests[1].pk).update(status="pending")  # only by hand
    assert counts()[3] == 1
    ApprovalRequest.objects.filter(pk=requests[1].pk).delete()
    assert counts() == {0: 0, 1: 0, 2: 1, 3: 0, 4: 0}


def test_another_tenants_requests_never_count(agent, outsider_agent, counts):
    make_pending_approval(outsider_agent, risk_tier=3)
    assert counts()[3] == 0


def test_reading_folds_the_deltas_into_one_row_per_tier_and_keeps_the_counts(agent, reviewer, counts, monkeypatch):
    requests = [make_pending_approval(agent, risk_tier=3 + i % 2) for i in range(6)]
    for request in requests[:3]:
        decisions.approval_expire(approval_id=request.approval_id)
    before = counts()
    assert PendingCount.objects.count() == 9
    monkeypatch.setattr(selectors, "PENDING_COUNT_COMPACT_AT", 4)
    assert counts() == before == {0: 0, 1: 0, 2: 0, 3: 1, 4: 2}
    assert sorted(PendingCount.objects.values_list("risk_tier", "delta")) == [(3, 1), (4, 2)]
    make_pending_approval(agent, risk_tier=3)
    assert counts()[3] == 2
    assert PendingCount.objects.aggregate(n=Sum("delta"))["n"] == 4


def test_a_fold_that_fails_leaves_the_deltas_and_the_counts_as_they_were(agent, counts, monkeypatch):
    from django.db import DatabaseError

    for tier in (3, 3, 4):
        make_pending_approval(agent, risk_tier=tier)
    monkeypatch.setattr(selectors, "PENDING_COUNT_COMPACT_AT", 1)

    def deadlock(*args, **kwargs):
        raise DatabaseError("deadlock detected")

    monkeypatch.setattr(PendingCount.objects, "bulk_create", deadlock)
    assert counts() == {0: 0, 1: 0, 2: 0, 3: 2, 4: 1}
    assert PendingCount.objects.count() == 3  # the DELETE was rolled back with the failed fold
