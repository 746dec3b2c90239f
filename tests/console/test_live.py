"""The live stream (console/live.py + console/consumers.py): the tail of committed events over a
websocket, with catch-up from the last event id the page saw."""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async

from console.models import Event
from tests.factories import make_task

pytestmark = [
    pytest.mark.django_db(transaction=True),
]

PATH = "/ws/live/activity/"
ORIGIN = (b"origin", b"http://testserver")
TIMEOUT = 10  # an upper bound, not a wait: each receive returns as soon as a frame arrives


class WebsocketCommunicator(ApplicationCommunicator):
    """The few websocket verbs of channels.testing.WebsocketCommunicator, which cannot be
    imported here: channels.testing imports daphne (not a dependency) for its live server."""

    def __init__(self, app, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(app, {
            "type": "websocket", "path": path, "query_string": b"", "headers": headers or [],
            "subprotocols": [],
        })

    async def connect(self, timeout: float = 1) -> tuple[bool, int | None]:
        await self.send_input({"type": "websocket.connect"})
        response = await self.receive_output(timeout)
        if response["type"] == "websocket.close":
            return False, response.get("code", 1000)
        assert response["type"] == "websocket.accept"
        return True, None

    async def send_json_to(self, data) -> None:
        await self.send_input({"type": "websocket.receive", "text": json.dumps(data)})

    async def receive_from(self, timeout: float = 1) -> str:
        response = await self.receive_output(timeout)
        assert response["type"] == "websocket.send", response
        return response["text"]

    async def disconnect(self, timeout: float = 1) -> None:
        await self.send_input({"type": "websocket.disconnect", "code": 1000})
        await self.wait(timeout)


def application():
    from console.asgi import application

    return application


def session_headers(client, user) -> list[tuple[bytes, bytes]]:
    client.force_login(user)
    return [ORIGIN, (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


def rows(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="event-(\d+)"', html)]


def cursor(html: str) -> int:
    return int(re.search(r'id="live-cursor" data-last-event-id="(\d+)"', html).group(1))


def new_event(agent) -> int:
    task = make_task(agent)
    return Event.objects.filter(entity="task", entity_id=task.task_id).values_list("id", flat=True).get()


async def receive_until(communicator, last_id: int) -> list[str]:
    """Fragments until the cursor reaches `last_id`."""
    fragments = []
    while not fragments or cursor(fragments[-1]) < last_id:
        fragments.append(await communicator.receive_from(timeout=TIMEOUT))
    return fragments


def an_event_after_connecting(headers, agent) -> tuple[int, str]:
    """Connect as of the latest event, commit one more: its id, and the first frame received."""
    seen = new_event(agent)

    async def scenario():
        communicator = WebsocketCommunicator(application(), PATH, headers=headers)
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert connected
        await communicator.send_json_to({"last_event_id": seen})
        fresh = await database_sync_to_async(new_event)(agent)

        html = await communicator.receive_from(timeout=TIMEOUT)

        await communicator.disconnect()
        return fresh, html

    return async_to_sync(scenario)()


def test_an_event_committed_after_connecting_arrives_with_the_new_cursor(client, reviewer, agent):
    fresh, html = an_event_after_connecting(session_headers(client, reviewer), agent)

    assert rows(html) == [fresh]
    assert cursor(html) == fresh
    assert 'hx-swap-oob="true"' in html
    assert 'hx-swap-oob="afterbegin:#activity-rows"' in html


def test_a_read_that_fails_once_does_not_end_the_sockets_stream(client, reviewer, agent, monkeypatch):
    """A read that failed (the database away for a moment) ended the socket's poller for good:
    the page kept saying "live" and never changed again (seen once in CI's browser tests). The
    next round reads again from the same place."""
    from django.db import OperationalError

    from console.consumers import LiveConsumer

    real = LiveConsumer._send_next_batch
    failures = []

    async def fails_once(self):
        if not failures:
            failures.append(self)
            raise OperationalError("database is locked")
        return await real(self)

    monkeypatch.setattr(LiveConsumer, "_send_next_batch", fails_once)

    fresh, html = an_event_after_connecting(session_headers(client, reviewer), agent)

    assert len(failures) == 1
    assert rows(html) == [fresh] and cursor(html) == fresh


def test_a_reconnect_with_an_older_cursor_receives_what_it_missed_in_order(client, reviewer, agent):
    headers = session_headers(client, reviewer)
    start = new_event(agent)

    async def scenario():
        first = WebsocketCommunicator(application(), PATH, headers=headers)
        assert (await first.connect(timeout=TIMEOUT))[0]
        await first.send_json_to({"last_event_id": start})
        seen = await database_sync_to_async(new_event)(agent)
        before_drop = await receive_until(first, seen)
        await first.disconnect()

        # While the page is away, three more events commit.
        missed = [await database_sync_to_async(new_event)(agent) for _ in range(3)]

        second = WebsocketCommunicator(application(), PATH, headers=headers)
        assert (await second.connect(timeout=TIMEOUT))[0]
        await second.send_json_to({"last_event_id": seen})
        after_reconnect = await receive_until(second, missed[-1])
        await second.disconnect()
        return seen, missed, before_drop, after_reconnect

    seen, missed, before_drop, after_reconnect = async_to_sync(scenario)()

    assert [i for html in before_drop for i in rows(html)] == [seen]
    received = [rows(html) for html in after_reconnect]
    # Each fragment is prepended to the table, newest on top, so a page that applies them in
    # the order they arrive shows every missed event exactly once, in commit order.
    table: list[int] = []
    for fragment_rows in received:
        table = fragment_rows + table
    assert table == sorted(missed, reverse=True)
    cursors = [cursor(html) for html in after_reconnect]
    assert cursors == sorted(cursors)
    assert cursors[-1] == missed[-1]


def test_a_page_that_saw_nothing_yet_gets_the_whole_tail_it_may_see(client, reviewer, agent):
    headers = session_headers(client, reviewer)
    existing = [new_event(agent) for _ in range(2)]

    async def scenario():
        communicator = WebsocketCommunicator(application(), PATH, headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.send_json_to({"last_event_id": 0})
        fragments = await receive_until(communicator, existing[-1])
        await communicator.disconnect()
        return fragments

    fragments = async_to_sync(scenario)()

    assert sorted(i for html in fragments for i in rows(html)) == existing


def test_events_of_another_tenant_never_arrive(client, reviewer, agent, outsider_agent):
    headers = session_headers(client, reviewer)
    start = new_event(agent)

    async def scenario():
        communicator = WebsocketCommunicator(application(), PATH, headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.send_json_to({"last_event_id": start})
        foreign = [await database_sync_to_async(new_event)(outsider_agent) for _ in range(2)]
        # Committed after the foreign ones: when it arrives, any leak would have arrived too.
        own = await database_sync_to_async(new_event)(agent)
        fragments = await receive_until(communicator, own)
        await communicator.disconnect()
        return foreign, own, fragments

    foreign, own, fragments = async_to_sync(scenario)()

    received = [i for html in fragments for i in rows(html)]
    assert received == [own]
    assert not set(foreign) & set(received)
    assert all(f'id="event-{i}"' not in html for html in fragments for i in foreign)


def test_the_other_tenant_sees_its_own_events_and_not_ours(client, outsider, agent, outsider_agent):
    headers = session_headers(client, outsider)
    start = new_event(outsider_agent)

    async def scenario():
        communicator = WebsocketCommunicator(application(), PATH, headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.send_json_to({"last_event_id": start})
        ours = await database_sync_to_async(new_event)(agent)
        theirs = await database_sync_to_async(new_event)(outsider_agent)
        fragments = await receive_until(communicator, theirs)
        await communicator.disconnect()
        return ours, theirs, fragments

    ours, theirs, fragments = async_to_sync(scenario)()

    assert [i for html in fragments for i in rows(html)] == [theirs]
    assert ours < theirs


def test_an_anonymous_user_is_refused(db):
    async def scenario():
        communicator = WebsocketCommunicator(application(), PATH, headers=[ORIGIN])
        result = await communicator.connect(timeout=TIMEOUT)
        await communicator.disconnect(timeout=TIMEOUT)
        return result

    connected, code = async_to_sync(scenario)()

    assert connected is False
    assert code == 4403


def test_an_unknown_stream_is_refused(client, reviewer):
    headers = session_headers(client, reviewer)

    async def scenario():
        communicator = WebsocketCommunicator(application(), "/ws/live/nope/", headers=headers)
        result = await communicator.connect(timeout=TIMEOUT)
        await communicator.disconnect(timeout=TIMEOUT)
        return result

    assert async_to_sync(scenario)() == (False, 4403)


def test_a_foreign_origin_is_refused(client, reviewer):
    headers = [(b"origin", b"http://evil.example.com"), *session_headers(client, reviewer)[1:]]

    async def scenario():
        communicator = WebsocketCommunicator(application(), PATH, headers=headers)
        result = await communicator.connect(timeout=TIMEOUT)
        await communicator.disconnect(timeout=TIMEOUT)
        return result

    connected, _ = async_to_sync(scenario)()
    assert connected is False


# ------------------------------------------------------------------- one render per view


@pytest.fixture
def counted_stream():
    """A stream like `activity` whose renders are counted, with a viewer key that holds only
    the tenants (so two users of one tenant share renders)."""
    from console import live

    calls: list[tuple[str, tuple[int, ...]]] = []

    def render(user, events, arg):
        calls.append((user.get_username(), tuple(e.id for e in events)))
        return "".join(f'<tr id="event-{e.id}"></tr>' for e in events)

    def viewer(user):
        tenant_ids = frozenset(live.tenant_ids_for(user))
        return live.Viewer(tenant_ids=tenant_ids, key=("tenants", tuple(sorted(tenant_ids))))

    live.register(live.Stream(name="counted", entities=("task",), render=render, viewer=viewer))
    yield calls
    live.STREAMS.pop("counted", None)


def test_sockets_with_the_same_view_share_one_render_and_others_get_their_own(
        client, reviewer, senior, outsider, agent, outsider_agent, counted_stream):
    from django.test import Client

    start = new_event(agent)
    headers = [session_headers(Client(), user) for user in (reviewer, reviewer, senior, outsider)]

    async def scenario():
        sockets = [WebsocketCommunicator(application(), "/ws/live/counted/", headers=h) for h in headers]
        for socket in sockets:
            assert (await socket.connect(timeout=TIMEOUT))[0]
            await socket.send_json_to({"last_event_id": start})
        ours = await database_sync_to_async(new_event)(agent)
        theirs = await database_sync_to_async(new_event)(outsider_agent)
        got = [await receive_until(s, ours) for s in sockets[:3]] + [await receive_until(sockets[3], theirs)]
        for socket in sockets:
            await socket.disconnect()
        return ours, theirs, got

    ours, theirs, got = async_to_sync(scenario)()

    # Three sockets of one tenant (two users): the same HTML, rendered once.
    assert [[i for html in fragments for i in rows(html)] for fragments in got] == [[ours]] * 3 + [[theirs]]
    assert [ids for _, ids in counted_stream].count((ours,)) == 1
    assert [ids for _, ids in counted_stream].count((theirs,)) == 1


def test_the_cursor_fragment_is_the_cursor_template_out_of_band(db):
    from django.template.loader import render_to_string

    from console.live import cursor_fragment

    expected = render_to_string("console/_live_cursor.html", {"last_event_id": 1234, "oob": True}).strip()
    assert cursor_fragment(1234) == expected


def test_the_tails_database_threads_are_bounded_keep_their_connection_and_close_it_at_stop():
    import threading

    from django.db import connections

    from console.consumers import _DbThreads

    seen: dict[str, object] = {}
    inside = threading.Barrier(2, timeout=5)

    def job():
        # Two jobs at once: the second of two threads is started, never a third.
        inside.wait()
        Event.objects.exists()
        seen.setdefault(threading.current_thread().name, connections["default"])
        return threading.current_thread().name

    def quick():
        Event.objects.exists()
        return connections["default"]

    async def scenario():
        import asyncio

        db = _DbThreads(2)
        names = await asyncio.gather(*(db.run(job) for _ in range(2)))
        again = [await db.run(quick) for _ in range(6)]
        open_before_stop = all(conn.connection is not None for conn in seen.values())
        db.stop()
        return names, again, db, open_before_stop

    names, again, db, open_before_stop = async_to_sync(scenario)()
    assert open_before_stop
    assert len(set(names)) == 2 and all(n.startswith("live-db") for n in names)
    assert {id(c) for c in again} <= {id(c) for c in seen.values()}  # kept between calls
    for thread in list(db.executor._threads):
        thread.join(timeout=15)
    assert all(conn.connection is None for conn in seen.values())  # each thread closed its own


@pytest.mark.parametrize("path", ["/approvals/", "/operations/unknown/", "/dashboard/"])
def test_a_pages_cursor_counts_only_its_viewers_tenants(client, agent, outsider_agent, tenant, path):
    from console.models import Role
    from tests.conftest import make_user

    own = new_event(agent)
    foreign = [new_event(outsider_agent) for _ in range(3)]
    client.force_login(make_user("both", tenant, Role.REVIEWER, Role.SUPPORT, max_tier=4))

    page_cursor = cursor(client.get(path).content.decode())

    assert page_cursor == own < foreign[-1]


def test_a_run_pages_cursor_counts_only_its_viewers_tenants(client, reviewer, agent, outsider_agent):
    task = make_task(agent)
    own = Event.objects.filter(tenant=agent.tenant).order_by("-id").values_list("id", flat=True).first()
    new_event(outsider_agent)
    client.force_login(reviewer)

    assert cursor(client.get(f"/runs/{task.task_id}/").content.decode()) == own


def test_a_socket_whose_tenant_was_quiet_while_others_wrote_much_gets_its_next_event(
        client, reviewer, agent, outsider_agent):
    from console.consumers import WINDOW_IDS

    headers = session_headers(client, reviewer)
    own = new_event(agent)
    foreign = new_event(outsider_agent)
    template = Event.objects.get(pk=foreign)
    Event.objects.bulk_create([Event(**{f.attname: getattr(template, f.attname) for f in Event._meta.concrete_fields
                                        if f.attname not in ("id", "chain_seq", "prev_hash", "hash")})
                                for _ in range(WINDOW_IDS + 100)])  # copies, each sealed into the chain anew

    async def scenario():
        communicator = WebsocketCommunicator(application(), PATH, headers=headers)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        await communicator.send_json_to({"last_event_id": own})  # the page's cursor: its tenant's last
        fresh = await database_sync_to_async(new_event)(agent)
        more = await database_sync_to_async(new_event)(agent)
        fragments = await receive_until(communicator, more)
        await communicator.disconnect()
        return fresh, more, fragments

    fresh, more, fragments = async_to_sync(scenario)()

    assert sorted(i for html in fragments for i in rows(html)) == [fresh, more]
    assert [cursor(html) for html in fragments][-1] == more


class _Member:
    """What the tail needs of a socket: something to wake."""

    def __init__(self) -> None:
        import asyncio

        self.wakeup = asyncio.Event()


class _YieldingLayer:
    """The in-memory channel layer, but every call gives the event loop a turn, as a network
    layer (Redis) does: other sockets connect and leave in between."""

    def __init__(self, layer) -> None:
        self.layer = layer

    def __getattr__(self, name):
        import asyncio

        method = getattr(self.layer, name)

        async def call(*args, **kwargs):
            await asyncio.sleep(0)
            return await method(*args, **kwargs)

        return call


def test_a_socket_that_joins_while_the_last_one_leaves_gets_a_working_tail(monkeypatch, agent):
    """A filter swaps the support queue's table: the old socket closes as the new one opens.
    The last socket's leave stopped the tail's threads and dropped its state after an await;
    a socket that joined during that await found a new tail whose threads were then stopped
    under it: every read failed and the page said "live" and never changed again (seen in CI's
    browser tests on PostgreSQL and Redis)."""
    import asyncio

    from channels import layers
    from channels.layers import InMemoryChannelLayer

    from console import doorbell
    from console.consumers import Tail

    layer = InMemoryChannelLayer()
    monkeypatch.setattr(layers, "get_channel_layer", lambda *a, **k: _YieldingLayer(layer))

    async def until(condition, what: str) -> None:
        for _ in range(1000):
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"waited 10 s for {what}")

    async def join(member) -> Tail:
        return Tail.join(member)

    async def scenario():
        first, second = _Member(), _Member()
        old = Tail.join(first)
        await until(lambda: old.floor is not None, "the first read")
        _, tail = await asyncio.gather(old.leave(first), join(second))
        await until(lambda: tail.channel in layer.groups.get(doorbell.DOORBELL_GROUP, {}), "the doorbell")
        fresh = await database_sync_to_async(new_event)(agent)
        await until(lambda: fresh in tail.events, "the new event in the tail")
        in_group = tail.channel in layer.groups.get(doorbell.DOORBELL_GROUP, {})
        await tail.leave(second)
        await tail.leave(second)  # a second leave of the same socket ends nothing twice
        return second.wakeup.is_set(), in_group

    woken, in_group = async_to_sync(scenario)()
    assert woken
    assert in_group  # still rung, not only polled
