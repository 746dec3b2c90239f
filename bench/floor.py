"""The protocol's floor: one lifecycle's own statements replayed with nothing in between.

A client records the statements a real lifecycle sends (text, parameters, transaction
boundaries) and then sends them again, over and over, straight through psycopg: no gate, no
ledger logic, no Celery, no Django. Each replay gets a new operation, call and step ID, so it
writes the same rows, index entries and foreign-key checks a lifecycle writes. What remains is
the cost of the protocol's writes on this server: the lower bound of any client, in any
language, that keeps these writes and these commits.

Three shapes:
- "one at a time" (the floor): the statements one at a time, with psycopg's own `BEGIN` per
  transaction, as the service layer sends them (the same round trips);
- "pipelined": each transaction sent in one go (pipeline mode, one sync), the fewest round
  trips these transactions can have;
- "through Django": one at a time through this thread's Django connection, in Django's atomic
  blocks, on the cursor the hot path keeps (Django's cursor wrapper around a server-binding
  psycopg cursor): no gate or ledger code, only the framework's database layer. What separates
  it from the floor is Django's; what separates the lifecycle from it is ours.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

# A statement that writes: an INSERT, an UPDATE … SET or a DELETE, also inside a WITH (not the
# UPDATE of a SELECT's FOR UPDATE).
_WRITES = re.compile(r'\b(INSERT\s+INTO|UPDATE\s+"?\w+"?\s+SET|DELETE\s+FROM)\b', re.IGNORECASE)


@dataclass
class Transaction:
    autocommit: bool  # a single statement outside any atomic block
    statements: list[tuple[str, Any]] = field(default_factory=list)
    rowcounts: list[int] = field(default_factory=list)  # what each statement touched when recorded

    @property
    def writes(self) -> bool:
        return any(writes(sql) for sql, _ in self.statements)


def writes(sql: str) -> bool:
    """Whether a statement writes (an INSERT, UPDATE or DELETE, also inside a WITH)."""
    return _WRITES.search(sql) is not None


@dataclass
class Recording:
    transactions: list[Transaction]
    ids: tuple[str, ...]  # the operation, call and step IDs the replay renames

    @property
    def statements(self) -> int:
        return sum(len(t.statements) for t in self.transactions)

    @property
    def write_commits(self) -> int:
        """Transactions that commit a write: every atomic block, and a statement in autocommit
        that writes (one statement is its own transaction)."""
        return sum(1 for t in self.transactions if not t.autocommit or t.writes)


def record(lifecycle: Callable[[str, str], str]) -> Recording:
    """Runs `lifecycle(call_id, step_id) -> operation_id` once on this thread's Django
    connection and keeps what it sent. Statements outside an atomic block are their own
    transactions (autocommit); the others are grouped up to each commit."""
    from django.db import connection

    transactions: list[Transaction] = []
    open_tx: list[Transaction] = []

    def wrapper(execute, sql, params, many, context):
        if many:
            raise RuntimeError("executemany is not on the lifecycle's path; the floor cannot replay it")
        if not context["connection"].in_atomic_block:
            tx = Transaction(autocommit=True)
            transactions.append(tx)
        else:
            if not open_tx:
                open_tx.append(Transaction(autocommit=False))
            tx = open_tx[0]
        result = execute(sql, params, many, context)
        tx.statements.append((sql, params))
        tx.rowcounts.append(context["cursor"].rowcount)
        return result

    original_commit = connection.commit

    def recording_commit() -> None:
        original_commit()
        if open_tx:
            transactions.append(open_tx.pop())

    suffix = uuid.uuid4().hex[:12]
    call_id, step_id = f"floor-call-{suffix}", f"floor-step-{suffix}"
    connection.commit = recording_commit  # this thread's connection only
    try:
        with connection.execute_wrapper(wrapper):
            operation_id = lifecycle(call_id, step_id)
    finally:
        del connection.commit
    if open_tx:
        raise RuntimeError("the lifecycle left a transaction open")
    return Recording(transactions=transactions, ids=(operation_id, call_id, step_id))


def _renamed(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        for old, new in names.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, Jsonb):
        return Jsonb(_renamed(value.obj, names), dumps=value.dumps)
    if isinstance(value, dict):
        return {_renamed(k, names): _renamed(v, names) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_renamed(v, names) for v in value)
    return value


SHAPES = ("one at a time", "pipelined", "through Django")


class Replayer:
    """Sends a recording again, under new IDs each time: on its own psycopg connection, or
    ("through Django") on this thread's Django connection."""

    def __init__(self, url: str, recording: Recording, *, shape: str) -> None:
        import psycopg

        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {SHAPES}")
        self.recording = recording
        self.shape = shape
        self.conn = None if shape == "through Django" else psycopg.connect(url, autocommit=True, prepare_threshold=2)
        self.cursor = None if self.conn is None else self.conn.cursor()

    def _names(self) -> dict[str, str]:
        operation_id, call_id, step_id = self.recording.ids
        tag = uuid.uuid4().hex
        return {operation_id: f"op_{tag}", call_id: f"floor-call-{tag}", step_id: f"floor-step-{tag}"}

    def replay(self) -> None:
        """One lifecycle's statements under new IDs. Every statement must touch as many rows as
        when it was recorded: an insert that met a conflict, or an update whose guard no longer
        matched, would make the floor cheaper than the writes it stands for."""
        names = self._names()
        for tx in self.recording.transactions:
            statements = [(sql, _renamed(params, names)) for sql, params in tx.statements]
            if self.shape == "through Django":
                _check(_through_django(tx, statements), tx, statements)
                continue
            if self.shape == "pipelined":
                # A cursor per statement: each one's row count is known only after the sync.
                cursors = [self.conn.cursor() for _ in statements]
                with self.conn.pipeline():
                    if not tx.autocommit:
                        self.conn.execute("BEGIN")
                    for cur, (sql, params) in zip(cursors, statements, strict=True):
                        cur.execute(sql, params)
                    if not tx.autocommit:
                        self.conn.execute("COMMIT")
                _check([cur.rowcount for cur in cursors], tx, statements)
                continue
            # One cursor for every statement, the least a client does per statement; psycopg's
            # transaction block sends BEGIN alone, as Django's atomic does.
            counts = []
            with nullcontext() if tx.autocommit else self.conn.transaction():
                for sql, params in statements:
                    self.cursor.execute(sql, params)
                    counts.append(self.cursor.rowcount)
            _check(counts, tx, statements)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _through_django(tx: Transaction, statements: list[tuple[str, Any]]) -> list[int]:
    from django.db import connection, transaction

    from console.lib import sql as hot_path

    counts = []
    with nullcontext() if tx.autocommit else transaction.atomic():
        cursor = hot_path.cursor(connection)
        for statement, params in statements:
            cursor.execute(statement, params)
            counts.append(cursor.rowcount)
    return counts


def _check(counts: list[int], tx: Transaction, statements: list[tuple[str, Any]]) -> None:
    if counts != tx.rowcounts:
        raise RuntimeError(f"replay touched {counts} rows where the lifecycle touched {tx.rowcounts}: "
                           f"{[sql[:60] for sql, _ in statements]}")
