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
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext
from django.db import connections


class RequestThreads:
    def __init__(self, app, *, keep: int = 16) -> None:
        self.app = app
        self.keep = keep
        self.idle: list[ThreadPoolExecutor] = []

    async def __call__(self, scope, receive, send) -> None:
        # Only the event loop's thread touches the free list: no lock.
        executor = self.idle.pop() if self.idle else ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.app(scope, receive, send)
        finally:
            # A request cancelled while its sync code runs leaves that code running: the next
            # request's work waits behind it in the same thread, one call at a time.
            if len(self.idle) < self.keep:
                self.idle.append(executor)
            else:
                executor.submit(connections.close_all)
                executor.shutdown(wait=False)
