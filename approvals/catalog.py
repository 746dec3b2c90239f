"""The configuration the gate reads on every proposal, cached per process.

Tools, escalation rules, policy tiers, agents' allowed tools, emergency stops and budget caps change only
when an administrator edits them, yet the gate read them with four queries per proposal. Database
triggers (migration 0007) give the one row of `PolicyGeneration` a new random token whenever any
of those tables is written, by any writer (admin, shell, migration, test). A `Catalog` holds what
was read under one token; the proposal reads the token inside its own transaction, in the
statement that locks the task (`approvals.queries.TOKEN_SUBQUERY`), so a revoked tool or a
raised tier is seen by the next proposal exactly as when the rows were read directly. A token is
never reused (random, not a counter), so a cache cannot confuse two configurations, not even
across a test database's flush; no token (an emptied table) means nothing is cached.

Cached instances are shared between threads: read them, never change or save them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from approvals import queries
from approvals.models import (
    BudgetCap,
    EscalationRule,
    PolicyGeneration,
    PolicyTier,
    Stop,
    StopStatus,
    Tool,
)
from console.lib import sql

_MISSING = object()


@dataclass
class Catalog:
    token: str | None
    _tools: dict[str, Tool | None] = field(default_factory=dict)
    _rules: dict[int, tuple[EscalationRule, ...]] = field(default_factory=dict)
    _allowed: dict[int, frozenset[int]] = field(default_factory=dict)
    _tiers: dict[int, PolicyTier] | None = None
    _stops: dict[int, tuple[Stop, ...]] = field(default_factory=dict)
    _caps: dict[int, tuple[BudgetCap, ...]] = field(default_factory=dict)

    def tool(self, name: str) -> Tool | None:
        tool = self._tools.get(name, _MISSING)
        if tool is _MISSING:
            tool = Tool.objects.filter(name=name).first()
            self._keep(self._tools, name, tool)
        return tool

    def rules(self, tool: Tool) -> tuple[EscalationRule, ...]:
        """The tool's escalation rules in the order the gate applies them."""
        rules = self._rules.get(tool.pk)
        if rules is None:
            rules = tuple(EscalationRule.objects.filter(tool_id=tool.pk).order_by("tier", "id"))
            self._keep(self._rules, tool.pk, rules)
        return rules

    def allowed_tool_ids(self, principal_id: int) -> frozenset[int]:
        allowed = self._allowed.get(principal_id)
        if allowed is None:
            allowed = frozenset(Tool.agents.through.objects.filter(agentprincipal_id=principal_id)
                                .values_list("tool_id", flat=True))
            self._keep(self._allowed, principal_id, allowed)
        return allowed

    def stops(self, tenant_id: int) -> tuple[Stop, ...]:
        """The tenant's stops in force, oldest first (usually none)."""
        stops = self._stops.get(tenant_id)
        if stops is None:
            stops = tuple(Stop.objects.filter(tenant_id=tenant_id, status=StopStatus.STOPPED)
                          .select_related("tenant", "agent__tenant", "tool", "stopped_by").order_by("created_at"))
            self._keep(self._stops, tenant_id, stops)
        return stops

    def caps(self, tenant_id: int) -> tuple[BudgetCap, ...]:
        """The tenant's budget caps (usually none): the tenant's, its agents' and its tools'."""
        caps = self._caps.get(tenant_id)
        if caps is None:
            caps = tuple(BudgetCap.objects.filter(tenant_id=tenant_id).select_related("tenant", "agent__tenant", "tool")
                         .order_by("id"))
            self._keep(self._caps, tenant_id, caps)
        return caps

    def tier(self, level: int) -> PolicyTier | None:
        return self.tiers().get(level)

    def tiers(self) -> dict[int, PolicyTier]:
        tiers = self._tiers
        if tiers is None:
            tiers = {tier.level: tier for tier in PolicyTier.objects.all()}
            if self.token is not None:
                self._tiers = tiers
        return tiers

    def _keep(self, store: dict, key, value) -> None:
        if self.token is not None:
            store[key] = value


_lock = threading.Lock()
_current = Catalog(token=None)


def for_token(token: str | None) -> Catalog:
    """The catalog of this configuration generation (read by the caller in its transaction)."""
    global _current
    catalog = _current
    if token is None or catalog.token != token:
        with _lock:
            if _current.token != token or token is None:
                _current = Catalog(token=token)
            catalog = _current
    return catalog


def held() -> Catalog:
    """The current catalog, with the configuration held still until the caller's transaction
    ends (PostgreSQL: the generation row share-locked; SQLite serializes writers anyway): no
    tool, rule, tier, allowed tool or stop changes between this read and the caller's commit,
    and a change committed before it is seen. For a decision that must not commit on
    configuration withdrawn meanwhile (the dispatcher's claim). Call inside `atomic`."""
    connection = sql.connection_for(PolicyGeneration)
    row = sql.fetchone(connection, queries.token_for_share_sql(connection.vendor), [])
    return for_token(row[0] if row else None)


def current() -> Catalog:
    """For callers off the proposal's path: one query for the token."""
    return for_token(PolicyGeneration.objects.filter(pk=1).values_list("token", flat=True).first())
