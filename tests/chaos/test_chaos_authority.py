"""Scenario 18, one trial of each withdrawal: a tool disabled, the agent deactivated, the tier
raised and the tenant stopped at a random moment while calls are proposed, approved and
dispatched by real workers. No attempt commits after the withdrawal (a stop: until its resume),
and every operation settles with the invariants intact."""

from __future__ import annotations

import random

import pytest

from chaos import scenarios
from chaos.authority import MODES
from tests.chaos.conftest import start_stack

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("index", range(len(MODES)), ids=MODES)
def test_no_attempt_starts_on_authority_withdrawn_at_a_random_moment(django_db_blocker, index):
    scenario = scenarios.get_scenario("authority-withdrawn")
    stack = start_stack(**scenario.stack_options())
    try:
        notes: list[str] = []
        findings = scenarios.run_trial(scenario, stack, scenarios.ensure_world(), random.Random(16), index, notes=notes)
        assert findings == [], "\n".join(map(str, findings)) + f"\n{stack.logs()}"
        assert notes and MODES[index] in notes[0]
    finally:
        stack.stop()
