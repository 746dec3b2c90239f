"""One trial each of the tool-kill scenarios (chaos/tool_kills.py): a worker SIGKILLed while a
call of an HTTP tool configured as data, or of an MCP server's tool, is in flight — the
provider has committed the effect and holds its answer back. Effects are counted at the
provider (the payments sandbox's log; the chaos MCP server's per-ref count)."""

from __future__ import annotations

import random

import pytest

from chaos import scenarios
from chaos.tool_kills import HTTP_REFUND, MCP_NOTE
from console.models import Event
from ledger.models import Operation, OperationStatus
from tests.chaos.conftest import start_stack
from tests.chaos.test_chaos import explain

S = OperationStatus
pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]
MID_CALL = 1  # the trial index of the mid-call kill


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        running = start_stack(**scenarios.get_scenario("kill-mcp-tool").stack_options())
    yield running
    running.stop()


def run_one(name: str, stack, index: int) -> list:
    world = scenarios.ensure_world()
    return scenarios.run_trial(scenarios.get_scenario(name), stack, world, random.Random(7), index)


def moves(operation: Operation) -> list[str]:
    return list(Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id)
                .order_by("id").values_list("to_status", flat=True))


def test_a_worker_killed_mid_call_of_an_http_tool_is_reconciled_by_its_status_query(stack):
    findings = run_one("kill-http-tool", stack, MID_CALL)

    assert findings == [], explain(findings, stack)
    operation = Operation.objects.get(tool__name=HTTP_REFUND)
    assert operation.status == S.CONFIRMED and operation.attempt_count == 1
    assert S.UNKNOWN in moves(operation)
    assert operation.receipt["via"] == "query"  # found by the configured status query


def test_a_worker_killed_mid_call_of_an_mcp_tool_goes_to_a_person_with_one_effect(stack):
    findings = run_one("kill-mcp-tool", stack, MID_CALL)

    assert findings == [], explain(findings, stack)
    operation = Operation.objects.get(tool__name=MCP_NOTE)
    assert operation.status == S.MANUAL and operation.attempt_count == 1
    assert moves(operation)[-2:] == [S.UNKNOWN, S.MANUAL]
