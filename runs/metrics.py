"""The reliability indicators, computed from the ledger, the event log and the
traces — never from the agent's own word.

Terminal success rate, duplicate side-effect rate, automatic recovery rate, recovery time, human
intervention rate, retry / token / latency amplification, plus pass@k and pass^k over repeated
trials of the same task (same type and inputs).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from math import comb

from django.db.models import Count, Q, Sum

from console.lib.canonical import sha256_hex
from console.models import Event
from ledger.models import Attempt, Fact, Operation, OperationStatus
from runs.models import Span, Task, TaskStatus
from runs.pricing import format_money, spans_cost

RESOLVED = {OperationStatus.CONFIRMED, OperationStatus.RETRY_SAFE, OperationStatus.FAILED, OperationStatus.COMPENSATION_REQUIRED}
TASK_DONE = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED)


@dataclass
class Indicators:
    window_start: datetime
    tasks_terminal: int = 0
    tasks_succeeded: int = 0
    terminal_success_rate: float | None = None
    operations: int = 0
    confirmed: int = 0
    duplicates: int = 0
    duplicate_side_effect_rate: float | None = None
    went_unknown: int = 0
    auto_recovered: int = 0
    resolved_by_person: int = 0
    automatic_recovery_rate: float | None = None
    unresolved: int = 0
    unresolved_rate: float | None = None
    recovery_time_median_seconds: float | None = None
    recovery_time_p95_seconds: float | None = None
    human_intervention_rate: float | None = None
    retry_amplification: float | None = None
    latency_amplification: float | None = None
    tokens_per_success: float | None = None
    cost_per_success: dict[str, Decimal] = field(default_factory=dict)  # per currency
    pass_at_k: dict[int, float] = field(default_factory=dict)
    pass_hat_k: dict[int, float] = field(default_factory=dict)
    trial_groups: int = 0

    def value(self, indicator: str) -> float | None:
        return getattr(self, indicator, None)

    @property
    def cost_per_success_display(self) -> str:
        return format_money(self.cost_per_success)


def _ratio(numerator: int | float, denominator: int | float) -> float | None:
    return (numerator / denominator) if denominator else None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k trials drawn from n (c successful) succeeds."""
    return 1.0 - comb(n - c, k) / comb(n, k) if n - c >= k else 1.0


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Probability that all k trials drawn from n (c successful) succeed."""
    return comb(c, k) / comb(n, k)


def _scope(*, tenant_ids: set[int], since: datetime, task_type: str, tier: int | None):
    """The tasks and operations an indicator counts: the user's tenants, the window, the filters."""
    tasks = Task.objects.filter(tenant_id__in=tenant_ids, updated_at__gte=since)
    operations = Operation.objects.filter(tenant_id__in=tenant_ids, created_at__gte=since)
    if task_type:
        tasks = tasks.filter(task_type=task_type)
        operations = operations.filter(task__task_type=task_type)
    if tier is not None:
        operations = operations.filter(risk_tier=tier)
    return tasks, operations


def compute(*, tenant_ids: set[int], since: datetime, task_type: str = "", tier: int | None = None,
            ks: tuple[int, ...] = (1, 3, 5)) -> Indicators:
    result = Indicators(window_start=since)
    tasks, operations = _scope(tenant_ids=tenant_ids, since=since, task_type=task_type, tier=tier)

    counts = tasks.aggregate(terminal=Count("task_id", filter=Q(status__in=TASK_DONE)),
                             succeeded=Count("task_id", filter=Q(status=TaskStatus.SUCCEEDED)))
    result.tasks_terminal, result.tasks_succeeded = counts["terminal"], counts["succeeded"]
    result.terminal_success_rate = _ratio(result.tasks_succeeded, result.tasks_terminal)

    op_counts = operations.aggregate(
        total=Count("operation_id"), confirmed=Count("operation_id", filter=Q(status=OperationStatus.CONFIRMED)),
        unresolved=Count("operation_id", filter=Q(status=OperationStatus.MANUAL)),
    )
    result.operations, result.confirmed = op_counts["total"], op_counts["confirmed"]
    result.unresolved = op_counts["unresolved"]
    result.unresolved_rate = _ratio(result.unresolved, result.operations)

    attempts = Attempt.objects.filter(operation__in=operations)
    # Two attempts that each report an effect for one operation: the ledger's view of a duplicate.
    result.duplicates = (
        attempts.filter(fact=Fact.KNOWN_SUCCESS).values("operation_id").annotate(n=Count("id"))
        .filter(n__gt=1).count()
    )
    result.duplicate_side_effect_rate = _ratio(result.duplicates, result.confirmed)
    per_op = attempts.aggregate(n=Count("id"), ops=Count("operation_id", distinct=True),
                                total_latency=Sum("latency_ms"),
                                first_latency=Sum("latency_ms", filter=Q(number=1)))
    result.retry_amplification = _ratio(per_op["n"], per_op["ops"])
    result.latency_amplification = _ratio(per_op["total_latency"] or 0, per_op["first_latency"] or 0)

    _recovery(result, operations)
    result.human_intervention_rate = _ratio(len(_touched_by_people(operations)), result.operations)
    tokens = Span.objects.filter(task__in=tasks).aggregate(i=Sum("input_tokens"), o=Sum("output_tokens"))
    result.tokens_per_success = _ratio((tokens["i"] or 0) + (tokens["o"] or 0), result.tasks_succeeded)
    if result.tasks_succeeded:
        result.cost_per_success = {currency: amount / result.tasks_succeeded
                                   for currency, amount in _token_cost(tasks, tenant_ids).items()}
    _trials(result, tasks, ks)
    return result


def _token_cost(tasks, tenant_ids: set[int]) -> dict[str, Decimal]:
    """What the tasks' model calls cost, per currency: all of them, failed attempts included,
    which is the point of an amplification figure; on the dashboard a new price takes effect
    from the next full hour."""
    return spans_cost(Span.objects.filter(task__in=tasks), tenant_ids)


def _touched_by_people(operations) -> set[str]:
    """Operations a person approved, rejected, resolved or otherwise moved."""
    touched = set(operations.filter(approval_requests__isnull=False).values_list("operation_id", flat=True))
    touched |= set(Event.objects.filter(entity=Event.Entity.OPERATION, entity_id__in=operations.values("operation_id"),
                                        actor__startswith="user:").values_list("entity_id", flat=True))
    return touched


def _resolutions(operations) -> tuple[list[tuple[datetime, bool, float]], int]:
    """Each way out of `unknown`: (when, by the system?, seconds in doubt); and how many are
    still in doubt."""
    events = (
        Event.objects.filter(entity=Event.Entity.OPERATION, entity_id__in=operations.values("operation_id"))
        .filter(Q(to_status=OperationStatus.UNKNOWN) | Q(from_status__in=[OperationStatus.UNKNOWN, OperationStatus.MANUAL]))
        .order_by("id").values_list("entity_id", "to_status", "actor", "created_at")
    )
    entered: dict[str, datetime] = {}
    resolved: list[tuple[datetime, bool, float]] = []
    for op_id, to_status, actor, at in events:
        if to_status == OperationStatus.UNKNOWN:
            entered.setdefault(op_id, at)
        elif to_status in RESOLVED and op_id in entered:
            resolved.append((at, actor.startswith("system:"), (at - entered.pop(op_id)).total_seconds()))
    return resolved, len(entered)


def _recovery(result: Indicators, operations) -> None:
    resolved, still_open = _resolutions(operations)
    durations = [seconds for _, _, seconds in resolved]
    result.auto_recovered = sum(1 for _, auto, _ in resolved if auto)
    result.resolved_by_person = len(resolved) - result.auto_recovered
    result.went_unknown = len(resolved) + still_open
    result.automatic_recovery_rate = _ratio(result.auto_recovered, result.went_unknown)
    result.recovery_time_median_seconds = statistics.median(durations) if durations else None
    result.recovery_time_p95_seconds = _percentile(durations, 0.95)


def _trials(result: Indicators, tasks, ks: tuple[int, ...]) -> None:
    groups: dict[str, list[bool]] = defaultdict(list)
    for task_type, inputs, status in tasks.filter(status__in=TASK_DONE).values_list("task_type", "inputs", "status"):
        groups[sha256_hex({"type": task_type, "inputs": inputs})].append(status == TaskStatus.SUCCEEDED)
    repeated = [g for g in groups.values() if len(g) > 1]
    result.trial_groups = len(repeated)
    for k in ks:
        eligible = [(len(g), sum(g)) for g in repeated if len(g) >= k]
        if eligible:
            result.pass_at_k[k] = sum(pass_at_k(n, c, k) for n, c in eligible) / len(eligible)
            result.pass_hat_k[k] = sum(pass_hat_k(n, c, k) for n, c in eligible) / len(eligible)


def series(*, tenant_ids: set[int], since: datetime, task_type: str = "", tier: int | None = None,
           buckets: int = 24) -> dict[str, list]:
    """Per time bucket, for the dashboard charts: operations created, confirmed and gone
    unknown; and three of the indicators over time (None where a bucket has no data): terminal
    success rate (tasks finishing in the bucket), automatic recovery rate (ways out of
    `unknown` in the bucket) and human intervention rate (operations created in the bucket)."""
    now = datetime.now(tz=since.tzinfo)
    width = max((now - since) / buckets, timedelta(seconds=1))
    tasks, operations = _scope(tenant_ids=tenant_ids, since=since, task_type=task_type, tier=tier)

    def bucket(at: datetime) -> int:
        return min(buckets - 1, max(0, int((at - since) / width)))

    def zeros() -> list[int]:
        return [0] * buckets

    created, confirmed, unknown, touched = zeros(), zeros(), zeros(), zeros()
    people = _touched_by_people(operations)
    for op_id, at in operations.values_list("operation_id", "created_at"):
        created[bucket(at)] += 1
        touched[bucket(at)] += op_id in people
    rows = Event.objects.filter(entity=Event.Entity.OPERATION, entity_id__in=operations.values("operation_id"),
                                created_at__gte=since, to_status__in=[OperationStatus.CONFIRMED, OperationStatus.UNKNOWN])
    for to_status, at in rows.values_list("to_status", "created_at"):
        (confirmed if to_status == OperationStatus.CONFIRMED else unknown)[bucket(at)] += 1
    finished, succeeded = zeros(), zeros()
    for status, at in tasks.filter(status__in=TASK_DONE).values_list("status", "updated_at"):
        finished[bucket(at)] += 1
        succeeded[bucket(at)] += status == TaskStatus.SUCCEEDED
    recovered, by_system = zeros(), zeros()
    for at, auto, _ in _resolutions(operations)[0]:
        recovered[bucket(at)] += 1
        by_system[bucket(at)] += auto
    xs = [int((since + width * i).timestamp()) for i in range(buckets)]
    return {
        "x": xs, "created": created, "confirmed": confirmed, "unknown": unknown,
        "success_rate": [_ratio(a, b) for a, b in zip(succeeded, finished, strict=True)],
        "auto_recovery_rate": [_ratio(a, b) for a, b in zip(by_system, recovered, strict=True)],
        "human_rate": [_ratio(a, b) for a, b in zip(touched, created, strict=True)],
    }
