"""Waiting for a call to change, shared by the agent API's long-poll (`GET /api/v1/calls/{id}?wait=`)
and the MCP server's answers and `countersign_wait`: short database hops off the event loop
(`db_hop`) and a wait that wakes on the events doorbell (`wait_for_change`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import close_old_connections

from console.live import DOORBELL_GROUP, latest_event_id
from ledger.selectors import call_operation_status

# A waiting long-poll wakes on the events doorbell (a commit that wrote events). Without a ring
# it looks again after this long: a ring can be lost (channels-redis drops over capacity).
FALLBACK_POLL_SECONDS = 2.0
# With an in-memory layer the doorbell watches the event table's tail instead: one query per
# this interval per event loop, however many polls wait.
TAIL_POLL_SECONDS = 0.02

logger = logging.getLogger(__name__)


def db_hop(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run one short database hop off the event loop, in any pool thread, and give its
    connection back at once (a long-poll must not pin a connection while it sleeps)."""
    def hop(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(hop, thread_sensitive=False)


class Doorbell:
    """The events doorbell for the long-polls of one event loop: one channel-layer listener
    however many polls wait, subscribed with the first and dropped with the last. A poll takes
    the next ring's future before it reads the status, so a commit between the read and the
    wait still wakes it."""

    _by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @classmethod
    def for_loop(cls) -> Doorbell:
        loop = asyncio.get_running_loop()
        bell = cls._by_loop.get(loop)
        if bell is None:
            bell = cls._by_loop[loop] = cls(loop)
        return bell

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.rung: asyncio.Future = loop.create_future()
        self.waiters = 0
        self.listener: asyncio.Task | None = None
        self.starting = asyncio.Lock()

    def next_ring(self) -> asyncio.Future:
        return self.rung

    def _ring(self) -> None:
        rung, self.rung = self.rung, self.loop.create_future()
        rung.set_result(None)

    async def _subscribe(self) -> None:
        layer = get_channel_layer()
        if layer is None or isinstance(layer, InMemoryChannelLayer):
            # No ring reaches this process from another one (embedded mode's worker commits
            # where the web server cannot hear it): the tail of the event table rings instead.
            self.listener = asyncio.create_task(self._watch_tail())
            return
        try:
            channel = await layer.new_channel()
            await layer.group_add(DOORBELL_GROUP, channel)
        except Exception:  # noqa: BLE001 - the fallback poll still answers
            logger.warning("long-poll doorbell unavailable", exc_info=True)
            return
        self.listener = asyncio.create_task(self._listen(layer, channel))

    async def _listen(self, layer, channel: str) -> None:
        try:
            while True:
                try:
                    await layer.receive(channel)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - the fallback poll still answers
                    logger.warning("long-poll doorbell receive failed", exc_info=True)
                    await asyncio.sleep(1)
                    continue
                self._ring()
        finally:
            with contextlib.suppress(Exception):
                await layer.group_discard(DOORBELL_GROUP, channel)

    async def _watch_tail(self) -> None:
        last = None
        while True:
            try:
                current = await db_hop(latest_event_id)()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the fallback poll still answers
                logger.warning("long-poll event tail unreadable", exc_info=True)
                current = last
            if last is not None and current != last:
                self._ring()
            last = current
            await asyncio.sleep(TAIL_POLL_SECONDS)

    @contextlib.asynccontextmanager
    async def waiting(self):
        self.waiters += 1
        try:
            async with self.starting:
                if self.listener is None:
                    await self._subscribe()
            yield self
        finally:
            self.waiters -= 1
            if not self.waiters:
                # Forgotten with its last poll: its futures hold the loop, which would keep the
                # entry of a finished loop alive for ever.
                if self._by_loop.get(self.loop) is self:
                    del self._by_loop[self.loop]
                if self.listener is not None:
                    listener, self.listener = self.listener, None
                    listener.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await listener


async def wait_for_change(call_pk: int, baseline: str, wait: float) -> None:
    """Until the call's status differs from `baseline` or `wait` seconds have passed, reading
    the status again at each ring of the doorbell (and at the fallback interval)."""
    fallback = FALLBACK_POLL_SECONDS
    bell = Doorbell.for_loop()
    async with bell.waiting():
        deadline = bell.loop.time() + wait
        while (remaining := deadline - bell.loop.time()) > 0:
            ring = bell.next_ring()
            if await db_hop(call_operation_status)(call_pk=call_pk) != baseline:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(ring), timeout=min(fallback, remaining))
