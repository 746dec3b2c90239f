"""console.lib.sql: hand-written statements store and load exactly what the ORM does."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.lib import sql
from console.models import Event
from ledger.models import Attempt, Operation
from runs.models import Step, Task
from tests.factories import make_operation, make_task


def test_an_inserted_row_reads_back_through_the_orm_as_written(agent):
    operation = make_operation(agent)
    started = timezone.now() - timedelta(seconds=3)
    raw = {"nested": [1, 2.5, None, "ü"], "flag": True}

    [(pk,)] = sql.insert(Attempt, [{"operation": operation, "number": 1, "fencing_token": 7, "worker": "w",
                                    "started_at": started, "finished_at": None, "fact": "", "error_class": "",
                                    "error_code": "", "raw_response": raw, "latency_ms": None, "stale": False}],
                         returning=("id",))

    attempt = Attempt.objects.get(pk=pk)
    assert (attempt.operation_id, attempt.number, attempt.fencing_token) == (operation.pk, 1, 7)
    assert attempt.started_at == started
    assert attempt.raw_response == raw
    assert attempt.finished_at is None and attempt.latency_ms is None


def test_a_loaded_row_equals_the_orm_instance_field_by_field(agent):
    task = make_task(agent, constraints={"max_amount": 12.5}, inputs={"order": "o-1"})
    Task.objects.filter(pk=task.pk).update(amount_used=Decimal("3.2500"))
    expected = Task.objects.get(pk=task.pk)

    row = sql.fetchone(connection, f"SELECT {sql.columns(Task, 't')} FROM runs_task t WHERE t.task_id = %s",
                       [task.pk])
    loaded = sql.load(Task, row)

    for field in Task._meta.concrete_fields:
        assert getattr(loaded, field.attname) == getattr(expected, field.attname), field.name
    assert loaded._state.adding is False


def test_the_empty_side_of_an_outer_join_loads_as_none(agent):
    operation = make_operation(agent)
    row = sql.fetchone(
        connection,
        f"SELECT {sql.columns(Operation, 'o')}, {sql.columns(Attempt, 'a')} FROM ledger_operation o "
        "LEFT JOIN ledger_attempt a ON a.operation_id = o.operation_id WHERE o.operation_id = %s",
        [operation.pk])
    assert sql.load(Operation, row).pk == operation.pk
    assert sql.load(Attempt, row, sql.width(Operation)) is None


def test_a_row_of_some_columns_loads_them_as_the_orm_does_and_defers_the_others(agent):
    operation = make_operation(agent)
    Operation.objects.filter(pk=operation.pk).update(receipt={"id": "r1", "n": [1.5, None]})
    expected = Operation.objects.get(pk=operation.pk)
    only = ("operation_id", "needs_approval", "receipt", "created_at")

    row = sql.fetchone(connection, f"SELECT {sql.columns(Operation, 'o', only=only)} FROM ledger_operation o "
                                   "WHERE o.operation_id = %s", [operation.pk])
    loaded = sql.load(Operation, row, only=only)

    assert len(row) == sql.width(Operation, only=only) == 4
    for name in only:
        assert getattr(loaded, name) == getattr(expected, name), name
    assert loaded.get_deferred_fields() == {f.attname for f in Operation._meta.concrete_fields} - {
        Operation._meta.get_field(name).attname for name in only}
    with pytest.raises(ValueError, match="primary key"):
        sql.columns(Operation, only=("status",))
    with pytest.raises(ValueError, match="order"):
        sql.columns(Operation, only=("status", "operation_id"))


def test_update_matches_on_every_equality_and_says_how_many_rows(agent):
    operation = make_operation(agent)
    stamp = timezone.now()

    assert sql.update(Operation, where={"pk": operation.pk, "status": "authorized"}, values={"last_error": "x"}) == 0
    assert sql.update(Operation, where={"pk": operation.pk, "status": operation.status},
                      values={"last_error": "boom", "receipt": {"id": "r1"}, "updated_at": stamp}) == 1

    stored = Operation.objects.get(pk=operation.pk)
    assert (stored.last_error, stored.receipt, stored.updated_at) == ("boom", {"id": "r1"}, stamp)


def test_update_returns_the_columns_asked_for_or_none(agent):
    operation = make_operation(agent)
    assert sql.update(Operation, where={"pk": operation.pk}, values={"attempt_count": 4},
                      returning=("attempt_count", "status")) == (4, operation.status)
    assert sql.update(Operation, where={"pk": "op_missing"}, values={"attempt_count": 4},
                      returning=("attempt_count",)) is None


def attempt_row(operation, number: int, **fields) -> dict:
    return {"operation": operation, "number": number, "fencing_token": 1, "worker": "w", "started_at": timezone.now(),
            "finished_at": None, "fact": "", "error_class": "", "error_code": "", "raw_response": None,
            "latency_ms": None, "stale": False, **fields}


def test_update_then_write_writes_the_rows_that_go_with_a_matched_update_and_returns_their_keys(agent):
    operation = make_operation(agent)
    earlier = Attempt.objects.create(operation=operation, number=1, fencing_token=1)
    event = {"tenant_id": operation.tenant_id, "entity": "operation", "entity_id": operation.pk, "kind": "transition", "from_status": "x",
             "to_status": "y", "actor": "t", "reason": "", "evidence": {"k": [1]}, "created_at": timezone.now(), "content_hash": "", "prev_hash": "", "hash": ""}
    with CaptureQueriesContext(connection) as queries:
        written = sql.update_then_write(
            Operation, where={"pk": operation.pk, "status": operation.status}, values={"last_error": "moved"},
            inserts=[(Event, event), (Attempt, attempt_row(operation, 2, raw_response={"r": 1}))],
            updates=[(Attempt, {"pk": earlier.pk}, {"stale": True, "latency_ms": 12})])

    event_pk, attempt_pk = written
    assert Operation.objects.get(pk=operation.pk).last_error == "moved"
    assert Event.objects.get(pk=event_pk).evidence == {"k": [1]}
    second = Attempt.objects.get(pk=attempt_pk)
    # NULLs of every type in the inserted row (integer, timestamp, JSON) land as NULLs.
    assert (second.number, second.raw_response, second.latency_ms, second.finished_at) == (2, {"r": 1}, None, None)
    assert Attempt.objects.filter(pk=earlier.pk, stale=True, latency_ms=12).exists()
    assert len(queries) == (1 if connection.vendor == "postgresql" else 4)


def test_update_then_write_writes_nothing_when_the_update_matches_no_row(agent):
    operation = make_operation(agent)
    earlier = Attempt.objects.create(operation=operation, number=1, fencing_token=1)
    events = Event.objects.count()

    written = sql.update_then_write(
        Operation, where={"pk": operation.pk, "status": "not-its-status"}, values={"last_error": "moved"},
        inserts=[(Attempt, attempt_row(operation, 2))], updates=[(Attempt, {"pk": earlier.pk}, {"stale": True})])

    assert written is None
    assert Operation.objects.get(pk=operation.pk).last_error == ""
    assert list(Attempt.objects.filter(operation=operation).values_list("number", "stale")) == [(1, False)]
    assert Event.objects.count() == events


def test_update_then_write_needs_the_primary_key(agent):
    with pytest.raises(ValueError, match="primary key"):
        sql.update_then_write(Operation, where={"status": "planned"}, values={"last_error": "x"})


def test_a_json_null_receipt_is_stored_as_sql_null(agent):
    operation = make_operation(agent)
    sql.update(Operation, where={"pk": operation.pk}, values={"receipt": None})
    assert Operation.objects.filter(pk=operation.pk, receipt__isnull=True).exists()


def test_insert_with_ignore_conflicts_returns_only_the_rows_it_wrote(agent):
    task = make_task(agent)
    now = timezone.now()
    first = sql.insert(Step,
                       [{"task": task, "step_id": "s1", "created_at": now}], returning=("id",), ignore_conflicts=True)
    again = sql.insert(Step,
                       [{"task": task, "step_id": "s1", "created_at": now}], returning=("id",), ignore_conflicts=True)
    assert len(first) == 1 and again == []


def test_a_unique_violation_without_ignore_conflicts_is_djangos_integrity_error(agent):
    task = make_task(agent)
    row = {"task": task, "step_id": "s1", "created_at": timezone.now()}
    sql.insert(Step, [row])
    with pytest.raises(IntegrityError), transaction.atomic():
        sql.insert(Step, [row])


def test_several_rows_in_one_statement_keep_their_order(tenant):
    rows = [{"tenant_id": tenant.pk, "entity": "x", "entity_id": str(n), "kind": "created", "from_status": "", "to_status": "t",
             "actor": "a", "reason": "", "evidence": {"n": n}, "created_at": timezone.now(), "content_hash": "", "prev_hash": "", "hash": ""} for n in range(3)]
    with CaptureQueriesContext(connection) as queries:
        ids = [pk for (pk,) in sql.insert(Event, rows, returning=("id",))]
    assert len(queries) == 1  # statements are still seen by Django's query log and wrappers
    assert [Event.objects.get(pk=pk).evidence for pk in ids] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_a_filter_on_something_that_is_not_a_column_fails_loudly(agent):
    operation = make_operation(agent)
    with pytest.raises(Exception, match="status__in|not a column"):
        sql.update(Operation, where={"pk": operation.pk, "status__in": ["x"]}, values={"last_error": ""})


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="prepared statements are PostgreSQL's")
def test_on_postgresql_the_hot_path_statements_are_prepared_once_per_connection(agent):
    from approvals.models import Tool
    from ledger.dispatcher import run_dispatch
    from ledger.proposals import call_propose
    from tests.fixtures.api import start_task

    tool = Tool.objects.create(name="test.noop", adapter="noop", json_schema={"type": "object"}, base_tier=0,
                               idempotency=Tool.Idempotency.NATIVE)
    agent.allowed_tools.add(tool)
    run = start_task(agent)
    for n in range(4):
        proposal = call_propose(principal=agent, task_id=run.task_id, call_id=f"c{n}", step_id=f"s{n}",
                                tool_name="test.noop", arguments={"n": n}, expected_version=run.version,
                                fencing_token=run.fencing_token)
        assert run_dispatch(proposal.operation_id, worker="t") == "confirmed"
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("FROM ledger_operation o" in text for text in prepared)  # the claim
    assert any('INSERT INTO "ledger_call"' in text for text in prepared)  # the proposal's writes
    assert len(prepared) == len(set(prepared))  # each once, however often it ran


def test_update_then_write_with_unless_writes_nothing_and_says_so_when_its_query_finds_a_row(agent):
    from console.models import AgentPrincipal

    operation = make_operation(agent)
    events = Event.objects.count()
    finds_the_agent = (f'SELECT 1 FROM "{AgentPrincipal._meta.db_table}" WHERE "id" = %s', [agent.pk])

    with pytest.raises(sql.Declined):
        sql.update_then_write(Operation, where={"pk": operation.pk, "status": operation.status},
                              values={"last_error": "moved"}, inserts=[(Attempt, attempt_row(operation, 1))],
                              unless=finds_the_agent)

    assert Operation.objects.get(pk=operation.pk).last_error == ""
    assert not Attempt.objects.filter(operation=operation).exists()
    assert Event.objects.count() == events


def test_update_then_write_with_unless_writes_as_usual_when_its_query_finds_nothing(agent):
    from console.models import AgentPrincipal

    operation = make_operation(agent)
    finds_nobody = (f'SELECT 1 FROM "{AgentPrincipal._meta.db_table}" WHERE "id" = %s', [-1])

    with CaptureQueriesContext(connection) as queries:
        written = sql.update_then_write(Operation, where={"pk": operation.pk, "status": operation.status},
                                        values={"last_error": "moved"}, inserts=[(Attempt, attempt_row(operation, 1))],
                                        unless=finds_nobody)

    assert Attempt.objects.filter(pk=written[0]).exists()
    assert Operation.objects.get(pk=operation.pk).last_error == "moved"
    assert len(queries) == (1 if connection.vendor == "postgresql" else 3)


def _adapted(value):
    # psycopg's Jsonb wraps the object it will dump; compare what it holds.
    return ("jsonb", value.obj) if type(value).__name__ == "Jsonb" else value


@pytest.mark.parametrize("model", [Operation, Attempt, Event, Step, Task])
def test_prep_gives_what_the_fields_own_preparation_gives_for_every_column_and_kind_of_value(model):
    """`prep` and `prep_all` skip Django's field methods where they can: what they give must be
    what those give."""
    from datetime import datetime

    values = [None, "text", Event.Kind.TRANSITION, 7, True, {"k": [1, 2]}, [1, "a"], Decimal("12.50"), timezone.now(),
              datetime(2026, 12, 3, 7, 0, tzinfo=timezone.get_current_timezone())]
    for field in model._meta.concrete_fields:
        for value in values:
            try:
                expected = field.get_db_prep_save(value, connection)
            except (TypeError, ValueError, ArithmeticError, AttributeError, ValidationError):
                continue  # not a value of this field
            assert _adapted(sql.prep(field, value, connection)) == _adapted(expected), (field.name, value)
            [prepped] = sql.prep_all(model, (field.attname,), [value], connection)
            assert _adapted(prepped) == _adapted(expected), (field.name, value)


@pytest.mark.parametrize("model", [Operation, Attempt, Event, Step, Task])
def test_a_where_value_is_what_the_fields_own_preparation_gives_for_every_column_and_kind_of_value(model):
    """The values a hand-written statement compares with skip Django's field methods where they
    can, as `prep` does: what they give must be what those give."""
    values = [None, "text", Event.Kind.TRANSITION, 7, True, {"k": [1, 2]}, Decimal("12.50"), timezone.now()]
    for field in model._meta.concrete_fields:
        for value in values:
            try:
                expected = field.get_db_prep_value(value, connection, prepared=False)
            except (TypeError, ValueError, ArithmeticError, AttributeError, ValidationError):
                continue  # not a value of this field
            assert _adapted(sql._where_value(model, field.name, value, connection)) == _adapted(expected), (
                field.name, value)


@pytest.mark.parametrize("step_there", [False, True], ids=["new step", "step already there"])
def test_update_then_write_inserts_a_row_or_takes_the_one_there_and_a_later_row_names_its_key(agent, step_there):
    operation = make_operation(agent)
    task = operation.task
    if step_there:
        there = Step.objects.create(task=task, step_id="s-known")
    with CaptureQueriesContext(connection) as queries:
        step_pk, attempt_pk = sql.update_then_write(
            Operation, where={"pk": operation.pk, "status": operation.status}, values={"last_error": "moved"},
            inserts=[sql.Existing(Step, {"task": task, "step_id": "s-known", "created_at": timezone.now()},
                                  on=("task", "step_id")),
                     (Attempt, attempt_row(operation, 1, worker=sql.Key(0)))])

    step = Step.objects.get(task=task, step_id="s-known")
    assert step_pk == step.pk and (not step_there or step.pk == there.pk)
    # The key lands where the later row names it (here as text: the attempt's worker column).
    assert Attempt.objects.get(pk=attempt_pk).worker == str(step.pk)
    # SQLite: the update, the step (and, when it is there, the read of its key), the attempt.
    assert len(queries) == (1 if connection.vendor == "postgresql" else 3 + step_there)


# Every model the proposal and the claim load by hand (ledger/proposals.py, ledger/dispatcher.py).
def _hot_path_rows(agent):
    from approvals.models import Tool
    from console.models import AgentPrincipal, Tenant
    from ledger.models import ToolCircuit
    from runs.models import Lease

    operation = make_operation(agent)
    ToolCircuit.objects.get_or_create(tool=operation.tool)
    Lease.objects.update_or_create(task=operation.task, defaults={
        "owner": "w", "expires_at": timezone.now() + timedelta(minutes=5)})
    return [(Operation, operation.pk), (Tool, operation.tool_id), (Task, operation.task_id),
            (AgentPrincipal, agent.pk), (Tenant, agent.tenant_id), (ToolCircuit, operation.tool_id),
            (Lease, operation.task_id)]


def _read(model, pk, only=()):
    row = sql.fetchone(connection, f"SELECT {sql.columns(model, 't', only=only)} FROM {model._meta.db_table} t "
                                   f"WHERE t.{model._meta.pk.column} = %s", [pk])
    return sql.load(model, row, only=only)


def test_every_model_the_hot_path_loads_is_the_orms_instance(agent):
    for model, pk in _hot_path_rows(agent):
        expected, loaded = model.objects.get(pk=pk), _read(model, pk)
        assert type(loaded) is model
        assert {k: v for k, v in vars(loaded).items() if k != "_state"} == {
            k: v for k, v in vars(expected).items() if k != "_state"}, model.__name__
        assert (loaded._state.adding, loaded._state.db) == (False, expected._state.db), model.__name__
        assert loaded.get_deferred_fields() == set(), model.__name__
        loaded.save()  # an update of the row it was read from, as for the ORM's instance
        assert model.objects.filter(pk=pk).count() == 1


def test_a_loaded_row_is_built_without_model_init_unless_something_listens_for_it(agent, model_inits):
    """Model.__init__ sets each field through its descriptor, one by one: the hot path loads about
    a dozen rows per call. A row read by hand needs none of it, except where a post_init
    receiver (or a model's own __init__ or from_db) expects to see the instance built."""
    from django.db.models.signals import post_init

    [(model, pk), *_] = _hot_path_rows(agent)
    model_inits.clear()
    _read(model, pk)
    assert model_inits == []

    seen: list[str] = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.pk)

    post_init.connect(receiver, sender=model)
    try:
        assert _read(model, pk).pk == pk
    finally:
        post_init.disconnect(receiver, sender=model)
    assert model_inits == [model] and seen == [pk]


def test_an_unsaved_row_is_what_the_model_builds_with_its_defaults_and_related_rows(agent, model_inits):
    """The proposal builds its operation with `unsaved`: the fields it does not give get the
    model's defaults, its related rows are there without a query, and Model.__init__ (one
    descriptor call per field) is not run."""

    operation = make_operation(agent)
    task, tool = operation.task, operation.tool
    given = {"operation_id": "op_new", "tenant_id": agent.tenant_id, "tool_schema_version": 1, "call_id": "c1",
             "arguments": {"n": 1}, "arguments_hash": "a" * 64, "intent_hash": "i" * 64, "idempotency_key": "k",
             "business_key": "", "risk_tier": 0, "needs_approval": False, "status": "authorized",
             "created_at": operation.created_at, "updated_at": operation.created_at}
    expected = Operation(**given, task=task, tool=tool, principal=agent)
    model_inits.clear()
    built = sql.unsaved(Operation, given, task=task, tool=tool, principal=agent)
    assert model_inits == []

    assert {k: v for k, v in vars(built).items() if k != "_state"} == {
        k: v for k, v in vars(expected).items() if k != "_state"}
    assert (built._state.adding, built._state.db) == (True, None)
    with CaptureQueriesContext(connection) as captured:
        assert (built.task, built.tool, built.principal) == (task, tool, agent)
    assert captured.captured_queries == []
    with pytest.raises(ValueError, match="no_such_field"):
        sql.unsaved(Operation, {**given, "no_such_field": 1})


def test_values_of_gives_every_column_by_attribute_name_and_leaves_an_unset_auto_key_to_the_database(agent):
    operation = make_operation(agent)
    event = Event(entity="operation", entity_id="op_1", kind=Event.Kind.CREATED, actor="gate")
    values = sql.values_of(event)
    assert "id" not in values
    assert set(values) == {f.attname for f in Event._meta.concrete_fields} - {"id"}
    event.id = 41
    assert sql.values_of(event)["id"] == 41
    deferred = Operation.objects.only("pk", "status").get(pk=operation.pk)  # the others read on demand
    assert sql.values_of(deferred) == sql.values_of(Operation.objects.get(pk=operation.pk))
