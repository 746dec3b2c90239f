"""Named locks held until the end of the current transaction."""

from __future__ import annotations

from django.db import connection


def lock_name(name: str) -> None:
    """Serialize transactions that touch the same named thing (e.g. one order's refunds).

    PostgreSQL: a transaction-scoped advisory lock. SQLite: a no-op, because the IMMEDIATE
    transaction already holds the database's single write lock.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [name])
