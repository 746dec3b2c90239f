"""Budget caps: the administrator's ceilings over a tenant, an agent or a tool (`BudgetCap`),
which a task contract's own budgets can only lower.

Per task, the limit that binds is the least of the contract's (`max_tool_calls`, `max_writes`,
`max_amount`) and every tenant or agent cap that covers the task (`task_limits`); a tool's cap per
task counts that tool's calls in the task. Per day, each cap counts every call it covers across
the tenant's tasks in the tenant's day (`Tenant.time_zone`). A contract asking for more than a cap
is not refused: it is capped, and the task's answer says which limit binds and why.

Counting per day holds under concurrency because the counters are rows (`runs.BudgetCounter`)
that a proposal locks, in key order, before it reads them, and writes in its own statement
(`ledger.proposals`). Only calls made while a cap exists are counted: a cap created at noon counts
from noon. The gate reads; it writes nothing.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone

from approvals.catalog import Catalog
from approvals.models import BudgetCap, Tool
from console.models import Tenant
from runs.models import Span, Task
from runs.pricing import spans_cost

# Contract key → (cap field per task, the task's counter, what it counts in words).
TASK_KEYS = {
    "max_tool_calls": ("calls_per_task", "calls_used", "tool call"),
    "max_writes": ("writes_per_task", "writes_used", "write"),
    "max_amount": ("amount_per_task", "amount_used", "amount"),
}
DAY_FIELDS = ("calls_per_day", "writes_per_day", "amount_per_day")
TOOL_TASK_FIELDS = ("calls_per_task", "writes_per_task", "amount_per_task")


@dataclass(frozen=True)
class Limit:
    value: Decimal
    source: str  # "contract", or the cap's scope in words ("tenant acme", "agent acme/bot")
    contract_asked: Decimal | None = None  # what the contract asked, when a cap lowered it


@dataclass(frozen=True)
class Spent:
    calls: int = 0
    writes: int = 0
    amount: Decimal = Decimal(0)

    def plus(self, *, writes: int, amount: Decimal) -> Spent:
        return Spent(calls=self.calls + 1, writes=self.writes + writes, amount=self.amount + amount)


@dataclass(frozen=True)
class CapState:
    """The caps covering one call and what their counters hold (read under lock by a proposal,
    without one by a dry run)."""

    caps: tuple[BudgetCap, ...] = ()
    day: str = ""
    spent: dict[tuple[str, str], Spent] = field(default_factory=dict)


def caps_covering(*, catalog: Catalog, tenant_id: int, agent_id: int | None, tool_id: int | None) -> tuple[BudgetCap, ...]:
    """The tenant's cap, the agent's and the tool's, as far as they exist."""
    return tuple(cap for cap in catalog.caps(tenant_id)
                 if (cap.agent_id is None or cap.agent_id == agent_id)
                 and (cap.tool_id is None or cap.tool_id == tool_id))


def tenant_day(tenant: Tenant, now: datetime | None = None) -> str:
    """Today in the tenant's time zone, as YYYY-MM-DD (UTC if the zone cannot be read)."""
    return tenant_day_start(tenant, now).date().isoformat()


def tenant_day_start(tenant: Tenant, now: datetime | None = None) -> datetime:
    """When the tenant's today began: midnight in its time zone (UTC if it cannot be read)."""
    try:
        zone = zoneinfo.ZoneInfo(tenant.time_zone or "UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        zone = zoneinfo.ZoneInfo("UTC")
    return (now or timezone.now()).astimezone(zone).replace(hour=0, minute=0, second=0, microsecond=0)


def counter_keys(caps: tuple[BudgetCap, ...], *, task_id: str, day: str) -> list[tuple[str, str]]:
    """The counters these caps bind, sorted (the order a proposal locks them in)."""
    keys = set()
    for cap in caps:
        if any(getattr(cap, name) is not None for name in DAY_FIELDS):
            keys.add((cap.counter_key, day))
        if cap.tool_id is not None and any(getattr(cap, name) is not None for name in TOOL_TASK_FIELDS):
            keys.add((cap.counter_key, task_period(task_id)))
    return sorted(keys)


def task_period(task_id: str) -> str:
    return f"task:{task_id}"


def task_limits(task: Task, caps: tuple[BudgetCap, ...], contract_limit) -> dict[str, Limit]:
    """The per-task limits that bind the task's counters: the least of the contract's and of
    every tenant or agent cap that covers it (a tool's cap per task binds only that tool's
    calls, `check_caps`). `contract_limit(value)` reads a contract value as the gate does."""
    constraints = task.constraints or {}
    limits: dict[str, Limit] = {}
    for key, (cap_field, _, _) in TASK_KEYS.items():
        asked = contract_limit(constraints.get(key))
        best = Limit(asked, "contract") if asked is not None else None
        for cap in caps:
            value = getattr(cap, cap_field)
            if cap.tool_id is not None or value is None:
                continue
            if best is None or Decimal(value) < best.value:
                best = Limit(Decimal(value), cap.describe(), asked)
        if best is not None:
            limits[key] = best
    return limits


def check_caps(*, state: CapState, task: Task, tool: Tool, amount: Decimal) -> list[str]:
    """Refusals from the counted caps: every cap's day, and a tool's cap per task. A call that
    would pass a cap is refused; nothing is paused (tomorrow, or another tool, may still go)."""
    writes = 1 if tool.kind == Tool.Kind.WRITE else 0
    refusals = []
    for cap in state.caps:
        checks = [((cap.counter_key, state.day), DAY_FIELDS, f"{cap.describe()}'s daily cap ({state.day})")]
        if cap.tool_id is not None:
            checks.append(((cap.counter_key, task_period(task.task_id)), TOOL_TASK_FIELDS,
                           f"{cap.describe()}'s cap per task"))
        for key, (calls_field, writes_field, amount_field), label in checks:
            spent = state.spent.get(key, Spent())
            refusals += _over(label, spent, writes=writes, amount=amount,
                              calls_cap=getattr(cap, calls_field), writes_cap=getattr(cap, writes_field),
                              amount_cap=getattr(cap, amount_field))
    return refusals


def check_cost(*, state: CapState, task: Task, now: datetime | None = None) -> list[str]:
    """Refusals from the model cost caps of the tenant and the agent: the task's spans per task,
    and per day the spans of the tenant's (or the agent's) tasks since the tenant's day began.
    Cost is known only after a model call, so a cap refuses the calls after it is spent."""
    refusals = []
    for cap in state.caps:
        if cap.tool_id is not None or not cap.cost_currency:
            continue
        if cap.cost_per_task is not None:
            spent = spans_cost(Span.objects.filter(task_id=task.task_id), {task.tenant_id}).get(cap.cost_currency, Decimal(0))
            if spent >= cap.cost_per_task:
                refusals.append(f"model cost per task spent: {cap.cost_currency} {_num(spent)} of "
                                f"{_num(cap.cost_per_task)} (capped by {cap.describe()})")
        if cap.cost_per_day is not None:
            spans = Span.objects.filter(tenant_id=task.tenant_id, start_time__gte=tenant_day_start(task.tenant, now))
            if cap.agent_id is not None:
                spans = spans.filter(task__actor_id=cap.agent_id)
            spent = spans_cost(spans, {task.tenant_id}).get(cap.cost_currency, Decimal(0))
            if spent >= cap.cost_per_day:
                refusals.append(f"{cap.describe()}'s daily model cost cap ({state.day}): {cap.cost_currency} "
                                f"{_num(spent)} of {_num(cap.cost_per_day)} spent")
    return refusals


def _over(label: str, spent: Spent, *, writes: int, amount: Decimal, calls_cap: Any, writes_cap: Any,
          amount_cap: Any) -> list[str]:
    out = []
    if calls_cap is not None and spent.calls + 1 > calls_cap:
        out.append(f"{label}: {spent.calls} of {calls_cap} tool calls used")
    if writes and writes_cap is not None and spent.writes + writes > writes_cap:
        out.append(f"{label}: {spent.writes} of {writes_cap} writes used")
    if amount and amount_cap is not None and spent.amount + amount > Decimal(amount_cap):
        left = max(Decimal(amount_cap) - spent.amount, Decimal(0))
        out.append(f"{label}: amount {_num(amount)} exceeds what is left, {_num(left)} of {_num(Decimal(amount_cap))}")
    return out


def _num(value: Decimal) -> str:
    return format(value.normalize(), "f")
