"""Every use of Django's undocumented internals, in one place.

The hot path's hand-written statements (`console.lib.sql`) and the compare-and-set with F()
expressions (`console.lib.transitions`) lean on parts of Django that are not public API and may
change in any feature release. They are used here only, checked against the Django version in
`CHECKED_WITH` (pyproject.toml pins Django below the next feature release), and
tests/console/test_django_private.py fails, naming what moved, when an upgrade changes them:

- `BaseDatabaseWrapper._prepare_cursor`, `.wrap_database_errors`, `.queries_logged` and
  PostgreSQL's `ServerBindingCursor`: a cursor that binds parameters on the server, so psycopg
  prepares the hot path's statements and PostgreSQL stops parsing and planning them on every
  call, while the ORM's own queries keep client-side binding. Still wrapped by Django
  (execute wrappers, query logging, error translation): by a subclass of `CursorWrapper` whose
  fetches are methods, built as `_prepare_cursor` builds Django's when queries are not logged.
  The psycopg cursor is kept with its psycopg connection, which the web server's pool hands
  from one request thread to another. The gain is measured in docs/benchmarks.md ("Prepared
  statements on PostgreSQL"; session 23 for the rest).
- psycopg's `PostgresQuery` (`convert`, `dump`, the attributes `convert` sets) and
  `_queries._query2pg_nocache`: that cursor keeps the split of a statement's text into its
  parameters for statements longer than psycopg keeps it for (the proposal's writing statement).
- psycopg's `BaseCursor._start_query` and the `_tx` and `_last_query` it reads: that cursor
  keeps each statement's Transformer, whose dumpers and loaders psycopg looks up again (in
  Python) for every statement that is not the one it ran last. The cursor also loads timestamptz
  with psycopg's own (C) loader instead of Django's Python subclass of it, when the session's
  time zone is the connection's.
- `Field.get_col`, `BaseDatabaseOperations.get_db_converters` and `Col.get_db_converters`: the
  converters the ORM's compiler applies to a column, so a row read by hand loads exactly as the
  ORM loads it.
- `ModelState` and what `Model.from_db` leaves in an instance (its loaded fields' values in
  `__dict__` by attribute name, `_state.adding` false, `_state.db`): `loaded_instance` builds it
  without `Model.__init__`'s per-field descriptor calls; `unsaved_instance` the same for a new
  row, with the defaults `Field.get_default` gives.
- `FieldCacheMixin.set_cached_value`: what `select_related` does, so a related row read in the
  same statement needs no second query.
- `Field.cast_db_type`: the SQL type of a typed parameter (`%s::type`), as `Cast()` writes it.
- `UpdateQuery` (`add_update_values`, `add_q`) and its compiler's `as_sql`: an UPDATE with F()
  expressions compiled by the ORM, to which the caller appends RETURNING (the computed values in
  the same statement instead of a second SELECT).
- `ASGIHandler.handle` (and `get_script_prefix` beside it): `console.lib.asgi_handler.Handler`
  is a copy of it with the request's bookkeeping queued in its thread; the test compares the
  original's source with the one copied (`COPIED_FROM`).
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.base import ModelState
from django.db.models.signals import post_init
from django.db.models.sql import UpdateQuery

# The Django feature release these internals were read against (pyproject.toml: Django <5.3).
CHECKED_WITH = (5, 2)


def queries_logged(connection) -> bool:
    """Whether Django logs this connection's queries (DEBUG, assertNumQueries, CaptureQueriesContext)."""
    return connection.queries_logged


def server_binding_cursor(connection):
    """A Django cursor wrapper (execute wrappers, query logging, error translation) around a
    psycopg cursor that binds parameters on the server, which psycopg prepares once a statement
    has run `prepare_threshold` times, and that keeps every statement's split into parameters
    (`_kept_split`). PostgreSQL with psycopg 3 only; the connection is open."""
    with connection.wrap_database_errors:
        cursor = _kept_cursor(connection)
        if connection.queries_logged:
            return connection._prepare_cursor(cursor)  # Django's wrapper that logs each statement
        connection.validate_thread_sharing()  # as `_prepare_cursor` does before it wraps
        return _hot_path_wrapper_class()(cursor, connection)


# The hot path's psycopg cursor of each psycopg connection, by the connection's id (beside it, so
# that a new connection at the same address is not taken for it). Kept with the psycopg
# connection rather than with Django's: the web server's pool hands a connection to one request
# thread's Django connection, then to another's. At most this many (then it starts again): a
# process's pool holds a few, replaced now and then.
KEPT_CURSORS = 64
_kept_cursors: dict[int, tuple[Any, bool, Any]] = {}


def _kept_cursor(connection):
    raw = connection.connection
    # Django loads timestamptz with a Python subclass of psycopg's loader that sets the value's
    # zone to the connection's; psycopg's own (C) loader gives the session's zone, the same one
    # when the session is in it (Django sets it so when it connects).
    own_loader = raw.info.timezone == connection.timezone
    kept = _kept_cursors.get(id(raw))
    if kept is not None and kept[0] is raw and kept[1] == own_loader and not kept[2].closed:
        return kept[2]
    cursor = _hot_path_cursor_class()(raw)
    if own_loader:
        from psycopg.types.datetime import TimestamptzLoader

        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
    if len(_kept_cursors) >= KEPT_CURSORS:
        _kept_cursors.clear()
    _kept_cursors[id(raw)] = (raw, own_loader, cursor)
    return cursor


@cache
def _hot_path_wrapper_class():
    from django.db.backends.utils import CursorWrapper

    class HotPathCursorWrapper(CursorWrapper):
        """Django's cursor wrapper, whose `__getattr__` builds a new error-translating function
        for every fetch; here the fetches are methods that translate errors the same way. Its
        `execute` builds a context and walks the execute wrappers for every statement; here
        only while one is installed, with Django's other checks either way."""

        def execute(self, sql, params=None):
            if self.db.execute_wrappers:
                return super().execute(sql, params)
            self.db.validate_no_broken_transaction()
            with self.db.wrap_database_errors:
                return self.cursor.execute(sql, params)

        def fetchone(self):
            with self.db.wrap_database_errors:
                return self.cursor.fetchone()

        def fetchmany(self, size=0):
            with self.db.wrap_database_errors:
                return self.cursor.fetchmany(size)

        def fetchall(self):
            with self.db.wrap_database_errors:
                return self.cursor.fetchall()

    return HotPathCursorWrapper


# Statements whose adapters a hot path cursor keeps at most (then it starts again): the hot
# path's are a few dozen, one per shape.
KEPT_TRANSFORMERS = 128


@cache
def _hot_path_cursor_class():
    from django.db.backends.postgresql.base import ServerBindingCursor
    from psycopg import _queries, adapt

    class KeptSplitQuery(_queries.PostgresQuery):
        __slots__ = ()

        def convert(self, query, vars) -> None:
            if vars is None or type(query) is not str:
                super().convert(query, vars)
                return
            self.query, self._want_formats, self._order, self._parts = _kept_split(query, self._tx.encoding)
            self.dump(vars)

    class HotPathCursor(ServerBindingCursor):
        _query_cls = KeptSplitQuery

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._transformers: dict[str, adapt.Transformer] = {}

        def _start_query(self, query=None):
            # psycopg makes a new Transformer, and so looks every parameter's dumper and every
            # column's loader up again, unless the statement is the one it ran last; the hot
            # path alternates a few statements, so the cursor keeps one for each.
            if type(query) is str:
                kept = self._transformers.get(query)
                if kept is None:
                    if len(self._transformers) >= KEPT_TRANSFORMERS:
                        self._transformers.clear()
                    kept = self._transformers[query] = adapt.Transformer(self)
                self._tx, self._last_query = kept, query
            return super()._start_query(query)

    return HotPathCursor


@lru_cache(maxsize=1024)
def _kept_split(query: str, encoding: str):
    """psycopg's split of a statement's text into its parameters (`%s` → `$n`), kept. psycopg
    keeps it itself only for statements of at most 50 parameters and 4 KB (ORMs make long
    statements of varying shapes); the hot path's statements are built once per shape
    (`console.lib.sql`), so their texts are few, and the proposal's writing statement has more
    than 50 parameters. The split is read only, as psycopg's own kept one is."""
    from psycopg import _queries

    return _queries._query2pg_nocache(query.encode(encoding), encoding)


def db_converters(model: type[models.Model], field: models.Field, connection) -> tuple[tuple, Any]:
    """The converters the ORM applies to `field`'s column of `model` read on `connection`, and
    the column expression they are called with."""
    col = field.get_col(model._meta.db_table)
    return tuple(connection.ops.get_db_converters(col)) + tuple(col.get_db_converters(connection)), col


def loaded_instance(model: type[models.Model], alias: str, attnames: tuple[str, ...], values: list[Any]):
    """What `model.from_db(alias, attnames, values)` returns, built directly: `Model.__init__`
    sets each field through its descriptor, one call after another, for every row the hot path
    loads. A model that builds its instances itself (its own `__init__` or `from_db`) or whose
    instances a `post_init` receiver watches gets `from_db`."""
    if not _built_plainly(model) or post_init.has_listeners(model):
        return model.from_db(alias, list(attnames), values)
    instance = model.__new__(model)
    state = ModelState()
    state.adding, state.db = False, alias
    instance.__dict__["_state"] = state
    instance.__dict__.update(zip(attnames, values, strict=True))
    return instance


def unsaved_instance(model: type[models.Model], values: dict[str, Any]):
    """What `model(**values)` builds, `values` naming fields by attribute name (`task_id`, not
    `task`), built directly, as `loaded_instance` is: the fields not given get their defaults as
    `Model.__init__` computes them. Raises ValueError for a name the model has no field for."""
    unknown = values.keys() - _attnames(model)
    if unknown:
        raise ValueError(f"{model.__name__} has no field {', '.join(sorted(unknown))}")
    if not _built_plainly(model) or post_init.has_listeners(model):
        return model(**values)
    instance = model.__new__(model)
    fields = instance.__dict__
    fields["_state"] = ModelState()
    fixed, computed = _defaults(model)
    fields.update(fixed)
    for field in computed:
        if field.attname not in values:
            fields[field.attname] = field.get_default()
    fields.update(values)
    return instance


@cache
def _defaults(model: type[models.Model]) -> tuple[dict[str, Any], tuple[models.Field, ...]]:
    """Each field's default: the value itself where it is one (Django hands out the same object
    each time), and the fields whose default is a callable, called for every instance."""
    computed = tuple(field for field in model._meta.concrete_fields if field.has_default() and callable(field.default))
    return {field.attname: field.get_default() for field in model._meta.concrete_fields
            if field not in computed}, computed


@cache
def _attnames(model: type[models.Model]) -> frozenset[str]:
    return frozenset(field.attname for field in model._meta.concrete_fields)


@cache
def _built_plainly(model: type[models.Model]) -> bool:
    return model.__init__ is models.Model.__init__ and model.from_db.__func__ is models.Model.from_db.__func__


def set_related(instance: models.Model, field: models.Field, related: models.Model | None) -> None:
    """`instance.<field>` is `related` without a query, as after `select_related`."""
    field.set_cached_value(instance, related)


def cast_type(field: models.Field, connection) -> str:
    """The SQL type `Cast()` would use for `field` on `connection`."""
    return field.cast_db_type(connection)


def update_sql(model: type[models.Model], *, filters: dict[str, Any], values: dict[str, Any],
               using: str) -> tuple[str, tuple[Any, ...]]:
    """`UPDATE … SET values WHERE filters` (F() expressions allowed) as the ORM compiles it for
    database `using`: the text and its parameters."""
    query = UpdateQuery(model)
    query.add_update_values(values)
    query.add_q(Q(**filters))
    return query.get_compiler(using).as_sql()
