"""How many statements the dispatcher's three steps send (claim, the attempt's fencing check,
receipt): the hot path's cost, kept from growing back (docs/benchmarks.md)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.utils import timezone

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
    from django.db.backends.base.base import BaseDatabaseWrapper

    from console import doorbell

    operation = run_at_once()
    rings: list[str] = []
    registered: list[object] = []
    monkeypatch.setattr(doorbell, "SERVING", True)  # the ring is registered as in a worker with Redis
    monkeypatch.setattr(doorbell, "_ring", lambda moved=None: rings.append("ring"))
    on_commit = BaseDatabaseWrapper.on_commit  # where transaction.on_commit registers a hook too

    def recording(self, func, robust=False):
        registered.append(func)
        return on_commit(self, func, robust=robust)

    monkeypatch.setattr(BaseDatabaseWrapper, "on_commit", recording)

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


def _compiled_during(monkeypatch, run) -> list[str]:
    """The ORM queries compiled while `run` runs (their SQL)."""
    compiled: list[str] = []
    as_sql = SQLCompiler.as_sql

    def recording(self, *args, **kwargs):
        result = as_sql(self, *args, **kwargs)
        compiled.append(result[0])
        return result

    monkeypatch.setattr(SQLCompiler, "as_sql", recording)
    run()
    return compiled


def test_a_claim_with_a_business_key_compiles_no_orm_query(run_at_once, monkeypatch):
    """Every call with a business key (a refund's order) takes its lock and checks that no
    other operation on it is in flight: statements written once, not a queryset compiled per
    claim (the compile cost more of a dispatch's CPU than the round trip)."""
    operation = run_at_once()
    assert operation.business_key

    compiled = _compiled_during(monkeypatch, lambda: dispatcher._claim(operation.operation_id, worker="test"))

    assert compiled == []
    assert reload(operation).status == S.DISPATCHED


def test_the_business_key_check_sees_only_that_tools_operations_in_flight(agent, tools, unique):
    """The busy check's scope: the same tool and business key, dispatched or in doubt, not the
    operation itself; a settled one (confirmed, failed) leaves the key free."""
    order = unique("ord")
    operation = authorized_refund(agent, order)
    Operation.objects.filter(pk=operation.pk).update(needs_approval=False)
    other = authorized_refund(agent, order, amount=5)
    guards = dispatcher._load_guards
    for status, expected in ((S.CONFIRMED, None), (S.FAILED, None), (S.UNKNOWN, "business_key_busy"),
                             (S.DISPATCHED, "business_key_busy")):
        Operation.objects.filter(pk=other.pk).update(status=status)
        deferred = guards(reload(operation), circuit_until=None, in_flight=0, now=timezone.now())
        assert (deferred.reason if deferred else None) == expected, status
    # Itself dispatched (a worker's retry of its own claim): not busy because of itself.
    Operation.objects.filter(pk=other.pk).update(status=S.CONFIRMED)
    Operation.objects.filter(pk=operation.pk).update(status=S.DISPATCHED)
    assert guards(reload(operation), circuit_until=None, in_flight=0, now=timezone.now()) is None
