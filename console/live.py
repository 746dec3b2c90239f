"""Live views are the tail of committed events.

A page opens a websocket on a named stream; the consumer sends every committed event after the
last one the page saw, rendered as htmx out-of-band fragments. Nothing is published before
commit (only committed rows are read), and nothing is lost on reconnect (the page says the last
event id it saw). Apps register their streams here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.template.loader import render_to_string

from console.access import tenant_ids_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Viewer:
    """What one socket's user may see of a stream, read once and then every few seconds (not
    once per batch): the tenants whose events reach them, and a key. Two sockets on the same
    stream and arg whose viewers have equal keys are sent the same HTML for the same events,
    rendered once (console/consumers.py)."""

    tenant_ids: frozenset[int]
    key: Hashable


@dataclass(frozen=True)
class Stream:
    name: str
    # Entities whose events this stream follows (empty: all).
    entities: tuple[str, ...]
    # Renders the fragments for a batch of events; runs in a worker thread (may query).
    render: Callable[[AbstractBaseUser, Sequence, str], str]
    # Roles that may open the stream (any role when empty).
    roles: tuple[str, ...] = ()
    # Who sees the same thing. Default: the user's tenants for these roles, and a key per user
    # (only one person's sockets share renders) — safe for a render that reads the user.
    viewer: Callable[[AbstractBaseUser], Viewer] | None = None
    # Per-user facts about a batch that the render shows but the viewer key does not hold
    # (e.g. "you approved this one"): `batch_facts` reads them once per batch for everybody,
    # `personal` turns them into a key for one user. Both optional.
    batch_facts: Callable[[Sequence], Any] | None = None
    personal: Callable[[AbstractBaseUser, Any], Hashable] | None = None
    # Fragments that may follow `render`'s in a second message (same signature), e.g. totals
    # that take longer to compute than the rows: the page shows the rows first.
    then: Callable[[AbstractBaseUser, Sequence, str], str] | None = None

    def viewer_for(self, user: AbstractBaseUser) -> Viewer:
        if self.viewer is not None:
            return self.viewer(user)
        return Viewer(tenant_ids=frozenset(tenant_ids_for(user, *self.roles)), key=("user", user.pk))

    def follows(self, event, viewer: Viewer) -> bool:
        return event.tenant_id in viewer.tenant_ids and (not self.entities or event.entity in self.entities)


STREAMS: dict[str, Stream] = {}

def register(stream: Stream) -> None:
    STREAMS[stream.name] = stream


def events_after(*, user: AbstractBaseUser | None = None, stream: Stream, after_id: int, limit: int = 200,
                 tenant_ids: frozenset[int] | None = None) -> list:
    from console.models import Event

    if tenant_ids is None:
        tenant_ids = frozenset(tenant_ids_for(user, *stream.roles))
    qs = Event.objects.filter(id__gt=after_id, tenant_id__in=tenant_ids)
    if stream.entities:
        qs = qs.filter(entity__in=stream.entities)
    return list(qs.order_by("id")[:limit])


def latest_event_id() -> int:
    """The newest event of all tenants: the tail's own place in the table, never shown to anyone
    (how busy the other tenants are is theirs to know)."""
    from console.models import Event

    return Event.objects.order_by("-id").values_list("id", flat=True).first() or 0


def cursor_for(user: AbstractBaseUser, tenant_ids: frozenset[int] | None = None) -> int:
    """The cursor a page shows: the newest event of the viewer's tenants. One query per tenant,
    each the top of the (tenant, id) index."""
    from console.models import Event

    if tenant_ids is None:
        tenant_ids = frozenset(tenant_ids_for(user))
    return max((Event.objects.filter(tenant_id=tenant_id).order_by("-id").values_list("id", flat=True).first() or 0
                for tenant_id in tenant_ids), default=0)


def cursor_fragment(last_event_id: int) -> str:
    # templates/console/_live_cursor.html with oob=True, without the template engine: every
    # socket sends one with every batch, on the event loop.
    return f'<span id="live-cursor" data-last-event-id="{int(last_event_id)}" hidden hx-swap-oob="true"></span>'


def _render_activity(user: AbstractBaseUser, events: Sequence, arg: str) -> str:
    return render_to_string("console/_activity_rows.html", {"events": list(reversed(events)), "oob": True})


def _activity_viewer(user: AbstractBaseUser) -> Viewer:
    tenant_ids = frozenset(tenant_ids_for(user))
    return Viewer(tenant_ids=tenant_ids, key=("tenants", tuple(sorted(tenant_ids))))


# The activity rows depend on the events alone: everyone with the same tenants shares them.
register(Stream(name="activity", entities=(), render=_render_activity, viewer=_activity_viewer))
