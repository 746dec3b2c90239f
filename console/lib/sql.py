"""Hand-written statements for the ledger's hot path, on PostgreSQL and SQLite alike.

The ORM compiles every query anew (joins, filters, column lists, converters): on the proposal →
dispatch → receipt path that compilation dominates the CPU a lifecycle costs (docs/benchmarks.md). These helpers build each
statement's text once per model and column set, prepare values with the fields' own
`get_db_prep_save` (so JSON, dates and decimals are stored exactly as the ORM stores them), and
turn rows back into model instances with the fields' and the backend's own converters. They
run on Django's connection, inside Django's transactions (`atomic`, `on_commit` and the test
framework all see them). Only equality filters: anything richer stays with the ORM.

The statements written by hand for one place (a claim, a lock) live in their app's `queries`
module, named from the models with `table` and `column` and described by a `Shape`. What these
helpers need of Django's undocumented internals goes through `console.lib.django_private`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, models, router

from console.lib import django_private

Row = tuple[Any, ...]


def connection_for(model: type[models.Model]):
    # No router configured (the product's settings): the default database, without asking the
    # router, for every statement the hot path writes.
    return connections[router.db_for_write(model) if router.routers else DEFAULT_DB_ALIAS]


@cache
def _fields(model: type[models.Model], only: tuple[str, ...] = ()) -> tuple[models.Field, ...]:
    """`model`'s concrete fields, or those `only` names (in the model's order, the primary key
    among them)."""
    fields = tuple(model._meta.concrete_fields)
    if not only:
        return fields
    named = tuple(_field(model, name) for name in only)
    if tuple(field for field in fields if field in named) != named or model._meta.pk not in named:
        raise ValueError(f"{model.__name__}: name the primary key and the fields in the model's order")
    return named


@cache
def _columns(model: type[models.Model], alias: str, only: tuple[str, ...] = ()) -> str:
    prefix = f"{alias}." if alias else ""
    return ", ".join(f'{prefix}"{field.column}"' for field in _fields(model, only))


def columns(model: type[models.Model], alias: str = "", *, only: tuple[str, ...] = ()) -> str:
    """Every concrete column of `model` (or those of the fields `only` names), in the order
    `load` reads them (`alias.` prefixed)."""
    return _columns(model, alias, only)


def width(model: type[models.Model], *, only: tuple[str, ...] = ()) -> int:
    return len(_fields(model, only))


_BARE = re.compile(r"[a-z_][a-z0-9_]*")


def _identifier(name: str) -> str:
    """`name` bare when it needs no quotes (lower case letters, digits, underscores), as the
    statements written by hand spell their tables and columns; quoted otherwise. A column named
    like a reserved word would need quotes too: tests/console/test_queries.py runs every
    statement, so it would fail there."""
    return name if _BARE.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def table(model: type[models.Model]) -> str:
    """`model`'s table, for a statement's FROM, JOIN or INTO."""
    return _identifier(model._meta.db_table)


def column(model: type[models.Model], name: str, alias: str = "") -> str:
    """The column of `model`'s field `name` ("pk": the primary key), `alias.` prefixed."""
    spelled = _identifier(_field(model, name).column)
    return f"{alias}.{spelled}" if alias else spelled


@dataclass(frozen=True)
class Shape:
    """What a statement written by hand reads and writes, declared beside it in its app's
    `queries` module (`SHAPES`, by the statement's name). tests/console/test_queries.py checks
    every statement against its shape and the models, and runs it once.

    `tables`: the statement's table aliases and the models they name ("" for a table named
    without an alias). `params`: per `%s` in order, the (model, field name) it is compared with
    or written to, or None for a value that is no column (a JSON document of rows). `loads`: the
    models whose `columns` the SELECT returns first, in this order (read back with `load`), then
    `scalars` further values. `vendors`: the databases it runs on. `only`: for a model of `loads`
    read with `columns(model, only=)`, the fields it names."""

    tables: Mapping[str, type[models.Model]]
    params: tuple[tuple[type[models.Model], str] | None, ...] = ()
    loads: tuple[type[models.Model], ...] = ()
    scalars: int = 0
    vendors: frozenset[str] = frozenset({"postgresql", "sqlite"})
    only: Mapping[type[models.Model], tuple[str, ...]] = dataclasses.field(default_factory=dict)


@cache
def _converters(model: type[models.Model], alias: str,
                only: tuple[str, ...] = ()) -> tuple[tuple[int, tuple, Any], ...]:
    connection = connections[alias]
    found = []
    for index, field in enumerate(_fields(model, only)):
        convs, col = django_private.db_converters(model, field, connection)
        if convs:
            found.append((index, convs, col))
    return tuple(found)


@cache
def _loaded(model: type[models.Model], only: tuple[str, ...]) -> tuple[int, tuple[str, ...]]:
    fields = _fields(model, only)
    return fields.index(model._meta.pk), tuple(field.attname for field in fields)


def load(model: type[models.Model], row: Sequence[Any], start: int = 0, *, connection=None,
         only: tuple[str, ...] = ()):
    """The instance in `row[start : start + width(model, only=only)]` (selected with
    `columns(model, only=only)`; with `only`, the other fields are deferred, as `.only()`
    leaves them), or None when its primary key is NULL (the empty side of an outer join)."""
    connection = connection or connection_for(model)
    pk_index, names = _loaded(model, only)
    values = list(row[start:start + width(model, only=only)])
    if values[pk_index] is None:
        return None
    for index, convs, col in _converters(model, connection.alias, only):
        value = values[index]
        for converter in convs:
            value = converter(value, col, connection)
        values[index] = value
    return django_private.loaded_instance(model, connection.alias, names, values)


def unsaved(model: type[models.Model], values: dict[str, Any], **related: models.Model):
    """A new row, as `model(**values, **related)` builds it: `values` by attribute name, the
    other fields with their defaults, each `related` row (by its field's name) there without a
    query. Built without `Model.__init__`, which sets each field through its descriptor."""
    instance = django_private.unsaved_instance(
        model, {**values, **{_field(model, name).attname: row.pk for name, row in related.items()}})
    for name, row in related.items():
        attach(instance, name, row)
    return instance


def attach(instance: models.Model, field_name: str, related: models.Model | None) -> None:
    """What select_related does: `instance.<field_name>` is `related` without a query."""
    django_private.set_related(instance, instance._meta.get_field(field_name), related)


def for_update(connection, of: str = "") -> str:
    """` FOR UPDATE [OF alias]`, or nothing where rows cannot be locked (SQLite serializes
    writers with its IMMEDIATE transactions instead)."""
    if not connection.features.has_select_for_update:
        return ""
    if of and connection.features.has_select_for_update_of:
        return f" FOR UPDATE OF {of}"
    return " FOR UPDATE"


def for_share(connection) -> str:
    """` FOR SHARE` (readers share the row, a writer waits for them all to end), or nothing
    where rows cannot be locked (SQLite serializes writers with its IMMEDIATE transactions)."""
    return " FOR SHARE" if connection.vendor == "postgresql" else ""


def cursor(connection):
    """The cursor these statements run on. On PostgreSQL one that binds parameters on the
    server, so psycopg prepares a statement run often (settings: DATABASE_PREPARE_THRESHOLD)
    and the server stops parsing and planning it on every call; the ORM's own queries keep
    Django's client-side binding. Still Django's cursor wrapper: execute wrappers, query
    logging and error translation see these statements like any other. One per connection,
    kept while the connection lives (each thread has its own connection)."""
    connection.ensure_connection()
    logged = django_private.queries_logged(connection)
    kept = connection.__dict__.get("_hot_path_cursor")
    if kept is not None and kept[0] is connection.connection and kept[1] == logged:
        return kept[2]
    if connection.vendor == "postgresql" and not logged:
        # Django logs a server-bound statement's text as None, so a connection whose queries
        # are logged (DEBUG, assertNumQueries) gets Django's own cursor: the log stays readable.
        wrapped = django_private.server_binding_cursor(connection)
    else:
        wrapped = connection.cursor()
    connection.__dict__["_hot_path_cursor"] = (connection.connection, logged, wrapped)
    return wrapped


def fetchone(connection, sql: str, params: Sequence[Any]) -> Row | None:
    cur = cursor(connection)
    cur.execute(sql, params)
    return cur.fetchone()


def fetchall(connection, sql: str, params: Sequence[Any]) -> list[Row]:
    cur = cursor(connection)
    cur.execute(sql, params)
    return cur.fetchall()


@cache
def _field(model: type[models.Model], name: str) -> models.Field:
    # Cached: asked for every value of every statement the hot path writes.
    field = model._meta.pk if name == "pk" else model._meta.get_field(name)
    if not field.concrete:
        raise ValueError(f"{model.__name__}.{name} is not a column")
    return field


def prep(field: models.Field, value: Any, connection) -> Any:
    """What `field.get_db_prep_save(value, connection)` returns, without its calls where the
    value goes to the database as it is (every value of every statement the hot path writes)."""
    if isinstance(value, models.Model):
        value = value.pk
    kind = _kind(field)
    if value is None:
        return None  # SQL NULL, also for a JSON field (JSON null is `Value(None, JSONField())`)
    if kind.json and type(field) is models.JSONField and (type(value) is dict or type(value) is list):
        # JSONField's own last step (a subclass may prepare its values first: the slow path).
        return connection.ops.adapt_json_value(value, field.encoder)
    if kind.keeps(value):
        return value
    if kind.is_datetime and type(value) is datetime and value.tzinfo is not None and connection.vendor == "postgresql":
        return value  # psycopg sends an aware datetime itself; Django's methods return it unchanged
    return field.get_db_prep_save(value, connection)


@dataclass(frozen=True)
class _Kind:
    """What `prep` needs to know of a field, looked up by the field's identity (hashing a Django
    field runs Python code)."""

    field: models.Field
    plain: type | None  # the Python type the field stores unchanged
    json: bool
    is_datetime: bool

    def keeps(self, value: Any) -> bool:
        """The value goes to the database as it is: of the type the field stores unchanged (a
        text field keeps a str subclass, a TextChoices member, as it is)."""
        return type(value) is self.plain or (self.plain is str and isinstance(value, str))

    @classmethod
    def of(cls, field: models.Field) -> _Kind:
        target = field.target_field if field.is_relation else field
        plain = None
        if isinstance(target, models.BooleanField):
            plain = bool
        elif isinstance(target, models.CharField | models.TextField):
            plain = str
        elif isinstance(target, models.IntegerField | models.AutoField):
            plain = int
        return cls(field=field, plain=plain, json=isinstance(field, models.JSONField),
                   is_datetime=isinstance(target, models.DateTimeField))


_kinds: dict[int, _Kind] = {}


def _kind(field: models.Field) -> _Kind:
    kind = _kinds.get(id(field))
    if kind is None or kind.field is not field:
        kind = _kinds[id(field)] = _Kind.of(field)
    return kind


@cache
def _kinds_of(model: type[models.Model], names: tuple[str, ...]) -> tuple[_Kind, ...]:
    return tuple(_kind(_field(model, name)) for name in names)


def prep_all(model: type[models.Model], names: tuple[str, ...], values: Iterable[Any], connection) -> list[Any]:
    """`prep` of each of `values` for the field of `model` that `names` gives at its place: the
    fields looked up once per statement shape, and no call at all for a value that goes to the
    database as it is (most of them)."""
    postgres = connection.vendor == "postgresql"
    return [value if (type(value) is kind.plain or value is None
                      or (kind.plain is str and isinstance(value, str))
                      or (postgres and kind.is_datetime and type(value) is datetime and value.tzinfo is not None))
            else prep(kind.field, value, connection)
            for kind, value in zip(_kinds_of(model, names), values, strict=True)]


@cache
def _update_sql(model: type[models.Model], sets: tuple[str, ...], where: tuple[str, ...],
                returning: tuple[str, ...], vendor: str) -> str:
    set_sql = ", ".join(f'"{_field(model, name).column}" = %s' for name in sets)
    where_sql = " AND ".join(f'"{_field(model, name).column}" = %s' for name in where)
    sql = f'UPDATE "{model._meta.db_table}" SET {set_sql} WHERE {where_sql}'
    if returning:
        sql += " RETURNING " + ", ".join(f'"{_field(model, name).column}"' for name in returning)
    return sql


def update(model: type[models.Model], *, where: dict[str, Any], values: dict[str, Any],
           returning: Iterable[str] = ()) -> int | Row | None:
    """`UPDATE … SET values WHERE (equalities)`: the number of rows, or with `returning` the
    first row's returned columns (None when nothing matched)."""
    connection = connection_for(model)
    sets, keys, returning = tuple(values), tuple(where), tuple(returning)
    sql = _update_sql(model, sets, keys, returning, connection.vendor)
    params = prep_all(model, sets, values.values(), connection)
    params += [_where_value(model, name, where[name], connection) for name in keys]
    cur = cursor(connection)
    cur.execute(sql, params)
    if returning:
        return cur.fetchone()
    return cur.rowcount


def _where_value(model: type[models.Model], name: str, value: Any, connection) -> Any:
    """What `field.get_db_prep_value(value, connection, prepared=False)` returns, without its
    calls where the value goes to the database as it is (as `prep`)."""
    if isinstance(value, models.Model):
        value = value.pk
    field = _field(model, name)
    if _kind(field).keeps(value):
        return value
    return field.get_db_prep_value(value, connection, prepared=False)


@cache
def _insert_sql(model: type[models.Model], names: tuple[str, ...], rows: int, returning: tuple[str, ...],
                ignore_conflicts: bool, vendor: str) -> str:
    cols = ", ".join(f'"{_field(model, name).column}"' for name in names)
    one = "(" + ", ".join(["%s"] * len(names)) + ")"
    sql = f'INSERT INTO "{model._meta.db_table}" ({cols}) VALUES ' + ", ".join([one] * rows)
    if ignore_conflicts:
        sql += " ON CONFLICT DO NOTHING"
    if returning:
        sql += " RETURNING " + ", ".join(f'"{_field(model, name).column}"' for name in returning)
    return sql


def insert(model: type[models.Model], rows: Sequence[dict[str, Any]], *, returning: Iterable[str] = (),
           ignore_conflicts: bool = False) -> list[Row]:
    """One `INSERT … VALUES (…), (…)` of rows with the same keys; the returned columns of the
    rows written (with `ignore_conflicts`, a row that met a unique constraint is not among them)."""
    if not rows:
        return []
    connection = connection_for(model)
    names, returning = tuple(rows[0]), tuple(returning)
    sql = _insert_sql(model, names, len(rows), returning, ignore_conflicts, connection.vendor)
    params = []
    for row in rows:
        params += prep_all(model, names, [row[name] for name in names], connection)
    cur = cursor(connection)
    cur.execute(sql, params)
    return cur.fetchall() if returning else []


def values_of(instance: models.Model) -> dict[str, Any]:
    """Every concrete column of an unsaved instance, by attribute name, for `insert`; an
    auto-increment primary key not set yet is left to the database, as the ORM does."""
    names, auto_pk = _column_names(type(instance))
    fields = instance.__dict__  # where a model keeps its fields' values (a deferred one is not there)
    values = {name: fields[name] if name in fields else getattr(instance, name) for name in names}
    if auto_pk is not None and values[auto_pk] is None:
        del values[auto_pk]
    return values


@cache
def _column_names(model: type[models.Model]) -> tuple[tuple[str, ...], str | None]:
    # Every concrete field's attribute name, and the primary key's when the database assigns it.
    pk = model._meta.pk
    return (tuple(field.attname for field in model._meta.concrete_fields),
            pk.attname if isinstance(pk, models.AutoField) else None)


# The rows written with a guarded update: (model, row) to insert, (model, where, values) to update.
Insert = tuple[type[models.Model], dict[str, Any]]
Update = tuple[type[models.Model], dict[str, Any], dict[str, Any]]


@dataclass(frozen=True)
class Key:
    """A value in a row of `update_then_write`'s inserts: the primary key of the row that an
    earlier insert, `inserts[index]`, wrote (or, for an `Existing`, found)."""

    index: int


@dataclass(frozen=True)
class Existing:
    """An insert of `update_then_write` that, when a row with the same values of `on` is there
    already, gives that row's key instead of writing one (PostgreSQL: ON CONFLICT … DO UPDATE
    with the value it has, which returns the row)."""

    model: type[models.Model]
    row: dict[str, Any]
    on: tuple[str, ...]


# A statement that, if it finds a row, keeps `update_then_write` from writing: (sql, params).
Unless = tuple[str, Sequence[Any]]


class Declined(Exception):
    """`update_then_write`'s `unless` found a row: nothing was written."""


@cache
def _update_then_write_sql(model: type[models.Model], sets: tuple[str, ...], where: tuple[str, ...],
                           inserts: tuple[_InsertShape, ...],
                           updates: tuple[tuple[type[models.Model], tuple[str, ...], tuple[str, ...]], ...],
                           ignore_conflicts: bool, unless: str | None) -> str:
    connection = connection_for(model)
    update = _update_sql(model, sets, where, (), "postgresql")
    parts = []
    if unless is not None:
        # Read in the statement's own snapshot, as the update's WHERE is: nothing can commit
        # between the check and the write.
        parts.append(f"declined AS ({unless})")
        update += " AND NOT EXISTS (SELECT 1 FROM declined)"
    parts.append(f"moved AS ({update} RETURNING 1)")
    for index, (insert_model, names, keys, on) in enumerate(inserts):
        cols = ", ".join(f'"{_field(insert_model, name).column}"' for name in names)
        # Typed: a parameter in a SELECT list is otherwise text, and a NULL integer fails.
        exprs = ", ".join(
            f"{'%s' if key is None else f'(SELECT * FROM i{key})'}::"
            f"{django_private.cast_type(_field(insert_model, name), connection)}"
            for name, key in zip(names, keys, strict=True))
        if on:
            first = _field(insert_model, on[0]).column
            on_conflict = (" ON CONFLICT (" + ", ".join(f'"{_field(insert_model, name).column}"' for name in on)
                           + f') DO UPDATE SET "{first}" = EXCLUDED."{first}"')
        else:
            on_conflict = " ON CONFLICT DO NOTHING" if ignore_conflicts else ""
        pk = insert_model._meta.pk.column
        parts.append(f'i{index} AS (INSERT INTO "{insert_model._meta.db_table}" ({cols}) '
                     f'SELECT {exprs} FROM moved{on_conflict} RETURNING "{pk}")')
    for index, (update_model, update_sets, update_where) in enumerate(updates):
        parts.append(f"u{index} AS ({_update_sql(update_model, update_sets, update_where, (), 'postgresql')} "
                     "AND EXISTS (SELECT 1 FROM moved))")
    # The update names its primary key: `moved` holds one row or none.
    declined = ["EXISTS (SELECT 1 FROM declined)"] if unless is not None else []
    selected = ", ".join(["(SELECT 1 FROM moved)", *declined] + [f"(SELECT * FROM i{i})" for i in range(len(inserts))])
    return f"WITH {', '.join(parts)} SELECT {selected}"


# An insert's shape in the statement: its model, its columns, which of them take an earlier
# insert's key (its index, else None), and the columns of `Existing.on` (empty: none).
_InsertShape = tuple[type[models.Model], tuple[str, ...], tuple[int | None, ...], tuple[str, ...]]


def update_then_write(model: type[models.Model], *, where: dict[str, Any], values: dict[str, Any],
                      inserts: Sequence[Insert | Existing] = (), updates: Sequence[Update] = (),
                      ignore_conflicts: bool = False, unless: Unless | None = None) -> list[Any] | None:
    """`update` of one row and, only if it matched, one row inserted per `inserts` and the
    `updates` applied: None when it did not match, else the inserted rows' primary keys (with
    `ignore_conflicts`, None for a row that met a unique constraint and was not written). A row
    may name an earlier insert's key (`Key`); an `Existing` gives the key of the row already
    there instead of writing one. `where` must name the primary key. With `unless`, nothing is
    written if that statement finds a row, and Declined is raised. One statement (and one round
    trip) on PostgreSQL, the inserts and updates reading the update's RETURNING, so it needs no
    transaction of its own; one per write elsewhere, inside the caller's transaction, so none
    lands without the others."""
    if "pk" not in where and model._meta.pk.name not in where:
        raise ValueError("update_then_write needs the primary key in `where`: it writes for one row")
    connection = connection_for(model)
    rows = [(entry.model, entry.row, entry.on) if isinstance(entry, Existing) else (*entry, ())
            for entry in inserts]
    if connection.vendor != "postgresql":
        return _update_then_write_apart(model, connection, where=where, values=values, rows=rows, updates=updates,
                                        ignore_conflicts=ignore_conflicts, unless=unless)
    sets, keys = tuple(values), tuple(where)
    params = prep_all(model, sets, values.values(), connection)
    params += [_where_value(model, name, where[name], connection) for name in keys]
    insert_shapes = []
    for insert_model, row, on in rows:
        names = tuple(row)
        if Key in map(type, row.values()):
            refs = tuple(value.index if type(value) is Key else None for value in row.values())
            written = tuple(name for name, ref in zip(names, refs, strict=True) if ref is None)
            params += prep_all(insert_model, written, [row[name] for name in written], connection)
        else:
            refs = (None,) * len(names)
            params += prep_all(insert_model, names, row.values(), connection)
        insert_shapes.append((insert_model, names, refs, tuple(on)))
    update_shapes = []
    for update_model, update_where, update_values in updates:
        update_shapes.append((update_model, tuple(update_values), tuple(update_where)))
        params += prep_all(update_model, tuple(update_values), update_values.values(), connection)
        params += [_where_value(update_model, name, update_where[name], connection) for name in update_where]
    unless_sql = None
    if unless is not None:
        unless_sql, unless_params = unless
        params = [*unless_params, *params]
    cur = cursor(connection)
    cur.execute(_update_then_write_sql(model, sets, keys, tuple(insert_shapes), tuple(update_shapes),
                                       ignore_conflicts, unless_sql), params)
    matched, *rest = cur.fetchone()
    if unless is not None:
        declined, *rest = rest
        if declined:
            raise Declined
    return rest if matched is not None else None


def _update_then_write_apart(model: type[models.Model], connection, *, where: dict[str, Any],
                             values: dict[str, Any], rows: list[tuple[type[models.Model], dict[str, Any], tuple]],
                             updates: Sequence[Update], ignore_conflicts: bool,
                             unless: Unless | None) -> list[Any] | None:
    """`update_then_write` one statement per write (SQLite)."""
    if unless is not None and fetchone(connection, *unless) is not None:
        raise Declined
    if update(model, where=where, values=values) != 1:
        return None
    pks: list[Any] = []
    for insert_model, row, on in rows:
        row = {name: pks[value.index] if isinstance(value, Key) else value for name, value in row.items()}
        returned = insert(insert_model, [row], returning=("pk",), ignore_conflicts=ignore_conflicts or bool(on))
        if returned:
            pks.append(returned[0][0])
        elif on:
            pks.append(insert_model._default_manager.using(connection.alias)
                       .filter(**{name: row[name] for name in on}).values_list("pk", flat=True).get())
        else:
            pks.append(None)
    for update_model, update_where, update_values in updates:
        update(update_model, where=update_where, values=update_values)
    return pks
