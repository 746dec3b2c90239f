"""The live-update websocket: the tail of the event table, per stream, with catch-up."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.db import DatabaseSyncToAsync
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from console import live

logger = logging.getLogger(__name__)


def in_thread(func):
    # Not thread-sensitive: each socket's reads run in the pool, side by side, instead of
    # queueing behind every other socket's on one shared thread.
    return DatabaseSyncToAsync(func, thread_sensitive=False)


# On PostgreSQL ids come from a sequence at insert time, but transactions commit in another
# order: an event with a lower id can become visible after a higher one was sent. Each poll
# therefore looks back this many ids and sends what it has not sent yet; fragments are
# idempotent (out-of-band swaps by element id), so a repeat after a reconnect is harmless.
LOOKBACK_IDS = 200


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Client → server: `{"last_event_id": N}` on open (and after every reconnect).
    Server → client: HTML with out-of-band swaps, ending with the new cursor."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        stream = live.STREAMS.get(self.scope["url_route"]["kwargs"]["stream"])
        if user is None or not user.is_authenticated or stream is None:
            await self.close(code=4403)
            return
        self.user = user
        self.stream = stream
        self.arg = self.scope["url_route"]["kwargs"].get("arg", "")
        self.last_event_id: int | None = None
        self.sent_ids: set[int] = set()
        self.wakeup = asyncio.Event()
        await self.accept()
        if self.channel_layer is not None:
            await self.channel_layer.group_add(live.DOORBELL_GROUP, self.channel_name)
        self.poller = asyncio.create_task(self._poll())

    async def disconnect(self, code: int) -> None:
        if self.channel_layer is not None and hasattr(self, "wakeup"):
            await self.channel_layer.group_discard(live.DOORBELL_GROUP, self.channel_name)
        poller = getattr(self, "poller", None)
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller

    async def receive_json(self, content, **kwargs) -> None:
        raw = content.get("last_event_id") if isinstance(content, dict) else None
        try:
            self.last_event_id = max(0, int(raw))
        except (TypeError, ValueError):
            self.last_event_id = await in_thread(live.latest_event_id)()
        self.wakeup.set()

    async def events_committed(self, message) -> None:
        """The doorbell: something committed; look now instead of at the next poll."""
        self.wakeup.set()

    async def _poll(self) -> None:
        # Until the page says where it is, it is up to date as of the moment it was rendered;
        # wait briefly for the hello, then start from the current tail.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wakeup.wait(), timeout=2)
        if self.last_event_id is None:
            self.last_event_id = await in_thread(live.latest_event_id)()
        self.sent_ids = await in_thread(self._ids_already_shown)()
        while True:
            self.wakeup.clear()
            html, last = await in_thread(self._next_batch)()
            if html is not None:
                self.last_event_id = last
                await self.send(text_data=html)
                continue  # there may be more
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=settings.LIVE_POLL_SECONDS)

    def _ids_already_shown(self) -> set[int]:
        # What the page had when it said its cursor; anything in the look-back window that
        # commits later is new to it.
        floor = max(0, self.last_event_id - LOOKBACK_IDS)
        events = live.events_after(user=self.user, stream=self.stream, after_id=floor, limit=LOOKBACK_IDS)
        return {e.id for e in events if e.id <= self.last_event_id}

    def _next_batch(self) -> tuple[str | None, int]:
        after = max(0, self.last_event_id - LOOKBACK_IDS)
        events = [
            e for e in live.events_after(user=self.user, stream=self.stream, after_id=after)
            if e.id not in self.sent_ids
        ]
        if not events:
            return None, self.last_event_id
        self.sent_ids.update(e.id for e in events)
        last = max(self.last_event_id, events[-1].id)
        self.sent_ids = {i for i in self.sent_ids if i > last - LOOKBACK_IDS}
        body = self.stream.render(self.user, events, self.arg)
        return body + live.cursor_fragment(last), last
