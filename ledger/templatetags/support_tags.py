"""Template helpers of the support console."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django import template

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """Indented, key-sorted JSON for raw provider answers (escaped by the template as usual)."""
    if value in (None, "", {}, []):
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def duration(seconds: float | int | timedelta | None) -> str:
    """"42s", "3m 05s", "2h 10m", "1d 04h"."""
    if seconds is None:
        return "—"
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    seconds = max(0, int(seconds))
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    if d:
        return f"{d}d {h:02d}h"
    if h:
        return f"{h}h {m:02d}m"
    if m:
        return f"{m}m {s:02d}s"
    return f"{s}s"
