"""The reviewer inbox's filters (a GET form), as a django-filter FilterSet.

The same filters narrow the inbox page, the decisions export and, through `live_arg()`, the rows
the inbox's live stream inserts (console/lib/filtersets.py).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.db import connections
from django.db.models import Q, QuerySet
from django.utils import timezone
from django_filters import CharFilter, ChoiceFilter, TypedChoiceFilter

from approvals.models import ApprovalRequest
from console.lib.filtersets import LiveFilterSet
from console.models import RiskTier

AGE_WINDOWS: dict[str, tuple[timedelta | None, timedelta | None]] = {
    # key: (newer than, older than)
    "15m": (timedelta(minutes=15), None),
    "1h": (timedelta(hours=1), None),
    "24h": (timedelta(hours=24), None),
    "older": (None, timedelta(hours=24)),
}

# The four IDs the search matches, each as `icontains` (the operation's and the task's are the
# request's own foreign-key columns: no join).
SEARCH_COLUMNS = ("call_id", "operation__operation_id", "task__task_id", "approval_id")

# A query that may be an ID, whole or in part: no spaces, and long enough to be rare. The IDs the
# console issues are longer (`apr_`, `tsk_` + 26 characters, `op_` + 32), and so are the call IDs
# models invent (`call_…`, `toolu_…`); a shorter query tends to match many requests, which the
# inbox's own order finds sooner than an index of trigrams would.
ID_LIKE = re.compile(r"\S{10,}")

AGE_LABELS = {
    "15m": "Under 15 minutes",
    "1h": "Under 1 hour",
    "24h": "Under 24 hours",
    "older": "Older than 24 hours",
}


class InboxFilterSet(LiveFilterSet):
    """Every filter but the search reads a column of the request itself (tool and task type are
    copied onto it at creation), so each one is an index on pending requests, never a scan.

    The choices of tool, task type, tenant and agent come from `selectors.filter_choices`."""

    dynamic = ("tool", "task_type", "tenant", "requested_by")

    q = CharFilter(
        method="search", max_length=128, label="Search",
        widget=forms.TextInput(attrs={
            "type": "search", "placeholder": "Call, task, operation or approval ID", "autocomplete": "off",
        }),
    )
    tool = ChoiceFilter(field_name="tool__name", label="Tool", empty_label="Any tool")
    tier = TypedChoiceFilter(
        field_name="risk_tier", label="Tier", coerce=int, empty_value=None,
        choices=[("", "Any tier"), *[(t.value, t.label) for t in RiskTier]],
    )
    task_type = ChoiceFilter(field_name="task_type", label="Task type", empty_label="Any task type")
    tenant = ChoiceFilter(field_name="tenant__slug", label="Tenant", empty_label="Any tenant")  # the slug
    requested_by = TypedChoiceFilter(  # an agent principal's id
        field_name="requested_by_id", label="Requested by", coerce=int, empty_value=None,
    )
    age = ChoiceFilter(
        method="created_within", label="Age", empty_label="Any age",
        choices=[(k, AGE_LABELS[k]) for k in AGE_WINDOWS],
    )

    class Meta:
        model = ApprovalRequest
        fields: tuple[str, ...] = ()

    def __init__(self, data=None, *, tools: list[str] | None = None, task_types: list[str] = (),
                 tenants: list[tuple[str, str]] = (), agents: list[tuple[int, str]] = (), **kwargs: Any) -> None:
        choices = None if tools is None else {
            "tool": [(t, t) for t in tools],
            "task_type": [(t, t) for t in task_types],
            "tenant": list(tenants),
            "requested_by": list(agents),
        }
        super().__init__(data, choices=choices, **kwargs)
        agent_choices = self.filters["requested_by"].extra
        agent_choices["choices"] = [("", "Any agent"), *agent_choices["choices"]]
        self.now: datetime | None = None
        self.pending = False

    def apply(self, queryset: QuerySet, *, now: datetime | None = None, pending: bool = False) -> QuerySet:
        """`queryset` narrowed by the valid filters; `age` counts back from `now`. `pending`: the
        queryset holds pending requests only, which the search's trigram index covers."""
        self.now = now or timezone.now()
        self.pending = pending
        return super().apply(queryset)

    def search(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        q = value.strip()
        if getattr(self, "pending", False) and ID_LIKE.fullmatch(q) and connections[queryset.db].vendor == "postgresql":
            # The same matches as below, one column at a time: PostgreSQL reads each column's
            # matches from the trigram index (approval_search_trgm_idx), where the four ORed
            # together are priced above reading every pending request and so are never looked
            # up in it (the more trigrams an ID has, the higher each lookup is priced).
            arms = [queryset.filter(**{f"{column}__icontains": q}).order_by().values("pk") for column in SEARCH_COLUMNS]
            return queryset.filter(pk__in=arms[0].union(*arms[1:]))
        matches = Q()
        for column in SEARCH_COLUMNS:
            matches |= Q(**{f"{column}__icontains": q})
        return queryset.filter(matches)

    def created_within(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        now = self.now or timezone.now()
        newer_than, older_than = AGE_WINDOWS[value]
        if newer_than is not None:
            queryset = queryset.filter(created_at__gte=now - newer_than)
        if older_than is not None:
            queryset = queryset.filter(created_at__lt=now - older_than)
        return queryset
