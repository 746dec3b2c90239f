"""The console's statements written by hand for every agent request, named from the models'
`_meta` and built at import, so each text is the same on every call and psycopg prepares it on
PostgreSQL. Each statement's `Shape` is in `SHAPES`; tests/console/test_queries.py checks every
statement against it and runs it once.
"""

from __future__ import annotations

from console.lib import sql
from console.models import AgentPrincipal, Tenant

_col = sql.column

# The agent named by a bearer token, with its tenant (the rate limit reads the tenant's own
# limit); active agents only. Parameter: the token's hash.
PRINCIPAL_SQL = (f"SELECT {sql.columns(AgentPrincipal, 'a')}, {sql.columns(Tenant, 'n')} "
                 f"FROM {sql.table(AgentPrincipal)} a "
                 f"JOIN {sql.table(Tenant)} n ON {_col(Tenant, 'pk', 'n')} = {_col(AgentPrincipal, 'tenant', 'a')} "
                 f"WHERE {_col(AgentPrincipal, 'token_hash', 'a')} = %s AND {_col(AgentPrincipal, 'is_active', 'a')}")

SHAPES = {
    "PRINCIPAL_SQL": sql.Shape(
        tables={"a": AgentPrincipal, "n": Tenant},
        params=((AgentPrincipal, "token_hash"),), loads=(AgentPrincipal, Tenant)),
}
