"""`manage.py chaos` end to end: its own stack, one trial, exactly one summary line."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

SUMMARY = re.compile(r"^chaos: trials=(\d+) duplicates=(\d+) lost=(\d+) stuck=(\d+) violations=(\d+)$")


def test_the_command_runs_a_trial_and_prints_one_summary_line():
    out, err = io.StringIO(), io.StringIO()
    call_command("chaos", "--scenario", "duplicate-delivery", "--trials", "1", "--seed", "1", "--no-migrate",
                 stdout=out, stderr=err)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, out.getvalue()
    assert SUMMARY.match(lines[0]).groups() == ("1", "0", "0", "0", "0"), err.getvalue()


def test_the_command_refuses_an_unknown_scenario():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="unknown scenario"):
        call_command("chaos", "--scenario", "nope", "--trials", "1", "--no-migrate")


def test_scenario_6_needs_postgresql_and_is_skipped_only_within_all():
    from django.core.management.base import CommandError

    from chaos import scenarios
    from console.management.commands.chaos import runnable_on

    every = list(scenarios.SCENARIOS.values())
    assert sorted(s.number for s in every) == list(range(1, 20))
    drop = scenarios.get_scenario("6")
    with pytest.raises(CommandError, match="needs PostgreSQL"):
        runnable_on([drop], "sqlite")
    run, skipped = runnable_on(every, "sqlite")
    assert skipped == [drop] and drop not in run and len(run) == 18
    assert runnable_on(every, "postgresql") == (every, [])
