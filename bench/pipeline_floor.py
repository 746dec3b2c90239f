"""The floor of the architecture: an agent's auto-run call through the same processes and hops as
the product's, with nothing in them but the minimum.

`bench/latency.py` starts it beside the product (PostgreSQL + Redis) and sends every agent's
call through both, interleaved, with the same read sent straight to the provider. The product's
path, which this copies hop for hop:

    agent ──HTTP──▶ ASGI server: commit the call, push it to the broker, wait for its ring
                    worker process: pop, commit the claim, call the provider over HTTP, commit
                    the receipt, ring (Redis publish)
    agent ◀──HTTP── ASGI server: the ring wakes the waiting request, which answers

and, for a call the product dispatches in the request (ledger/request_dispatch.py), `POST
/call-here`: the server itself commits the call already claimed (one statement, as the product
inserts it `dispatched` in the proposal's write), calls the provider, commits the receipt and
answers — no broker, no worker, no ring. `POST /refund-here` does the same with a write for its
provider call (the refund of bench/system.py, keyed by its order): the whole system's floor.

Here the server is a bare ASGI callable under the same uvicorn (uvloop, httptools; one process,
as `make run` starts one), writing with async psycopg from a pool and waiting on one Redis
subscription per process; the worker is a plain process of threads, each blocked in BRPOP with
its own connections, one committed statement per step. No Django, no Celery, no serialization
beyond a few bytes: whatever the product spends above this on the same machine, in the same
run, is its code's; what this spends is the machine's and the architecture's.

    .venv/bin/python -m bench.pipeline_floor worker   # what bench/latency.py starts, with
    .venv/bin/python -m uvicorn bench.pipeline_floor:app  # FLOOR_DATABASE_URL, FLOOR_REDIS_URL
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
WORK = "bench-pipeline-floor-work"  # the broker's list
RINGS = "bench-pipeline-floor-rings"  # the doorbell's channel: a ring names the call
TABLE = "bench_pipeline_floor"
WORKER_THREADS = 8  # as many calls at once as the product's worker (CELERY_WORKER_CONCURRENCY)
SERVER_CONNECTIONS = 10  # the product server's pool


def libpq_url(url: str) -> str:
    """psycopg takes `postgresql://`; Django's settings also accept `postgres://`."""
    return url.replace("postgres://", "postgresql://", 1)


def database_url() -> str:
    return libpq_url(os.environ["FLOOR_DATABASE_URL"])


def prepare(url: str) -> None:
    import psycopg

    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, order_id text NOT NULL, "
                     "status text NOT NULL, result text)")


# --- the server: a bare ASGI app ---------------------------------------------------------------


class Server:
    def __init__(self) -> None:
        self.pool = None
        self.redis = None
        self.provider: httpx.AsyncClient | None = None
        self.waiting: dict[str, asyncio.Future] = {}
        self.listener: asyncio.Task | None = None

    async def start(self) -> None:
        import redis.asyncio as aioredis
        from psycopg_pool import AsyncConnectionPool

        self.pool = AsyncConnectionPool(database_url(), min_size=SERVER_CONNECTIONS, max_size=SERVER_CONNECTIONS,
                                        kwargs={"autocommit": True}, open=False)
        await self.pool.open(wait=True)
        self.redis = aioredis.Redis.from_url(os.environ["FLOOR_REDIS_URL"])
        self.provider = httpx.AsyncClient(base_url=os.environ["FLOOR_PROVIDER_URL"], timeout=30)
        self.listener = asyncio.get_running_loop().create_task(self.listen())

    async def listen(self) -> None:
        subscription = self.redis.pubsub()
        await subscription.subscribe(RINGS)
        async for message in subscription.listen():
            if message["type"] == "message":
                future = self.waiting.pop(message["data"].decode(), None)
                if future is not None and not future.done():
                    future.set_result(None)

    async def call(self, body: bytes) -> bytes:
        order_id = json.loads(body)["order_id"]
        async with self.pool.connection() as conn:
            row = await (await conn.execute(f"INSERT INTO {TABLE} (order_id, status) VALUES (%s, 'created') "
                                            "RETURNING id", [order_id])).fetchone()
        call_id = str(row[0])
        ringed = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = ringed
        await self.redis.lpush(WORK, f"{call_id} {order_id}")
        await asyncio.wait_for(ringed, timeout=10)
        async with self.pool.connection() as conn:
            status, result = await (await conn.execute(f"SELECT status, result FROM {TABLE} WHERE id = %s",
                                                       [row[0]])).fetchone()
        return json.dumps({"call_id": call_id, "status": status, "result": result}).encode()

    async def call_here(self, body: bytes) -> bytes:
        """The dispatch in the request, as the product runs it: the call written already claimed
        (the product inserts it `dispatched`), the provider read, the receipt (two commits), in
        this process."""
        order_id = json.loads(body)["order_id"]

        async def read() -> str:
            return (await self.provider.get(f"/orders/{order_id}")).text

        return await self._here(order_id, read)

    async def refund_here(self, body: bytes) -> bytes:
        """`call_here` with a write for its provider call: the body POSTed as a refund with the
        order as its idempotency key, as bench/system.py's agents propose it."""
        refund = json.loads(body)

        async def pay() -> str:
            response = await self.provider.post("/refunds", json=refund,
                                                headers={"Idempotency-Key": refund["order_id"]})
            response.raise_for_status()
            return response.text

        return await self._here(refund["order_id"], pay)

    async def _here(self, order_id: str, provide) -> bytes:
        async with self.pool.connection() as conn:
            row = await (await conn.execute(f"INSERT INTO {TABLE} (order_id, status) VALUES (%s, 'dispatched') "
                                            "RETURNING id", [order_id])).fetchone()
        result = await provide()
        async with self.pool.connection() as conn:
            await conn.execute(f"UPDATE {TABLE} SET status = 'confirmed', result = %s WHERE id = %s",
                               [result, row[0]])  # the receipt
        return json.dumps({"call_id": str(row[0]), "status": "confirmed", "result": result}).encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await self.start()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] != "POST":
            answer = b"{}"
        else:
            handle = {"/call-here": self.call_here, "/refund-here": self.refund_here}.get(scope["path"], self.call)
            answer = await handle(body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})


app = Server()


# --- the worker: threads blocked on the broker's list ----------------------------------------


def work(provider_url: str) -> None:
    import psycopg
    import redis

    broker = redis.Redis.from_url(os.environ["FLOOR_REDIS_URL"])
    with psycopg.connect(database_url(), autocommit=True) as conn, \
            httpx.Client(base_url=provider_url, timeout=30) as provider:
        while True:
            _, item = broker.brpop([WORK])
            call_id, order_id = item.decode().split(" ", 1)
            conn.execute(f"UPDATE {TABLE} SET status = 'dispatched' WHERE id = %s", [call_id])  # the claim
            result = provider.get(f"/orders/{order_id}").text
            conn.execute(f"UPDATE {TABLE} SET status = 'confirmed', result = %s WHERE id = %s",
                         [result, call_id])  # the receipt
            broker.publish(RINGS, call_id)


def run_worker() -> None:
    provider_url = os.environ["FLOOR_PROVIDER_URL"]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # for sigwait, below
    threads = [threading.Thread(target=work, args=(provider_url,), daemon=True) for _ in range(WORKER_THREADS)]
    for thread in threads:
        thread.start()
    signal.sigwait({signal.SIGINT, signal.SIGTERM})


# --- started and driven by bench/latency.py ------------------------------------------------


class Pipeline:
    """The floor's server and worker as two processes, on the product's database server and Redis."""

    def __init__(self, database_url: str, redis_url: str, provider_url: str) -> None:
        self.env = {**os.environ, "FLOOR_DATABASE_URL": database_url, "FLOOR_REDIS_URL": redis_url,
                    "FLOOR_PROVIDER_URL": provider_url}
        self.procs: list[subprocess.Popen] = []
        self.port = 0

    def start(self) -> Pipeline:
        prepare(self.env["FLOOR_DATABASE_URL"])
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        for command in ([sys.executable, "-m", "bench.pipeline_floor", "worker"],
                        [sys.executable, "-m", "uvicorn", "bench.pipeline_floor:app", "--host", "127.0.0.1",
                         "--port", str(self.port), "--lifespan", "on", "--log-level", "warning"]):
            self.procs.append(subprocess.Popen(command, cwd=ROOT, env=self.env, start_new_session=True))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/", timeout=1).raise_for_status()
                return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("the pipeline floor's server did not start in 30 s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    run_worker()
