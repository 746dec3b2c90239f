"""Live views are the tail of committed events.

A page opens a websocket on a named stream; the consumer sends every committed event after the
last one the page saw, rendered as htmx out-of-band fragments. Nothing is published before
commit (only committed rows are read), and nothing is lost on reconnect (the page says the last
event id it saw). Apps register their streams here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.template.loader import render_to_string

from console.access import tenant_ids_for


@dataclass(frozen=True)
class Stream:
    name: str
    # Entities whose events this stream follows (empty: all).
    entities: tuple[str, ...]
    # Renders the fragments for a batch of events; runs in a worker thread (may query).
    render: Callable[[AbstractBaseUser, Sequence, str], str]
    # Roles that may open the stream (any role when empty).
    roles: tuple[str, ...] = ()


STREAMS: dict[str, Stream] = {}


def register(stream: Stream) -> None:
    STREAMS[stream.name] = stream


def events_after(*, user: AbstractBaseUser, stream: Stream, after_id: int, limit: int = 200) -> list:
    from ledger.models import Event

    qs = Event.objects.filter(id__gt=after_id, tenant_id__in=tenant_ids_for(user, *stream.roles))
    if stream.entities:
        qs = qs.filter(entity__in=stream.entities)
    return list(qs.order_by("id")[:limit])


def latest_event_id() -> int:
    from ledger.models import Event

    return Event.objects.order_by("-id").values_list("id", flat=True).first() or 0


def cursor_fragment(last_event_id: int) -> str:
    return render_to_string("console/_live_cursor.html", {"last_event_id": last_event_id, "oob": True})


def _render_activity(user: AbstractBaseUser, events: Sequence, arg: str) -> str:
    return render_to_string("console/_activity_rows.html", {"events": list(reversed(events)), "oob": True})


register(Stream(name="activity", entities=(), render=_render_activity))
