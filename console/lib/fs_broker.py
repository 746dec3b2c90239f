"""Kombu's file-system transport for embedded mode: atomic publishing, and consumers woken by
the publisher instead of polling the folder.

Atomic: kombu writes a message file in place: a consumer can move and read it before the
publisher has finished writing, get half a JSON document, and lose the message with a crashed
worker (seen in the chaos suite: 102 times in 1,600 trials). Here a message is written under a
name no consumer matches and renamed into place, which is atomic on one file system.

Woken: kombu's consumer lists the folder every `polling_interval`, so each message waits half
an interval on average and an idle worker keeps listing. Here each consumer binds a UNIX
datagram socket per queue it consumes, under `<folder>/wake/<queue's digest>/`; a publisher,
after renaming the message into place, sends one datagram to every socket of that queue. The
file is the message and the datagram only a bell: a consumer drains its bells, then lists the
folder, so a message renamed before the drain is listed and one renamed after it rings again.
A consumer that heard nothing lists the folder anyway every `fallback_interval` (a publisher
that died between the rename and the bell, a process running older code), and falls back to
kombu's `polling_interval` when it cannot bind a socket or its prefetch is full.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import secrets
import select
import socket
import uuid
from queue import Empty
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

from console.lib import datagram

logger = logging.getLogger(__name__)

WAKE_FOLDER = "wake"  # inside the data folder: kombu only reads "<anything>.<queue>.msg" there
DEFAULT_FALLBACK_INTERVAL = 1.0


def bell_folder(folder: str, queue: str) -> str:
    # A digest, not the name: queue names are long (Celery's "<node>.celery.pidbox") and a
    # socket's path is limited to 107 bytes.
    return os.path.join(folder, WAKE_FOLDER, hashlib.blake2s(queue.encode(), digest_size=8).hexdigest())


def ring(folder: str, queue: str) -> None:
    """Wake every consumer of `queue` whose bell is in `folder`."""
    path = bell_folder(folder, queue)
    try:
        names = os.listdir(path)
    except OSError:
        return  # no consumer ever bound one: nobody to wake, the file waits for them
    for name in names:
        target = os.path.join(path, name)
        if not datagram.send(target):
            # Left by a consumer killed before it could unlink it; its name is never bound again.
            try:
                os.unlink(target)
            except OSError:
                pass


class Bell:
    """A consumer's datagram socket for one queue."""

    def __init__(self, folder: str, queue: str) -> None:
        directory = bell_folder(folder, queue)
        os.makedirs(directory, exist_ok=True)
        self.pid = os.getpid()
        self.path = os.path.join(directory, f"{self.pid}-{secrets.token_hex(4)}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.setblocking(False)
            self.sock.bind(self.path)
        except OSError:
            self.sock.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def clear(self) -> None:
        while True:
            try:
                self.sock.recv(16)
            except OSError:  # BlockingIOError: nothing left
                return

    def ring(self) -> None:
        datagram.send(self.path)

    def close(self) -> None:
        self.sock.close()
        # A forked child (a prefork pool's) closing its copy must not unlink its parent's bell.
        if os.getpid() == self.pid:
            try:
                os.unlink(self.path)
            except OSError:
                pass


class Channel(filesystem.Channel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bells: dict[str, Bell] = {}
        self.deaf: set[str] = set()  # consumed queues without a bell: the transport polls them
        self.held = False  # the last drain found the prefetch full

    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".partial"  # "<queue>.msg.partial" is not "<queue>.msg": never consumed
        try:
            with open(partial, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc
        ring(self.data_folder_out, queue)

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        """Kombu's, without its race: kombu creates the exchange's file (empty) before it locks
        and writes it, so a worker binding at that moment read nothing and died on the JSON.
        Here a new file appears whole (written under another name, then linked into place,
        which fails if another process got there first), and an existing one is changed under
        its exclusive lock, which readers wait for; one found empty is an empty table."""
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            if not file.exists():
                partial = file.with_name(f".{file.name}.{uuid.uuid4().hex}.partial")
                partial.write_bytes(str_to_bytes(dumps([binding])))
                try:
                    os.link(partial, file)
                    return
                except FileExistsError:
                    pass  # bound by another process meanwhile: add to its table below
                finally:
                    partial.unlink(missing_ok=True)
            with open(file, "rb+", buffering=0) as handle:
                filesystem.lock(handle, filesystem.LOCK_EX)
                try:
                    # Empty: created by kombu's own transport (a process on older code), not written yet.
                    text = bytes_to_str(handle.read())
                    table = [filesystem.exchange_queue_t(*row) for row in loads(text)] if text else []
                    if binding not in table:
                        table.insert(0, binding)
                        handle.seek(0)
                        handle.write(str_to_bytes(dumps(table)))
                        handle.truncate()
                finally:
                    filesystem.unlock(handle)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot open {file}") from exc

    def basic_consume(self, queue, *args, **kwargs):
        result = super().basic_consume(queue, *args, **kwargs)
        if queue not in self.bells and queue not in self.deaf:
            try:
                self.bells[queue] = Bell(self.data_folder_in, queue)
            except OSError as exc:
                logger.warning("No wake socket for queue %r (%s): polling it every %s s",
                               queue, exc, self.connection.polling_interval)
                self.deaf.add(queue)
        # Messages published before the bell was bound rang nobody: list the folder now.
        self.connection.scan_now()
        return result

    def basic_cancel(self, consumer_tag):
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            bell = self.bells.pop(queue, None)
            if bell is not None:
                bell.close()
            self.deaf.discard(queue)
        return result

    def basic_ack(self, delivery_tag, multiple=False):
        super().basic_ack(delivery_tag, multiple=multiple)
        self._wake_own_consumer()

    def basic_reject(self, delivery_tag, requeue=False):
        super().basic_reject(delivery_tag, requeue=requeue)
        self._wake_own_consumer()

    def basic_qos(self, *args, **kwargs):
        result = super().basic_qos(*args, **kwargs)
        self.connection.scan_now()
        return result

    def _wake_own_consumer(self) -> None:
        # An ack frees a place in the prefetch window, often from a pool thread while the
        # consumer waits on its bells with messages left in the folder: ring it.
        bells = list(self.bells.values())  # a copy: this may run on a pool thread
        if bells:
            bells[0].ring()

    def drain_events(self, timeout=None, callback=None):
        self.held = bool(self._consumers) and not self.qos.can_consume()
        return super().drain_events(timeout=timeout, callback=callback)

    def close(self):
        super().close()  # cancels the consumers, which closes their bells
        for bell in self.bells.values():
            bell.close()
        self.bells.clear()


class Transport(filesystem.Transport):
    Channel = Channel
    fallback_interval = DEFAULT_FALLBACK_INTERVAL

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        fallback = client.transport_options.get("fallback_interval")
        if fallback is not None:
            self.fallback_interval = float(fallback)
        self._scan_at = 0.0  # when the folder is listed next without a bell ringing

    def scan_now(self) -> None:
        self._scan_at = 0.0

    def drain_events(self, connection, timeout=None):
        bells = [bell for channel in self.channels for bell in channel.bells.values()]
        if not bells:
            return super().drain_events(connection, timeout=timeout)
        start = monotonic()
        poller = select.poll()
        for bell in bells:
            poller.register(bell, select.POLLIN)
        rang = False
        while True:
            now = monotonic()
            if rang or now >= self._scan_at:
                # Bells first, then the folder: a message renamed after this listing rings again.
                for bell in bells:
                    bell.clear()
                try:
                    self.cycle.get(self._deliver, timeout=timeout)
                except Empty:
                    polls = any(channel.deaf or channel.held for channel in self.channels)
                    self._scan_at = now + ((self.polling_interval or 0.0) if polls else self.fallback_interval)
                else:
                    self._scan_at = 0.0  # more may be waiting: the next drain lists again
                    return
            wait = self._scan_at - monotonic()
            if timeout is not None:
                wait = min(wait, timeout - (monotonic() - start))
            events = poller.poll(max(0, math.ceil(wait * 1000)))
            for fd, event in events:
                if not event & select.POLLIN:
                    poller.unregister(fd)  # closed under us: never a reason to spin
            rang = bool(events)
            if not rang and timeout is not None and monotonic() - start >= timeout:
                raise TimeoutError()  # socket.timeout, which Celery expects
