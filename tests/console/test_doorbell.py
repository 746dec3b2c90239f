"""The live doorbell: one ring per committed transaction that wrote events, none before commit,
sent without the committing thread waiting for it, on a loop that keeps the layer's connections;
in embedded mode a commit of another process rings the server by a datagram."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from console import doorbell
from console.lib.procs import wait_until
from console.lib.transitions import record_event
from console.models import Event
from tests import asgi as test_asgi

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30  # an upper bound on a wait for a condition, never a measure


def wait_for(condition, what: str) -> None:
    wait_until(condition, timeout=TIMEOUT, what=what, interval=0.01)


def commit_an_event(tenant, entity_id: str = "t") -> None:
    with transaction.atomic():
        record_event(entity="task", entity_id=entity_id, tenant_id=tenant.id, kind=Event.Kind.CREATED,
                     to_status="queued", actor="a")


class HeldLayer:
    """A channel layer whose group_send blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.sent: list[tuple[str, dict, bool, asyncio.AbstractEventLoop]] = []

    async def group_send(self, group: str, message: dict) -> None:
        released = await asyncio.get_running_loop().run_in_executor(None, self.release.wait, TIMEOUT)
        self.sent.append((group, message, released, asyncio.get_running_loop()))


@pytest.fixture
def held_layer(monkeypatch, settings):
    settings.CHANNEL_LAYER_URL = "redis://127.0.0.1:1/0"  # not sent anywhere: the held layer takes it
    # Rings an earlier test of this process asked for are sent first, to the layer they were
    # asked for: else one would reach the held layer and be counted as this test's.
    doorbell._own_loop_ringer().drain(TIMEOUT)
    layer = HeldLayer()
    monkeypatch.setattr(doorbell, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(doorbell, "SERVER_LOOP", None)
    yield layer
    layer.release.set()


def test_a_transaction_with_two_events_rings_once_after_commit(tenant, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks, transaction.atomic():
        for n in range(2):
            record_event(entity="task", entity_id=f"t{n}", tenant_id=tenant.id, kind=Event.Kind.CREATED,
                         to_status="queued", actor="a")
    rings = [cb for cb in callbacks if isinstance(cb, doorbell.TransactionRing)]
    assert len(rings) == 1
    assert rings[0].moved == [("task", "t0", "queued"), ("task", "t1", "queued")]


@pytest.mark.django_db(transaction=True)
def test_the_ring_says_what_the_transactions_events_moved(held_layer, tenant):
    # What moved rides along (the long-polls read only for what concerns them); the table stays the truth.
    held_layer.release.set()
    with transaction.atomic():
        record_event(entity="operation", entity_id="op_1", tenant_id=tenant.id, kind=Event.Kind.CREATED,
                     to_status="planned", actor="a")
        # Not a move: its to_status is the provider's answer.
        record_event(entity="operation", entity_id="op_1", tenant_id=tenant.id, kind=Event.Kind.PROVIDER_ANSWER,
                     to_status="found", actor="a")
        record_event(entity="operation", entity_id="op_1", tenant_id=tenant.id, kind=Event.Kind.TRANSITION,
                     from_status="planned", to_status="authorized", actor="a")
    wait_for(lambda: held_layer.sent, "the ring")
    assert held_layer.sent[0][1] == {"type": "events.committed",
                                     "moved": [["operation", "op_1", "planned"], ["operation", "op_1", "authorized"]]}


def test_rings_sent_as_one_say_what_each_moved_or_nothing_past_the_limit(held_layer):
    doorbell._ring([("operation", "op_0", "confirmed")])  # held: its send has started
    ringer = doorbell._own_loop_ringer()
    wait_for(lambda: not ringer.waiting, "the first send to start")
    with loop_kept_busy(ringer):
        doorbell._ring([("operation", "op_1", "dispatched")])
        doorbell._ring([("operation", "op_2", "confirmed")])
    held_layer.release.set()
    ringer.drain(TIMEOUT)
    ringer.drain(TIMEOUT)
    # Both sends wait on the one release: which of them finishes first is the threads' race.
    assert sorted((message.get("moved") for _, message, _, _ in held_layer.sent), key=len) == [
        [["operation", "op_0", "confirmed"]], [["operation", "op_1", "dispatched"], ["operation", "op_2", "confirmed"]]]

    held_layer.sent.clear()
    doorbell._ring([("operation", f"op_{n}", "expired") for n in range(doorbell.MAX_MOVED + 1)])
    doorbell._ring(None)  # a ring that cannot say what moved
    ringer.drain(TIMEOUT)
    ringer.drain(TIMEOUT)
    assert all("moved" not in message for _, message, _, _ in held_layer.sent) and held_layer.sent


@pytest.mark.django_db(transaction=True)
def test_the_committing_thread_does_not_wait_for_the_ring(held_layer, tenant):
    commit_an_event(tenant)
    # Had the commit waited for the ring, it would have returned only when the held send gave up.
    assert held_layer.sent == []
    held_layer.release.set()
    wait_for(lambda: held_layer.sent, "the ring")
    assert [(group, message["type"], released) for group, message, released, _ in held_layer.sent] == [
        (doorbell.DOORBELL_GROUP, "events.committed", True)]


@pytest.mark.django_db(transaction=True)
def test_in_the_server_the_ring_is_sent_on_the_servers_loop(held_layer, tenant):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        wait_for(loop.is_running, "the loop")
        doorbell.serve_on(loop)
        commit_an_event(tenant)
        held_layer.release.set()
        wait_for(lambda: held_layer.sent, "the ring")
        assert held_layer.sent[0][3] is loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@contextlib.contextmanager
def loop_kept_busy(ringer):
    """The ringer's loop runs nothing else meanwhile: rings asked for now all wait to be sent
    (else, on a busy machine, the loop could start sending one between two of them)."""
    busy = threading.Event()
    ringer.loop.call_soon_threadsafe(busy.wait, TIMEOUT)
    try:
        yield
    finally:
        busy.set()


def test_rings_asked_for_while_one_waits_are_sent_as_one(held_layer):
    doorbell._ring()  # held: its send has started
    ringer = doorbell._own_loop_ringer()
    wait_for(lambda: not ringer.waiting, "the first send to start")
    with loop_kept_busy(ringer):
        for _ in range(5):
            doorbell._ring()
    held_layer.release.set()
    ringer.drain(TIMEOUT)
    ringer.drain(TIMEOUT)  # the second one was asked for from the loop's own queue
    assert len(held_layer.sent) == 2


class Listener:
    """A channel in the doorbell's group, on an event loop of the test's own: a publish/subscribe
    layer's channel lives on the loop that made it (each `async_to_sync` call may run on another)."""

    def __init__(self, layer) -> None:
        self.layer, self.loop = layer, asyncio.new_event_loop()
        self.channel = self.loop.run_until_complete(layer.new_channel())
        self.loop.run_until_complete(layer.group_add(doorbell.DOORBELL_GROUP, self.channel))

    def receive(self) -> dict:
        return self.loop.run_until_complete(asyncio.wait_for(self.layer.receive(self.channel), TIMEOUT))

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.layer.group_discard(doorbell.DOORBELL_GROUP, self.channel))
        finally:
            self.loop.close()


def redis_layer(settings):
    if not settings.CHANNEL_LAYER_URL.startswith("redis"):
        pytest.skip("a Redis channel layer (CHANNEL_LAYER_URL=redis://...)")
    return get_channel_layer()


def test_rings_outside_the_server_share_one_redis_connection(settings, monkeypatch):
    from redis.asyncio.connection import AbstractConnection

    layer = redis_layer(settings)
    monkeypatch.setattr(doorbell, "SERVER_LOOP", None)
    opened: list[str] = []
    connect = AbstractConnection.connect

    async def counting_connect(self, *args, **kwargs):
        if not self.is_connected:  # a new connection
            opened.append(threading.current_thread().name)
        return await connect(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "connect", counting_connect)
    # The test listens on one loop of its own, in this thread: the connections it opens are told
    # apart from the rings' by the thread.
    listener = Listener(layer)
    try:
        for _ in range(5):
            doorbell._ring()
            assert listener.receive() == {"type": "events.committed"}
    finally:
        listener.close()
    ringing = [name for name in opened if name != threading.current_thread().name]
    assert len(ringing) <= 1  # none when an earlier test's ring opened it


def layer_on(url: str):
    from django.utils.module_loading import import_string

    from console.settings import channel_layers

    config = channel_layers(url)["default"]
    return import_string(config["BACKEND"])(**config.get("CONFIG", {}))


def test_a_deployment_on_another_redis_database_does_not_hear_the_rings(settings):
    # Redis's publish and subscribe ignore the database number: the layer's names must not.
    redis_layer(settings)
    base, database = settings.CHANNEL_LAYER_URL.rsplit("/", 1)
    other = f"{base}/{int(database) + 1}"  # this test process's broker database: no layer there
    ours, same, theirs = (layer_on(settings.CHANNEL_LAYER_URL), layer_on(settings.CHANNEL_LAYER_URL),
                          layer_on(other))

    async def rings_heard() -> tuple[bool, bool]:
        channel = await ours.new_channel()
        await ours.group_add(doorbell.DOORBELL_GROUP, channel)
        try:
            await theirs.group_send(doorbell.DOORBELL_GROUP, dict(doorbell.RING))
            await same.group_send(doorbell.DOORBELL_GROUP, {**doorbell.RING, "from": "same"})
            first = await asyncio.wait_for(ours.receive(channel), TIMEOUT)
            # Theirs was sent first: had it arrived, it would have been the first message.
            heard_same = first.get("from") == "same"
            try:
                await asyncio.wait_for(ours.receive(channel), 0.5)
                heard_more = True
            except TimeoutError:
                heard_more = False
            return heard_same, heard_more
        finally:
            await ours.group_discard(doorbell.DOORBELL_GROUP, channel)
            for layer in (ours, same, theirs):
                await layer.flush()

    assert async_to_sync(rings_heard)() == (True, False)


def test_a_forked_child_rings_on_a_loop_of_its_own(settings, monkeypatch):
    listener = Listener(redis_layer(settings))
    monkeypatch.setattr(doorbell, "SERVER_LOOP", None)
    try:
        doorbell._ring()  # the parent's loop thread exists now
        listener.receive()
        parent = doorbell._own_loop_ringer()
        pid = os.fork()
        if pid == 0:  # the child: ring, wait for the send, say whether the loop was its own
            code = 1
            try:
                doorbell._ring()
                ringer = doorbell._own_loop_ringer()
                ringer.drain(TIMEOUT)
                code = 0 if ringer is not parent and ringer.sent == 1 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The child's ring reached the group.
        assert listener.receive() == {"type": "events.committed"}
    finally:
        listener.close()


def test_the_ring_reaches_a_socket_in_the_group(monkeypatch):
    monkeypatch.setattr(doorbell, "SERVER_LOOP", None)
    monkeypatch.setattr(doorbell, "SERVING", True)  # an in-memory layer is rung only in the server
    listener = Listener(get_channel_layer())
    try:
        doorbell._ring()
        assert listener.receive() == {"type": "events.committed"}
    finally:
        listener.close()


# ------------------------------------------------------------------------------ embedded mode

@pytest.fixture
def embedded(settings, monkeypatch, tmp_path_factory):
    # A short directory: a UNIX socket's path is limited to about 100 bytes.
    var = Path(tmp_path_factory.mktemp("bell"))
    settings.VAR_DIR = var
    settings.CHANNEL_LAYER_URL = "memory://"
    monkeypatch.setattr(doorbell, "SERVER_LOOP", None)
    monkeypatch.setattr(doorbell, "SERVING", False)
    return var


def test_outside_the_server_a_commit_rings_the_embedded_server_by_datagram(embedded, monkeypatch):
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(doorbell, "get_channel_layer", lambda: layer)

    async def hear_one() -> dict:
        async with doorbell.embedded_doorbell():
            assert doorbell.embedded_doorbell_path().exists()
            channel = await layer.new_channel()
            await layer.group_add(doorbell.DOORBELL_GROUP, channel)
            # A commit's ring, from a thread of no server (the loop here stands for the server's).
            await asyncio.get_running_loop().run_in_executor(None, doorbell._ring)
            return await layer.receive(channel)

    assert asyncio.run(asyncio.wait_for(hear_one(), TIMEOUT)) == {"type": "events.committed"}
    assert not doorbell.embedded_doorbell_path().exists()  # removed when the server stops


def test_a_commit_in_a_thread_that_runs_an_event_loop_still_rings_the_embedded_server(embedded, monkeypatch, caplog):
    # A process that imported the server's module (SERVING) but commits in a thread that runs an
    # event loop of its own (a sync call from async code, a browser test's driver): the in-process
    # send cannot run there, and the datagram must go anyway.
    monkeypatch.setattr(doorbell, "SERVING", True)
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(doorbell, "get_channel_layer", lambda: layer)

    async def hear_one() -> dict:
        async with doorbell.embedded_doorbell():
            channel = await layer.new_channel()
            await layer.group_add(doorbell.DOORBELL_GROUP, channel)
            doorbell._ring()  # in this thread, whose loop is running
            return await layer.receive(channel)

    assert asyncio.run(asyncio.wait_for(hear_one(), TIMEOUT)) == {"type": "events.committed"}
    assert "doorbell failed" not in caplog.text


def test_with_no_server_listening_the_ring_is_dropped_quietly(embedded, caplog):
    doorbell._ring()
    path = doorbell.embedded_doorbell_path()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stale:  # a server that died
        stale.bind(str(path))
    doorbell._ring()
    assert "doorbell" not in caplog.text


CHILD_COMMIT = """
import django, os
django.setup()
from django.db import transaction
from console.lib.procs import wait_until
from console.lib.transitions import record_event
from console.models import Event
with transaction.atomic():
    record_event(entity="task", entity_id="from-the-worker", tenant_id=int(os.environ["TENANT"]),
                 kind=Event.Kind.CREATED, to_status="queued", actor="worker")
"""


@pytest.mark.django_db(transaction=True)
def test_a_commit_in_another_process_wakes_the_servers_long_polls_without_the_tail_poll(
        embedded, settings, monkeypatch, tenant):
    from ledger import longpoll

    # Far beyond the wait below: only a ring can wake the doorbell in time.
    monkeypatch.setattr(longpoll, "TAIL_POLL_SECONDS", 600)
    layer = InMemoryChannelLayer()
    monkeypatch.setattr(doorbell, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(longpoll, "get_channel_layer", lambda: layer)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "DATABASE_URL": test_asgi.test_database_url(),
           "COUNTERSIGN_VAR_DIR": str(embedded), "PORT": str(settings.PORT), "CHANNEL_LAYER_URL": "memory://",
           "TENANT": str(tenant.id)}

    async def serve() -> int:
        async with doorbell.embedded_doorbell():
            bell = longpoll.Doorbell.for_loop()
            async with bell.waiting():
                before = bell.rings
                child = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD_COMMIT, cwd=REPO, env=env)
                assert await child.wait() == 0
                while bell.rings == before:
                    await asyncio.sleep(0.01)
                return bell.rings - before

    assert asyncio.run(asyncio.wait_for(serve(), TIMEOUT)) >= 1
    assert Event.objects.filter(entity_id="from-the-worker").exists()
