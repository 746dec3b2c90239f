"""How many statements the dispatcher's three steps send (claim, the attempt's fencing check,
receipt): the hot path's cost, kept from growing back (docs/benchmarks.md)."""

from __future__ import annotations

import pytest
from django.db import connection

from ledger import dispatcher
from ledger.models import Attempt, Operation, OperationStatus
from tests.fixtures.dispatch import authorized_refund, reload

S = OperationStatus
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sandbox_settings", "enqueued")]


@pytest.fixture
def run_at_once(agent, tools, unique):
    """A refund the gate ran at once (authorized, no approval to consume), after one dispatched
    before it: the configuration's catalog is warm, as in a worker that has run a call."""

    def make():
        operation = authorized_refund(agent, unique("ord"))
        Operation.objects.filter(pk=operation.pk).update(needs_approval=False)
        return reload(operation)

    dispatcher.run_dispatch(make().operation_id, worker="test")
    return make


def _statements(captured) -> list[str]:
    """What reached the database, less the test's own savepoints around `atomic`."""
    return [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]


def test_the_claim_reads_and_locks_the_operation_its_tool_and_its_agent_in_one_statement(
        run_at_once, django_assert_max_num_queries):
    operation = run_at_once()

    # The configuration's generation (share), the operation with its tool, task and agent
    # (share), the business key's lock and its busy check, the move with its event and attempt:
    # one statement on PostgreSQL, one per write on SQLite.
    limit = 5 if connection.vendor == "postgresql" else 6
    with django_assert_max_num_queries(limit + 2) as captured:
        operation, attempt = dispatcher._claim(operation.operation_id, worker="test")

    statements = _statements(captured)
    assert len(statements) <= limit, statements
    assert sum("console_agentprincipal" in sql for sql in statements) == 1
    assert operation.status == S.DISPATCHED
    assert Attempt.objects.get(pk=attempt.pk).fencing_token == attempt.fencing_token


def test_the_attempt_checks_its_fencing_token_in_one_statement(run_at_once, django_assert_max_num_queries):
    operation, attempt = dispatcher._claim(run_at_once().operation_id, worker="test")

    with django_assert_max_num_queries(1):
        outcome, _latency = dispatcher._call_provider(operation, attempt)

    assert outcome.fact == "known_success"


def test_the_receipt_is_the_move_with_its_event_and_attempt_and_the_webhook_check(
        run_at_once, django_assert_max_num_queries):
    operation, attempt = dispatcher._claim(run_at_once().operation_id, worker="test")
    outcome, latency = dispatcher._call_provider(operation, attempt)

    # PostgreSQL: one statement, the webhook check inside it (the agent takes none).
    limit = 1 if connection.vendor == "postgresql" else 4
    with django_assert_max_num_queries(limit + 2) as captured:
        assert dispatcher._record(operation, attempt, outcome, latency)[0] == S.CONFIRMED

    assert len(_statements(captured)) <= limit, _statements(captured)
    assert reload(operation).status == S.CONFIRMED
    assert Attempt.objects.get(pk=attempt.pk).finished_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_dispatch_runs_one_commit_hook_per_commit_the_doorbell(run_at_once, monkeypatch):
    """The hooks after the claim's commit run before the provider is called, inside the
    ledger's "provider" stage, and the receipt's before the worker takes its next call: in a
    worker both are the events doorbell's ring (a Redis round trip), and nothing else."""
    from django.db import transaction

    from console import doorbell

    operation = run_at_once()
    rings: list[str] = []
    registered: list[object] = []
    monkeypatch.setattr(doorbell, "SERVING", True)  # the ring is registered as in a worker with Redis
    monkeypatch.setattr(doorbell, "_ring", lambda moved=None: rings.append("ring"))
    on_commit = transaction.on_commit

    def recording(func, using=None, robust=False):
        registered.append(func)
        return on_commit(func, using=using, robust=robust)

    monkeypatch.setattr(transaction, "on_commit", recording)

    assert dispatcher.run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED

    assert [type(func) for func in registered] == [doorbell.TransactionRing, doorbell.TransactionRing]
    assert rings == ["ring", "ring"]


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="one statement is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_receipt_is_one_statement_in_no_transaction_block(run_at_once, monkeypatch):
    """The move, its event, its attempt and the check that the agent takes no webhooks are one
    statement, atomic on its own: no BEGIN or COMMIT round trip around it."""
    from django.test.utils import CaptureQueriesContext

    operation, attempt = dispatcher._claim(run_at_once().operation_id, worker="test")
    outcome, latency = dispatcher._call_provider(operation, attempt)
    commits: list[str] = []
    commit = connection.commit
    monkeypatch.setattr(connection, "commit", lambda: (commits.append("commit"), commit()))

    with CaptureQueriesContext(connection) as captured:
        assert dispatcher._record(operation, attempt, outcome, latency)[0] == S.CONFIRMED

    assert len(captured.captured_queries) == 1, captured.captured_queries
    assert commits == []
    assert reload(operation).status == S.CONFIRMED
    assert Attempt.objects.get(pk=attempt.pk).finished_at is not None


def test_a_receipt_for_an_agent_with_a_webhook_writes_its_call_final_event_with_the_move(
        run_at_once, agent, monkeypatch, django_capture_on_commit_callbacks):
    """The one-statement receipt is for agents without a webhook; for one with a webhook the
    move and its `call.final` event are written together, as every move's events are."""
    from console.models import AgentPrincipal
    from ledger.models import WebhookEvent

    enqueued_webhooks: list[int] = []
    monkeypatch.setattr("ledger.tasks.enqueue_webhook", enqueued_webhooks.append)
    operation, attempt = dispatcher._claim(run_at_once().operation_id, worker="test")
    outcome, latency = dispatcher._call_provider(operation, attempt)
    AgentPrincipal.objects.filter(pk=agent.pk).update(webhook_url="https://hooks.example.com/countersign")

    with django_capture_on_commit_callbacks(execute=True):
        assert dispatcher._record(operation, attempt, outcome, latency)[0] == S.CONFIRMED

    (event,) = WebhookEvent.objects.filter(operation_id=operation.operation_id)
    assert (event.kind, event.operation_status) == ("call.final", S.CONFIRMED)
    assert enqueued_webhooks == [event.pk]
    assert reload(operation).status == S.CONFIRMED
