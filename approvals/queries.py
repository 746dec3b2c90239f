"""The approvals app's statements written by hand, named from the models' `_meta`.

Each statement's `Shape` (what it reads, by model and field) is in `SHAPES`, by name;
tests/console/test_queries.py checks every statement against it and runs it once.
"""

from __future__ import annotations

from functools import cache

from approvals.models import PolicyGeneration
from console.lib import sql

# The configuration generation's token as a scalar subquery, for a statement the caller runs
# anyway (the proposal's task lock reads it inside its own transaction: `approvals.catalog`).
TOKEN_SUBQUERY = (f"(SELECT {sql.column(PolicyGeneration, 'token', 'g')} FROM {sql.table(PolicyGeneration)} g "
                  f"WHERE {sql.column(PolicyGeneration, 'pk', 'g')} = 1)")



@cache
def token_for_share_sql(vendor: str) -> str:
    """The generation's token, its row share-locked until the reader's transaction ends: a
    configuration change (whose triggers rewrite that row) waits for the reader to commit, and
    one committed before is seen (`approvals.catalog.held`; the dispatcher's claim reads it as
    a subquery of its statement)."""
    connection = sql.connection_for(PolicyGeneration)
    return (f"SELECT {sql.column(PolicyGeneration, 'token', 'g')} FROM {sql.table(PolicyGeneration)} g "
            f"WHERE {sql.column(PolicyGeneration, 'pk', 'g')} = 1{sql.for_share(connection)}")


SHAPES = {
    "TOKEN_SUBQUERY": sql.Shape(tables={"g": PolicyGeneration}, scalars=1),
    "token_for_share_sql": sql.Shape(tables={"g": PolicyGeneration}, scalars=1),
}
