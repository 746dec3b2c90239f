"""console.lib.django_private: the Django internals it uses are still there, with the same shape.

A failure here after a Django upgrade means: read console/lib/django_private.py against the new
release's source, adapt it (or drop the private use), then move CHECKED_WITH and the pin in
pyproject.toml together.
"""

from __future__ import annotations

import hashlib
import inspect
import tomllib
from pathlib import Path

import django
import pytest
from django.db import connection, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import F
from django.db.models.expressions import Col
from django.db.models.fields.mixins import FieldCacheMixin
from django.db.models.sql import Query, UpdateQuery
from django.utils.functional import cached_property
from packaging.requirements import Requirement

from console.lib import django_private, sql
from ledger.models import Operation
from tests.factories import make_operation

ROOT = Path(__file__).resolve().parents[2]
UPGRADE = "re-read console/lib/django_private.py against this Django release before changing CHECKED_WITH"


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_installed_django_is_the_release_the_private_apis_were_checked_against():
    assert django.VERSION[:2] == django_private.CHECKED_WITH, (
        f"Django {django.get_version()} is installed; console.lib.django_private was checked with "
        f"{'.'.join(map(str, django_private.CHECKED_WITH))}: {UPGRADE}")


def test_pyproject_pins_django_below_the_next_feature_release():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [pin] = [Requirement(dep) for dep in dependencies if Requirement(dep).name.lower() == "django"]
    major, minor = django_private.CHECKED_WITH
    assert f"{major}.{minor}.99" in pin.specifier, f"pyproject.toml's {pin} excludes the checked release"
    assert f"{major}.{minor + 1}" not in pin.specifier and f"{major + 1}.0" not in pin.specifier, (
        f"pyproject.toml's {pin} lets pip install a Django release whose internals nobody checked: {UPGRADE}")


def test_the_asgi_handlers_handle_is_the_one_copied():
    from django.core.handlers.asgi import ASGIHandler, get_script_prefix

    from console.lib.asgi_handler import COPIED_FROM

    source = inspect.getsource(ASGIHandler.handle)
    assert hashlib.sha256(source.encode()).hexdigest() == COPIED_FROM, (
        f"Django's ASGIHandler.handle changed: copy it into console.lib.asgi_handler.Handler again, "
        f"with the request's bookkeeping queued, and update COPIED_FROM; {UPGRADE}")
    assert parameters(get_script_prefix) == ["scope"], UPGRADE


def test_the_cursor_internals_are_there():
    assert parameters(BaseDatabaseWrapper._prepare_cursor) == ["self", "cursor"], UPGRADE
    assert isinstance(inspect.getattr_static(BaseDatabaseWrapper, "queries_logged"), property), UPGRADE
    assert isinstance(inspect.getattr_static(BaseDatabaseWrapper, "wrap_database_errors"), cached_property), UPGRADE
    # The hot path wraps its cursor itself, as `_prepare_cursor` does when queries are not logged.
    prepare = inspect.getsource(BaseDatabaseWrapper._prepare_cursor)
    assert "self.validate_thread_sharing()" in prepare and "self.make_cursor(cursor)" in prepare, UPGRADE
    assert "utils.CursorWrapper(cursor, self)" in inspect.getsource(BaseDatabaseWrapper.make_cursor), UPGRADE
    # The hot path's `execute` does what Django's does when no execute wrapper is installed.
    from django.db.backends.utils import CursorWrapper

    assert "for wrapper in reversed(self.db.execute_wrappers)" in inspect.getsource(
        CursorWrapper._execute_with_wrappers), UPGRADE
    execute = inspect.getsource(CursorWrapper._execute)
    assert "self.db.validate_no_broken_transaction()" in execute, UPGRADE
    assert "with self.db.wrap_database_errors:" in execute and "self.cursor.execute(sql, params)" in execute, UPGRADE


def test_postgresqls_server_binding_cursor_is_there():
    import psycopg
    from django.db.backends.postgresql import base

    assert issubclass(base.ServerBindingCursor, psycopg.Cursor), UPGRADE
    assert not issubclass(base.ServerBindingCursor, psycopg.ClientCursor), UPGRADE
    assert issubclass(base.ServerBindingCursor, base.CursorMixin), UPGRADE


def test_psycopgs_query_split_is_there():
    """The hot path's cursor keeps psycopg's split of a statement's text (django_private)."""
    from psycopg import _queries

    assert parameters(_queries._query2pg_nocache) == ["query", "encoding"], UPGRADE
    assert parameters(_queries.PostgresQuery.convert) == ["self", "query", "vars"], UPGRADE
    assert parameters(_queries.PostgresQuery.dump) == ["self", "vars"], UPGRADE
    assert {"query", "_want_formats", "_order", "_parts", "_tx"} <= set(_queries.PostgresQuery.__slots__), UPGRADE


def test_the_converter_and_field_internals_are_there():
    assert parameters(models.Field.get_col) == ["self", "alias", "output_field"], UPGRADE
    assert parameters(BaseDatabaseOperations.get_db_converters) == ["self", "expression"], UPGRADE
    assert parameters(Col.get_db_converters) == ["self", "connection"], UPGRADE
    assert parameters(FieldCacheMixin.set_cached_value) == ["self", "instance", "value"], UPGRADE
    assert issubclass(models.ForeignKey, FieldCacheMixin), UPGRADE
    assert parameters(models.Field.cast_db_type) == ["self", "connection"], UPGRADE


def test_the_update_query_internals_are_there():
    assert issubclass(UpdateQuery, Query), UPGRADE
    assert parameters(Query.__init__)[:2] == ["self", "model"], UPGRADE  # UpdateQuery(model)
    assert parameters(UpdateQuery.add_update_values) == ["self", "values"], UPGRADE
    assert parameters(Query.add_q)[:2] == ["self", "q_object"], UPGRADE
    assert parameters(Query.get_compiler)[:3] == ["self", "using", "connection"], UPGRADE


def test_converters_and_the_related_cache_do_what_the_orm_does(agent):
    operation = make_operation(agent)
    field = Operation._meta.get_field("receipt")
    convs, col = django_private.db_converters(Operation, field, connection)
    assert col.target is field and convs  # JSON is decoded by a converter on every backend
    loaded = Operation.objects.only("pk").get(pk=operation.pk)
    django_private.set_related(loaded, Operation._meta.get_field("tool"), operation.tool)
    assert loaded.tool is operation.tool  # no query: the cache select_related fills


def test_the_update_compiles_f_expressions_and_runs_with_returning(agent):
    operation = make_operation(agent)
    text, params = django_private.update_sql(Operation, filters={"pk": operation.pk, "status": operation.status},
                                             values={"attempt_count": F("attempt_count") + 2}, using="default")
    assert text.startswith("UPDATE ")
    with connection.cursor() as cursor:
        cursor.execute(f"{text} RETURNING {connection.ops.quote_name('attempt_count')}", params)
        assert cursor.fetchone() == (operation.attempt_count + 2,)


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="server-side binding is PostgreSQL's")
def test_on_postgresql_the_hot_path_cursor_binds_on_the_server(db):
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.ensure_connection()
    assert not django_private.queries_logged(connection)
    wrapped = django_private.server_binding_cursor(connection)
    assert isinstance(wrapped.cursor, ServerBindingCursor)
    assert isinstance(sql.cursor(connection).cursor, ServerBindingCursor)
    wrapped.execute("SELECT %s::int", [41])
    assert wrapped.fetchone() == (41,)


def test_psycopgs_cursor_internals_the_hot_path_cursor_keeps_are_there():
    """The hot path's cursor keeps each statement's Transformer (django_private)."""
    from psycopg import Cursor, adapt
    from psycopg._cursor_base import BaseCursor

    assert parameters(BaseCursor._start_query) == ["self", "query"], UPGRADE
    assert "if not self._last_query or (self._last_query is not query)" in inspect.getsource(
        BaseCursor._start_query), UPGRADE  # a new Transformer unless the statement is the last one
    assert {"_tx", "_last_query"} <= set(BaseCursor.__slots__), UPGRADE
    assert issubclass(Cursor, BaseCursor) and callable(adapt.Transformer), UPGRADE


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the hot path's cursor is PostgreSQL's")
def test_on_postgresql_the_hot_path_cursor_keeps_each_statements_adapters(db):
    """psycopg looks its dumpers and loaders up again (in Python) for every statement that is
    not the one just run; the hot path alternates a few statements, so it keeps them for each."""
    wrapped = sql.cursor(connection)
    first, second = "SELECT %s::int, now()", "SELECT %s::text"
    seen = []
    for statement, value in ((first, 1), (second, "a"), (first, None), (second, None), (first, 3)):
        wrapped.execute(statement, [value])
        seen.append((statement, wrapped.cursor._tx, wrapped.fetchone()[0]))
    [(_, tx_first, _), (_, tx_second, _), (_, again, _), *_] = seen
    assert again is tx_first and tx_second is not tx_first
    assert [value for *_, value in seen] == [1, "a", None, None, 3]  # a NULL between values loads as one


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the hot path's cursor is PostgreSQL's")
def test_on_postgresql_the_hot_path_cursor_loads_timestamps_as_the_orm_does_with_psycopgs_own_loader(db):
    """Django loads timestamptz with a Python subclass of psycopg's loader, ten times slower than
    psycopg's C one; on a UTC session both give the same aware datetime."""
    import datetime

    from django.db.backends.postgresql.psycopg_any import BaseTzLoader
    from psycopg.pq import Format

    statement = "SELECT %s::timestamptz, NULL::timestamptz"
    moment = datetime.datetime(2026, 12, 4, 17, 5, 6, 789012, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    wrapped = sql.cursor(connection)
    wrapped.execute(statement, [moment])
    loaded = wrapped.fetchone()
    with connection.cursor() as orm:
        orm.execute(statement, [moment])
        expected = orm.fetchone()
    assert loaded == expected and loaded[0] == moment
    assert loaded[0].tzinfo is expected[0].tzinfo is datetime.UTC
    oid = connection.connection.adapters.types["timestamptz"].oid
    assert not issubclass(wrapped.cursor.adapters.get_loader(oid, Format.TEXT), BaseTzLoader)


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the hot path's cursor is PostgreSQL's")
def test_on_postgresql_a_session_in_another_time_zone_keeps_djangos_timestamp_loader(db):
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader
    from psycopg.pq import Format

    connection.ensure_connection()
    with connection.cursor() as orm:
        orm.execute("SET TIME ZONE 'Europe/Paris'")
    try:
        cursor = django_private.server_binding_cursor(connection).cursor
        oid = connection.connection.adapters.types["timestamptz"].oid
        assert issubclass(cursor.adapters.get_loader(oid, Format.TEXT), BaseTzLoader)
    finally:
        with connection.cursor() as orm:
            orm.execute("SET TIME ZONE 'UTC'")


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the hot path's cursor is PostgreSQL's")
def test_on_postgresql_the_hot_path_cursor_fetches_through_its_own_methods_and_still_translates_errors(db):
    """Django's cursor wrapper builds a new error-translating function at every `fetchone`
    (`__getattr__`); the hot path's wrapper has the fetches as methods."""
    from django.db import ProgrammingError
    from django.db.backends.utils import CursorWrapper

    wrapped = sql.cursor(connection)
    assert isinstance(wrapped, CursorWrapper)
    assert {"fetchone", "fetchmany", "fetchall"} <= set(vars(type(wrapped)))
    wrapped.execute("SELECT %s::int UNION ALL SELECT 2", [1])
    assert (wrapped.fetchone(), wrapped.fetchmany(1), wrapped.fetchall()) == ((1,), [(2,)], [])
    wrapped.execute("SELECT set_config('application_name', %s, true)", ["x"])
    wrapped.execute("SET LOCAL statement_timeout = 0")
    with pytest.raises(ProgrammingError):  # Django's, not psycopg's: no result to fetch
        wrapped.fetchone()


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the hot path's cursor is PostgreSQL's")
def test_on_postgresql_the_hot_path_cursor_executes_through_its_own_method_with_djangos_checks(db):
    """Django's `execute` builds a context and walks the execute wrappers for every statement;
    the hot path's wrapper does that only while one is installed, and keeps the other checks:
    a broken transaction refuses the statement, and errors are Django's."""
    from django.db import ProgrammingError, transaction
    from django.db.transaction import TransactionManagementError

    wrapped = sql.cursor(connection)
    assert "execute" in vars(type(wrapped))
    seen = []

    def wrapper(execute, statement, params, many, context):
        seen.append((statement, params, many, context["cursor"] is wrapped))
        return execute(statement, params, many, context)

    with connection.execute_wrapper(wrapper):
        wrapped.execute("SELECT %s::int", [3])
        assert wrapped.fetchone() == (3,)
    wrapped.execute("SELECT %s::int", [4])  # the wrapper is gone: not called again
    assert wrapped.fetchone() == (4,)
    assert seen == [("SELECT %s::int", [3], False, True)]
    with pytest.raises(ProgrammingError), transaction.atomic():  # Django's error, not psycopg's
        wrapped.execute("SELECT no_such_column FROM console_tenant")
    with transaction.atomic():
        transaction.set_rollback(True)
        with pytest.raises(TransactionManagementError):
            wrapped.execute("SELECT 1")


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the hot path's cursor is PostgreSQL's")
def test_on_postgresql_a_pooled_connection_keeps_its_hot_path_cursor_from_one_thread_to_the_next(db):
    """The web server's request threads each have their own Django connection, and take a
    connection from psycopg's pool for each request: the hot path's cursor (and the adapters it
    keeps) stays with the pooled connection, not with the thread's Django connection."""
    from django.db import connections

    settings_dict = {**connection.settings_dict,
                     "OPTIONS": {**connection.settings_dict["OPTIONS"], "pool": {"min_size": 1, "max_size": 1}}}
    # Two threads' Django connections (alias "default": their own pool, shared by both).
    threads = [type(connections["default"])(settings_dict, alias="default") for _ in range(2)]
    try:
        seen = []
        for django_connection in (*threads, *threads):  # four requests, each on the pool's one connection
            django_connection.ensure_connection()
            wrapped = sql.cursor(django_connection)
            wrapped.execute("SELECT %s::int", [7])
            assert wrapped.fetchone() == (7,)
            seen.append((django_connection.connection, wrapped.cursor))
            django_connection.close()  # back to the pool
        assert len({id(raw) for raw, _ in seen}) == 1  # the same pooled connection every time
        assert len({id(cursor) for _, cursor in seen}) == 1
    finally:
        threads[0].close_pool()


def test_an_instance_loaded_from_the_database_is_still_its_dict_and_its_state(agent):
    """`loaded_instance` builds what `Model.from_db` builds: the loaded values in `__dict__` by
    attribute name and a `ModelState` saying where it came from."""
    from django.db.models.base import ModelState

    assert parameters(models.Model.from_db) == ["db", "field_names", "values"], UPGRADE
    state = ModelState()
    assert (state.adding, state.db) == (True, None), UPGRADE
    operation = make_operation(agent)
    built = Operation.from_db("default", [f.attname for f in Operation._meta.concrete_fields],
                              [getattr(operation, f.attname) for f in Operation._meta.concrete_fields])
    direct = django_private.loaded_instance(Operation, "default",
                                            tuple(f.attname for f in Operation._meta.concrete_fields),
                                            [getattr(operation, f.attname) for f in Operation._meta.concrete_fields])
    assert set(vars(built)) == set(vars(direct)), UPGRADE
    assert (built._state.adding, built._state.db) == (direct._state.adding, direct._state.db), UPGRADE
