"""console.lib.asgi_handler: the web server's Django handler runs a request's own bookkeeping
(`request_started`'s and `request_finished`'s receivers, `response.close()`) in the request's
kept thread, queued there without a hop the event loop waits for, in the order Django runs it."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from django.core import signals
from django.http import HttpResponse
from django.test import override_settings
from django.urls import path

from console.lib.request_threads import RequestThreads
from console.middleware import asgi_handler
from tests.console.asgi_driver import call, counting_hops
from tests.console.test_request_threads import stop

events: list[tuple[str, int]] = []


def _sync_view(request):
    events.append(("view", threading.get_ident()))
    return HttpResponse("sync")


async def _async_view(request):
    events.append(("view", threading.get_ident()))
    return HttpResponse("async")


urlpatterns = [path("sync", _sync_view), path("async", _async_view)]


@pytest.fixture
def recorded():
    """What ran, in which thread, in order: the request signals' receivers and the views."""
    events.clear()

    def started(**kwargs):
        events.append(("started", threading.get_ident()))

    def finished(**kwargs):
        events.append(("finished", threading.get_ident()))

    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    yield events
    signals.request_started.disconnect(started)
    signals.request_finished.disconnect(finished)


def served(*paths: str) -> tuple[list, int, RequestThreads]:
    """The server's application (console.asgi: kept threads around the handler) answers each
    path in turn; then its threads have run all they were given. Returns the answers' statuses,
    the hops the event loop waited for, and the threads."""
    app = RequestThreads(asgi_handler())

    async def run():
        statuses, hops = [], 0
        for one in paths:
            answer, counted = await counting_hops(lambda one=one: call(app, one))
            statuses.append(answer.status)
            hops += counted
        return statuses, hops

    statuses, hops = asyncio.run(run())
    for executor in app.idle:
        executor.submit(lambda: None).result()  # what was queued in it has run
    return statuses, hops, app


@pytest.mark.django_db(transaction=True)
def test_a_sync_view_is_the_only_hop_the_loop_waits_for():
    statuses, hops, app = served("/healthz")
    stop(app)
    assert statuses == [200]
    assert hops == 1  # the view; Django's own handler adds request_started's and response.close()'s


@pytest.mark.django_db(transaction=True)
def test_an_async_view_that_reads_nothing_makes_no_hop_but_djangos_log_line():
    # /api/v1/calls/ is the async long-poll: a missing token is answered before any query.
    statuses, hops, app = served("/api/v1/calls/nope")
    stop(app)
    assert statuses == [401]
    assert hops == 1  # Django logs a 4xx through sync_to_async (not in the request's thread)


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__)
def test_the_request_signals_run_in_the_sync_views_thread_around_it(recorded):
    statuses, _, app = served("/sync", "/sync")
    stop(app)
    assert statuses == [200, 200]
    assert [name for name, _ in recorded] == ["started", "view", "finished"] * 2
    assert len({thread for _, thread in recorded}) == 1  # the kept thread, as Django's own would be one thread
    assert recorded[0][1] != threading.get_ident()


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__)
def test_around_an_async_view_the_request_signals_still_run_in_the_requests_thread(recorded):
    statuses, _, app = served("/async")
    stop(app)
    assert statuses == [200]
    names = [name for name, _ in recorded]
    assert names.index("started") < names.index("finished")
    view_thread = dict(recorded)["view"]
    assert dict(recorded)["started"] == dict(recorded)["finished"] != view_thread  # the loop ran the view


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__)
def test_a_failing_receiver_is_logged_and_the_request_still_answered(recorded):
    def broken(**kwargs):
        raise RuntimeError("a receiver that fails")

    # Its own handler: asgi_handler() sets Django up again, which configures the root logger anew.
    kept, logger = Kept(), logging.getLogger("console.lib.request_threads")
    logger.addHandler(kept)
    signals.request_finished.connect(broken)
    try:
        statuses, _, app = served("/sync")
        stop(app)
    finally:
        signals.request_finished.disconnect(broken)
        logger.removeHandler(kept)
    assert statuses == [200]
    assert [str(record.exc_info[1]) for record in kept.records] == ["a receiver that fails"]
    assert [name for name, _ in recorded] == ["started", "view", "finished"]


@pytest.mark.django_db(transaction=True)
@override_settings(ROOT_URLCONF=__name__)
def test_without_kept_threads_the_handler_hops_as_djangos_own(recorded):
    # asgi_handler() alone (as tests drive it): no kept thread to queue in, so Django's hops.
    async def run():
        return await counting_hops(lambda: call(asgi_handler(), "/sync"))

    answer, hops = asyncio.run(run())
    assert answer.status == 200
    assert hops == 3
    assert [name for name, _ in recorded] == ["started", "view", "finished"]


def test_the_response_is_closed_in_the_requests_thread_after_it_was_sent():
    closed: list[int] = []
    sent: list[str] = []

    class Watched(HttpResponse):
        def close(self):
            closed.append(threading.get_ident())
            super().close()

    async def app_view(request):
        return Watched("watched")

    # Only the ordering is checked here: the answer is sent before close() is queued.
    with override_settings(ROOT_URLCONF=__name__):
        urlpatterns.append(path("watched", app_view))
        try:
            app = RequestThreads(asgi_handler())

            async def run():
                async def send(message):
                    sent.append(message["type"])
                    assert not closed

                scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                         "scheme": "http", "path": "/watched", "raw_path": b"/watched", "query_string": b"",
                         "root_path": "", "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 1),
                         "server": ("testserver", 80)}
                delivered = asyncio.Event()

                async def receive():
                    if not delivered.is_set():
                        delivered.set()
                        return {"type": "http.request", "body": b"", "more_body": False}
                    await asyncio.Event().wait()

                await app(scope, receive, send)

            asyncio.run(run())
            for executor in app.idle:
                executor.submit(lambda: None).result()
            stop(app)
        finally:
            urlpatterns.pop()
    assert sent == ["http.response.start", "http.response.body"]
    assert len(closed) == 1 and closed[0] != threading.get_ident()
