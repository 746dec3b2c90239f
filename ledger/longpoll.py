"""Waiting for a call to change, shared by the agent API's long-poll (`GET /api/v1/calls/{id}?wait=`)
and the MCP server's answers and `countersign_wait`: short database hops off the event loop
(`db_hop`) and a wait that wakes on the events doorbell (`wait_for_change`).

The polls of one event loop wait together: a ring of the doorbell reads, in one query (not one
per poll), the status of the calls it may answer, and wakes only the polls whose call reached
what they wait for (any status but the one they started from, or one of a set: `until`),
handing them the status it read. A ring that says what its commit moved reads only for the
polls whose operation moved to a status that may answer them (a poll until final reads nothing
at `dispatched`); one that does not say reads for every poll."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import close_old_connections

from console import doorbell
from console.doorbell import DOORBELL_GROUP, Moved, moved_in
from console.live import latest_event_id
from ledger.models import Operation
from ledger.selectors import call_operation_statuses

# A waiting long-poll wakes on the events doorbell (a commit that wrote events). Without a ring
# it looks again after this long: a ring can be lost (published while the listener reconnects to Redis).
FALLBACK_POLL_SECONDS = 2.0
# With an in-memory layer the doorbell also watches the event table's tail, one query per this
# interval per event loop however many polls wait: a commit of another process rings this one by
# a datagram (embedded mode, console.doorbell.embedded_doorbell), which can be lost, or not sent at
# all when no server listens on the socket.
TAIL_POLL_SECONDS = 1.0
# What the last this many rings said moved is kept, for a poll that starts watching after them.
RINGS_REMEMBERED = 256

logger = logging.getLogger(__name__)


def _operations(moved: Moved | None) -> dict[str, str] | None:
    """The operations a ring says moved, each with the last status it says (None: not said)."""
    if moved is None:
        return None
    return {entity_id: status for entity, entity_id, status in moved if entity == Operation.EVENT_ENTITY}


def db_hop(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run one short database hop off the event loop, in any pool thread, and give its
    connection back at once (a long-poll must not pin a connection while it sleeps)."""
    def hop(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(hop, thread_sensitive=False)


class _Watch:
    __slots__ = ("answer", "baseline", "future", "operation_id", "until")

    def __init__(self, baseline: str, future: asyncio.Future, answer: Callable[[], Any] | None,
                 until: frozenset[str] | None = None, operation_id: str | None = None) -> None:
        self.baseline, self.future, self.answer, self.until = baseline, future, answer, until
        self.operation_id = operation_id

    def may_be_answered_by(self, moved: dict[str, str] | None) -> bool:
        """Whether a ring that says this (operation → the status it moved to; None: it does not
        say) may answer this poll: a read is needed. A poll that did not name its operation
        reads at every ring."""
        if moved is None or self.operation_id is None:
            return True
        return self.operation_id in moved and self.answered_by(moved[self.operation_id])

    def answered_by(self, status: str | None) -> bool:
        """Whether this status answers the poll: one of `until`, else any but the baseline."""
        if status is None:
            return False
        return status in self.until if self.until is not None else status != self.baseline


def _read(watches: list[tuple[int, _Watch]]) -> tuple[dict[int, str], dict[int, Any]]:
    """One hop for one ring: the status of every watched call (one query). When one watch is
    answered by it, its answer is built in this hop too (no second hop for it). When several are,
    each poll builds its own, in hops of their own: in parallel, and the next ring's read does
    not wait behind them."""
    statuses = call_operation_statuses(sorted({call_pk for call_pk, _ in watches}))
    moved = [watch for call_pk, watch in watches if watch.answered_by(statuses.get(call_pk))]
    answers: dict[int, Any] = {}
    if len(moved) == 1 and moved[0].answer is not None:
        try:
            answers[id(moved[0])] = moved[0].answer()
        except Exception:  # noqa: BLE001 - the poll builds its answer itself
            logger.warning("long-poll answer failed in the shared read", exc_info=True)
    return statuses, answers


class Doorbell:
    """The events doorbell for the long-polls of one event loop: one channel-layer listener
    however many polls wait, subscribed with the first. On the server's loop it stays for the
    process's life (a poll after a quiet spell does not subscribe again, nor wait for a Redis
    receiver that went idle); on any other loop (`async_to_sync`, tests) it goes with the last.

    Each ring reads, in one query, the status of every call a poll waits on (`watch`) that the
    ring may answer (`_Watch.may_be_answered_by`: all of them when it does not say what moved),
    and answers the polls that status answers (`_Watch.answered_by`) with the status read. A poll
    marks `rings` before it reads its call: a ring heard since (a commit between its read and
    its watch) that may answer it makes its watch look at once instead of waiting for the next
    ring."""

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
        self.rings = 0
        # What the last rings said moved (operation → status, or None), by ring number: for a
        # poll that starts watching after rings it may have missed.
        self.said: deque[tuple[int, dict[str, str] | None]] = deque(maxlen=RINGS_REMEMBERED)
        self.waiters = 0
        self.listener: asyncio.Task | None = None
        self.starting = asyncio.Lock()
        self.watches: dict[int, list[_Watch]] = {}
        self.checker: asyncio.Task | None = None
        self.check_wanted = False
        self.wanted: set[int] | None = set()  # the calls the next read is for; None: every one
        self.reads = 0  # status reads made for the watches (one per ring, however many wait)

    def _ring(self, moved: Moved | None = None) -> None:
        self.rings += 1
        operations = _operations(moved)
        self.said.append((self.rings, operations))
        if self.watches:
            self._request_check({call_pk for call_pk, watches in self.watches.items()
                                 if any(watch.may_be_answered_by(operations) for watch in watches)})

    def _request_check(self, call_pks: set[int] | None = None) -> None:
        """Read the status of these watched calls (None: of every one) soon."""
        if call_pks is not None and not call_pks:
            return
        if self.wanted is not None:
            self.wanted = None if call_pks is None else self.wanted | call_pks
        self.check_wanted = True
        if self.checker is None or self.checker.done():
            self.checker = self.loop.create_task(self._check())

    def _missed(self, since: int, watch: _Watch) -> bool:
        """Whether rings heard since `since` (before the watch began) may answer it."""
        said = [operations for number, operations in self.said if number > since]
        if len(said) < self.rings - since:
            return True  # older than what is remembered: read
        return any(watch.may_be_answered_by(operations) for operations in said)

    async def _check(self) -> None:
        # Rings that come while a read is under way are folded into one more read after it.
        while self.check_wanted and self.watches:
            self.check_wanted = False
            wanted, self.wanted = self.wanted, set()
            # A poll answered by the last read is still listed until it resumes: not read again
            # (its answer would be built a second time).
            watched = [(call_pk, watch) for call_pk, watches in self.watches.items() for watch in watches
                       if not watch.future.done() and (wanted is None or call_pk in wanted)]
            if not watched:
                continue
            try:
                self.reads += 1
                statuses, answers = await db_hop(_read)(watched)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the fallback poll still answers
                logger.warning("long-poll status read failed", exc_info=True)
                return
            for call_pk, watch in watched:
                status = statuses.get(call_pk)
                if watch.answered_by(status) and not watch.future.done():
                    watch.future.set_result((status, answers.get(id(watch))))

    async def watch(self, call_pk: int, baseline: str, wait: float, *, since: int | None,
                    answer: Callable[[], Any] | None = None, until: frozenset[str] | None = None,
                    operation_id: str | None = None) -> tuple[str, Any] | None:
        """Once the call's status differs from `baseline` (with `until`: once it is one of
        those): that status and `answer()` (None if building it failed), called in the database
        hop that read the status. None after `wait` seconds. `since`: the `rings` count before
        the caller read `baseline` (None: read now). `operation_id`, the call's operation: the
        watch then reads only at rings that say it moved to a status that may answer it."""
        watch = _Watch(baseline, self.loop.create_future(), answer, until, operation_id)
        self.watches.setdefault(call_pk, []).append(watch)
        try:
            if since is None or (since != self.rings and self._missed(since, watch)):
                self._request_check({call_pk})
            deadline = self.loop.time() + wait
            while (remaining := deadline - self.loop.time()) > 0:
                try:
                    return await asyncio.wait_for(asyncio.shield(watch.future),
                                                  timeout=min(FALLBACK_POLL_SECONDS, remaining))
                except TimeoutError:
                    # A ring can be lost (published during a reconnect): look anyway.
                    self._request_check()
            return watch.future.result() if watch.future.done() else None
        finally:
            watches = self.watches.get(call_pk, [])
            if watch in watches:
                watches.remove(watch)
            if not watches:
                self.watches.pop(call_pk, None)

    async def _subscribe(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        tail, last = isinstance(layer, InMemoryChannelLayer), None
        if tail:
            # Rings reach this layer from this process's commits and, in embedded mode, from the
            # worker's by datagram; the tail of the event table covers a ring that never came.
            # Its first place is read before any poll reads its call, so no commit falls between.
            try:
                last = await db_hop(latest_event_id)()
            except Exception:  # noqa: BLE001 - the fallback poll still answers
                logger.warning("long-poll event tail unreadable", exc_info=True)
                last = None
        try:
            channel = await layer.new_channel()
            await layer.group_add(DOORBELL_GROUP, channel)
        except Exception:  # noqa: BLE001 - the fallback poll still answers
            logger.warning("long-poll doorbell unavailable", exc_info=True)
            if tail:
                self.listener = asyncio.create_task(self._watch_tail(last))
            return
        self.listener = asyncio.create_task(
            self._listen_watching_tail(layer, channel, last) if tail else self._listen(layer, channel))

    async def _listen_watching_tail(self, layer, channel: str, last: int | None) -> None:
        tail = asyncio.create_task(self._watch_tail(last))
        try:
            await self._listen(layer, channel)
        finally:
            tail.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await tail

    async def _listen(self, layer, channel: str) -> None:
        try:
            while True:
                try:
                    message = await layer.receive(channel)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - the fallback poll still answers
                    logger.warning("long-poll doorbell receive failed", exc_info=True)
                    await asyncio.sleep(1)
                    continue
                self._ring(moved_in(message) if isinstance(message, dict) else None)
        finally:
            with contextlib.suppress(Exception):
                await layer.group_discard(DOORBELL_GROUP, channel)

    async def _watch_tail(self, last: int | None) -> None:
        while True:
            await asyncio.sleep(TAIL_POLL_SECONDS)
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
            if not self.waiters and self.loop is not doorbell.SERVER_LOOP:
                await self._stop()

    async def _stop(self) -> None:
        # Forgotten with its last poll: its futures hold the loop, which would keep the entry
        # of a finished loop alive for ever.
        if self._by_loop.get(self.loop) is self:
            del self._by_loop[self.loop]
        for task in (self.listener, self.checker):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self.listener = self.checker = None


async def wait_for_change(call_pk: int, baseline: str, wait: float, *,
                          until: frozenset[str] | None = None, operation_id: str | None = None) -> str | None:
    """Until the call's status differs from `baseline` (with `until`: is one of those), answered
    with it, or `wait` seconds have passed (None), woken by the doorbell (and at the fallback
    interval); with `operation_id`, only at rings that say it moved (`Doorbell.watch`)."""
    bell = Doorbell.for_loop()
    async with bell.waiting():
        moved = await bell.watch(call_pk, baseline, wait, since=None, until=until, operation_id=operation_id)
    return moved[0] if moved is not None else None
