"""The events doorbell: after a transaction that wrote events commits, the live views' consumers
and the agent API's long-polls are told to look at the event table now instead of at their next
poll. The bell carries no data (the table does), so a lost ring costs a poll interval, never an
update.

A ring is handed over and the committing thread returns at once: in the server to its event
loop, elsewhere (Celery workers, commands) to one event loop per process in a thread of its own,
so channels-redis keeps its connections from one ring to the next. In embedded mode (an
in-memory channel layer, the worker in another process) a commit outside the server rings it by
a UNIX datagram (`embedded_doorbell`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from console.lib import datagram

logger = logging.getLogger(__name__)


# Consumers wait on the event table; after a commit that wrote events, this group is rung so
# they look at once. The table is the truth: a lost ring (published while a listener
# reconnects, a datagram the server did not read) only costs the poll interval, never an update.
DOORBELL_GROUP = "events"
RING = {"type": "events.committed"}
# A ring also says what the commit moved, `moved`: [entity, id, status] of each status its
# events set (a record created, a transition), so a listener that waits on a few records reads
# only when one of them moved. Past this many, or from a ring that cannot tell (a datagram, a
# tail poll), it says nothing: every listener reads.
MAX_MOVED = 100
Moved = list[tuple[str, str, str]]


class TransactionRing:
    """The one ring of a transaction, sent after it commits, with what its events moved."""

    def __init__(self) -> None:
        self.moved: Moved = []

    def __call__(self) -> None:
        _ring(self.moved)


def ring_doorbell_on_commit(events) -> None:
    """Called inside a transaction with the event rows it writes: one ring per transaction,
    after commit, saying what they moved."""
    moved = [(event.entity, event.entity_id, event.to_status) for event in events
             if event.kind in _MOVING_KINDS and event.to_status]
    connection = transaction.get_connection()
    for entry in connection.run_on_commit:
        if isinstance(entry[1], TransactionRing):  # already rung once for this transaction
            entry[1].moved += moved
            return
    ring = TransactionRing()
    ring.moved += moved
    connection.on_commit(ring)


# Event kinds whose rows say a record moved (Event.Kind.CREATED, Event.Kind.TRANSITION), as
# plain strings: this module is imported before the models are.
_MOVING_KINDS = frozenset({"created", "transition"})


def _ring(moved: Moved | None = None) -> None:
    """After commit, in the committing thread: hand the ring over and return at once. The agent's
    answer (in the server) or the next step of a dispatch (in a worker) does not wait for it.
    `moved`: what the commit moved (None: not known)."""
    try:
        loop = SERVER_LOOP
        if loop is not None and loop.is_running():
            _ringer_on(loop).ring(moved)
        elif settings.CHANNEL_LAYER_URL.startswith("memory://"):
            # The in-process layer reaches only this process's sockets: in embedded mode the server
            # is another process, rung by a datagram. Without a server loop here (a test that
            # drives consumers itself) the in-process send is a few queue operations.
            if SERVING:
                _send_in_thread(moved)
            _ring_embedded_server()
        else:
            _own_loop_ringer().ring(moved)
    except Exception:  # noqa: BLE001 - the bell is an optimisation; the poll still delivers
        logger.warning("live doorbell failed", exc_info=True)


def ring_message(moved: Moved | None) -> dict:
    if moved is None or len(moved) > MAX_MOVED:
        return dict(RING)
    return {**RING, "moved": [list(move) for move in moved]}


def moved_in(message: dict) -> Moved | None:
    """What a ring says moved, None when it does not say (or says it in another shape)."""
    moved = message.get("moved")
    if not isinstance(moved, list) or len(moved) > MAX_MOVED:
        return None
    if not all(isinstance(move, list | tuple) and len(move) == 3 and all(isinstance(part, str) for part in move)
               for move in moved):
        return None
    return [tuple(move) for move in moved]


def _send_in_thread(moved: Moved | None) -> None:
    # A thread that runs an event loop of its own cannot block on a send; the datagram that
    # follows rings the embedded server there, whichever process holds its socket.
    if _loop_running_here():
        return
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(DOORBELL_GROUP, ring_message(moved))


def _loop_running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Ringer:
    """Sends the rings of one process on one long-lived event loop: channels_redis keeps its
    connections per loop, so they are reused from one ring to the next. A ring asked for while
    another waits to be sent is that same ring (it goes after both commits): a slow or absent
    Redis leaves at most one ring waiting, not one per commit."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()
        self.waiting = False
        self.moved: Moved | None = None  # what the ring waiting to be sent says moved
        self.tasks: set[asyncio.Task] = set()
        self.sent = 0  # rings handed to the layer (tests, bench)
        self.close: Callable[[], None] = lambda: None

    def ring(self, moved: Moved | None = None) -> None:
        with self.lock:
            if self.waiting:
                # One ring for both commits: it says what both moved, or nothing if one cannot tell.
                self.moved = None if self.moved is None or moved is None else self.moved + moved
                return
            self.waiting, self.moved = True, None if moved is None else list(moved)
        self.loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        task = self.loop.create_task(self._send())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _send(self) -> None:
        with self.lock:
            self.waiting = False  # from here a new commit needs a ring of its own
            moved = self.moved
        try:
            layer = get_channel_layer()
            if layer is not None:
                await layer.group_send(DOORBELL_GROUP, ring_message(moved))
                self.sent += 1
        except Exception:  # noqa: BLE001 - the bell is an optimisation; the poll still delivers
            logger.warning("live doorbell failed", exc_info=True)

    async def _drain(self) -> None:
        if self.tasks:
            await asyncio.wait(set(self.tasks))

    def drain(self, timeout: float) -> None:
        """Wait (from another thread) until the rings asked for so far have been sent."""
        asyncio.run_coroutine_threadsafe(self._drain(), self.loop).result(timeout)


# Set by console.asgi: this process serves the sockets, so its in-memory layer reaches them,
# and SERVER_LOOP is the server's event loop, where its rings are sent (its sockets and
# long-polls listen there, on the layer's connections of that loop).
SERVING = False
SERVER_LOOP: asyncio.AbstractEventLoop | None = None
_server_ringer: _Ringer | None = None


def serve_on(loop: asyncio.AbstractEventLoop) -> None:
    global SERVER_LOOP
    SERVER_LOOP = loop


def _ringer_on(loop: asyncio.AbstractEventLoop) -> _Ringer:
    global _server_ringer
    ringer = _server_ringer
    if ringer is None or ringer.loop is not loop:
        ringer = _server_ringer = _Ringer(loop)
    return ringer


# Outside the server (Celery workers, commands) the rings go to one event loop of the process's
# own, in a daemon thread started with the first ring. A forked child (Celery prefork) has no
# such thread: it starts its own (the pid tells).
_own_lock = threading.Lock()
_own: tuple[int, _Ringer] | None = None


def _own_loop_ringer() -> _Ringer:
    global _own
    own = _own
    if own is not None and own[0] == os.getpid():
        return own[1]
    with _own_lock:
        if _own is None or _own[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="doorbell", daemon=True).start()
            _own = (os.getpid(), _Ringer(loop))
        return _own[1]


def _forget_own_loop() -> None:
    # In a forked child: the parent's lock may have been held by a thread that does not exist here.
    global _own_lock, _own
    _own_lock, _own = threading.Lock(), None


os.register_at_fork(after_in_child=_forget_own_loop)


@atexit.register
def _send_last_rings() -> None:
    # A command that commits and exits: its last ring goes out before the daemon thread dies.
    own = _own
    if own is not None and own[0] == os.getpid():
        with contextlib.suppress(Exception):
            own[1].drain(timeout=1.0)


# Embedded mode: the server listens on a UNIX datagram socket in VAR_DIR (one per PORT, as the
# server is one per PORT); a commit in another process (the worker) sends one datagram there, and
# the server turns it into a ring of its in-memory layer on its loop.
def embedded_doorbell_path() -> Path:
    return Path(_path_text(str(settings.VAR_DIR), settings.PORT))


def _ring_embedded_server() -> None:
    # No server, a stale socket, or the server is behind (it has a ring to read anyway): dropped.
    datagram.send(_path_text(str(settings.VAR_DIR), settings.PORT))


@functools.lru_cache(maxsize=8)
def _path_text(var_dir: str, port) -> str:
    # Every commit rings: the path is built once per (folder, port), not per ring.
    return str(Path(var_dir) / f"doorbell-{port}.sock")


@contextlib.asynccontextmanager
async def embedded_doorbell(path: Path | None = None):
    """While open, datagrams at `path` ring the in-memory layer on the running loop. The server
    holds it open for its lifetime (console.asgi's lifespan). Embedded mode runs one server per
    PORT: a second one on the same path takes the socket over and the first hears only its own
    commits and the fallback polls."""
    path = embedded_doorbell_path() if path is None else path
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by a server that did not stop cleanly
        sock.bind(str(path))
    except OSError:
        sock.close()
        logger.warning("embedded doorbell unavailable at %s: commits of other processes reach this "
                       "server by its fallback polls", path, exc_info=True)
        yield None
        return
    ringer = _Ringer(loop)

    def readable() -> None:
        # Any number of datagrams waiting are one ring.
        try:
            while sock.recv(64):
                pass
        except BlockingIOError:
            pass
        except OSError:
            logger.warning("embedded doorbell read failed", exc_info=True)
        ringer.ring()

    def close() -> None:
        if sock.fileno() != -1:
            loop.remove_reader(sock.fileno())
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    ringer.close = close  # the server closes it when told to stop: it may not get back here
    loop.add_reader(sock.fileno(), readable)
    try:
        yield ringer
    finally:
        close()
