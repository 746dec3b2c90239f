"""Scenario 9: every worker's clock off by ±30 s (its own stack, so no other worker takes the
trial's operations)."""

from __future__ import annotations

import random

import pytest

from chaos import scenarios
from tests.chaos.conftest import start_stack
from tests.chaos.test_chaos import explain

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]


def test_workers_with_clocks_off_by_30_seconds_stay_safe(django_db_blocker):
    scenario = scenarios.get_scenario("clock-skew")
    with django_db_blocker.unblock():
        skewed = start_stack(workers=2, worker_skews=scenario.worker_skews)
    try:
        world = scenarios.ensure_world()
        rng = random.Random(3)
        findings = []
        for index in range(2):
            findings += scenarios.run_trial(scenario, skewed, world, rng, index)
        assert findings == [], explain(findings, skewed)
    finally:
        skewed.stop()
