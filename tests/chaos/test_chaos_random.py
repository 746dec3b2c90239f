"""One trial of each random-moment scenario (13–15): workers and pool children SIGKILLed, and
workers SIGSTOPped, at random times under a load of mixed provider faults; every operation
settles with the invariants intact and nothing due waits past the limit."""

from __future__ import annotations

import random

import pytest

from chaos import scenarios
from tests.chaos.conftest import start_stack

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("name", ["random-kill-pool-child", "random-kill-worker", "random-stop-worker"])
def test_faults_at_random_moments_leave_every_operation_settled(django_db_blocker, name):
    scenario = scenarios.get_scenario(name)
    stack = start_stack(**scenario.stack_options())
    try:
        notes: list[str] = []
        findings = scenarios.run_trial(scenario, stack, scenarios.ensure_world(), random.Random(3), 0, notes=notes)
        assert findings == [], "\n".join(map(str, findings)) + f"\nrestarts: {stack.restarts}\n{stack.logs()}"
        assert notes and " 0 fault(s)" not in notes[0] and " 1 fault(s)" not in notes[0]
    finally:
        stack.stop()
