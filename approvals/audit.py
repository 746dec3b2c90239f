"""Audited tiers: a call the gate runs at once under a tier whose requirement is "run and audit"
gets an `AuditReview` entry, and reviewers look at it after the fact — marked reviewed, or
flagged with a note (the flag is an event, and the operation's page shows it).

Who reviews: a reviewer of the entry's tenant whose maximum tier is the call's tier or above,
never the person who proposed the call. Admins of the tenant see the list, as they see the
inbox, and review nothing unless they are reviewers too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Count, QuerySet
from django.db.models.functions import TruncDate
from django.utils import timezone

from approvals.models import AuditReview, AuditStatus
from approvals.services import user_ref
from console.access import reviewer_max_tier
from console.lib.errors import Conflict, InvalidInput, NotFound, NotPermitted
from console.lib.transitions import transition

VERDICTS = (AuditStatus.REVIEWED, AuditStatus.FLAGGED)
MAX_NOTE = 2000


def audit_entry_values(*, operation_id: str, tenant_id: int, tool_id: int, call_id: str, risk_tier: int,
                       requested_by_id: int, created_at: datetime) -> dict[str, Any]:
    """The row of a new entry, for the proposal to write in its own statement (it writes the
    call and the operation there; the entry lands with them or not at all)."""
    return {"operation_id": operation_id, "tenant_id": tenant_id, "tool_id": tool_id, "call_id": call_id,
            "risk_tier": risk_tier, "requested_by_id": requested_by_id, "status": AuditStatus.UNREVIEWED,
            "note": "", "created_at": created_at}


def audit_set_proposer(*, operation_id: str, user: AbstractBaseUser) -> None:
    """A person proposed this call (a reviewer's edit that ran at once): they may not review it."""
    AuditReview.objects.filter(pk=operation_id).update(proposed_by=user)


def may_review(user: AbstractBaseUser, entry: AuditReview, *, max_tier: int | None = None) -> bool:
    """A reviewer of the tenant up to the call's tier or above, who did not propose it.
    `max_tier`: the user's maximum tier in the entry's tenant, when the caller knows it."""
    if max_tier is None:
        max_tier = reviewer_max_tier(user, entry.tenant_id)
    return max_tier is not None and entry.risk_tier <= max_tier and entry.proposed_by_id != user.pk


def audit_review(*, operation_id: str, reviewer: AbstractBaseUser, verdict: str, note: str) -> AuditReview:
    """unreviewed → reviewed | flagged, with the reviewer, the time and the note, and its event
    (entity `audit`). A flag needs a note. Already in that state: a no-op; the other verdict
    after a review: a conflict that says who reviewed it."""
    note = (note or "").strip()
    with transaction.atomic():
        entry = (AuditReview.objects.select_for_update(of=("self",)).select_related("reviewed_by")
                 .filter(pk=operation_id).first())
        if entry is None:
            raise NotFound(f"No audited call {operation_id}.", details={"operation_id": operation_id})
        if entry.proposed_by_id is not None and entry.proposed_by_id == reviewer.pk:
            raise NotPermitted("You proposed this call; someone else reviews it.",
                               details={"operation_id": operation_id})
        if not may_review(reviewer, entry):
            raise NotPermitted(f"Reviewing this call needs a reviewer of L{entry.risk_tier} or above in its tenant.",
                               details={"operation_id": operation_id, "risk_tier": entry.risk_tier})
        # Who may act is checked before what they sent: a refusal says nothing about the input.
        if verdict not in VERDICTS:
            raise InvalidInput(f"verdict must be one of {', '.join(VERDICTS)}.", details={"field": "verdict"})
        if verdict == AuditStatus.FLAGGED and not note:
            raise InvalidInput("A flag needs a note: say what is wrong with this call.", details={"field": "note"})
        if len(note) > MAX_NOTE:
            raise InvalidInput(f"The note is longer than {MAX_NOTE} characters.", details={"field": "note"})
        if entry.status == verdict:
            return entry
        if entry.status != AuditStatus.UNREVIEWED:
            by = entry.reviewed_by.get_username() if entry.reviewed_by else "someone"
            raise Conflict(f"Already {entry.status} by {by}.", details={"status": entry.status})
        now = timezone.now()
        transition(entry, to=verdict, actor=user_ref(reviewer), reason=note or "reviewed",
                   evidence={"operation_id": entry.operation_id, "call_id": entry.call_id,
                             "risk_tier": entry.risk_tier, "note": note},
                   changes={"note": note, "reviewed_by": reviewer, "reviewed_at": now})
        entry.status, entry.note, entry.reviewed_by, entry.reviewed_at = verdict, note, reviewer, now
    return entry


# ------------------------------------------------------------------------------------ reads

LIST_FILTERS = ("unreviewed", "reviewed", "flagged", "all")
PLOT_DAYS = 14


def audit_entries(tenant_ids: set[int], status: str) -> QuerySet[AuditReview]:
    """The entries of these tenants, newest first; `status` one of LIST_FILTERS."""
    qs = AuditReview.objects.filter(tenant_id__in=tenant_ids)
    if status != "all":
        qs = qs.filter(status=status)
    return qs.select_related("tool", "tenant", "requested_by", "proposed_by", "reviewed_by").order_by(
        "-created_at", "operation_id")


def audit_for_operation(operation_id: str) -> AuditReview | None:
    return AuditReview.objects.select_related("reviewed_by").filter(pk=operation_id).first()


@dataclass(frozen=True)
class AuditDay:
    day: date
    audited: int  # calls run under an audited tier that day
    reviewed: int  # reviews marked that day
    flagged: int  # flags raised that day


def audit_days(tenant_ids: set[int], *, days: int = PLOT_DAYS, now: datetime | None = None) -> list[AuditDay]:
    """Per day (the server's time zone), the last `days` days, oldest first, today last: how many
    calls were audited, and how many reviews and flags were given. Two grouped queries."""
    today = timezone.localdate(now or timezone.now())
    first = today - timedelta(days=days - 1)
    start = timezone.make_aware(datetime.combine(first, time.min))
    entries = AuditReview.objects.filter(tenant_id__in=tenant_ids)
    audited = dict(entries.filter(created_at__gte=start).annotate(day=TruncDate("created_at"))
                   .order_by().values("day").annotate(n=Count("pk")).values_list("day", "n"))
    decided: dict[tuple[date, str], int] = {
        (day, status): n for day, status, n in
        entries.filter(reviewed_at__gte=start).annotate(day=TruncDate("reviewed_at")).order_by()
        .values("day", "status").annotate(n=Count("pk")).values_list("day", "status", "n")}
    out = []
    for offset in range(days):
        day = first + timedelta(days=offset)
        out.append(AuditDay(day=day, audited=audited.get(day, 0),
                            reviewed=decided.get((day, AuditStatus.REVIEWED), 0),
                            flagged=decided.get((day, AuditStatus.FLAGGED), 0)))
    return out


def audit_backlog(tenant_ids: set[int]) -> int:
    return AuditReview.objects.filter(tenant_id__in=tenant_ids, status=AuditStatus.UNREVIEWED).count()


PLOT_HEIGHT = 40
BAR_STEP = 12


def audit_plot(days: list[AuditDay]) -> list[dict[str, Any]]:
    """Bars for the dashboard's small plot (an SVG drawn on the server, no script): per day, the
    audited calls' bar and, over it, the share already reviewed or flagged."""
    top = max((d.audited for d in days), default=0) or 1
    bars = []
    for index, d in enumerate(days):
        height = round(PLOT_HEIGHT * d.audited / top)
        done = round(PLOT_HEIGHT * min(d.reviewed + d.flagged, d.audited) / top)
        bars.append({"day": d, "x": index * BAR_STEP, "y": PLOT_HEIGHT - height, "height": height,
                     "done_y": PLOT_HEIGHT - done, "done": done, "flagged": d.flagged > 0})
    return bars
