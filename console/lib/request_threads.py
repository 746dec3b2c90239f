"""Threads for the sync code of ASGI requests, kept from one request to the next.

Django's ASGI handler runs a request's sync code (its sync views, `request_started` and
`request_finished` receivers, `response.close`) in a thread of that request's own: asgiref
makes a new single-thread executor for every request, starts its thread, and at the end starts
a second thread to join the first. Every request, even one to an async view, pays two thread
starts, and the thread's database connection dies with it, so each request that queries opens a
new one (on SQLite, a new connection parses the whole schema before its first statement).

`RequestThreads` hands each request an executor of one thread from a free list instead and
takes it back at the end: asgiref's `ThreadSensitiveContext(executor=...)`, which Django's own
context then leaves alone. A request's sync code still runs in one thread, which no other
request uses meanwhile, as Django requires; the thread, and with CONN_MAX_AGE its connection,
serve the next request. Requests beyond the free list get new executors; of those given back,
at most `keep` stay, the others close their connections and stop.

`queue_in_request_thread` gives the request's thread work the event loop does not wait for
(console.lib.asgi_handler: the request's bookkeeping before and after its own sync code).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext
from django.db import connections

logger = logging.getLogger(__name__)

# The executor of the request being served in this task (and the tasks it starts).
_request_thread: contextvars.ContextVar[ThreadPoolExecutor] = contextvars.ContextVar("request_thread")


class RequestThreads:
    def __init__(self, app, *, keep: int = 16) -> None:
        self.app = app
        self.keep = keep
        self.idle: list[ThreadPoolExecutor] = []

    async def __call__(self, scope, receive, send) -> None:
        # Only the event loop's thread touches the free list: no lock.
        executor = self.idle.pop() if self.idle else ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")
        token = _request_thread.set(executor)
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.app(scope, receive, send)
        finally:
            _request_thread.reset(token)
            # A request cancelled while its sync code runs leaves that code running: the next
            # request's work waits behind it in the same thread, one call at a time.
            if len(self.idle) < self.keep:
                self.idle.append(executor)
            else:
                executor.submit(connections.close_all)
                executor.shutdown(wait=False)


def queue_in_request_thread(work: Callable[[], object]) -> bool:
    """Queue `work()` in the current request's kept thread, in the request's context, and return
    at once: the thread runs it after the sync code queued before it and before any queued
    after it (one thread, one call at a time), so it keeps its place among the request's sync
    code as if awaited. A failure is logged, as nobody waits for it. False (nothing queued)
    outside a request served by `RequestThreads`."""
    executor = _request_thread.get(None)
    if executor is None:
        return False
    executor.submit(contextvars.copy_context().run, work).add_done_callback(_log_failure)
    return True


def _log_failure(done: Future) -> None:
    error = done.exception()
    if error is not None:
        logger.error("work queued in a request's thread failed", exc_info=error)
