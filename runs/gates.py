"""Release gates, judged per split: each enabled `ReleaseGate` against the ledger, the event log
and the traces of the user's tenants, in the dashboard's window.

Every indicator is first built as *units* — a task, an operation, a proposal, or a group of
operations summed in SQL — each knowing its task type, risk tier and tools. A gate keeps the
units of its scope (and the page's filters) and sums them per split, so one query per
indicator serves every gate and every split: the page's query count does not grow with the
number of gates, splits or rows. docs/architecture.md ("Release gates") defines each indicator.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Exists, F, Max, Min, OuterRef, Q, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce, TruncHour
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, Tool
from console.lib import audit
from console.lib.canonical import arguments_hash
from console.models import Event
from ledger.models import Attempt, Call, Fact, Operation, OperationStatus
from runs.models import TASK_TERMINAL, ReleaseGate, Span, Task, TaskStatus
from runs.pricing import PriceBook

Ind = ReleaseGate.Indicator

# L3 and L4: the tiers that need a person's approval under the default policy.
HIGH_RISK_TIER = 3
# A task a person handed back that has not moved for this long did not continue.
STALLED_AFTER = timedelta(hours=1)
# The operations' recorded moves out of doubt by a person, a held call approved by a person, a
# task a person resumed: a person took over.
OUT_OF_DOUBT = (OperationStatus.UNKNOWN, OperationStatus.MANUAL)
TASK_DONE = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED)
RELEASE_KEY = "release"
SPLITTABLE = ReleaseGate.SPLITTABLE
COUNTS = frozenset({Ind.HIGH_RISK_MISEXECUTIONS})
CHANGES = frozenset({Ind.TIME_P95_CHANGE, Ind.COST_P95_CHANGE})
DIMENSIONS = ("task_type", "risk_tier", "tool")


@dataclass
class Unit:
    """What one indicator counts for one task, operation, proposal or group of them.

    `tools`: every tool the unit used (a task may use several: it then counts once in each tool's
    split, and once in any split that is not by tool). `samples`: values per series (a currency
    for costs, "" otherwise) for percentiles."""

    task_type: str
    risk_tier: int | None
    tools: tuple[str, ...]
    num: float = 0
    den: float = 0
    samples: dict[str, list[float]] = field(default_factory=dict)
    notes: list[tuple[str, str, str]] = field(default_factory=list)  # (page, record, what to look at there)


@dataclass
class Split:
    labels: dict[str, str]
    value: float | None
    passed: bool | None
    num: float = 0
    den: float = 0
    previous: float | None = None  # a regression gate: the previous release's p95
    current: float | None = None  # … and this release's
    series: str = ""  # … in this currency ("" for times, in seconds)
    notes: list[tuple[str, str, str]] = field(default_factory=list)  # (page, record, reason)
    shown: str = "—"  # the value as people read it

    @property
    def p95_shown(self) -> str:
        """The two p95s of a regression gate, in seconds or in their currency."""
        def one(value: float | None) -> str:
            if value is None:
                return "—"
            return f"{self.series} {value:.4f}" if self.series else f"{value:.1f} s"
        return f"p95 {one(self.previous)} → {one(self.current)}"

    @property
    def name(self) -> str:
        return " · ".join(self.labels.values()) or "all"


@dataclass
class GateResult:
    gate: ReleaseGate
    splits: list[Split]
    value: float | None  # the worst split's value
    passed: bool | None  # every split with data passes; None: no split has data
    splittable: bool = True

    @property
    def rows(self) -> list[tuple[Split, Bar]]:
        return list(zip(self.splits, bars(self), strict=True))

    @property
    def threshold_shown(self) -> str:
        return f"{self.gate.get_comparison_display()} {shown(self.gate.indicator, self.gate.threshold)}"

    @property
    def failing(self) -> int:
        return sum(1 for s in self.splits if s.passed is False)


@dataclass
class Releases:
    current: str = ""
    previous: str = ""
    all: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------ evaluation

def evaluate(*, tenant_ids: set[int], since: datetime, task_type: str = "", tier: int | None = None,
             release: str = "", fallback=None, now: datetime | None = None) -> tuple[list[GateResult], Releases]:
    """Every enabled gate, per split. `fallback`: the window's `runs.metrics.Indicators`, whose
    value stands for an indicator this module does not split. `release`: the release to judge
    against the one before it (default: the newest)."""
    now = now or timezone.now()
    gates = [g for g in ReleaseGate.objects.filter(enabled=True)
             if not task_type or not g.task_type or g.task_type == task_type]
    releases = release_pair(tenant_ids, release)
    wanted = {g.indicator for g in gates}
    units: dict[str, list[Unit]] = {}
    previous: dict[str, list[Unit]] = {}
    builders = _builders(tenant_ids=tenant_ids, since=since, now=now)
    for indicator in sorted(wanted & SPLITTABLE):
        if indicator in CHANGES:
            current, before = _release_units(tenant_ids, releases, cost=indicator == Ind.COST_P95_CHANGE)
            units[indicator], previous[indicator] = current, before
        else:
            units[indicator] = builders[indicator]()
    results = []
    for gate in gates:
        if gate.indicator not in SPLITTABLE:
            value = fallback.value(gate.indicator) if fallback is not None else None
            whole = Split(labels={}, value=value, passed=gate.passes(value), shown=shown(gate.indicator, value))
            results.append(GateResult(gate=gate, splits=[whole], value=value, passed=whole.passed, splittable=False))
            continue
        page = (task_type, tier)
        groups = _group(units[gate.indicator], gate, page)
        before = _group(previous.get(gate.indicator, []), gate, page)
        splits = [_judge(gate, key, groups.get(key), before.get(key))
                  for key in sorted(set(groups) | set(before), key=_sort_key)]
        results.append(_overall(gate, splits))
    return results, releases


def _sort_key(key: tuple) -> tuple:
    return tuple((value is None, str(value)) for value in key)


def _keys(unit: Unit, gate: ReleaseGate, page: tuple[str, int | None]) -> set[tuple]:
    """The splits of `gate` the unit counts in (none when it is outside the gate's scope or the
    page's filters)."""
    page_type, page_tier = page
    for wanted_type in (gate.task_type, page_type):
        if wanted_type and unit.task_type != wanted_type:
            return set()
    for wanted in (gate.risk_tier, page_tier):
        if wanted is not None and unit.risk_tier != wanted:
            return set()
    tools = [tool for tool in (unit.tools or ("",)) if not gate.tool or tool == gate.tool]
    dims = gate.split_dimensions
    keys = set()
    for tool in tools:
        values = {"task_type": unit.task_type, "risk_tier": unit.risk_tier, "tool": tool}
        keys.add(tuple(values[d] for d in dims))
    return keys


def _group(units: list[Unit], gate: ReleaseGate, page) -> dict[tuple, Unit]:
    groups: dict[tuple, Unit] = {}
    for unit in units:
        for key in _keys(unit, gate, page):
            total = groups.setdefault(key, Unit(task_type="", risk_tier=None, tools=()))
            total.num += unit.num
            total.den += unit.den
            for series, values in unit.samples.items():
                total.samples.setdefault(series, []).extend(values)
            total.notes.extend(unit.notes)
    return groups


def _labels(gate: ReleaseGate, key: tuple) -> dict[str, str]:
    labels = {}
    for dim, value in zip(gate.split_dimensions, key, strict=True):
        if dim == "risk_tier":
            labels[dim] = f"L{value}" if value is not None else "no tier"
        else:
            labels[dim] = value or ("no tool" if dim == "tool" else "—")
    return labels


def _judge(gate: ReleaseGate, key: tuple, group: Unit | None, before: Unit | None) -> Split:
    split = Split(labels=_labels(gate, key), value=None, passed=None, notes=group.notes if group else [])
    if gate.indicator in CHANGES:
        split.current, split.previous, split.value, split.series = _change(group, before)
    elif group is not None:
        split.num, split.den = group.num, group.den
        if gate.indicator in COUNTS:
            split.value = group.num if group.den else None
        else:
            split.value = group.num / group.den if group.den else None
    split.passed = gate.passes(split.value)
    split.shown = shown(gate.indicator, split.value)
    return split


RATES = frozenset({Ind.SUCCESS_RATE, Ind.ARGUMENT_VALIDITY, Ind.CONTINUATION_RATE, Ind.UNRESOLVED_RATE,
                   Ind.DUPLICATE_RATE, Ind.AUTO_RECOVERY_RATE, Ind.HUMAN_RATE})


def shown(indicator: str, value: float | None) -> str:
    """A gate's value or threshold as people read it: rates in %, changes signed, counts whole."""
    if value is None:
        return "—"
    if indicator in RATES:
        return f"{value * 100:.2f}%"
    if indicator in CHANGES:
        return f"{value * 100:+.1f}%"
    if indicator in COUNTS:
        return f"{value:.0f}"
    return f"{value:.2f}"


def _change(group: Unit | None, before: Unit | None) -> tuple[float | None, float | None, float | None, str]:
    """(this release's p95, the previous one's, the relative change, the series) of the series
    both have; with several series (currencies), the one that changed most."""
    if group is None or before is None:
        series = _first(group) or _first(before)
        return (_p95(group, series), _p95(before, series), None, series)
    worst: tuple[float | None, float | None, float | None, str] = (None, None, None, "")
    for series in sorted(set(group.samples) & set(before.samples)):
        now, then = _p95(group, series), _p95(before, series)
        if now is None or not then:
            continue
        change = now / then - 1
        if worst[2] is None or change > worst[2]:
            worst = (now, then, change, series)
    return worst


def _first(group: Unit | None) -> str:
    return sorted(group.samples)[0] if group is not None and group.samples else ""


def _p95(group: Unit | None, series: str) -> float | None:
    return percentile(group.samples.get(series, []), 0.95) if group is not None else None


def _overall(gate: ReleaseGate, splits: list[Split]) -> GateResult:
    judged = [s for s in splits if s.passed is not None]
    if not judged:
        return GateResult(gate=gate, splits=splits, value=None, passed=None)
    failing = [s for s in judged if not s.passed]
    higher_is_better = gate.comparison in (ReleaseGate.Comparison.GTE, ReleaseGate.Comparison.GT)
    pool = failing or judged
    worst = (min if higher_is_better else max)(pool, key=lambda s: s.value)
    return GateResult(gate=gate, splits=splits, value=worst.value, passed=not failing)


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (the value at rank ⌈q·n⌉): one of the observed values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(round(q * len(ordered), 9)))
    return ordered[min(rank, len(ordered)) - 1]


# ---------------------------------------------------------------------------------- releases

def release_of():
    """The release label of a task contract: `versions.release`."""
    return KeyTextTransform(RELEASE_KEY, "versions")


def release_pair(tenant_ids: set[int], wanted: str = "") -> Releases:
    """The releases in the tenants' tasks, oldest first by their first task; the one asked for
    (default: the newest) and the one before it."""
    rows = (Task.objects.filter(tenant_id__in=tenant_ids).annotate(release=release_of())
            .values("release").annotate(first=Min("created_at")).order_by("first", "release"))
    names = [row["release"] for row in rows if row["release"]]
    if not names:
        return Releases()
    current = wanted if wanted in names else names[-1]
    index = names.index(current)
    return Releases(current=current, previous=names[index - 1] if index else "", all=names)


# ------------------------------------------------------------------------ task-level units

@dataclass
class _TaskFacts:
    task_type: str
    status: str
    created_at: datetime
    updated_at: datetime
    risk_tier: int | None
    tools: tuple[str, ...]
    release: str = ""
    last_move: datetime | None = None


def _task_facts(tasks) -> dict[str, _TaskFacts]:
    """Per task: its type, status, times, highest operation tier (the task's tier), the tools
    of its operations and its last operation move. Two queries."""
    rows = tasks.annotate(tier=Max("operations__risk_tier"), last_op=Max("operations__updated_at"),
                          release=release_of()).values_list(
        "task_id", "task_type", "status", "created_at", "updated_at", "tier", "last_op", "release")
    facts = {task_id: _TaskFacts(task_type=kind, status=status, created_at=created, updated_at=updated,
                                 risk_tier=tier, tools=(), release=release or "",
                                 last_move=max(updated, last_op) if last_op else updated)
             for task_id, kind, status, created, updated, tier, last_op, release in rows}
    tools: dict[str, set[str]] = defaultdict(set)
    pairs = Operation.objects.filter(task__in=tasks.values("task_id")).values_list("task_id", "tool__name").distinct()
    for task_id, tool in pairs:
        tools[task_id].add(tool)
    for task_id, fact in facts.items():
        fact.tools = tuple(sorted(tools.get(task_id, ())))
    return facts


def _run_note(task_id: str, why: str) -> tuple[str, str, str]:
    return reverse("runs:detail", args=[task_id]), task_id, why


def _task_unit(fact: _TaskFacts, **values) -> Unit:
    return Unit(task_type=fact.task_type, risk_tier=fact.risk_tier, tools=fact.tools, **values)


def _success_units(tasks) -> list[Unit]:
    done = tasks.filter(status__in=TASK_DONE)
    return [_task_unit(f, num=f.status == TaskStatus.SUCCEEDED, den=1) for f in _task_facts(done).values()]


def _release_units(tenant_ids: set[int], releases: Releases, *, cost: bool) -> tuple[list[Unit], list[Unit]]:
    """The finished tasks of this release and of the previous one, with their duration (time
    from the contract to its verified success: succeeded tasks only) or their cost (what their
    model calls cost, every finished task: a failed task costs too)."""
    if not releases.current or not releases.previous:
        return [], []
    tasks = Task.objects.filter(tenant_id__in=tenant_ids, status__in=TASK_DONE,
                                versions__release__in=[releases.current, releases.previous])
    if not cost:
        tasks = tasks.filter(status=TaskStatus.SUCCEEDED)
    facts = _task_facts(tasks)
    costs = _task_costs(tasks, tenant_ids) if cost else {}
    split: dict[str, list[Unit]] = {releases.current: [], releases.previous: []}
    for task_id, fact in facts.items():
        if cost:
            samples = {currency: [amount] for currency, amount in costs.get(task_id, {}).items()}
        else:
            samples = {"": [(fact.updated_at - fact.created_at).total_seconds()]}
        if samples:
            split[fact.release].append(_task_unit(fact, samples=samples))
    return split[releases.current], split[releases.previous]


def _task_costs(tasks, tenant_ids: set[int]) -> dict[str, dict[str, float]]:
    """Per task and currency, what its model calls cost: usage summed per task, model and hour
    in SQL, priced as the dashboard prices it (runs.metrics). A task without priced usage has
    no cost (not a cost of 0)."""
    book = PriceBook.for_tenants(tenant_ids)
    usage = (Span.objects.filter(task__in=tasks.values("task_id")).exclude(input_tokens=None, output_tokens=None)
             .values("task_id", "tenant_id", "gen_ai_model", "gen_ai_response_model", hour=TruncHour("start_time"))
             .annotate(i=Sum("input_tokens"), o=Sum("output_tokens")).order_by())
    totals: dict[str, dict[str, float]] = defaultdict(dict)
    for row in usage:
        priced = book.cost(tenant_id=row["tenant_id"], request_model=row["gen_ai_model"],
                           response_model=row["gen_ai_response_model"], at=row["hour"],
                           input_tokens=row["i"], output_tokens=row["o"])
        if priced is not None:
            currency, amount = priced
            totals[row["task_id"]][currency] = totals[row["task_id"]].get(currency, 0.0) + float(amount)
    return totals


def _continuation_units(tenant_ids: set[int], since: datetime, now: datetime) -> list[Unit]:
    """Tasks a person took over in the window (resolved one of its operations out of `unknown`
    or `manual`, approved one of its held calls, or resumed it from a pause), while the task was
    not finished. Continued: it then reached `succeeded` or `failed` (the agent or the verifier
    carried it to an outcome). Did not continue: `cancelled`, or stalled — not finished, not
    waiting for a person, and no move of the task or its operations for STALLED_AFTER. Still
    moving (or waiting for a person): not counted yet."""
    by_person = Event.objects.filter(tenant_id__in=tenant_ids, created_at__gte=since, actor__startswith="user:")
    rows = by_person.filter(
        Q(entity=Event.Entity.OPERATION, from_status__in=OUT_OF_DOUBT)
        | Q(entity=Event.Entity.APPROVAL, to_status=ApprovalStatus.APPROVED)
        | Q(entity=Event.Entity.TASK, from_status=TaskStatus.PAUSED, to_status=TaskStatus.RUNNING)
    ).values_list("entity", "entity_id", "created_at")
    takeovers = list(rows)
    operations = {e for kind, e, _ in takeovers if kind == Event.Entity.OPERATION}
    approvals = {e for kind, e, _ in takeovers if kind == Event.Entity.APPROVAL}
    task_of = dict(Operation.objects.filter(operation_id__in=operations).values_list("operation_id", "task_id"))
    task_of |= dict(ApprovalRequest.objects.filter(approval_id__in=approvals).values_list("approval_id", "task_id"))
    first: dict[str, datetime] = {}
    for kind, entity_id, at in takeovers:
        task_id = entity_id if kind == Event.Entity.TASK else task_of.get(entity_id)
        if task_id is not None and (task_id not in first or at < first[task_id]):
            first[task_id] = at
    units = []
    for task_id, fact in _task_facts(Task.objects.filter(task_id__in=list(first))).items():
        taken = first[task_id]
        if fact.status in TASK_TERMINAL:
            if fact.updated_at < taken:
                continue  # finished before the person acted: nothing to continue
            cancelled = fact.status == TaskStatus.CANCELLED
            units.append(_task_unit(fact, num=not cancelled, den=1,
                                    notes=[_run_note(task_id, "cancelled after a person took over")] if cancelled else []))
        elif fact.status not in (TaskStatus.WAITING_APPROVAL, TaskStatus.PAUSED) and now - fact.last_move > STALLED_AFTER:
            units.append(_task_unit(fact, num=0, den=1, notes=[_run_note(task_id, f"stalled in {fact.status}")]))
    return units


# ------------------------------------------------------------------- operation-level units

CELL = ("task__task_type", "risk_tier", "tool__name")


def _cell_units(rows, num: str, den: str) -> list[Unit]:
    return [Unit(task_type=row["task__task_type"], risk_tier=row["risk_tier"], tools=(row["tool__name"],),
                 num=row[num] or 0, den=row[den] or 0) for row in rows]


def _unresolved_units(operations) -> list[Unit]:
    rows = operations.values(*CELL).annotate(
        n=Count("operation_id"), manual=Count("operation_id", filter=Q(status=OperationStatus.MANUAL))).order_by()
    return _cell_units(rows, "manual", "n")


def _duplicate_units(operations) -> list[Unit]:
    doubled = (Attempt.objects.filter(operation__in=operations, fact=Fact.KNOWN_SUCCESS).values("operation_id")
               .annotate(n=Count("id")).filter(n__gt=1).values("operation_id"))
    rows = operations.values(*CELL).annotate(
        confirmed=Count("operation_id", filter=Q(status=OperationStatus.CONFIRMED)),
        duplicates=Count("operation_id", filter=Q(operation_id__in=doubled))).order_by()
    return _cell_units(rows, "duplicates", "confirmed")


def _retry_units(operations) -> list[Unit]:
    rows = (Attempt.objects.filter(operation__in=operations)
            .values(task__task_type=F("operation__task__task_type"), risk_tier=F("operation__risk_tier"),
                    tool__name=F("operation__tool__name"))
            .annotate(n=Count("id"), ops=Count("operation_id", distinct=True)).order_by())
    return _cell_units(rows, "n", "ops")


def _argument_units(tenant_ids: set[int], since: datetime) -> list[Unit]:
    """Proposals in the window: each call the ledger recorded (its arguments passed the tool's
    schema, whatever the gate decided next) and each proposal refused for its arguments (a
    `call_refused` event with `invalid_arguments`). Split by the tool's base tier: the tier of
    arguments that failed the schema is not known (escalation rules read the arguments)."""
    base_tier = dict(Tool.objects.values_list("name", "base_tier"))
    calls = (Call.objects.filter(task__tenant_id__in=tenant_ids, created_at__gte=since)
             .values("task__task_type", tool=Coalesce("operation__tool__name", "tool_name"))
             .annotate(n=Count("id")).order_by())
    units = [Unit(task_type=row["task__task_type"], risk_tier=base_tier.get(row["tool"]), tools=(row["tool"],),
                  num=row["n"], den=row["n"]) for row in calls]
    invalid = (Event.objects.filter(tenant_id__in=tenant_ids, created_at__gte=since, entity=Event.Entity.CALL,
                                    kind=Event.Kind.CALL_REFUSED, evidence__has_key="invalid_arguments")
               .values(tool=KeyTextTransform("tool", "evidence"), task=KeyTextTransform("task_id", "evidence"))
               .annotate(n=Count("id")).order_by())
    invalid = list(invalid)
    task_types = dict(Task.objects.filter(task_id__in={row["task"] for row in invalid})
                      .values_list("task_id", "task_type"))
    units += [Unit(task_type=task_types.get(row["task"], ""), risk_tier=base_tier.get(row["tool"]),
                   tools=(row["tool"],), num=0, den=row["n"]) for row in invalid]
    return units


def _misexecution_units(operations) -> list[Unit]:
    """Operations at L3 or L4 with at least one attempt (the dispatcher sent, or was about to
    send, them), each a misexecution when the ledger shows any of:

    - no valid authority: it needed approval, and no request of it at its tier (or above) was
      consumed with as many approvals as it needed whose signed receipts hold for the call, the
      arguments that ran and the task version; or it ran at once without the gate's recorded
      verdict at its tier;
    - something other than what was approved: the approved arguments hash is not the hash of
      the arguments the dispatcher sent (the operation's arguments, hashed again here);
    - reconciliation found the provider's effect differs from the intent (the move to
      `compensation_required` carries `differences`).

    Four queries; the arguments are read only for these operations."""
    risky = operations.filter(Exists(Attempt.objects.filter(operation=OuterRef("pk"))),
                              risk_tier__gte=HIGH_RISK_TIER)
    rows = list(risky.values("operation_id", "arguments", "arguments_hash", "needs_approval", "risk_tier",
                             "task__task_type", "tool__name"))
    ids = [row["operation_id"] for row in rows]
    approvals: dict[str, dict] = {}
    decisions = (ApprovalDecision.objects.filter(request__operation_id__in=ids, request__status=ApprovalStatus.CONSUMED,
                                                 verdict=ApprovalDecision.Verdict.APPROVE)
                 .values("request_id", "request__operation_id", "request__call_id", "request__arguments_hash",
                         "request__state_version", "request__approvals_needed", "request__risk_tier",
                         "reviewer__username", "signature", "verdict", "created_at"))
    for d in decisions:
        request = approvals.setdefault(d["request__operation_id"], {}).setdefault(d["request_id"], {"decisions": []})
        request.update(call_id=d["request__call_id"], hash=d["request__arguments_hash"],
                       version=d["request__state_version"], needed=d["request__approvals_needed"],
                       tier=d["request__risk_tier"])
        request["decisions"].append(d)
    gate_verdicts = dict(Event.objects.filter(entity=Event.Entity.OPERATION, entity_id__in=ids,
                                              to_status=OperationStatus.AUTHORIZED, actor="system:gate")
                         .values_list("entity_id", "evidence"))
    mismatched = set(Event.objects.filter(entity=Event.Entity.OPERATION, entity_id__in=ids,
                                          to_status=OperationStatus.COMPENSATION_REQUIRED,
                                          evidence__has_key="differences").values_list("entity_id", flat=True))
    units = []
    for row in rows:
        op_id = row["operation_id"]
        reasons = _misexecution_reasons(row, approvals.get(op_id, {}), gate_verdicts.get(op_id))
        if op_id in mismatched:
            reasons.append("reconciliation found a different effect")
        units.append(Unit(task_type=row["task__task_type"], risk_tier=row["risk_tier"], tools=(row["tool__name"],),
                          num=1 if reasons else 0, den=1,
                          notes=[(reverse("operations:detail", args=[op_id]), op_id, "; ".join(reasons))] if reasons else []))
    return units


def _misexecution_reasons(row: dict, requests: dict[str, dict], gate_verdict: dict | None) -> list[str]:
    ran = arguments_hash(row["arguments"])
    reasons = []
    if ran != row["arguments_hash"]:
        reasons.append("ran other arguments than were proposed")
    if not row["needs_approval"]:
        recorded = (gate_verdict or {}).get("risk_tier")
        if recorded is None or recorded < row["risk_tier"]:
            reasons.append(f"ran at once without the gate's verdict at L{row['risk_tier']}")
        return reasons
    if not requests:
        reasons.append("no consumed approval")
        return reasons
    if not any(request["hash"] == ran for request in requests.values()):
        reasons.append("ran other arguments than were approved")
        return reasons
    at_tier = [request for request in requests.values() if request["tier"] >= row["risk_tier"]]
    if not at_tier:
        reasons.append(f"approved for a lower tier than L{row['risk_tier']}")
        return reasons
    for request in at_tier:
        valid = [d for d in request["decisions"] if request["hash"] == ran and audit.decision_signature_holds(
            d["signature"], call_id=request["call_id"], arguments_hash=ran, state_version=request["version"],
            approver=f"user:{d['reviewer__username']}", decision=d["verdict"], at=d["created_at"])]
        if len(valid) >= request["needed"]:
            return reasons
    reasons.append("fewer valid approvals than needed")
    return reasons


def _builders(*, tenant_ids: set[int], since: datetime, now: datetime) -> dict:
    tasks = Task.objects.filter(tenant_id__in=tenant_ids, updated_at__gte=since)
    operations = Operation.objects.filter(tenant_id__in=tenant_ids, created_at__gte=since)
    return {
        Ind.SUCCESS_RATE: lambda: _success_units(tasks),
        Ind.UNRESOLVED_RATE: lambda: _unresolved_units(operations),
        Ind.DUPLICATE_RATE: lambda: _duplicate_units(operations),
        Ind.RETRY_AMPLIFICATION: lambda: _retry_units(operations),
        Ind.HIGH_RISK_MISEXECUTIONS: lambda: _misexecution_units(operations),
        Ind.ARGUMENT_VALIDITY: lambda: _argument_units(tenant_ids, since),
        Ind.CONTINUATION_RATE: lambda: _continuation_units(tenant_ids, since, now),
    }


# ------------------------------------------------------------------------------- the picture

@dataclass(frozen=True)
class Bar:
    """Where a split's value and the gate's threshold sit on one shared scale (0–100)."""

    value: float | None
    threshold: float


def bars(result: GateResult) -> list[Bar]:
    """One bar per split of a gate, on a scale that shows them all and the threshold: rates on
    at most [0, 1], counts from 0, changes around 0, padded by a quarter of the range."""
    gate = result.gate
    values = [s.value for s in result.splits if s.value is not None]
    low, high = min([*values, gate.threshold]), max([*values, gate.threshold])
    pad = (high - low) / 4 or max(abs(high), 1) / 10
    low, high = low - pad, high + pad
    if gate.indicator in COUNTS:
        low = 0
    if gate.indicator in (Ind.SUCCESS_RATE, Ind.ARGUMENT_VALIDITY, Ind.CONTINUATION_RATE, Ind.UNRESOLVED_RATE,
                          Ind.DUPLICATE_RATE):
        low, high = max(low, 0.0), min(high, 1.0)
    if gate.indicator in CHANGES:
        low = min(low, 0.0)

    def at(v: float) -> float:
        return round(100 * (v - low) / (high - low), 2) if high > low else 50.0

    return [Bar(value=at(s.value) if s.value is not None else None, threshold=at(gate.threshold))
            for s in result.splits]
