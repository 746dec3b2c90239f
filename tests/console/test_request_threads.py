"""console.lib.request_threads: a request's sync code runs in a thread kept for the next request
(with its database connection), never in one another request is using at the same time."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

from asgiref.sync import sync_to_async
from django.db import connections

from console.lib.request_threads import RequestThreads
from tests.console.asgi_driver import call


def sync_app(work):
    """An ASGI app whose request runs `work()` as Django runs a sync view: thread-sensitive."""

    async def app(scope, receive, send):
        await sync_to_async(work, thread_sensitive=True)()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return app


def stop(threads: RequestThreads) -> None:
    for executor in threads.idle:
        executor.submit(connections.close_all).result()
        executor.shutdown()


def test_requests_one_after_the_other_run_in_one_kept_thread():
    seen: list[int] = []
    threads = RequestThreads(sync_app(lambda: seen.append(threading.get_ident())))

    async def two():
        await call(threads, "/")
        await call(threads, "/")

    asyncio.run(two())
    stop(threads)
    assert len(seen) == 2 and seen[0] == seen[1]
    assert seen[0] != threading.get_ident()


def test_requests_at_the_same_time_never_share_a_thread():
    both_in = threading.Barrier(2, timeout=10)  # a shared thread would never let both arrive
    seen: list[int] = []

    def work():
        seen.append(threading.get_ident())
        both_in.wait()

    threads = RequestThreads(sync_app(work))

    async def together():
        await asyncio.gather(call(threads, "/"), call(threads, "/"))

    asyncio.run(together())
    stop(threads)
    assert len(set(seen)) == 2


def test_at_most_keep_threads_stay_after_a_burst():
    burst = 5
    all_in = threading.Barrier(burst, timeout=10)
    threads = RequestThreads(sync_app(all_in.wait), keep=2)

    async def at_once():
        await asyncio.gather(*(call(threads, "/") for _ in range(burst)))

    asyncio.run(at_once())
    assert len(threads.idle) == 2
    stop(threads)


SQLITE_PROBE = """
import asyncio, django
django.setup()
from django.db.backends.signals import connection_created
from console.lib.request_threads import RequestThreads
from console.middleware import asgi_handler
from tests.console.asgi_driver import call
opened = []
connection_created.connect(lambda sender, connection, **kwargs: opened.append(connection), weak=False)
threads = RequestThreads(asgi_handler())
async def two():
    return [await call(threads, "/healthz"), await call(threads, "/healthz")]
print([answer.status for answer in asyncio.run(two())], len(opened))
"""


def test_two_health_checks_in_a_row_open_one_sqlite_connection(tmp_path):
    """Embedded mode's web server on SQLite (in a process of its own, so that the PostgreSQL run
    checks it too): a new SQLite connection parses the whole schema, so the second request must
    reuse the first's, kept with its thread."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "COUNTERSIGN_VAR_DIR": str(tmp_path),
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    done = subprocess.run([sys.executable, "-c", SQLITE_PROBE], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[200, 200] 1"


def test_the_web_servers_application_starts_in_a_fresh_interpreter_with_kept_threads(tmp_path):
    # Imported by uvicorn before anything sets Django up (console.middleware needs the apps).
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "COUNTERSIGN_VAR_DIR": str(tmp_path),
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    probe = "import console.asgi as a; print(type(a.http_app).__name__)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "RequestThreads"
