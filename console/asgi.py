"""ASGI entry point: HTTP through Django, websockets through Channels (session auth)."""

from __future__ import annotations

import asyncio
import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
# The web server keeps its PostgreSQL connections in a pool (console/settings.py; SQLite ignores
# it). Set only while the settings are read below, so that no process started from this one (a
# test session imports this module, then starts Celery prefork workers) inherits it.
_POOL_BY_DEFAULT = "DATABASE_POOL" not in os.environ
if _POOL_BY_DEFAULT:
    os.environ["DATABASE_POOL"] = "10"

import django  # noqa: E402
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from console.lib.request_threads import RequestThreads  # noqa: E402
from console.tracing import asgi_lifespan, setup_tracing  # noqa: E402

# Before the handler loads its middleware: Django's instrumentation works by adding one.
# Celery too, so a task's spans continue the trace of the request that published it.
setup_tracing(instrument_django=True, instrument_celery=True)
django.setup(set_prefix=False)
# After setup: it subclasses Django's middleware, whose modules import models.
from console.middleware import asgi_handler  # noqa: E402

django_asgi_app = asgi_handler()  # get_asgi_application(), the middleware's hooks on the loop
if _POOL_BY_DEFAULT:
    del os.environ["DATABASE_POOL"]  # the settings have been read


def _pool_retries_every_second() -> None:
    """psycopg_pool tries a failed connection again after 1, 2, 4, 8… s, so after a database
    restart the web server could stay without a connection long after the database was back
    (docs/reliability.md, chaos scenario 6). Once a second instead, with the pool's jitter; the
    pool still gives up after `reconnect_timeout`."""
    from psycopg_pool.base import AttemptWithBackoff

    AttemptWithBackoff.DELAY_BACKOFF = 1.0


def _pool_checks_a_quiet_connection_without_a_round_trip() -> None:
    """CONN_HEALTH_CHECKS makes the pool check each connection it hands out with a round trip
    (psycopg_pool's `check_connection`), and a request takes a connection up to twice (the
    dispatch in the request gives its own back around the provider call). A connection whose
    server went away (a terminated backend, a restarted database) has been told so, or closed:
    its socket is readable. One with nothing to read is handed out as it is; the others get the
    round trip, and the pool replaces those that fail it. A connection that dies without a word
    (a cut network) fails its next statement, as it could right after a round-trip check."""
    import select

    from django.db import connections
    from psycopg_pool import ConnectionPool

    pool = connections["default"].pool
    if pool is None or pool._check is None:  # no pool, or CONN_HEALTH_CHECKS off
        return

    def check(conn) -> None:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        if poller.poll(0):
            ConnectionPool.check_connection(conn)

    # psycopg_pool takes `check` only in its constructor, which Django calls with its own;
    # tests/console/test_asgi_pool.py fails if this attribute stops being the one it calls.
    pool._check = check


if settings.DATABASES["default"].get("OPTIONS", {}).get("pool"):
    _pool_retries_every_second()
    _pool_checks_a_quiet_connection_without_a_round_trip()
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC else django_asgi_app
# Each request's sync code runs in a thread kept between requests, not one started (and joined
# by another) for every request; with it stays the thread's connection (console/lib/request_threads.py).
http_app = RequestThreads(http_app)

from console import doorbell  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402
from ledger.mcp_server import McpServer, is_mcp_path  # noqa: E402

doorbell.SERVING = True

# Countersign as an MCP server (ledger/mcp_server.py, docs/agents.md): /mcp is not a Django view.
mcp_server = McpServer()


async def http_or_mcp(scope, receive, send) -> None:
    app = mcp_server if is_mcp_path(scope["path"]) else http_app
    await app(scope, receive, send)


def doorbell_lifespan(inner):
    """With the in-memory channel layer (embedded mode), the server hears the commits of other
    processes (the worker) on a datagram socket for as long as it runs (console/doorbell.py)."""
    async def lifespan(scope, receive, send) -> None:
        if not settings.CHANNEL_LAYER_URL.startswith("memory://"):
            await inner(scope, receive, send)
            return
        async with doorbell.embedded_doorbell() as bell:
            async def receive_until_shutdown():
                message = await receive()
                if message["type"] == "lifespan.shutdown" and bell is not None:
                    # uvicorn stops its loop once shutdown is complete, before this task ends.
                    bell.close()
                return message

            await inner(scope, receive_until_shutdown, send)

    return lifespan


router = ProtocolTypeRouter(
    {
        "http": http_or_mcp,
        # Flushes spans at shutdown, runs the MCP sessions and the embedded doorbell; run uvicorn
        # with --lifespan on.
        "lifespan": doorbell_lifespan(mcp_server.lifespan(asgi_lifespan)),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)


# What start-up made (settings, models, URL patterns, the middleware chain) lives as long as the
# process: out of the collector's sight, a full collection walks only what requests made since,
# instead of holding the GIL for every object of every import (over 100 ms) while requests wait.
gc.freeze()


async def application(scope, receive, send) -> None:
    # The loop the doorbell is rung on, from the request threads' commits (console.doorbell._ring).
    loop = asyncio.get_running_loop()
    if doorbell.SERVER_LOOP is not loop:
        doorbell.serve_on(loop)
    await router(scope, receive, send)
