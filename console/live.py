"""Live views are the tail of committed events.

A page opens a websocket on a named stream; the consumer sends every committed event after the
last one the page saw, rendered as htmx out-of-band fragments. Nothing is published before
commit (only committed rows are read), and nothing is lost on reconnect (the page says the last
event id it saw). Apps register their streams here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.template.loader import render_to_string

from console.access import tenant_ids_for

logger = logging.getLogger(__name__)


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

# Consumers wait on the event table; after a commit that wrote events, this group is rung so
# they look at once. The bell carries no data (the table does): a lost ring (channels_redis
# drops over capacity) only costs the poll interval, never an update.
DOORBELL_GROUP = "events"


def ring_doorbell_on_commit() -> None:
    """Called by record_event inside a transaction: one ring per transaction, after commit."""
    from django.conf import settings

    if settings.CHANNEL_LAYER_URL.startswith("memory://") and not SERVING:
        return  # an in-process layer outside the server reaches no socket: the poll covers it
    if any(entry[1] is _ring for entry in connection.run_on_commit):
        return  # already rung once for this transaction
    transaction.on_commit(_ring)


def _ring() -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(DOORBELL_GROUP, {"type": "events.committed"})
    except Exception:  # noqa: BLE001 - the bell is an optimisation; the poll still delivers
        logger.warning("live doorbell failed", exc_info=True)


# Set by console.asgi: this process serves the sockets, so its in-memory layer reaches them.
SERVING = False


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
