"""Scenario 19 (chaos/server_kills.py): the API server dispatches the call of an agent that
waits for it, and is killed (SIGKILL) at each seam of that dispatch. Workers, beat and the
provider's query settle it with one effect; the seam says which path they take."""

from __future__ import annotations

import random

import pytest

from chaos import scenarios
from console.models import Event
from ledger.models import Attempt, Operation, OperationStatus
from ledger.seams import SEAMS
from tests.chaos.conftest import start_stack
from tests.chaos.test_chaos import explain

S = OperationStatus
pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]
SCENARIO = "kill-server-mid-dispatch"


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        running = start_stack(**scenarios.get_scenario(SCENARIO).stack_options())
    yield running
    running.stop()


def run_at(seam: str, stack) -> tuple[list, Operation, list[Attempt], list[str]]:
    findings = scenarios.run_trial(scenarios.get_scenario(SCENARIO), stack, scenarios.ensure_world(),
                                   random.Random(7), SEAMS.index(seam))
    operation = Operation.objects.get()
    attempts = list(Attempt.objects.order_by("number"))
    moves = list(Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id)
                 .order_by("id").values_list("to_status", flat=True))
    return findings, operation, attempts, moves


def test_killed_before_its_claim_committed_nothing_was_written_and_the_agents_second_proposal_runs(stack):
    findings, operation, attempts, moves = run_at("before_dispatch_commit", stack)

    assert findings == [], explain(findings, stack)  # among them: the ledger had nothing after the kill
    assert operation.status == S.CONFIRMED
    (attempt,) = attempts
    assert not attempt.worker.startswith("server:")  # the second proposal, without a wait, went to a worker
    assert S.UNKNOWN not in moves


def test_killed_before_the_provider_call_the_call_is_reconciled_and_sent_once(stack):
    findings, operation, attempts, moves = run_at("before_provider_call", stack)

    assert findings == [], explain(findings, stack)
    assert operation.status == S.CONFIRMED
    assert attempts[0].worker.startswith("server:") and S.UNKNOWN in moves


def test_killed_after_the_provider_call_reconciliation_finds_the_effect(stack):
    findings, operation, attempts, moves = run_at("after_provider_call", stack)

    assert findings == [], explain(findings, stack)
    assert operation.status == S.CONFIRMED and operation.receipt["via"] == "query"
    (attempt,) = attempts
    assert attempt.worker.startswith("server:") and S.UNKNOWN in moves
