"""Named locks held until the end of the current transaction."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections

from console.lib import sql

_ADVISORY_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


def lock_name(name: str) -> None:
    """Serialize transactions that touch the same named thing (e.g. one order's refunds).

    PostgreSQL: a transaction-scoped advisory lock, on the hot path's cursor (the statement is
    prepared once per connection: every dispatch with a business key takes one). SQLite: a
    no-op, because the IMMEDIATE transaction already holds the database's single write lock.
    """
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor == "postgresql":
        sql.fetchone(connection, _ADVISORY_LOCK_SQL, [name])
