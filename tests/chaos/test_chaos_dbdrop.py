"""Scenario 6: the workers' and the API server's PostgreSQL connections cut mid-commit (by the
chaos proxy) at each commit of the protocol. Its own stack, with the proxy and an API server."""

from __future__ import annotations

import random

import pytest
from django.db import connection  # noqa: F401 - read by the skipif condition

from chaos import scenarios
from chaos.dbdrop import DROP_SEAMS, MODES
from ledger.models import Operation
from tests.chaos.conftest import start_stack
from tests.chaos.test_chaos import explain

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="SQLite has no connection to cut"),
]


@pytest.fixture(scope="module")
def proxied_stack(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        running = start_stack(**scenarios.get_scenario("db-connection-drop").stack_options())
    yield running
    running.stop()


# Every seam with the answer lost after the commit (the ambiguous case), and the API seam and
# the claim with the commit never reaching the server.
CASES = [0, 1, 2, 3, 4, 7]


@pytest.mark.parametrize("index", CASES, ids=[f"{DROP_SEAMS[i % 4]}-{MODES[(i // 4) % 2]}" for i in CASES])
def test_a_connection_cut_mid_commit_loses_nothing_acknowledged_and_duplicates_nothing(proxied_stack, index):
    world = scenarios.ensure_world()
    findings = scenarios.run_trial(scenarios.get_scenario("db-connection-drop"), proxied_stack, world,
                                   random.Random(index), index)
    assert findings == [], explain(findings, proxied_stack)
    (operation,) = Operation.objects.filter(tool__name__startswith="chaos.")
    assert operation.status == "confirmed"
