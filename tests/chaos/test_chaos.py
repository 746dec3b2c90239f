"""One trial of each chaos scenario with real processes: workers killed (SIGKILL) or frozen
(SIGSTOP/SIGCONT) at exact points of the protocol, duplicate deliveries, provider faults and
skewed clocks (test_chaos_clock_skew.py), races into the ledger (4, 5, 12), and database connections
cut mid-commit (test_chaos_dbdrop.py, PostgreSQL) — each checked against the provider's own
effect log (chaos/invariants.py)."""

from __future__ import annotations

import random

import pytest

from chaos import scenarios
from chaos.invariants import Finding
from ledger.models import Attempt, Operation, OperationStatus

S = OperationStatus
pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]


def run_one(name: str, stack, index: int = 0) -> list[Finding]:
    world = scenarios.ensure_world()
    return scenarios.run_trial(scenarios.get_scenario(name), stack, world, random.Random(7), index)


def explain(findings: list[Finding], stack) -> str:
    logs = "\n".join(f"--- {name}\n{text}" for name, text in stack.logs().items())
    return "\n".join(map(str, findings)) + "\n" + logs


def only_operation() -> Operation:
    return Operation.objects.get(tool__name__startswith="chaos.")


def test_a_worker_killed_after_the_provider_succeeded_ends_confirmed_with_one_effect(stack):
    findings = run_one("kill-after-provider", stack)
    assert findings == [], explain(findings, stack)
    operation = only_operation()
    assert operation.status == S.CONFIRMED and operation.attempt_count == 1
    assert operation.receipt["via"] == "query"  # found by reconciliation, not the dead worker


def test_a_worker_killed_before_the_dispatch_commit_is_dispatched_again_once(stack):
    findings = run_one("kill-before-dispatch", stack)
    assert findings == [], explain(findings, stack)
    assert only_operation().status == S.CONFIRMED


def test_a_dispatch_delivered_several_times_runs_once(stack):
    findings = run_one("duplicate-delivery", stack)
    assert findings == [], explain(findings, stack)
    assert Attempt.objects.count() == 1


def test_a_timeout_on_a_tool_without_idempotency_goes_to_a_person_without_a_retry(stack):
    findings = run_one("timeout-no-idempotency", stack)
    assert findings == [], explain(findings, stack)
    operation = only_operation()
    assert operation.status == S.MANUAL and operation.attempt_count == 1


def test_a_zombie_worker_that_wakes_up_after_a_takeover_changes_nothing(stack):
    findings = run_one("zombie-worker", stack, index=0)
    assert findings == [], explain(findings, stack)
    stale, fresh = Attempt.objects.order_by("number")
    assert stale.stale and not fresh.stale and fresh.fencing_token > stale.fencing_token
    assert only_operation().status == S.CONFIRMED


def test_a_zombie_worker_whose_success_arrives_after_reconciliation_changes_nothing(stack):
    findings = run_one("zombie-worker", stack, index=1)
    assert findings == [], explain(findings, stack)
    (late,) = Attempt.objects.all()
    assert late.stale and late.fact == "known_success"
    assert only_operation().receipt["via"] == "query"


@pytest.mark.parametrize("case", [0, 1, 2], ids=["always-failing", "one-failure", "not-retryable"])
def test_a_burst_of_429_and_5xx_is_retried_within_bounds(stack, case):
    findings = run_one("retry-burst", stack, index=case)
    assert findings == [], explain(findings, stack)


@pytest.mark.parametrize("case", [0, 1], ids=["approval-expired", "task-version-moved"])
def test_an_approval_gone_stale_in_the_queue_is_not_dispatched(stack, case):
    findings = run_one("approval-stale", stack, index=case)
    assert findings == [], explain(findings, stack)
    assert Attempt.objects.count() == 0
    assert only_operation().status == (S.EXPIRED if case == 0 else S.CANCELLED)


@pytest.mark.parametrize("case", [0, 1], ids=["runs-at-once", "needs-approval"])
def test_fifty_identical_proposals_at_once_make_one_operation(stack, case):
    findings = run_one("concurrent-proposals", stack, index=case)
    assert findings == [], explain(findings, stack)
    assert only_operation().status == S.CONFIRMED and Attempt.objects.count() == 1


@pytest.mark.parametrize("case", [0, 1], ids=["one-after-another", "racing"])
def test_one_call_id_with_other_arguments_is_refused_without_an_attempt(stack, case):
    findings = run_one("call-id-mismatch", stack, index=case)
    assert findings == [], explain(findings, stack)
    assert Attempt.objects.count() == 1


@pytest.mark.parametrize("case", [0, 1], ids=["old-holder-proposes", "old-holder-transitions"])
def test_two_workers_claiming_one_task_leave_the_stale_token_without_a_commit(stack, case):
    findings = run_one("stale-lease", stack, index=case)
    assert findings == [], explain(findings, stack)
    assert only_operation().status == S.CONFIRMED
