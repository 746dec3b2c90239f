"""FilterSets (django-filter) whose valid values also travel as the argument of a live stream.

A page's filters are a GET form; its live stream (console/live.py) must apply the same filters to
the rows an event touches. The page hands the stream `live_arg()`: the valid filter values (plus,
say, the page number) as a querystring, base64url-encoded because it is a path segment of the
websocket URL, which cannot hold "/" or "?". `from_arg()` reads it back; an argument that does
not decode is no filter at all, never an error in the consumer.
"""

from __future__ import annotations

import binascii
from base64 import urlsafe_b64decode, urlsafe_b64encode
from typing import Any, ClassVar, Self
from urllib.parse import urlencode

import django_filters
from django.core.exceptions import SuspiciousOperation
from django.core.validators import EMPTY_VALUES
from django.db.models import QuerySet
from django.http import QueryDict

ALL = "all"  # the argument of a page without filters


class LiveFilterSet(django_filters.FilterSet):
    """Choice filters named in `dynamic` take their choices per request (they come from the
    database: `choices`, by filter name). Built without `choices` — from a live argument the page
    wrote, or from code — each given value is its own choice (a query by an unknown value finds
    nothing). A value that does not validate (a stale link) is ignored: only that one when
    `partial`, else every filter."""

    dynamic: ClassVar[tuple[str, ...]] = ()
    partial: ClassVar[bool] = True

    def __init__(self, data: QueryDict | None = None, *, choices: dict[str, list] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        for name in self.dynamic:
            if choices is not None:
                options = list(choices.get(name, ()))
            else:
                options = [(value, value) for value in self.data.getlist(name) if value]
            self.filters[name].extra["choices"] = options

    @classmethod
    def of(cls, **values: Any) -> Self:
        """The filters with these values (None and "" mean no filter), e.g. in a test."""
        data = QueryDict(mutable=True)
        for name, value in values.items():
            if value not in (None, ""):
                data[name] = str(value)
        return cls(data)

    def active(self) -> dict[str, Any]:
        """The filters in use: their valid, non-empty values, by name."""
        if not self.is_bound or (not self.is_valid() and not self.partial):
            return {}
        return {name: value for name, value in self.form.cleaned_data.items() if value not in EMPTY_VALUES}

    @property
    def is_empty(self) -> bool:
        return not self.active()

    def apply(self, queryset: QuerySet) -> QuerySet:
        """`queryset` narrowed by the valid filters."""
        if not self.is_bound or (not self.is_valid() and not self.partial):
            return queryset
        return self.filter_queryset(queryset)

    def live_arg(self, **extra: Any) -> str:
        """The valid filters and `extra` as one opaque path segment ("all" when there are none)."""
        params = {name: str(value) for name, value in self.active().items()}
        params.update({name: str(value) for name, value in extra.items()})
        if not params:
            return ALL
        return urlsafe_b64encode(urlencode(sorted(params.items())).encode()).decode().rstrip("=")

    @classmethod
    def from_arg(cls, arg: str) -> tuple[Self, QueryDict]:
        """The filters a `live_arg()` carries, and its whole querystring (for the extras)."""
        data = QueryDict()
        if arg and arg != ALL:
            try:
                data = QueryDict(urlsafe_b64decode(arg + "=" * (-len(arg) % 4)).decode())
            except (binascii.Error, UnicodeDecodeError, ValueError, SuspiciousOperation):
                data = QueryDict()
        return cls(data), data
