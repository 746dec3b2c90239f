"""Django's ASGI handler with a request's bookkeeping queued in the request's thread.

Django's `ASGIHandler.handle` makes two thread hops of its own for every request, whatever the
view: it sends `request_started` (whose receivers reset the query log and close the thread's
stale database connections) and, after the answer is sent, calls `response.close()` (which sends
`request_finished`: the thread's connections given back), each through `sync_to_async`. Each
hop hands work to the request's thread, then wakes the event loop to resume the request; the
loop waits for work that nobody needs the result of.

`Handler.handle` is Django's, with those two hops replaced by `queue_in_request_thread`: the
same receivers and `close()` run in the same thread, in the same order relative to the request's
own sync code (one thread runs its queue in order), but the loop goes on at once. Outside a
request served by `console.lib.request_threads.RequestThreads` (no kept thread to queue in) it
hops as Django does.

What changes: a receiver that raises is logged instead of failing the request (the answer is
already sent for `request_finished`, and `request_started`'s are the thread's connection
housekeeping). Its body is Django 5.2's `ASGIHandler.handle`, checked by
tests/console/test_django_private.py, which fails when an upgrade changes the original.
"""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.dispatch import Signal
from django.http.response import HttpResponseBase
from django.urls import set_script_prefix

from console.lib.request_threads import queue_in_request_thread

# The SHA-256 of the source of the `ASGIHandler.handle` that `Handler.handle` was copied from.
COPIED_FROM = "98faeb5bef800331e6a8002fbc96b30e4122a23438ae45a047190a531ea11323"


async def _send(signal: Signal, sender, **named) -> None:
    if not queue_in_request_thread(lambda: signal.send(sender=sender, **named)):
        await signal.asend(sender=sender, **named)


async def _close(response: HttpResponseBase) -> None:
    if not queue_in_request_thread(response.close):
        await sync_to_async(response.close)()


class Handler(ASGIHandler):
    async def handle(self, scope, receive, send):
        """Django 5.2's `ASGIHandler.handle`; the changed lines say "queued"."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        await _send(signals.request_started, self.__class__, scope=scope)  # queued
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            await _close(error_response)  # queued
            return

        async def process_request(request, send):
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client disconnected during send_response
            return response

        # listen_for_disconnect() first: it must not raise errors that would keep
        # process_request() from being cancelled.
        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request(request, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass  # a client disconnect
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()  # views may handle their cancellation
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            await _send(signals.request_finished, self.__class__)  # queued
        else:
            await _close(response)  # queued
        body_file.close()
