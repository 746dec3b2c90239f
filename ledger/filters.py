"""The support queue's filters (a GET form), as a django-filter FilterSet.

The same filters narrow the queue page and, through `live_arg()`, the operations the queue's
live stream appends (console/lib/filtersets.py).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import Q, QuerySet
from django_filters import CharFilter, ChoiceFilter

from console.lib.filtersets import LiveFilterSet
from ledger.models import Call, Operation
from ledger.support_selectors import QUEUE_STATUSES


class QueueFilterSet(LiveFilterSet):
    """The tool's choices come from `support_selectors.tool_choices`. A value that does not
    validate (a stale link) drops every filter: the page then shows the whole queue."""

    dynamic = ("tool",)
    partial = False

    status = ChoiceFilter(label="Status", empty_label="Any status", choices=[(s, s) for s in QUEUE_STATUSES])
    tool = ChoiceFilter(field_name="tool__name", label="Tool", empty_label="Any tool")
    q = CharFilter(
        method="search", max_length=200, label="Search",
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "Call, operation or task ID",
                                      "autocomplete": "off"}),
    )

    class Meta:
        model = Operation
        fields: tuple[str, ...] = ()

    def __init__(self, data=None, *, tools: list[str] | None = None, **kwargs: Any) -> None:
        choices = None if tools is None else {"tool": [(t, t) for t in tools]}
        super().__init__(data, choices=choices, **kwargs)

    def search(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        q = value.strip()
        return queryset.filter(
            Q(operation_id__icontains=q) | Q(call_id__icontains=q) | Q(task__task_id__icontains=q)
            | Q(operation_id__in=Call.objects.filter(call_id=q).values("operation_id"))
        )
