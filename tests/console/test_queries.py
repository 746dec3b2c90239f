"""Every statement written by hand (each app's `queries` module) against the models it names.

The statements are built from the models' `_meta`, so a renamed field fails where the statement
is built; these tests also read each statement's text against the `Shape` declared beside it:
every table and `alias.column` it names is the declared model's, each `%s` is compared with or
written to the declared field, a SELECT returns the loaded models' columns in the order `load`
reads them plus the declared scalars, an INSERT writes as many columns as it selects. Then each
runs once on the test database (SQLite, and PostgreSQL in the PostgreSQL run), so a syntax or
column error fails here rather than on the hot path.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from types import ModuleType

import pytest
from django.apps import apps
from django.db import connection, models
from django.utils import timezone

from console.lib import sql
from ledger.models import Operation

APPS_WITH_QUERIES = {"approvals", "ledger", "runs"}  # at least these; any app may add one

TABLE = re.compile(r'\b(FROM|JOIN|INTO)\s+("[^"]+"|\w+)(\s*\()?(?:\s+(\w+))?')
DERIVED = re.compile(r"\bAS\s+(\w+)\s*\(")  # a function's rows named in the statement: r(a int, …)
QUALIFIED = re.compile(r'\b([A-Za-z_]\w*)\.("[^"]+"|[A-Za-z_]\w*)')
COMPARED = re.compile(r'(?:\b(\w+)\.)?("[^"]+"|\w+)\s*=\s*$')
NOT_ALIASES = {"WHERE", "ON", "JOIN", "LEFT", "INNER", "CROSS", "SELECT", "FOR", "DO", "GROUP", "ORDER", "LIMIT"}


def query_modules() -> list[ModuleType]:
    found = []
    for config in apps.get_app_configs():
        name = f"{config.name}.queries"
        if importlib.util.find_spec(name) is not None:
            found.append(importlib.import_module(name))
    return found


def statement_names(module: ModuleType) -> set[str]:
    """The module's public statements: its strings and the functions it defines."""
    return {name for name, value in vars(module).items()
            if not name.startswith("_") and name != "SHAPES"
            and (isinstance(value, str) or (callable(value) and getattr(value, "__module__", "") == module.__name__))}


STATEMENTS = [(module, name) for module in query_modules() for name in sorted(module.SHAPES)]


def text_of(module: ModuleType, name: str) -> str:
    value = getattr(module, name)
    return value(connection.vendor) if callable(value) else value


def unquote(identifier: str) -> str:
    return identifier[1:-1].replace('""', '"') if identifier.startswith('"') else identifier


# PostgreSQL's system columns a statement may read of any table (a row version: `xmin`).
SYSTEM_COLUMNS = {"xmin"}


def columns_of(model: type[models.Model]) -> set[str]:
    return {field.column for field in model._meta.concrete_fields} | SYSTEM_COLUMNS


def top_level_split(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            items.append(text[start:index].strip())
            start = index + 1
    return [*items, text[start:].strip()]


def select_items(text: str) -> list[str]:
    """The items of the statement's outermost SELECT list."""
    start = text.index("SELECT ") + len("SELECT ")
    depth = 0
    for index in range(start, len(text)):
        depth += text[index] == "("
        depth -= text[index] == ")"
        if depth == 0 and text.startswith(" FROM ", index):
            return top_level_split(text[start:index])
    return top_level_split(text[start:].rstrip(")"))


def field_of(model: type[models.Model], name: str) -> models.Field:
    return model._meta.pk if name == "pk" else model._meta.get_field(name)


def problems(text: str, shape: sql.Shape) -> list[str]:
    """What in `text` disagrees with `shape` and the models (empty when nothing does)."""
    found = []
    plain = re.sub(r"'[^']*'", "''", text)  # literals name no columns
    derived = set(DERIVED.findall(plain))

    named = {}
    for kind, table, paren, alias in TABLE.findall(plain):
        if paren and kind != "INTO":
            continue  # FROM a function, e.g. jsonb_to_recordset(…)
        alias = "" if kind == "INTO" or not alias or alias.upper() in NOT_ALIASES else alias
        named[alias] = unquote(table)
    if set(named) != set(shape.tables):
        found.append(f"aliases in the statement {sorted(named)} != declared {sorted(shape.tables)}")
    for alias, table in named.items():
        model = shape.tables.get(alias)
        if model is not None and model._meta.db_table != table:
            found.append(f"{alias or 'the table'} is {table}, declared {model.__name__} ({model._meta.db_table})")

    for alias, column in QUALIFIED.findall(plain):
        if alias in derived:
            continue
        model = shape.tables.get(alias)
        if model is None:
            found.append(f"{alias}.{column}: no table has the alias {alias}")
        elif unquote(column) not in columns_of(model):
            found.append(f"{alias}.{column}: {model.__name__} has no column {unquote(column)}")

    bare = []  # columns of the table named without an alias
    insert = re.search(r"\bINSERT INTO\s+\S+\s*\(([^)]*)\)", plain)
    inserted = [unquote(c.strip()) for c in insert.group(1).split(",")] if insert else []
    bare += inserted
    conflict = re.search(r"\bON CONFLICT\s*\(([^)]*)\)", plain)
    bare += [unquote(c.strip()) for c in conflict.group(1).split(",")] if conflict else []
    bare += [unquote(c) for alias, c in re.findall(r'(?<![\w."])(?:(\w+)\.)?("[^"]+"|\w+)\s*=\s*%s', plain)
             if not alias]
    for column in bare:
        if "" not in shape.tables:
            found.append(f"{column} is named without an alias, and no table is declared without one")
        elif column not in columns_of(shape.tables[""]):
            found.append(f"{column}: {shape.tables[''].__name__} has no column {column}")

    placeholders = [m.start() for m in re.finditer("%s", plain)]
    if len(placeholders) != len(shape.params):
        found.append(f"{len(placeholders)} parameters, {len(shape.params)} declared")
    selected = select_items(plain) if plain.lstrip("(").startswith("SELECT") or insert else []
    written = [column for column, item in zip(inserted, selected, strict=False) if item == "%s"]
    for position, param in zip(placeholders, shape.params, strict=False):
        compared = COMPARED.search(plain[:position])
        if param is None:
            if compared or not plain.startswith("%s::", position):
                found.append(f"the parameter at {position} is declared no column but is not a typed value")
            continue
        model, name = param
        try:
            field = field_of(model, name)
        except Exception as error:  # FieldDoesNotExist: the declaration went stale
            found.append(f"declared parameter {model.__name__}.{name}: {error}")
            continue
        if compared:
            alias, column = compared.group(1) or "", unquote(compared.group(2))
            if shape.tables.get(alias) is not model or column != field.column:
                found.append(f"the parameter at {position} is compared with {alias + '.' if alias else ''}{column}, "
                             f"declared {model.__name__}.{name} ({field.column})")
        elif not written or written.pop(0) != field.column or shape.tables.get("") is not model:
            found.append(f"the parameter at {position} is not written to {model.__name__}.{name}")

    if insert:
        if len(inserted) != len(selected):
            found.append(f"INSERT names {len(inserted)} columns and selects {len(selected)} values")
    elif selected:
        expected = sum(sql.width(model, only=shape.only.get(model, ())) for model in shape.loads) + shape.scalars
        if len(selected) != expected:
            found.append(f"SELECT returns {len(selected)} values, the shape {expected}")
        at = 0
        for model in shape.loads:
            only = shape.only.get(model, ())
            width = sql.width(model, only=only)
            alias = selected[at].split(".")[0] if "." in selected[at] else ""
            if shape.tables.get(alias) is not model or \
                    ", ".join(selected[at:at + width]) != sql.columns(model, alias, only=only):
                found.append(f"values {at}… are not sql.columns({model.__name__}) in the order load reads them")
            at += width
    return found


def sample(model: type[models.Model], name: str):
    """A value of the parameter's type, to run the statement (it need not match a row)."""
    field = field_of(model, name)
    target = field.target_field if field.is_relation else field
    if isinstance(target, models.DateTimeField):
        value = timezone.now()
    elif isinstance(target, models.IntegerField | models.AutoField):
        value = 0
    elif isinstance(target, models.CharField | models.TextField):
        value = "x"
    else:
        raise AssertionError(f"no sample value for {model.__name__}.{name} ({type(target).__name__}): add one here")
    return sql.prep(field, value, connection)


def test_the_apps_query_modules_are_found():
    assert APPS_WITH_QUERIES <= {module.__name__.split(".")[0] for module in query_modules()}


@pytest.mark.parametrize("module", query_modules(), ids=lambda module: module.__name__)
def test_every_statement_of_a_query_module_declares_its_shape(module):
    assert set(module.SHAPES) == statement_names(module), (
        f"{module.__name__}: every statement (a public string or function) has a Shape in SHAPES, and only those")
    for name, shape in module.SHAPES.items():
        assert isinstance(shape, sql.Shape), name


@pytest.mark.parametrize(("module", "name"), STATEMENTS, ids=[f"{m.__name__}.{n}" for m, n in STATEMENTS])
def test_each_statement_names_its_models_columns(module, name):
    assert problems(text_of(module, name), module.SHAPES[name]) == []


@pytest.mark.django_db
@pytest.mark.parametrize(("module", "name"), STATEMENTS, ids=[f"{m.__name__}.{n}" for m, n in STATEMENTS])
def test_each_statement_runs_on_the_test_database(module, name):
    shape = module.SHAPES[name]
    if connection.vendor not in shape.vendors:
        pytest.skip(f"{name} runs on {', '.join(sorted(shape.vendors))}")  # checked in that database's run
    text = text_of(module, name)
    params = ["[]" if param is None else sample(*param) for param in shape.params]
    statement = f"SELECT {text}" if text.startswith("(") else text  # a scalar subquery
    cur = sql.cursor(connection)
    cur.execute(statement, params)
    if not text.startswith("INSERT"):
        width = sum(sql.width(model, only=shape.only.get(model, ())) for model in shape.loads) + shape.scalars or 1
        assert len(cur.description) == width
        cur.fetchall()


def test_the_check_finds_a_column_the_model_does_not_have():
    table = Operation._meta.db_table
    assert problems(f"SELECT 1 FROM {table} WHERE operation_idx = %s",
                    sql.Shape(tables={"": Operation}, params=((Operation, "operation_id"),), scalars=1))
    assert problems(f"SELECT o.statuz FROM {table} o WHERE o.operation_id = %s",
                    sql.Shape(tables={"o": Operation}, params=((Operation, "operation_id"),), scalars=1))
    assert problems(f"SELECT o.status FROM {table} o WHERE o.status = %s",
                    sql.Shape(tables={"o": Operation}, params=((Operation, "operation_id"),), scalars=1))
    assert problems(f"SELECT {sql.columns(Operation, 'o')} FROM {table} o WHERE o.operation_id = %s",
                    sql.Shape(tables={"o": Operation}, params=((Operation, "operation_id"),), scalars=1))
    assert not problems(f"SELECT {sql.columns(Operation, 'o')} FROM {table} o WHERE o.operation_id = %s",
                        sql.Shape(tables={"o": Operation}, params=((Operation, "operation_id"),),
                                  loads=(Operation,)))
