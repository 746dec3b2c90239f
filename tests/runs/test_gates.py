"""Release gates per split (runs.gates): each new gate computed from ledger rows, split by task
type, risk tier and tool, and the regression of p95 time and cost against the previous release."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from approvals import services as approval_services
from console.lib.errors import InvalidInput
from console.models import Event, Role
from ledger import decisions
from ledger import services as ledger_services
from ledger.models import Call, Operation
from ledger.models import OperationStatus as S
from ledger.proposals import call_propose
from runs import gates
from runs.models import ModelPrice, ReleaseGate, Span, Task, TaskStatus
from tests.conftest import make_user
from tests.factories import make_operation, make_pending_approval, make_task, record_outcome
from tests.fixtures.api import refund, start_task

pytestmark = pytest.mark.django_db
Ind, C = ReleaseGate.Indicator, ReleaseGate.Comparison


def since():
    return timezone.now() - timedelta(hours=1)


def gate(indicator, comparison, threshold, **fields) -> ReleaseGate:
    return ReleaseGate.objects.create(indicator=indicator, comparison=comparison, threshold=threshold, **fields)


def judge(agent, **kwargs) -> dict[int, gates.GateResult]:
    results, _ = gates.evaluate(tenant_ids={agent.tenant_id}, since=since(), **kwargs)
    return {r.gate.pk: r for r in results}


def by_split(result: gates.GateResult) -> dict[str, tuple[float | None, bool | None]]:
    return {s.name: (s.value, s.passed) for s in result.splits}


def approved_and_run(agent, approvers, *, risk_tier=3, outcome="confirmed", task=None):
    """A held call approved by `approvers`, its approval consumed by the claim, dispatched and
    recorded as the dispatcher does it."""
    request = make_pending_approval(agent, risk_tier=risk_tier, task=task)
    for person in approvers:
        decisions.approval_approve(approval_id=request.approval_id, reviewer=person)
    approval_services.approval_consume(approval_id=request.approval_id, actor="system:dispatcher")
    ledger_services.operation_dispatch(operation_id=request.operation_id, worker="w1")
    operation = Operation.objects.get(pk=request.operation_id)
    record_outcome(operation, fact={"confirmed": "known_success", "unknown": "unknown"}[outcome])
    return Operation.objects.get(pk=request.operation_id)


# ------------------------------------------------------------------- high-risk misexecution

def test_an_approved_l3_call_that_ran_as_approved_is_no_misexecution(agent, reviewer):
    checked = gate(Ind.HIGH_RISK_MISEXECUTIONS, C.EQ, 0)
    approved_and_run(agent, [reviewer])
    make_operation(agent, status=S.CONFIRMED)  # L1: not high risk, not counted
    result = judge(agent)[checked.pk]
    assert (result.value, result.passed) == (0, True)
    assert (result.splits[0].num, result.splits[0].den) == (0, 1)


def test_no_high_risk_operation_ran_says_no_data(agent):
    checked = gate(Ind.HIGH_RISK_MISEXECUTIONS, C.EQ, 0)
    make_pending_approval(agent, risk_tier=3)  # held, never ran
    assert judge(agent)[checked.pk].passed is None


def test_each_way_to_misexecute_counts_and_the_split_by_tier_says_where(agent, reviewer, senior):
    checked = gate(Ind.HIGH_RISK_MISEXECUTIONS, C.EQ, 0, split_by_risk_tier=True)
    approved_and_run(agent, [reviewer])  # fine
    second = make_user("senior2", agent.tenant, Role.REVIEWER, max_tier=4)
    approved_and_run(agent, [senior, second], risk_tier=4)  # fine
    unapproved = make_operation(agent, status=S.CONFIRMED, risk_tier=3)
    altered = approved_and_run(agent, [reviewer])
    Operation.objects.filter(pk=altered.pk).update(arguments={**altered.arguments, "amount": 199})
    mismatched = approved_and_run(agent, [reviewer], outcome="unknown")
    ledger_services.operation_require_compensation(
        operation_id=mismatched.operation_id, actor="system:reconciler", reason="the effect differs",
        evidence={"differences": {"amount": {"intent": 120, "found": 210}}})
    # An L4 request with one approval of two, consumed anyway: not enough people stood behind it.
    short = make_pending_approval(agent, risk_tier=4)
    decisions.approval_approve(approval_id=short.approval_id, reviewer=senior)
    type(short).objects.filter(pk=short.pk).update(status="consumed")
    ledger_services.operation_authorize(operation_id=short.operation_id, actor="system:test")
    ledger_services.operation_dispatch(operation_id=short.operation_id, worker="w1")

    # Approved at L3, raised to L4 afterwards and run on the L3 approval.
    raised = approved_and_run(agent, [reviewer])
    Operation.objects.filter(pk=raised.pk).update(risk_tier=4)

    result = judge(agent)[checked.pk]
    assert by_split(result) == {"L3": (3, False), "L4": (2, False)}
    assert (result.value, result.passed, result.failing) == (3, False, 2)
    notes = {ref: why for split in result.splits for _page, ref, why in split.notes}
    assert notes == {
        unapproved.operation_id: "no consumed approval",
        altered.operation_id: "ran other arguments than were proposed; ran other arguments than were approved",
        mismatched.operation_id: "reconciliation found a different effect",
        short.operation_id: "fewer valid approvals than needed",
        raised.operation_id: "approved for a lower tier than L4",
    }


def test_a_forged_approval_receipt_is_no_authority(agent, reviewer):
    checked = gate(Ind.HIGH_RISK_MISEXECUTIONS, C.EQ, 0)
    operation = approved_and_run(agent, [reviewer])
    from approvals.models import ApprovalDecision

    ApprovalDecision.objects.filter(request__operation=operation).update(signature="0" * 64)
    assert judge(agent)[checked.pk].value == 1


# ------------------------------------------------------------------- tool-argument validity

def test_argument_validity_counts_proposals_refused_for_their_arguments_per_tool(agent):
    checked = gate(Ind.ARGUMENT_VALIDITY, C.GTE, 0.995, split_by_tool=True)
    run = start_task(agent)

    def propose(call_id, tool, arguments):
        return call_propose(principal=agent, task_id=run.task_id, call_id=call_id, step_id=f"s-{call_id}",
                            tool_name=tool, arguments=arguments, expected_version=run.version,
                            fencing_token=run.fencing_token)

    propose("c1", "payments.refund", refund(30))
    propose("c2", "payments.refund", refund(31, order_id="ord-2"))
    with pytest.raises(InvalidInput):
        propose("c3", "payments.refund", refund("thirty"))
    propose("c4", "mail.send", {"to": ["a@example.com"], "subject": "s", "body": "b"})
    # The refused proposal wrote no call, only its record.
    assert not Call.objects.filter(call_id="c3").exists()
    event = Event.objects.get(entity="call", entity_id="c3")
    assert (event.kind, event.evidence["tool"], event.evidence["task_id"]) == ("call_refused", "payments.refund",
                                                                               run.task_id)
    assert event.evidence["invalid_arguments"][0]["path"] == "amount"
    result = judge(agent)[checked.pk]
    assert by_split(result) == {"payments.refund": (pytest.approx(2 / 3), False), "mail.send": (1.0, True)}
    # Split by the tool's base tier (refund L1, mail L2): the tier of invalid arguments is not known.
    by_tier = gate(Ind.ARGUMENT_VALIDITY, C.GTE, 0.995, split_by_risk_tier=True)
    assert by_split(judge(agent)[by_tier.pk]) == {"L1": (pytest.approx(2 / 3), False), "L2": (1.0, True)}


# ------------------------------------------------------------- regressions against a release

def finished(agent, release, seconds, *, task_type="refund", status=TaskStatus.SUCCEEDED, tokens=0):
    task = make_task(agent, task_type=task_type, versions={"release": release, "model": "gpt-x"})
    start = timezone.now() - timedelta(minutes=30)
    Task.objects.filter(pk=task.pk).update(status=status, created_at=start,
                                           updated_at=start + timedelta(seconds=seconds))
    if tokens:
        Span.objects.create(tenant_id=task.tenant_id, trace_id=task.pk[-32:].rjust(32, "0"), span_id="00000000000000a1",
                            name="chat", start_time=start, end_time=start, duration_ms=1, task=task,
                            gen_ai_model="gpt-x", input_tokens=tokens, output_tokens=0)
    return task


def test_releases_are_ordered_by_their_first_task_and_the_newest_is_judged(agent):
    for release in ("2026.1", "2026.2", "2026.3"):
        finished(agent, release, 10)
    pair = gates.release_pair({agent.tenant_id})
    assert (pair.current, pair.previous, pair.all) == ("2026.3", "2026.2", ["2026.1", "2026.2", "2026.3"])
    assert (gates.release_pair({agent.tenant_id}, "2026.2").previous) == "2026.1"
    assert gates.release_pair({agent.tenant_id}, "2026.1").previous == ""


def test_p95_time_regression_is_judged_per_task_type_against_the_previous_release(agent):
    checked = gate(Ind.TIME_P95_CHANGE, C.LTE, 0.10, split_by_task_type=True)
    for seconds in range(1, 21):  # p95 of 1..20 s is 19 s
        finished(agent, "r1", seconds)
        finished(agent, "r1", seconds, task_type="email")
    for seconds in range(1, 21):
        finished(agent, "r2", seconds * 1.2)  # 20% slower: fails
        finished(agent, "r2", seconds * 1.05, task_type="email")  # 5% slower: passes
    finished(agent, "r2", 500, status=TaskStatus.FAILED)  # a failure is no completion time
    result = judge(agent)[checked.pk]
    assert by_split(result) == {"email": (pytest.approx(0.05), True), "refund": (pytest.approx(0.2), False)}
    email = next(s for s in result.splits if s.name == "email")
    assert (email.previous, email.current) == (19.0, pytest.approx(19.95))
    assert email.p95_shown.startswith("p95 19.0 s → ")
    assert (result.value, result.passed) == (pytest.approx(0.2), False)


def test_p95_cost_regression_prices_every_finished_task_and_needs_two_releases(agent):
    checked = gate(Ind.COST_P95_CHANGE, C.LTE, 0.15)
    ModelPrice.objects.create(model="gpt-x", input_per_million=Decimal("1"), output_per_million=Decimal("1"),
                              valid_from=timezone.now() - timedelta(days=1))
    for _ in range(5):
        finished(agent, "r1", 10, tokens=100_000)  # 0.10 each
    assert judge(agent)[checked.pk].passed is None  # one release: nothing to compare
    for _ in range(4):
        finished(agent, "r2", 10, tokens=110_000)  # 0.11
    finished(agent, "r2", 10, status=TaskStatus.FAILED, tokens=112_000)  # a failed task costs too
    result = judge(agent)[checked.pk]
    assert (result.value, result.passed) == (pytest.approx(0.12), True)
    assert (result.splits[0].previous, result.splits[0].current) == (pytest.approx(0.1), pytest.approx(0.112))
    assert result.splits[0].p95_shown == "p95 USD 0.1000 → USD 0.1120"


# ------------------------------------------------------------------ continuation after takeover

def test_continuation_counts_tasks_a_person_took_over_by_how_they_ended(agent, reviewer):
    checked = gate(Ind.CONTINUATION_RATE, C.GTE, 0.99, split_by_tool=True)
    support = make_user("support", agent.tenant, Role.SUPPORT)

    def take_over(status, tool="payments.refund"):
        operation = make_operation(agent, tool, status=S.MANUAL)
        ledger_services.operation_fail(operation_id=operation.operation_id, actor=f"user:{support.username}",
                                       reason="no effect", evidence={"query": "absent"})
        Task.objects.filter(pk=operation.task_id).update(status=status, updated_at=timezone.now())
        return operation.task_id

    take_over(TaskStatus.SUCCEEDED)
    take_over(TaskStatus.FAILED, tool="mail.send")  # carried on to an outcome
    cancelled = take_over(TaskStatus.CANCELLED)
    stalled = take_over(TaskStatus.RUNNING)
    # A held call a person approved, and the task went on to succeed.
    held = make_pending_approval(agent, risk_tier=3)
    decisions.approval_approve(approval_id=held.approval_id, reviewer=reviewer)
    Task.objects.filter(pk=held.task_id).update(status=TaskStatus.SUCCEEDED, updated_at=timezone.now())
    # Finished before anyone acted: nothing to continue.
    late = make_operation(agent, status=S.MANUAL)
    Task.objects.filter(pk=late.task_id).update(status=TaskStatus.SUCCEEDED, updated_at=timezone.now() - timedelta(minutes=5))
    ledger_services.operation_fail(operation_id=late.operation_id, actor="user:support", reason="no effect",
                                   evidence={"query": "absent"})

    now = judge(agent)[checked.pk]  # the running task is still moving: not counted yet
    assert by_split(now) == {"mail.send": (1.0, True), "payments.refund": (pytest.approx(2 / 3), False)}
    later, _ = gates.evaluate(tenant_ids={agent.tenant_id}, since=since(),
                              now=timezone.now() + gates.STALLED_AFTER + timedelta(minutes=1))
    result = next(r for r in later if r.gate.pk == checked.pk)
    assert by_split(result)["payments.refund"] == (pytest.approx(2 / 4), False)
    notes = {ref: why for split in result.splits for _page, ref, why in split.notes}
    assert notes == {cancelled: "cancelled after a person took over", stalled: "stalled in running"}


# ------------------------------------------------------------------------ splits and scopes

def test_success_rate_splits_by_tier_and_tool_and_a_scope_narrows_it(agent):
    per_tier_and_tool = gate(Ind.SUCCESS_RATE, C.GTE, 0.95, split_by_risk_tier=True, split_by_tool=True)
    refunds_only = gate(Ind.SUCCESS_RATE, C.GTE, 0.95, tool="payments.refund")
    overall = gate(Ind.SUCCESS_RATE, C.GTE, 0.5)
    both = make_operation(agent, status=S.CONFIRMED, risk_tier=3).task  # refund at L3 …
    make_operation(agent, "mail.send", status=S.CONFIRMED, task=both)  # … and mail in one task
    failed = make_operation(agent, status=S.CONFIRMED).task  # refund at L1
    Task.objects.filter(pk=both.pk).update(status=TaskStatus.SUCCEEDED)
    Task.objects.filter(pk=failed.pk).update(status=TaskStatus.FAILED)
    results = judge(agent)
    # The task's tier is its highest operation's; a task counts once in each tool it used.
    assert by_split(results[per_tier_and_tool.pk]) == {
        "L1 · payments.refund": (0.0, False), "L3 · mail.send": (1.0, True), "L3 · payments.refund": (1.0, True)}
    assert by_split(results[refunds_only.pk]) == {"all": (0.5, False)}
    assert by_split(results[overall.pk]) == {"all": (0.5, True)}
    # The page's filters narrow every gate too.
    assert by_split(judge(agent, tier=3)[overall.pk]) == {"all": (1.0, True)}


def test_a_gate_on_an_indicator_judged_only_on_the_whole_window_refuses_splits():
    with pytest.raises(ValidationError):
        ReleaseGate(indicator=Ind.HUMAN_RATE, comparison=C.LTE, threshold=0.2, split_by_tool=True).clean()
    ReleaseGate(indicator=Ind.HUMAN_RATE, comparison=C.LTE, threshold=0.2).clean()


def test_the_nearest_rank_percentile_is_an_observed_value():
    assert gates.percentile([], 0.95) is None
    assert gates.percentile(list(range(1, 21)), 0.95) == 19
    assert gates.percentile([5.0], 0.95) == 5.0
