"""An MCP write whose answer never came, dispatched and reconciled in this process against the
real test MCP server: without an idempotent hint it goes to a person, never sent again; with
one (native idempotency) the reconciler lets it be called again, and the second call confirms."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from ledger.dispatcher import run_dispatch
from ledger.models import Operation
from ledger.models import OperationStatus as S
from ledger.reconcile import run_reconcile
from tests.factories import make_operation
from tests.fixtures.mcp_upstream import McpToolsServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    server = McpToolsServer().start()
    yield server
    server.stop()


@pytest.fixture
def notes(db, server, agent):
    call_command("tools_import", "mcp", server.url, "--prefix", "notes", "--enable", "--timeout", "1",
                 stdout=StringIO())


def later():
    return timezone.now() + timedelta(hours=1)


def test_an_unknown_write_without_an_idempotent_hint_goes_to_a_person_and_is_not_sent_again(server, notes, agent):
    operation = make_operation(agent, "notes.slow_write", status=S.AUTHORIZED, arguments={"text": "once"})
    assert run_dispatch(operation.operation_id, worker="test") == S.UNKNOWN
    assert run_reconcile(operation.operation_id, worker="test", now=later()) == S.MANUAL
    assert run_dispatch(operation.operation_id, worker="test") != S.CONFIRMED
    assert Operation.objects.get(pk=operation.pk).attempts.count() == 1
    assert server.effects("slow_write") == [{"tool": "slow_write", "text": "once"}]


def test_an_unknown_idempotent_write_may_be_called_again_and_confirms(server, notes, agent):
    operation = make_operation(agent, "notes.slow_label", status=S.AUTHORIZED, arguments={"label": "vip"})
    assert run_dispatch(operation.operation_id, worker="test") == S.UNKNOWN
    assert run_reconcile(operation.operation_id, worker="test", now=later()) == S.RETRY_SAFE
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    operation = Operation.objects.get(pk=operation.pk)
    assert operation.attempts.count() == 2 and operation.result == {"label": "vip"}
    # Two calls, one label: what the server declared harmless.
    assert server.effects("slow_label") == [{"tool": "slow_label", "label": "vip"}] * 2
