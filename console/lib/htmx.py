"""htmx request helpers shared by the pages."""

from __future__ import annotations

from django.http import HttpRequest


def wants_fragment(request: HttpRequest) -> bool:
    """An htmx request that will swap a fragment (not a history restore, which needs the page)."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request
