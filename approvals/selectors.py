"""Reads for the reviewer console: the inbox and one approval request with its context.

Every query here is scoped to the tenants in which the user is a reviewer; the number of queries
does not grow with the number of rows (select_related and subquery annotations).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import DatabaseError, connection, transaction
from django.db.models import (
    Count,
    Exists,
    IntegerField,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from approvals import catalog
from approvals.filters import InboxFilterSet
from approvals.models import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalStatus,
    Notification,
    PendingCount,
    Tool,
)
from approvals.stops import active_stop
from console.access import remember_roles, roles_from
from console.lib.reveal import as_json
from console.models import AgentPrincipal, Membership, Role

# Who may look at approval requests (and open the live streams about them).
VIEWER_ROLES = (Role.REVIEWER, Role.ADMIN)

CHOICES_TTL_SECONDS = 60
logger = logging.getLogger(__name__)

@dataclass
class ReviewerScope:
    """The tenants a user may see approvals in, and the highest tier they may decide in each
    (None: may look, may not decide — e.g. an admin who is not a reviewer there)."""

    tenant_ids: set[int] = field(default_factory=set)
    max_tier: dict[int, int | None] = field(default_factory=dict)
    tenants: dict[int, tuple[str, str]] = field(default_factory=dict)  # id → (slug, name)

    def can_decide_tier(self, tenant_id: int, tier: int) -> bool:
        limit = self.max_tier.get(tenant_id)
        return limit is not None and tier <= limit

    def highest_tier(self) -> int | None:
        tiers = [t for t in self.max_tier.values() if t is not None]
        return max(tiers) if tiers else None


def reviewer_scope(user: AbstractBaseUser) -> ReviewerScope:
    """One query: the user's memberships, of which the viewer ones with their tiers make the
    scope; all of them are the roles the layout shows (console.access.remember_roles), so the
    page does not read them twice."""
    scope = ReviewerScope()
    if not user.is_authenticated or not user.is_active:
        return scope
    rows = list(Membership.objects.filter(user=user).values_list(
        "tenant_id", "role", "max_tier", "tenant__slug", "tenant__name"))
    remember_roles(user, roles_from(user, (role for _, role, _, _, _ in rows)))
    for tenant_id, role, max_tier, slug, name in rows:
        if role not in VIEWER_ROLES:
            continue
        scope.tenant_ids.add(tenant_id)
        scope.tenants[tenant_id] = (slug, name)
        current = scope.max_tier.get(tenant_id)
        if role == Role.REVIEWER and max_tier is not None:
            scope.max_tier[tenant_id] = max_tier if current is None else max(current, max_tier)
        else:
            scope.max_tier.setdefault(tenant_id, None)
    return scope


def _annotated(qs: QuerySet[ApprovalRequest], user: AbstractBaseUser) -> QuerySet[ApprovalRequest]:
    approvals_given = (
        ApprovalDecision.objects.filter(request=OuterRef("pk"), verdict=ApprovalDecision.Verdict.APPROVE)
        .order_by()
        .values("request")
        .annotate(n=Count("id"))
        .values("n")[:1]
    )
    return qs.annotate(
        approvals_given=Coalesce(Subquery(approvals_given, output_field=IntegerField()), Value(0)),
        decided_by_me=Exists(ApprovalDecision.objects.filter(request=OuterRef("pk"), reviewer_id=user.pk)),
    )


# What an inbox row shows (approvals/templatetags/inbox_rows.py) and nothing more: loading the
# JSON of each row's request, operation, tools and task meant about 350 JSON values decoded
# per page, a large share of the inbox's server time (bench/inbox.py).
ROW_FIELDS = ("approval_id", "tenant", "task", "operation", "tool", "task_type", "call_id", "risk_tier",
              "approvals_needed", "status", "expires_at", "created_at", "tool__name", "task__goal")


def _as_rows(qs: QuerySet[ApprovalRequest], user: AbstractBaseUser) -> QuerySet[ApprovalRequest]:
    return _annotated(qs.select_related("tool", "task").only(*ROW_FIELDS), user)


def pending_in_scope(scope: ReviewerScope, *, now=None) -> QuerySet[ApprovalRequest]:
    now = now or timezone.now()
    return ApprovalRequest.objects.filter(
        tenant_id__in=scope.tenant_ids, status=ApprovalStatus.PENDING, expires_at__gt=now
    )


INBOX_ORDER = ("expires_at", "created_at", "approval_id")


def inbox(user: AbstractBaseUser, scope: ReviewerScope, filters: InboxFilterSet) -> QuerySet[ApprovalRequest]:
    """Pending, unexpired requests in the user's tenants, most urgent (soonest expiry) first, as
    the page shows them (its IDs, then its rows). Higher tiers than the user may decide are
    included; the page marks them."""
    return _as_rows(ApprovalRequest.objects.filter(approval_id__in=inbox_ids(scope, filters)), user).order_by(
        *INBOX_ORDER)


def inbox_ids(scope: ReviewerScope, filters: InboxFilterSet) -> QuerySet:
    """The inbox's order as bare IDs, for paging: OFFSET then skips index entries only, not
    joined and annotated rows (a deep page over 10,000 pending requests stays cheap)."""
    now = timezone.now()
    return filters.apply(pending_in_scope(scope, now=now), now=now, pending=True).order_by(
        *INBOX_ORDER).values_list("approval_id", flat=True)


def inbox_rows(user: AbstractBaseUser, approval_ids: list[str]) -> list[ApprovalRequest]:
    """The annotated rows for one page of IDs, in the page's order."""
    rows = {r.approval_id: r for r in _as_rows(ApprovalRequest.objects.filter(approval_id__in=approval_ids), user)}
    return [rows[i] for i in approval_ids if i in rows]


def inbox_rows_by_id(user: AbstractBaseUser, scope: ReviewerScope, approval_ids: list[str]) -> dict[str, ApprovalRequest]:
    """The given requests (any status) as inbox rows, for the live stream."""
    qs = ApprovalRequest.objects.filter(approval_id__in=approval_ids, tenant_id__in=scope.tenant_ids)
    return {row.approval_id: row for row in _as_rows(qs, user)}


# Past this many delta rows in a reader's tenants, the reader folds them into one per tenant
# and tier: summing a few hundred rows costs nothing, a day of transitions would.
PENDING_COUNT_COMPACT_AT = 256


def tier_counts(scope: ReviewerScope) -> dict[int, int]:
    """Pending, unexpired requests per tier, L0..L4 (zeros included): the pending counters'
    sums (`PendingCount`, kept by a trigger in the writing transaction), less the requests still
    pending whose expiry has passed and that the sweeper has not moved yet (an index range over
    those few). One query, whatever the number of pending requests."""
    counts = {tier: 0 for tier in range(5)}
    if not scope.tenant_ids:
        return counts
    now = timezone.now()
    counted = (PendingCount.objects.filter(tenant_id__in=scope.tenant_ids).order_by().values("risk_tier")
               .annotate(n=Sum("delta"), rows=Count("pk")))
    expired = (ApprovalRequest.objects.filter(tenant_id__in=scope.tenant_ids, status=ApprovalStatus.PENDING,
                                              expires_at__lte=now)
               .order_by().values("risk_tier").annotate(n=-Count("pk"), rows=Value(0)))
    rows = 0
    for row in counted.union(expired, all=True):
        counts[row["risk_tier"]] = counts.get(row["risk_tier"], 0) + row["n"]
        rows += row["rows"]
    if rows > PENDING_COUNT_COMPACT_AT:
        compact_pending_counts(scope.tenant_ids)
    return counts


def compact_pending_counts(tenant_ids) -> None:
    """Fold the tenants' pending-count deltas into one row per tenant and tier, in one
    transaction: the rows deleted are exactly the rows summed (DELETE … RETURNING), so a delta
    committed meanwhile by another transaction is left for the next fold, and two readers
    folding at once each fold only what they deleted (PostgreSQL skips rows another deleted)."""
    table = PendingCount._meta.db_table
    ids = sorted(tenant_ids)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {table} WHERE tenant_id IN ({', '.join(['%s'] * len(ids))}) "  # noqa: S608
                           "RETURNING tenant_id, risk_tier, delta", ids)
            sums: dict[tuple[int, int], int] = {}
            for tenant_id, risk_tier, delta in cursor.fetchall():
                sums[(tenant_id, risk_tier)] = sums.get((tenant_id, risk_tier), 0) + delta
            PendingCount.objects.bulk_create(
                [PendingCount(tenant_id=t, risk_tier=r, delta=n) for (t, r), n in sorted(sums.items()) if n])
    except DatabaseError:
        # Folding only saves later readers work; the counts already read are exact. Two folds
        # that lock the same rows in another order (a deadlock) or a busy SQLite file leave the
        # deltas as they were, for the next reader.
        logger.warning("pending counts not folded", exc_info=True)


def filter_choices(scope: ReviewerScope) -> dict[str, list]:
    """Every tool, the user's tenants (from the scope), their agents, and the task types that
    appear among pending requests."""
    tools = list(Tool.objects.order_by("name").values_list("name", flat=True))
    tenants = sorted(scope.tenants.values())
    # A DISTINCT over every pending request costs milliseconds at 10,000 pending requests
    # (bench/inbox.py); these lists may lag by a minute.
    key = "approvals:choices:" + ",".join(str(t) for t in sorted(scope.tenant_ids))
    cached = cache.get(key)
    if cached is None:
        pending = pending_in_scope(scope).order_by()
        cached = {
            "task_types": sorted(set(pending.values_list("task_type", flat=True).distinct())),
            "agents": list(AgentPrincipal.objects.filter(tenant_id__in=scope.tenant_ids)
                           .order_by("tenant__slug", "name").values_list("pk", "name", "tenant__slug")),
        }
        cache.set(key, cached, CHOICES_TTL_SECONDS)
    agents = [(pk, f"{name} ({slug})" if len(tenants) > 1 else name) for pk, name, slug in cached["agents"]]
    return {"tools": tools, "task_types": cached["task_types"], "tenants": tenants, "agents": agents}


def approval_for_user(user: AbstractBaseUser, scope: ReviewerScope, approval_id: str) -> ApprovalRequest | None:
    qs = ApprovalRequest.objects.filter(approval_id=approval_id, tenant_id__in=scope.tenant_ids)
    # The request's tool is its operation's (copied at creation): loaded once, not twice (a
    # tool row carries a dozen JSON columns).
    approval = _annotated(qs, user).select_related("operation__tool", "task", "tenant", "requested_by").first()
    if approval is not None and approval.tool_id == approval.operation.tool_id:
        approval.tool = approval.operation.tool
    return approval


def decisions_for_operation(operation_id: str) -> list[ApprovalDecision]:
    """Every decision on any approval request for this operation (earlier requests included),
    oldest first."""
    return list(
        ApprovalDecision.objects.filter(request__operation_id=operation_id)
        .select_related("reviewer", "request")
        .order_by("created_at", "id")
    )


# ----------------------------------------------------------------------------- presentation


def decorate_rows(rows, scope: ReviewerScope) -> list[ApprovalRequest]:
    """Per-row flags for the templates: may this user decide it, and what else it needs."""
    now = timezone.now()
    out = []
    for row in rows:
        row.can_decide_tier = scope.can_decide_tier(row.tenant_id, row.risk_tier)
        row.is_open = row.status == ApprovalStatus.PENDING and row.expires_at > now
        out.append(row)
    return out


def review_context(user: AbstractBaseUser, scope: ReviewerScope, approval: ApprovalRequest) -> dict[str, Any]:
    """Everything the detail page's side panel (status, decision forms, earlier decisions)
    shows; the page renders it and so does the live stream when the request moves."""
    operation = approval.operation
    decorate_rows([approval], scope)
    limit = scope.max_tier.get(approval.tenant_id)
    needs_higher = not approval.can_decide_tier
    proposed_by_me = approval.proposed_by_id is not None and approval.proposed_by_id == user.pk
    can_decide = approval.is_open and not needs_higher and not approval.decided_by_me and not proposed_by_me
    return {
        "approval": approval,
        "operation": operation,
        "decisions": decisions_for_operation(operation.operation_id),
        "can_decide": can_decide,
        "proposed_by_me": proposed_by_me,
        "needs_higher": needs_higher,
        "reviewer_limit": limit,
        "is_expired": approval.status == ApprovalStatus.PENDING and approval.expires_at <= timezone.now(),
        # A stop in force freezes an open request: it cannot be approved until resumed.
        "frozen_by": active_stop(tenant_id=approval.tenant_id, agent_id=approval.requested_by_id,
                                 tool_id=approval.tool_id) if approval.is_open else None,
    }


MASK = "••••••••"


def display_value(value: Any) -> tuple[str, bool]:
    """A value as a person reads it: (text, is_block). A string as itself (its hidden
    characters are the template's `reveal` filter's to show); anything else as the JSON the
    agent sent, so that ["a, b"] and ["a", "b"] never look alike (console/lib/reveal.py)."""
    if isinstance(value, str):
        return value, "\n" in value
    text = as_json(value)
    return text, "\n" in text


def masked_arguments(arguments: dict[str, Any], secret_fields: list[str]) -> list[dict[str, Any]]:
    """Arguments for display; the values of secret fields never leave the server."""
    secret = set(secret_fields or [])
    rows = []
    for name, value in (arguments or {}).items():
        if name in secret:
            rows.append({"name": name, "text": MASK, "block": False, "masked": True})
        else:
            text, block = display_value(value)
            rows.append({"name": name, "text": text, "block": block, "masked": False})
    return rows


def tier_shows_preview(risk_tier: int) -> bool:
    """Does the policy of this tier show reviewers the adapter's preview (`PolicyTier.shows_preview`,
    read as it is now, so an admin's change applies to requests already waiting)? A tier
    nobody configured shows none."""
    policy = catalog.current().tier(risk_tier)
    return policy is not None and policy.shows_preview


def masked_preview(preview: dict[str, Any] | None, secret_fields: list[str]) -> dict[str, Any] | None:
    if preview is None:
        return None
    secret = set(secret_fields or [])
    return {k: (MASK if k in secret else v) for k, v in preview.items()}


# ---------------------------------------------------------------------------------- export

EXPORT_FIELDS = (
    "decided_at", "reviewer", "verdict", "reason", "arguments_hash", "approval_id", "approval_status",
    "superseded_by", "call_id", "operation_id", "task_id", "task_type", "tool", "risk_tier", "tenant",
)


def decisions_for_export(scope: ReviewerScope, filters: InboxFilterSet) -> QuerySet[ApprovalDecision]:
    """Every decision on requests in the user's tenants that match the inbox's filters (any
    status; `age` is the request's age), oldest first."""
    requests = filters.apply(ApprovalRequest.objects.filter(tenant_id__in=scope.tenant_ids))
    return (
        ApprovalDecision.objects.filter(request__in=requests.values("pk"))
        .select_related("reviewer", "request__tool", "request__tenant")
        .order_by("created_at", "id")
    )


def export_row(decision: ApprovalDecision) -> dict[str, Any]:
    request = decision.request
    return {
        "decided_at": decision.created_at.isoformat(),
        "reviewer": decision.reviewer.get_username(),
        "verdict": decision.verdict,
        "reason": decision.reason,
        "arguments_hash": decision.arguments_hash,
        "approval_id": request.approval_id,
        "approval_status": request.status,
        "superseded_by": request.superseded_by_id or "",
        "call_id": request.call_id,
        "operation_id": request.operation_id,
        "task_id": request.task_id,
        "task_type": request.task_type,
        "tool": request.tool.name,
        "risk_tier": request.risk_tier,
        "tenant": request.tenant.slug,
    }


def notifications_for(approval_id: str) -> list:
    return list(Notification.objects.filter(approval_id=approval_id).select_related("channel").order_by("id"))


def edited_from(approval_id: str) -> ApprovalRequest | None:
    """The request this one replaced by an edit, if any."""
    return ApprovalRequest.objects.filter(superseded_by_id=approval_id).first()
