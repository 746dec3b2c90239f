"""Reads of the support console: the queue of operations waiting for a person, its counts and
figures, and everything the detail page shows. (`ledger.selectors` belongs to the agent API.)

The queue's query count does not grow with its rows: what each row shows (tool, tenant, task,
since when it waits, who it is assigned to) comes from joins and correlated subqueries.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, F, OuterRef, QuerySet, Subquery
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce
from django.utils import timezone

from approvals.models import ApprovalRequest, Tool
from console.access import tenant_ids_for
from console.lib.filtersets import LiveFilterSet
from console.models import Event
from ledger.models import OPERATION_NEEDS_PERSON, Attempt, Operation, OperationStatus, WebhookEvent
from ledger.support import PROVIDER_QUERY_ENTITY, VIEW_ROLES

QUEUE_STATUSES = (OperationStatus.UNKNOWN, OperationStatus.MANUAL, OperationStatus.COMPENSATION_REQUIRED)
assert set(QUEUE_STATUSES) == set(OPERATION_NEEDS_PERSON)
RESOLVED_STATUSES = (OperationStatus.CONFIRMED, OperationStatus.FAILED, OperationStatus.RETRY_SAFE)


def viewer_tenant_ids(user: AbstractBaseUser) -> set[int]:
    return tenant_ids_for(user, *VIEW_ROLES)


def _operation_events(**filters: Any) -> QuerySet:
    return Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=OuterRef("pk"), **filters).order_by("-id")


def queue_base(tenant_ids: set[int]) -> QuerySet:
    waiting_since = _operation_events(to_status=OperationStatus.UNKNOWN).values("created_at")[:1]
    assigned = (
        _operation_events(evidence__has_key="assigned_to")
        .annotate(assignee=KeyTextTransform("assigned_to", "evidence")).values("assignee")[:1]
    )
    return (
        Operation.objects.filter(tenant_id__in=tenant_ids, status__in=QUEUE_STATUSES)
        .select_related("tool", "tenant", "task")
        .annotate(waiting_since=Coalesce(Subquery(waiting_since), F("updated_at")),
                  assignee=Subquery(assigned))
    )


def queue(user: AbstractBaseUser, filters: LiveFilterSet) -> QuerySet:
    """Oldest first: the operation that has waited longest for a person is at the top.
    `filters`: the page's (ledger.filters.QueueFilterSet)."""
    return filters.apply(queue_base(viewer_tenant_ids(user))).order_by("waiting_since", "operation_id")


def queue_rows_by_id(user: AbstractBaseUser, operation_ids: list[str]) -> dict[str, Operation]:
    rows = queue_base(viewer_tenant_ids(user)).filter(operation_id__in=operation_ids)
    return {row.operation_id: row for row in rows}


def status_counts(user: AbstractBaseUser) -> dict[str, int]:
    counts = dict.fromkeys(QUEUE_STATUSES, 0)
    rows = (
        Operation.objects.filter(tenant_id__in=viewer_tenant_ids(user), status__in=QUEUE_STATUSES)
        .values("status").annotate(n=Count("pk")).order_by()
    )
    for row in rows:
        counts[row["status"]] = row["n"]
    return counts


def tool_choices(user: AbstractBaseUser) -> list[str]:
    return list(Tool.objects.order_by("name").values_list("name", flat=True))


@dataclass(frozen=True)
class Figures:
    unknown_now: int
    waiting_now: int
    resolved: int
    median_seconds: float | None
    automatic: int
    by_person: int

    @property
    def automatic_pct(self) -> int:
        return round(100 * self.automatic / self.resolved) if self.resolved else 0

    @property
    def by_person_pct(self) -> int:
        return 100 - self.automatic_pct if self.resolved else 0


def figures(user: AbstractBaseUser, counts: dict[str, int], *, now=None, window=timedelta(days=1)) -> Figures:
    """Over the last day, from the event log: how long operations stayed unknown (became
    unknown → left unknown/manual for confirmed, failed or retry_safe), and who resolved them
    (actor "system:…" = the reconciler recovered it by itself; "user:…" = a person)."""
    now = now or timezone.now()
    tenant_ids = viewer_tenant_ids(user)
    resolutions = list(
        Event.objects.filter(tenant_id__in=tenant_ids, entity=Operation.EVENT_ENTITY, created_at__gte=now - window,
                             from_status__in=(OperationStatus.UNKNOWN, OperationStatus.MANUAL), to_status__in=RESOLVED_STATUSES)
        .only("id", "entity_id", "actor", "created_at").order_by("id")
    )
    entered: dict[str, list[tuple[int, Any]]] = {}
    if resolutions:
        for event_id, entity_id, created_at in (
            Event.objects.filter(entity=Operation.EVENT_ENTITY, to_status=OperationStatus.UNKNOWN,
                                 entity_id__in={e.entity_id for e in resolutions})
            .values_list("id", "entity_id", "created_at").order_by("id")
        ):
            entered.setdefault(entity_id, []).append((event_id, created_at))
    durations = []
    for event in resolutions:
        before = [at for event_id, at in entered.get(event.entity_id, []) if event_id < event.id]
        if before:
            durations.append((event.created_at - before[-1]).total_seconds())
    automatic = sum(1 for e in resolutions if e.actor.startswith("system:"))
    return Figures(
        unknown_now=counts.get(OperationStatus.UNKNOWN, 0), waiting_now=sum(counts.values()), resolved=len(resolutions),
        median_seconds=statistics.median(durations) if durations else None,
        automatic=automatic, by_person=len(resolutions) - automatic,
    )


# ------------------------------------------------------------------------------ detail


def timeline(operation: Operation) -> list[Event]:
    """Every event of the operation and of its provider queries, oldest first."""
    return list(
        Event.objects.filter(entity__in=(Operation.EVENT_ENTITY, PROVIDER_QUERY_ENTITY),
                             entity_id=operation.operation_id).order_by("id")
    )


def attempts(operation: Operation) -> list[Attempt]:
    return list(Attempt.objects.filter(operation=operation).order_by("number"))


def provider_answers(operation: Operation, limit: int = 10) -> list[Event]:
    return list(
        Event.objects.filter(entity=PROVIDER_QUERY_ENTITY, entity_id=operation.operation_id).order_by("-id")[:limit]
    )


def approvals_of(operation: Operation) -> list:
    return list(
        ApprovalRequest.objects.filter(operation=operation).prefetch_related("decisions__reviewer").order_by("created_at")
    )


def assignee_of(operation: Operation) -> str:
    event = (
        Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id,
                             evidence__has_key="assigned_to").order_by("-id").first()
    )
    return str(event.evidence.get("assigned_to")) if event else ""


def webhook_events_of(operation: Operation) -> list[WebhookEvent]:
    """The decision webhooks sent to the operation's agent, with their delivery attempts."""
    return list(WebhookEvent.objects.filter(operation=operation).select_related("principal")
                .prefetch_related("deliveries").order_by("id"))
