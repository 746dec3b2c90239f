"""The chaos checker must be able to fail: each invariant, broken on purpose, is reported in the
right count. No processes here; the records are driven through the services (tests/factories)."""

from __future__ import annotations

import pytest

from chaos.invariants import (
    DUPLICATE,
    LOST,
    STUCK,
    VIOLATION,
    Expect,
    Finding,
    Tally,
    check_expectations,
    check_operation,
)
from console.lib.transitions import record_event
from console.models import Event
from ledger import services
from ledger.models import Attempt, Operation, OperationStatus
from tests.factories import make_operation

S = OperationStatus
pytestmark = pytest.mark.django_db


def kinds(findings) -> list[str]:
    return sorted(finding.kind for finding in findings)


def test_a_confirmed_operation_with_exactly_one_effect_passes(agent):
    operation = make_operation(agent, status=S.CONFIRMED)
    assert check_operation(operation.operation_id, effects=1) == []


def test_two_effects_for_one_key_are_a_duplicate(agent):
    operation = make_operation(agent, status=S.CONFIRMED)
    assert kinds(check_operation(operation.operation_id, effects=2)) == [DUPLICATE]


def test_confirmed_without_an_effect_is_lost(agent):
    operation = make_operation(agent, status=S.CONFIRMED)
    assert kinds(check_operation(operation.operation_id, effects=0)) == [LOST]


def test_an_authorized_operation_never_attempted_is_lost_and_a_dispatched_one_is_stuck(agent):
    authorized = make_operation(agent, status=S.AUTHORIZED)
    dispatched = make_operation(agent, status=S.DISPATCHED)
    assert kinds(check_operation(authorized.operation_id, effects=0)) == [LOST]
    assert kinds(check_operation(dispatched.operation_id, effects=0)) == [STUCK]


def test_an_operation_asked_again_and_then_rejected_is_not_lost(agent):
    """authorized → planned: the dispatcher's re-check found the policy stricter; a reviewer
    then rejecting it is a decision, not a lost authorization."""
    operation = make_operation(agent, status=S.AUTHORIZED)
    services.operation_hold_for_approval(operation_id=operation.operation_id, actor="test", reason="stricter now",
                                         risk_tier=4)
    services.operation_reject(operation_id=operation.operation_id, actor="test", reason="no")

    assert check_operation(operation.operation_id, effects=0) == []


def test_an_illegal_move_in_the_event_log_is_a_violation(agent):
    operation = make_operation(agent, status=S.CONFIRMED)
    record_event(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id, tenant_id=operation.tenant_id,
                 kind=Event.Kind.TRANSITION, from_status=S.CONFIRMED, to_status=S.DISPATCHED, actor="test")
    findings = check_operation(operation.operation_id, effects=1)
    assert VIOLATION in kinds(findings)
    assert any("illegal move confirmed→dispatched" in finding.message for finding in findings)


def test_confirmed_without_a_receipt_and_failed_with_an_effect_are_violations(agent):
    confirmed = make_operation(agent, status=S.CONFIRMED)
    Operation.objects.filter(pk=confirmed.pk).update(receipt=None)
    failed = make_operation(agent, status=S.FAILED)
    assert kinds(check_operation(confirmed.operation_id, effects=1)) == [VIOLATION]
    assert kinds(check_operation(failed.operation_id, effects=1)) == [VIOLATION]


def test_fencing_tokens_that_do_not_increase_are_a_violation(agent):
    operation = make_operation(agent, status=S.CONFIRMED)
    Attempt.objects.create(operation=operation, number=2, fencing_token=1)
    messages = [finding.message for finding in check_operation(operation.operation_id, effects=1)]
    assert any("fencing tokens [1, 1]" in message for message in messages)


def test_a_scenario_expectation_that_is_not_met_is_a_violation(agent):
    operation = make_operation(agent, status=S.MANUAL)
    findings = check_expectations(operation.operation_id, Expect(frozenset({S.CONFIRMED}), attempts=2), effects=1)
    assert len(findings) == 2 and kinds(findings) == [VIOLATION, VIOLATION]


def test_the_summary_line_counts_each_kind():
    tally = Tally(trials=3)
    operation = "op_x"
    tally.add([Finding(DUPLICATE, operation, ""), Finding(STUCK, operation, ""), Finding(VIOLATION, operation, "")])
    assert tally.summary() == "chaos: trials=3 duplicates=1 lost=0 stuck=1 violations=1"
    assert not tally.ok
