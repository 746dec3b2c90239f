"""Live streams of the reviewer console (registered from `ApprovalsConfig.ready`).

- "inbox" (`/ws/live/inbox/<filters>/`): a new pending request matching the page's filters is
  inserted at the top of `#inbox-rows` (page 1 only); a request that is decided, expired or
  otherwise closed replaces its row (`#approval-<id>`, outerHTML) showing its new status; the
  per-tier counts are re-rendered.
- "approval" (`/ws/live/approval/<approval_id>/`): the detail page's status, operation status
  and decisions follow the request and its operation.

`arg` carries what the page shows: for the inbox, its filters and page number
(`InboxFilterSet.live_arg`, read back by `InboxFilterSet.from_arg`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.template.loader import render_to_string

from approvals import selectors
from approvals.filters import InboxFilterSet
from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.selectors import decorate_rows, review_context
from approvals.templatetags.inbox_rows import render_rows
from console import live
from console.models import Event

INBOX_ROWS_ID = "inbox-rows"


def read_inbox_arg(arg: str) -> tuple[InboxFilterSet, int]:
    """The page's filters and page number; an argument that does not read is page 1, unfiltered."""
    filters, data = InboxFilterSet.from_arg(arg)
    try:
        page = max(1, int(data.get("page", "1")))
    except ValueError:
        page = 1
    return filters, page


def _approval_ids(events: Sequence) -> list[str]:
    seen: dict[str, None] = {}
    for event in events:
        if event.entity == ApprovalRequest.EVENT_ENTITY:
            seen.setdefault(event.entity_id, None)
    return list(seen)


def render_inbox(user: AbstractBaseUser, events: Sequence, arg: str) -> str:
    ids = _approval_ids(events)
    if not ids:
        return ""
    scope = selectors.reviewer_scope(user)
    filters, page = read_inbox_arg(arg)
    rows = selectors.inbox_rows_by_id(user, scope, ids)
    decorate_rows(rows.values(), scope)
    matching = set(rows) if filters.is_empty else set(
        filters.apply(ApprovalRequest.objects.filter(approval_id__in=list(rows))).values_list("approval_id", flat=True)
    )
    inserted, replaced = [], []
    # Newest first, so that several arrivals in one batch end up in arrival order at the top.
    for approval_id in reversed(ids):
        row = rows.get(approval_id)
        if row is None:
            continue
        if row.is_open:
            if page == 1 and approval_id in matching:
                inserted.append(row)
        else:
            replaced.append(row)
    parts = [render_rows(replaced, oob="replace")]
    if inserted:
        rows_html = render_rows(reversed(inserted), oob="insert")
        parts.append(f'<tbody hx-swap-oob="afterbegin:#inbox-rows">{rows_html}</tbody>\n')
    return "".join(parts)


def render_inbox_counts(user: AbstractBaseUser, events: Sequence, arg: str) -> str:
    """The per-tier counts, sent after the rows, so that a new row never waits for them."""
    if not _approval_ids(events):
        return ""
    scope = selectors.reviewer_scope(user)
    counts = _tier_counts_for_batch(scope, events)
    return render_to_string("approvals/_tier_counts.html", {
        "counts": counts, "total": sum(counts.values()), "oob": True, "max_tier": scope.highest_tier(),
    })


def _tier_counts_for_batch(scope, events: Sequence) -> dict[int, int]:
    """Every open inbox in this process renders the same batch: the counts are read once per
    batch and tenant set, not once per socket.
    The key is the batch's event ids: another batch (a later event, or one that committed
    late with a lower id) computes them again, so they never lag behind the rows they come with."""
    ids = ",".join(str(e.id) for e in sorted(events, key=lambda e: e.id))
    tenants = ",".join(str(t) for t in sorted(scope.tenant_ids))
    key = "approvals:tier_counts:" + hashlib.sha256(f"{tenants}|{ids}".encode()).hexdigest()
    counts = cache.get(key)
    if counts is None:
        counts = selectors.tier_counts(scope)
        cache.set(key, counts, 5)
    return counts


def render_approval(user: AbstractBaseUser, events: Sequence, arg: str) -> str:
    scope = selectors.reviewer_scope(user)
    approval = selectors.approval_for_user(user, scope, arg)
    if approval is None:
        return ""
    relevant = [
        e for e in events
        if (e.entity == ApprovalRequest.EVENT_ENTITY and e.entity_id == approval.approval_id)
        or (e.entity == Event.Entity.OPERATION and e.entity_id == approval.operation_id)
        # A stop or resume in the tenant may freeze or thaw it.
        or (e.entity == Event.Entity.STOP and e.tenant_id == approval.tenant_id and approval.status == "pending")
    ]
    if not relevant:
        return ""
    context = review_context(user, scope, approval)
    context["oob"] = True
    # The decision forms are re-rendered only once the request is closed, so that a reason
    # being typed is not wiped by someone else's first of two approvals.
    context["replace_panel"] = not context["approval"].is_open
    return render_to_string("approvals/_review_oob.html", context)


def reviewer_viewer(user: AbstractBaseUser) -> live.Viewer:
    """Reviewers with the same tenants and maximum tiers see the same rows and controls."""
    scope = selectors.reviewer_scope(user)
    return live.Viewer(tenant_ids=frozenset(scope.tenant_ids), key=("scope", tuple(sorted(scope.max_tier.items()))))


def decisions_in_batch(events: Sequence) -> dict[str, frozenset]:
    """Who has decided each request of the batch: the one per-user thing the fragments show
    ("you approved; needs another reviewer"), read once for every socket."""
    ids = _approval_ids(events)
    operation_ids = [e.entity_id for e in events if e.entity == Event.Entity.OPERATION]
    out: dict[str, set] = {}
    rows = ApprovalDecision.objects.filter(request_id__in=ids) if not operation_ids else (
        ApprovalDecision.objects.filter(request_id__in=ids) | ApprovalDecision.objects.filter(
            request__operation_id__in=operation_ids))
    for request_id, reviewer_id in rows.values_list("request_id", "reviewer_id"):
        out.setdefault(request_id, set()).add(reviewer_id)
    return {k: frozenset(v) for k, v in out.items()}


def decided_by(user: AbstractBaseUser, facts: dict[str, frozenset]) -> frozenset:
    return frozenset(k for k, reviewers in facts.items() if user.pk in reviewers)


live.register(live.Stream(name="inbox", entities=(ApprovalRequest.EVENT_ENTITY,), render=render_inbox,
                          then=render_inbox_counts, roles=selectors.VIEWER_ROLES, viewer=reviewer_viewer,
                          batch_facts=decisions_in_batch, personal=decided_by))
live.register(live.Stream(name="approval", entities=(ApprovalRequest.EVENT_ENTITY, "operation", Event.Entity.STOP),
                          render=render_approval, roles=selectors.VIEWER_ROLES, viewer=reviewer_viewer,
                          batch_facts=decisions_in_batch, personal=decided_by))
