"""The live-update websocket: the tail of the event table, per stream, with catch-up.

Every socket of one server process (one event loop) shares one `Tail`:

- one reader of the event table, woken by the channel-layer doorbell after each commit that
  wrote events (console/doorbell.py) or every LIVE_POLL_SECONDS when no bell rings; it keeps the
  newest events in memory and wakes the sockets;
- each socket picks its own events out of that window (its tenants, its stream's entities, after
  its own cursor) without a query;
- sockets that would send the same HTML — same stream, arg, viewer key (console.live.Viewer) and
  events — share one render: the first one renders in a worker thread, the others await it.

So a commit costs one read, plus one render per distinct view, instead of a read and a render
per socket (bench/inbox.py: 50 open inboxes). A socket whose cursor is older than the window
(a page that reconnects after a while) catches up with reads of its own, as before.

Database work runs on a few threads of the tail's own that keep their connections between calls
(the default CONN_MAX_AGE=0 would open a new PostgreSQL connection for every read) and close them
when the last socket of the loop leaves.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import connections

from console import doorbell, live

logger = logging.getLogger(__name__)
# Per-stage timestamps of every delivery (ring, read, render, send), for bench/inbox.py.
timing = logging.getLogger("console.live.timing")

# On PostgreSQL ids come from a sequence at insert time, but transactions commit in another
# order: an event with a lower id can become visible after a higher one was sent. Each read
# therefore looks back this many ids and sends what it has not sent yet; fragments are
# idempotent (out-of-band swaps by element id), so a repeat after a reconnect is harmless.
LOOKBACK_IDS = 200
# Ids the tail keeps in memory behind the newest one; a cursor older than that catches up alone.
WINDOW_IDS = 2000
READ_LIMIT = 500
# How long a socket's viewer (its tenants and tiers) is trusted before it is read again: a
# reviewer whose membership is removed stops receiving events within this time.
VIEWER_TTL_SECONDS = 5.0
SHARED_RESULTS = 256
DB_THREADS = 4


class _DbThreads:
    """A few threads for the tail's database work: a ThreadPoolExecutor of `n` threads. Unlike
    Django's sync_to_async, a thread keeps its connection between calls (closed if it broke),
    and stop() has every thread close its own connections (Django's connections belong to the
    thread that opened them)."""

    def __init__(self, n: int) -> None:
        self.started = 0  # threads the executor has started (it starts them as work arrives)
        self.lock = threading.Lock()
        self.executor = ThreadPoolExecutor(max_workers=n, thread_name_prefix="live-db",
                                           initializer=self._thread_started)

    def _thread_started(self) -> None:
        with self.lock:
            self.started += 1

    @staticmethod
    def _call(func: Callable[[], Any]) -> Any:
        try:
            return func()
        finally:
            for conn in connections.all(initialized_only=True):
                if conn.errors_occurred and not conn.is_usable():
                    conn.close()

    async def run(self, func: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(self.executor.submit(self._call, func))

    def stop(self) -> None:
        """Without blocking: after the work already queued, each thread closes its connections
        and exits. One closing job per thread; each waits for the others at a barrier, so no
        thread takes two while another takes none."""
        with self.lock:
            parties = self.started
        if parties:
            barrier = threading.Barrier(parties)

            def close() -> None:
                connections.close_all()
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait(timeout=10)

            for _ in range(parties):
                self.executor.submit(close)
        self.executor.shutdown(wait=False)


class Tail:
    """The event table's tail for every socket of one event loop."""

    _by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.members: set[LiveConsumer] = set()
        self.ids: list[int] = []  # ascending
        self.events: dict[int, Any] = {}  # id → Event
        self.max_id = 0
        # Every committed event with an id above `floor` is in `events` (as of the last read).
        self.floor: int | None = None
        self.first_floor = 0  # where the first read starts; `floor` once its events are in memory
        self.read_at = 0.0  # time.time() when the last read started
        self.ring_at = 0.0  # time.time() when the last doorbell arrived
        self.wakeup = asyncio.Event()
        self.shared: OrderedDict[Any, asyncio.Future] = OrderedDict()
        self.channel: str | None = None
        self.ended = False  # its last socket left: it reads no more, and a new socket starts another
        self.db = _DbThreads(DB_THREADS)
        self.task = asyncio.create_task(self._run())

    # ---------------------------------------------------------------- membership

    @classmethod
    def join(cls, member: LiveConsumer) -> Tail:
        """The running loop's tail with `member` in it; a new one (reading) if the loop has none.
        Not a coroutine: finding the tail and joining it is one step, so the tail cannot end in
        between."""
        loop = asyncio.get_running_loop()
        tail = cls._by_loop.get(loop)
        if tail is None:
            tail = cls._by_loop[loop] = cls()
        tail.members.add(member)
        return tail

    async def leave(self, member: LiveConsumer) -> None:
        self.members.discard(member)
        if self.members or self.ended:
            return
        self.ended = True
        # The last socket: this tail ends, and a socket that connects from now on (even during
        # the awaits below) starts a new one. Ending it in place after those awaits instead
        # stopped the threads of a socket that had joined meanwhile: its page said "live" and
        # never changed again.
        loop = asyncio.get_running_loop()
        if self._by_loop.get(loop) is self:
            del self._by_loop[loop]
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.db.stop()

    # -------------------------------------------------------------------- reading

    async def _run(self) -> None:
        layer_task = None
        layer = None
        try:
            from channels.layers import get_channel_layer

            layer = get_channel_layer()
            if layer is not None:
                self.channel = await layer.new_channel()
                await layer.group_add(doorbell.DOORBELL_GROUP, self.channel)
                layer_task = asyncio.create_task(self._listen(layer))
            while True:
                self.wakeup.clear()
                try:
                    found = await self._read()
                except Exception:  # noqa: BLE001 - a failed read is retried at the next poll
                    logger.warning("live tail read failed", exc_info=True)
                    found = False
                if found:  # an idle poll wakes nobody
                    for member in list(self.members):
                        member.wakeup.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wakeup.wait(), timeout=settings.LIVE_POLL_SECONDS)
        finally:
            if layer_task is not None:
                layer_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await layer_task
            if layer is not None and self.channel is not None:
                with contextlib.suppress(Exception):
                    await layer.group_discard(doorbell.DOORBELL_GROUP, self.channel)

    async def _listen(self, layer) -> None:
        """The doorbell: one message per commit for the whole process, not one per socket."""
        while True:
            try:
                await layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the poll still delivers; try again shortly
                logger.warning("live doorbell receive failed", exc_info=True)
                await asyncio.sleep(1)
                continue
            self.ring_at = time.time()
            self.wakeup.set()

    async def _read(self) -> bool:
        self.read_at = time.time()
        new = await self.db.run(self._read_sync)
        for event in new:
            if event.id not in self.events:
                self.events[event.id] = event
                bisect.insort(self.ids, event.id)
        if new:
            self.max_id = max(self.max_id, self.ids[-1])
        floor = self.max_id - WINDOW_IDS
        cut = bisect.bisect_right(self.ids, floor)
        for event_id in self.ids[:cut]:
            del self.events[event_id]
        del self.ids[:cut]
        self.floor = max(floor, self.floor if self.floor is not None else self.first_floor)
        return bool(new)

    def _read_sync(self) -> list:
        from console.models import Event

        start = self.floor
        if start is None:
            # First read: start just behind the newest event (sockets with older cursors catch
            # up on their own). `floor` stays None until _read has stored these events: a socket
            # asking meanwhile would take the empty window for "nothing there" and be sent
            # again what its page already shows.
            self.max_id = live.latest_event_id()
            start = self.first_floor = max(0, self.max_id - LOOKBACK_IDS)
        after = max(start, self.max_id - LOOKBACK_IDS)
        out = []
        while True:
            batch = list(Event.objects.filter(id__gt=after).order_by("id")[:READ_LIMIT])
            out.extend(e for e in batch if e.id not in self.events)
            if len(batch) < READ_LIMIT:
                return out
            after = batch[-1].id

    def window_after(self, after_id: int) -> list | None:
        """Events above `after_id` from memory, or None if the window does not reach that far."""
        if self.floor is None or after_id < self.floor:
            return None
        return [self.events[i] for i in self.ids[bisect.bisect_right(self.ids, after_id):]]

    # -------------------------------------------------------------- shared work

    async def once(self, key, func: Callable[[], Any]) -> Any:
        """`func()` in a database thread, once for every caller with the same key."""
        future = self.shared.get(key)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self.shared[key] = future
            while len(self.shared) > SHARED_RESULTS:
                self.shared.popitem(last=False)
            try:
                future.set_result(await self.db.run(func))
            except BaseException as exc:
                self.shared.pop(key, None)
                future.set_exception(exc)
                future.exception()  # retrieved: other awaiters re-raise it
        return await asyncio.shield(future)


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
        self.position = 0
        self.sent_ids: set[int] = set()
        self.wakeup = asyncio.Event()
        self.hello = asyncio.Event()
        self.viewer: live.Viewer | None = None
        self.viewer_at = 0.0
        await self.accept()
        self.tail = Tail.join(self)
        self.poller = asyncio.create_task(self._poll())

    async def disconnect(self, code: int) -> None:
        poller = getattr(self, "poller", None)
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        if hasattr(self, "tail"):
            await self.tail.leave(self)

    async def receive_json(self, content, **kwargs) -> None:
        raw = content.get("last_event_id") if isinstance(content, dict) else None
        try:
            self.last_event_id = max(0, int(raw))
        except (TypeError, ValueError):
            self.last_event_id = None
        self.hello.set()
        self.wakeup.set()

    async def _poll(self) -> None:
        # Until the page says where it is, it is up to date as of the moment it was rendered;
        # wait briefly for the hello, then start from the current tail.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.hello.wait(), timeout=2)
        db = self.tail.db
        await self._refresh_viewer()
        if self.last_event_id is None:
            tenant_ids = self.viewer.tenant_ids
            self.last_event_id = await db.run(lambda: live.cursor_for(self.user, tenant_ids))
        self.position = self.last_event_id
        self.sent_ids = await self._ids_already_shown()
        while True:
            self.wakeup.clear()
            try:
                if await self._send_next_batch():
                    continue  # there may be more
                if time.monotonic() - self.viewer_at > VIEWER_TTL_SECONDS:
                    await self._refresh_viewer()
            except Exception:  # noqa: BLE001 - one failed read must not end the stream
                # The database away for a moment: without this the poller would end for good
                # and the page would say "live" and never change again. The next round reads
                # again from the same position.
                logger.warning("live stream %s: a read failed; reading again", self.stream.name, exc_info=True)
            # Woken by the tail after each of its reads (or by a hello).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=max(1.0, settings.LIVE_POLL_SECONDS * 4))

    async def _refresh_viewer(self) -> None:
        self.viewer = await self.tail.db.run(lambda: self.stream.viewer_for(self.user))
        self.viewer_at = time.monotonic()

    async def _events_after(self, after_id: int) -> list:
        events = self.tail.window_after(after_id)
        if events is not None:
            return [e for e in events if self.stream.follows(e, self.viewer)]
        # Older than the window: a read of this socket's own.
        tenant_ids = self.viewer.tenant_ids
        return await self.tail.db.run(lambda: live.events_after(
            stream=self.stream, after_id=after_id, tenant_ids=tenant_ids))

    async def _ids_already_shown(self) -> set[int]:
        # What the page had when it said its cursor; anything in the look-back window that
        # commits later is new to it.
        floor = max(0, self.last_event_id - LOOKBACK_IDS)
        return {e.id for e in await self._events_after(floor) if e.id <= self.last_event_id}

    async def _send_next_batch(self) -> bool:
        woke = time.time()
        # Two places: `last_event_id`, the page's cursor (the newest event of the viewer's
        # tenants it was sent: the only one it is shown), and `position`, how far this socket
        # has looked in the table (all tenants). A quiet tenant's cursor can be far behind the
        # tail; looking from `position` keeps its sockets in the tail's window.
        tail_read = self.tail.max_id
        after = max(0, self.position - LOOKBACK_IDS)
        events = [e for e in await self._events_after(after) if e.id not in self.sent_ids][:200]
        if not events:
            # Nothing of ours up to what the tail had read; a later commit below it (out of id
            # order) is still within LOOKBACK_IDS of the new position.
            self.position = max(self.position, tail_read)
            return False
        self.sent_ids.update(e.id for e in events)
        last = max(self.last_event_id, events[-1].id)
        self.position = max(self.position, last)
        self.sent_ids = {i for i in self.sent_ids if i > self.position - LOOKBACK_IDS}
        key = await self._view_key(events)
        body = await self._render(key, self.stream.render, events)
        rendered = time.time()
        if self.stream.then is None:
            self.last_event_id = last
            await self.send(text_data=body + live.cursor_fragment(last))
        else:
            # The cursor moves with the second message: a page that drops in between is sent
            # the batch again (fragments are idempotent).
            await self.send(text_data=body)
        sent = time.time()
        if self.stream.then is not None:
            body = await self._render(key, self.stream.then, events)
            self.last_event_id = last
            await self.send(text_data=body + live.cursor_fragment(last))
        if timing.isEnabledFor(logging.DEBUG):
            timing.debug("%s %.6f %.6f %.6f %.6f %.6f %s", self.stream.name, self.tail.ring_at, self.tail.read_at,
                         woke, rendered, sent, ",".join(str(e.id) for e in events))
        return True

    async def _view_key(self, events: list) -> tuple:
        """Sockets with equal keys are sent the same HTML for these events."""
        stream = self.stream
        ids = tuple(e.id for e in events)
        personal = ()
        if stream.batch_facts is not None and stream.personal is not None:
            facts = await self.tail.once(("facts", stream.name, ids), lambda: stream.batch_facts(events))
            personal = stream.personal(self.user, facts)
        return (stream.name, self.arg, self.viewer.key, personal, ids)

    async def _render(self, key: tuple, render, events: list) -> str:
        user, arg = self.user, self.arg
        return await self.tail.once((render, *key), lambda: render(user, events, arg))
