"""Benchmark of the operation ledger on PostgreSQL, against baselines measured in the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/countersign_bench \\
        .venv/bin/python bench/ledger.py [--fresh] [--seconds 5] [--clients 1,8] [--runs 3]

(needs `pip install -e '.[bench]'` for the DBOS baseline; figures in docs/benchmarks.md). In
every run, for each client count, interleaved so that a noisy neighbour hurts them all alike:

- roundtrip: `SELECT 1`, one round trip, to read the others by.
- raw (b): single-row INSERTs in autocommit on the same database, one commit each: the
  physical limit of this server and disk.
- lifecycle (a): the full life of an auto-dispatched write call through the service layer, as
  a server runs a waiting agent's call (ledger/request_dispatch.py): `call_propose` (gate →
  ledger → claim, one transaction; L0 so no approval; `dispatch_here`, so nothing is published)
  → `dispatcher.settle` (in-process no-op provider → receipt). An operation counts when its receipt is committed
  (`confirmed`). All clients in one tenant; with several clients also "a tenant per client".
- dbos (c): a one-step DBOS workflow, its system database on the same server.
- floor (d): the lifecycle's own statements replayed straight through psycopg, nothing in
  between (bench/floor.py): one at a time as the service layer sends them, and pipelined (a
  round trip per transaction). The bound of any client that keeps these writes: if the floor
  misses a target, no implementation of this protocol on this server meets it. And the same
  statements through Django's database layer (its atomic blocks and cursor wrapper, no gate or
  ledger code): the share of the gap that is the framework's, not the lifecycle's own.

Then commits per lifecycle (pg_stat_database.xact_commit, cross-checked by counting Django's
statements and commits) and function calls per lifecycle (a figure no load moves), and the HTTP API in front (uvicorn, 1 and 16 clients): the proposal
`POST /api/v1/tasks/{id}/calls` and `GET /api/v1/operations/{id}`. The broker is in memory, so
the HTTP figures are the proposal alone; no dispatch runs behind them.

With `--processes`, the lifecycle is then measured against the floor and against DBOS once more,
each pair in alternating slices of one run (bench/paired.py), so that a drift of the machine hits
both sides of a ratio alike.

Prints medians of the runs, the ratios of figures measured side by side and whether the targets
are met. Timings are never asserted in tests: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import floor, paired  # noqa: E402 - after the path is set

TOOL = "bench.noop"
TENANT = "bench"
AGENT = "bench-agent"
AGENT_TOKEN = "bench-agent-token"
# The yardsticks: the lifecycle's own statements replayed with no code in between (the floor,
# one statement per round trip), and DBOS doing a one-step workflow on the same server.
TARGET_VS_FLOOR = 0.8
TARGET_VS_DBOS = 1.0
HTTP_CLIENTS = 16

# Latency of the two halves of a lifecycle (proposal, dispatch), appended by every client thread
# (list.append is atomic under the GIL); emptied before each lifecycle measurement.
PHASES: dict[str, list[float]] = {"propose": [], "dispatch": []}


# --- results ---------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    clients: int
    ops: int
    seconds: float
    latencies: list[float] = field(repr=False)
    cpu_seconds: float = 0.0  # this process's CPU time (all threads) during the measurement
    sys_seconds: float = 0.0  # of which in the kernel (loopback TCP, context switches)
    sealed: int = 0  # event rows the sealer process linked (clients as processes, with `seal_every`)
    sealer_cpu_seconds: float = 0.0

    @property
    def sealer_ms_per_op(self) -> float:
        return self.sealer_cpu_seconds / self.ops * 1000 if self.ops else 0.0

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies, 50) * 1000

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies, 99) * 1000

    @property
    def cpu_ms_per_op(self) -> float:
        return self.cpu_seconds / self.ops * 1000 if self.ops else 0.0

    @property
    def sys_ms_per_op(self) -> float:
        return self.sys_seconds / self.ops * 1000 if self.ops else 0.0

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "clients": self.clients, "ops": self.ops, "seconds": round(self.seconds, 3),
                "ops_per_s": round(self.ops_per_s, 1), "p50_ms": round(self.p50_ms, 2),
                "p99_ms": round(self.p99_ms, 2), "client_cpu_ms_per_op": round(self.cpu_ms_per_op, 2),
                "client_sys_ms_per_op": round(self.sys_ms_per_op, 2)}


def percentile(values: list[float], pct: float) -> float:
    """Nearest rank: the smallest value with at least pct% of the values at or below it."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def run_clients(name: str, clients: int, seconds: float,
                make_client: Callable[[int], tuple[Callable[[], Any], Callable[[], None]]]) -> Result:
    """N threads; each builds its client (untimed), waits for the others, then calls its
    operation in a loop for `seconds`. Latency per call; throughput over the wall clock."""
    barrier = threading.Barrier(clients + 1)
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(index: int) -> None:
        teardown: Callable[[], None] = lambda: None  # noqa: E731
        try:
            op, teardown = make_client(index)
            op()  # warm: first connection, prepared statements, caches
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            barrier.abort()
            teardown()
            return
        try:
            barrier.wait()
            mine = latencies[index]
            clock = time.perf_counter
            while not stop.is_set():
                started = clock()
                op()
                mine.append(clock() - started)
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()
        finally:
            teardown()

    threads = [threading.Thread(target=worker, args=(i,), name=f"{name}-{i}", daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    times0, started = os.times(), time.perf_counter()
    if not errors:
        stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed, times1 = time.perf_counter() - started, os.times()
    sys_cpu = times1.system - times0.system
    cpu = times1.user - times0.user + sys_cpu
    if errors:
        raise RuntimeError(f"{name} with {clients} clients failed: {errors[0]!r}") from errors[0]
    flat = [x for per in latencies for x in per]
    return Result(name=name, clients=clients, ops=len(flat), seconds=elapsed, latencies=flat, cpu_seconds=cpu,
                  sys_seconds=sys_cpu)


def _process_client(kind: str, index: int, url: str, dbos_url: str, barrier, stop, results) -> None:
    """One client in a process of its own (spawned: Django set up afresh, its own connections,
    its own GIL). Reports its latencies, CPU time and phases, then exits."""
    setup_django(url)
    phases = {name: [] for name in PHASES}
    recording: list[floor.Recording] = []
    try:
        op, teardown = process_client_factory(kind, url, dbos_url, recording)(index)
        op()  # warm, untimed
        # As the product's servers and workers do (console.asgi, console.celery), every kind of
        # client alike: what start-up made is out of the collector's sight.
        gc.freeze()
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        results.put((index, None, 0.0, 0.0, phases, None, f"{type(exc).__name__}: {exc}"))
        barrier.abort()
        return
    for values in PHASES.values():
        values.clear()
    latencies: list[float] = []
    error = ""
    try:
        barrier.wait()
        times0 = os.times()
        clock = time.perf_counter
        while not stop.is_set():
            started = clock()
            op()
            latencies.append(clock() - started)
        times1 = os.times()
    except BaseException as exc:  # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}"
        stop.set()
        times1 = times0 = os.times()
    finally:
        teardown()
    results.put((index, latencies, times1.user - times0.user, times1.system - times0.system,
                 {name: list(values) for name, values in PHASES.items()}, recording[0] if recording else None, error))


def process_client_factory(kind: str, url: str, dbos_url: str, recordings: list[floor.Recording]):
    """The client factories by name, for clients that are processes."""
    if kind == "roundtrip":
        return roundtrip_client_factory(url)
    if kind == "raw":
        return raw_client_factory(url)
    if kind == "lifecycle":
        return lifecycle_client
    if kind == "lifecycle, a tenant per client":
        return partial(lifecycle_client, own_tenant=True)
    if kind in FLOOR_SHAPES:
        return floor_client_factory(url, shape=FLOOR_SHAPES[kind], recordings=recordings)
    if kind == "dbos":
        return Dbos(dbos_url).client
    raise ValueError(kind)


def sealer_process(url: str, interval: float, barrier, stop, clients_done, results) -> None:
    """The event log's sealer as beat runs it (`console.seal_events`): `audit.seal_pending`
    every `interval` seconds during the measurement, then, once every client has finished its
    last lifecycle, the rest; reports its rows and CPU."""
    setup_django(url)
    from console.lib import audit

    sealed = 0
    barrier.wait()
    times0 = os.times()
    while not stop.wait(interval):
        sealed += audit.seal_pending()
    times1 = os.times()
    clients_done.wait(300)
    sealed += audit.seal_pending()
    results.put((sealed, (times1.user - times0.user) + (times1.system - times0.system)))


def run_processes(name: str, clients: int, seconds: float, *, url: str, dbos_url: str,
                  recordings: list[floor.Recording], seal_every: float | None = None) -> Result:
    """N client processes, as a deployment runs its servers and workers: none shares a GIL or
    an interpreter with another. Set-up and warm-up are untimed; throughput over the wall clock.
    With `seal_every`, a sealer process beside them, as beat runs one on PostgreSQL."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(clients + 1 + (seal_every is not None))
    stop, clients_done = context.Event(), context.Event()
    results, sealer_results = context.Queue(), context.Queue()
    children = [context.Process(target=_process_client, args=(name, i, url, dbos_url, barrier, stop, results),
                                name=f"{name}-{i}", daemon=True) for i in range(clients)]
    if seal_every is not None:
        children.append(context.Process(target=sealer_process, name="sealer", daemon=True,
                                        args=(url, seal_every, barrier, stop, clients_done, sealer_results)))
    for child in children:
        child.start()
    try:
        barrier.wait(timeout=300)
    except threading.BrokenBarrierError:
        pass
    started = time.perf_counter()
    if not barrier.broken:
        stop.wait(seconds)
    stop.set()
    reports = [results.get(timeout=300) for _ in range(clients)]
    elapsed = time.perf_counter() - started
    clients_done.set()
    sealed, sealer_cpu = sealer_results.get(timeout=300) if seal_every is not None else (0, 0.0)
    for child in children:
        child.join(timeout=60)
    errors = [report[-1] for report in reports if report[-1]]
    if errors:
        raise RuntimeError(f"{name} with {clients} processes failed: {errors[0]}")
    flat = [x for report in reports for x in report[1]]
    for report in reports:
        for phase, values in report[4].items():
            PHASES[phase].extend(values)
        if report[5] is not None:
            recordings.append(report[5])
    user = sum(report[2] for report in reports)
    system = sum(report[3] for report in reports)
    return Result(name=name, clients=clients, ops=len(flat), seconds=elapsed, latencies=flat,
                  cpu_seconds=user + system, sys_seconds=system, sealed=sealed, sealer_cpu_seconds=sealer_cpu)


# --- database set-up -------------------------------------------------------------------------


def with_database(url: str, name: str, scheme: str | None = None) -> str:
    parts = urlsplit(url)
    return urlunsplit((scheme or parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def ensure_database(url: str, *, fresh: bool = False) -> None:
    import psycopg
    from psycopg import sql

    name = database_name(url)
    with psycopg.connect(with_database(url, "postgres"), autocommit=True) as conn:
        if fresh:
            # The dispatcher's circuit-breaker query grows with the ledger's history, so a run
            # on an old bench database is slower than one on a new one: start from empty.
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            print(f"created database {name}")


def setup_django(url: str) -> None:
    # Before settings are read: production-like (no DEBUG query log), and a broker that keeps
    # the on_commit enqueue in this process — the benchmark dispatches inline instead.
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ.setdefault("DEBUG", "false")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from console.celery import app

    app.conf.broker_url = "memory://"
    app.conf.task_always_eager = False
    # The memory transport warns that it has no hostname; it needs none.
    logging.getLogger("kombu.connection").setLevel(logging.ERROR)

    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def tenant_slug(index: int) -> str:
    return TENANT if index == 0 else f"{TENANT}-{index}"


def ensure_fixtures(max_tenants: int = 1) -> None:
    from approvals.defaults import ensure_policy_defaults
    from approvals.models import Tool
    from console.models import AgentPrincipal, Tenant

    ensure_policy_defaults()
    tool, _ = Tool.objects.update_or_create(
        name=TOOL,
        defaults=dict(adapter="noop", kind=Tool.Kind.WRITE, idempotency=Tool.Idempotency.NATIVE, base_tier=0,
                      json_schema={"type": "object"}, description="Benchmark: in-process no-op provider.",
                      enabled=True, timeout_seconds=5, max_attempts=3),
    )
    tool.escalation_rules.all().delete()
    for index in range(max_tenants):
        slug = tenant_slug(index)
        tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": f"Benchmark {slug}"})
        agent = AgentPrincipal.objects.filter(tenant=tenant, name=AGENT).first()
        if agent is None:
            agent = AgentPrincipal(tenant=tenant, name=AGENT)
        agent.set_token(AGENT_TOKEN if index == 0 else f"{AGENT_TOKEN}-{index}")
        agent.is_active = True
        agent.save()
        agent.allowed_tools.add(tool)


def ledger_size() -> int:
    from django.db import connections

    from ledger.models import Operation

    try:
        return Operation.objects.count()
    finally:
        connections.close_all()


def load_agent(tenant_index: int = 0):
    from console.models import AgentPrincipal

    return AgentPrincipal.objects.select_related("tenant").get(tenant__slug=tenant_slug(tenant_index), name=AGENT)


@dataclass
class RunningTask:
    task_id: str
    version: int
    fencing_token: int


def start_task(agent, owner: str) -> RunningTask:
    """A task driven to `running` through the services, with its lease (as an agent would)."""
    from ledger import decisions
    from runs import services as run_services

    task = run_services.task_create(principal=agent, task_type="bench", goal="Benchmark the ledger")
    lease = decisions.lease_acquire(task_id=task.task_id, owner=owner, ttl_seconds=3600)
    for to in ("planning", "running"):
        task = run_services.task_transition(task_id=task.task_id, to=to, expected_version=task.version,
                                            fencing_token=lease.fencing_token, actor=agent.ref)
    return RunningTask(task_id=task.task_id, version=task.version, fencing_token=lease.fencing_token)


# --- (a) the lifecycle -----------------------------------------------------------------------


def lifecycle_client(index: int, *, own_tenant: bool = False) -> tuple[Callable[[], None], Callable[[], None]]:
    """One agent task per client (proposals of one task serialize on its row, by design);
    each operation a new step and call ID. All clients in one tenant, or each in its own (every
    claim counts its tenant's operations in flight)."""
    one, close = lifecycle_runner(index, own_tenant=own_tenant)
    seq = itertools.count(1)

    def op() -> None:
        n = next(seq)
        one(f"c{n}", f"s{n}")

    return op, close


def lifecycle_runner(index: int, *, own_tenant: bool = False) -> tuple[Callable[[str, str], str], Callable[[], None]]:
    """`one(call_id, step_id) -> operation_id`: one lifecycle of a new task's call, confirmed."""
    from django.db import connections

    from approvals.gate import Decision
    from ledger.dispatcher import settle
    from ledger.models import OperationStatus
    from ledger.proposals import call_propose

    agent = load_agent(index if own_tenant else 0)
    run = start_task(agent, owner=f"bench-{index}")

    clock = time.perf_counter
    propose_times, dispatch_times = PHASES["propose"], PHASES["dispatch"]

    def one(call_id: str, step_id: str) -> str:
        started = clock()
        proposal = call_propose(
            principal=agent, task_id=run.task_id, call_id=call_id, step_id=step_id, tool_name=TOOL,
            arguments={"step": step_id}, expected_version=run.version, fencing_token=run.fencing_token,
            dispatch_here=True,
        )
        if proposal.decision != Decision.DISPATCHED or not proposal.dispatch_here:
            raise RuntimeError(f"proposal {call_id} was {proposal.decision}: {proposal.reasons}")
        proposed = clock()
        result, _ = settle(proposal.operation_id, proposal.claim)
        propose_times.append(proposed - started)
        dispatch_times.append(clock() - proposed)
        if result != OperationStatus.CONFIRMED:
            raise RuntimeError(f"dispatch of {proposal.operation_id} ended {result}")
        return proposal.operation_id

    return one, connections.close_all


# The floor's clients by name, and the replay shape each runs (bench/floor.py).
FLOOR_SHAPES = {"floor": "one at a time", "floor, pipelined": "pipelined", "floor, through Django": "through Django"}


def floor_client_factory(url: str, *, shape: str, recordings: list[floor.Recording]):
    """(d) Each client records one real lifecycle of its own task, then replays its statements
    (bench/floor.py). The recordings are kept for the report."""

    def make(index: int):
        from django.db import connections

        one, close = lifecycle_runner(index)
        one("warm-" + str(index), "warm-" + str(index))  # prepared statements, caches: as the lifecycle's warm-up
        recording = floor.record(one)
        close()
        recordings.append(recording)
        replayer = floor.Replayer(url, recording, shape=shape)

        def done() -> None:
            replayer.close()
            connections.close_all()

        return replayer.replay, done

    return make


# --- (b) raw commits -------------------------------------------------------------------------

RAW_TABLE = """CREATE TABLE IF NOT EXISTS bench_raw (
    id bigserial PRIMARY KEY, client int NOT NULL, n bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())"""


def raw_client_factory(url: str) -> Callable[[int], tuple[Callable[[], None], Callable[[], None]]]:
    import psycopg

    def make(index: int):
        conn = psycopg.connect(url, autocommit=True)
        seq = itertools.count(1)

        def op() -> None:
            conn.execute("INSERT INTO bench_raw (client, n) VALUES (%s, %s)", (index, next(seq)))

        return op, conn.close

    return make


def roundtrip_client_factory(url: str) -> Callable[[int], tuple[Callable[[], None], Callable[[], None]]]:
    """`SELECT 1`: one round trip, nothing to flush — what each of a lifecycle's statements costs
    at least on this machine at this moment."""
    import psycopg

    def make(index: int):
        conn = psycopg.connect(url, autocommit=True)
        return (lambda: conn.execute("SELECT 1").fetchone()), conn.close

    return make


# --- (c) DBOS --------------------------------------------------------------------------------


class Dbos:
    """A one-step DBOS workflow; launched once per process (DBOS is a singleton)."""

    def __init__(self, system_url: str) -> None:
        from dbos import DBOS

        logging.getLogger("dbos").setLevel(logging.WARNING)
        self.DBOS = DBOS

        @DBOS.step()
        def bench_step(n: int) -> int:
            return n + 1  # the in-process no-op provider's counterpart

        @DBOS.workflow()
        def bench_workflow(n: int) -> int:
            return bench_step(n)

        self.workflow = bench_workflow
        # An executor ID per process: under the default one ("local") each client process launched
        # would recover, and run again, the workflows the others have in flight.
        DBOS(config={"name": "countersign-bench", "system_database_url": system_url, "log_level": "WARNING",
                     "executor_id": f"countersign-bench-{os.getpid()}"})
        DBOS.launch()
        logging.getLogger("dbos").setLevel(logging.WARNING)

    def client(self, index: int):
        seq = itertools.count(1)

        def op() -> None:
            n = next(seq)
            if self.workflow(n) != n + 1:
                raise RuntimeError("DBOS workflow returned a wrong value")

        return op, lambda: None

    def destroy(self) -> None:
        self.DBOS.destroy()


class SqlAlchemyCounter:
    """Counts the statements and commits DBOS sends (through SQLAlchemy) from this thread —
    the workflow runs in its caller's thread; DBOS's background threads are left out."""

    def __init__(self) -> None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        self.statements = 0
        self.commits = 0
        self._thread = threading.get_ident()
        event.listen(Engine, "before_cursor_execute", self._statement)
        event.listen(Engine, "commit", self._commit)

    def _statement(self, *args, **kwargs) -> None:
        if threading.get_ident() == self._thread:
            self.statements += 1

    def _commit(self, *args, **kwargs) -> None:
        if threading.get_ident() == self._thread:
            self.commits += 1

    def close(self) -> None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.remove(Engine, "before_cursor_execute", self._statement)
        event.remove(Engine, "commit", self._commit)


# --- commits per operation -------------------------------------------------------------------


class Stats:
    """pg_stat_database.xact_commit of one database, read from a connection to another one
    (so the reads are not counted). Statistics are flushed asynchronously (a backend reports at
    most once a second, and at exit): wait until the figure stops moving."""

    def __init__(self, url: str, dbname: str) -> None:
        import psycopg

        self.dbname = dbname
        self.conn = psycopg.connect(with_database(url, "postgres"), autocommit=True)

    def read(self, column: str = "xact_commit") -> int:
        from psycopg import sql

        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute(sql.SQL("SELECT {} FROM pg_stat_database WHERE datname = %s").format(
            sql.Identifier(column)), [self.dbname]).fetchone()
        return int(row[0])

    def settled(self, column: str = "xact_commit", *, quiet: float = 1.5, timeout: float = 15.0) -> int:
        deadline = time.monotonic() + timeout
        value, since = self.read(column), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.read(column)
            if now != value:
                value, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                break
        return value

    def close(self) -> None:
        self.conn.close()


class DjangoCounter:
    """Counts what this thread's Django connection sends: statements, savepoints, statements
    in autocommit (each its own transaction) and the commits of outermost atomic blocks."""

    def __init__(self) -> None:
        self.statements = 0
        self.savepoints = 0
        self.autocommit_statements = 0
        self.autocommit_writes = 0
        self.commits = 0

    def __call__(self, execute, sql, params, many, context):
        self.statements += 1
        head = sql.lstrip()[:24].upper()
        if head.startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")):
            self.savepoints += 1
        elif not context["connection"].in_atomic_block:
            self.autocommit_statements += 1
            self.autocommit_writes += bool(floor.writes(sql))
        return execute(sql, params, many, context)

    @property
    def transactions(self) -> int:
        return self.commits + self.autocommit_statements


def _on_own_thread(body: Callable[[], None], name: str) -> None:
    """Run `body` on a new thread (its own database connection) and raise what it raised."""
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            body()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=guarded, name=name)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def measure_lifecycle_calls(count: int) -> float:
    """Function calls (Python and built-in, this thread, `sys.setprofile`) per lifecycle, over
    `count` single-threaded lifecycles after a warm-up: a figure no load moves, for before/after
    pairs of the client's code."""
    calls = [0.0]

    def body() -> None:
        from django.db import connections

        op, _ = lifecycle_client(0)
        for _ in range(20):
            op()
        counted = [0]

        def count_call(frame, event, arg) -> None:
            if event in ("call", "c_call"):
                counted[0] += 1

        sys.setprofile(count_call)
        try:
            for _ in range(count):
                op()
        finally:
            sys.setprofile(None)
        calls[0] = counted[0] / count
        connections.close_all()

    _on_own_thread(body, "calls")
    return calls[0]


def measure_lifecycle_commits(url: str, count: int) -> dict[str, Any]:
    """Single-threaded batch of `count` lifecycles; the task and lease are set up before."""
    out: dict[str, Any] = {}

    def body() -> None:
        from django.db import connection, connections

        op, _ = lifecycle_client(0)
        op()
        connections.close_all()  # the backend's exit flushes its statistics
        stats = Stats(url, database_name(url))
        try:
            connection.ensure_connection()
            before = stats.settled()
            counter = DjangoCounter()
            original_commit = connection.commit

            def counting_commit() -> None:
                counter.commits += 1
                original_commit()

            connection.commit = counting_commit  # this thread's wrapper only
            try:
                with connection.execute_wrapper(counter):
                    for _ in range(count):
                        op()
            finally:
                del connection.commit
            connections.close_all()
            after = stats.settled()
        finally:
            stats.close()
        out.update(
            lifecycles=count,
            pg_xact_commit=after - before,
            commits_per_lifecycle=(after - before) / count,
            django_transactions_per_lifecycle=counter.transactions / count,
            django_atomic_commits_per_lifecycle=counter.commits / count,
            django_autocommit_statements_per_lifecycle=counter.autocommit_statements / count,
            django_autocommit_writes_per_lifecycle=counter.autocommit_writes / count,
            django_statements_per_lifecycle=counter.statements / count,
            django_savepoint_statements_per_lifecycle=counter.savepoints / count,
        )

    _on_own_thread(body, "commits")
    return out


def measure_dbos_commits(dbos: Dbos, url: str, dbos_db: str, count: int) -> dict[str, Any]:
    """DBOS keeps a pool of connections open, so its statistics are read after destroy()."""
    stats = Stats(url, dbos_db)
    counter = SqlAlchemyCounter()
    try:
        op, _ = dbos.client(0)
        op()
        before_statements, before_commits = counter.statements, counter.commits
        before = stats.settled(quiet=2.0)
        for _ in range(count):
            op()
        statements, commits = counter.statements - before_statements, counter.commits - before_commits
        dbos.destroy()
        after = stats.settled(quiet=2.0)
    finally:
        counter.close()
        stats.close()
    return {"workflows": count, "pg_xact_commit": after - before,
            # Includes DBOS's own background work (queue polling, recovery) during the batch.
            "commits_per_workflow_upper_bound": (after - before) / count,
            "sqlalchemy_commits_per_workflow": commits / count,
            "sqlalchemy_statements_per_workflow": statements / count}


# --- HTTP API --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, url: str, workers: int) -> None:
        from console.lib.procs import Child, http_ok, python, wait_until

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_dir = Path(tempfile.mkdtemp(prefix="countersign-bench-"))
        self.child = Child(
            name="uvicorn",
            argv=python("-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                        "--port", str(self.port), "--lifespan", "off", "--workers", str(workers),
                        "--no-access-log", "--log-level", "warning"),
            env={"DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "console.settings",
                 "CELERY_BROKER_URL": "memory://", "DEBUG": "false", "LOG_LEVEL": "WARNING"},
        ).start(log_dir=self.log_dir)
        try:
            wait_until(http_ok(self.base + "/healthz"), timeout=60, what="uvicorn /healthz")
        except TimeoutError:
            self.stop()
            raise

    def stop(self) -> None:
        self.child.stop()


def http_propose_factory(base: str, runs: list[RunningTask], created: list[list[str]], tag: str):
    import httpx

    def make(index: int):
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {AGENT_TOKEN}"}, timeout=30)
        run = runs[index]
        seq = itertools.count(1)
        mine = created[index]

        def op() -> None:
            n = next(seq)
            response = client.post(f"/api/v1/tasks/{run.task_id}/calls", json={
                "call_id": f"h{tag}-{n}", "step_id": f"h{tag}-{n}", "tool": TOOL, "arguments": {"n": n},
                "expected_version": run.version, "fencing_token": run.fencing_token,
            })
            if response.status_code != 201:
                raise RuntimeError(f"POST calls answered {response.status_code}: {response.text[:300]}")
            mine.append(response.json()["operation_id"])

        return op, client.close

    return make


def http_get_factory(base: str, operation_ids: list[str], clients: int):
    import httpx

    def make(index: int):
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {AGENT_TOKEN}"}, timeout=30)
        ids = itertools.cycle(operation_ids[index::clients] or operation_ids)

        def op() -> None:
            response = client.get(f"/api/v1/operations/{next(ids)}")
            if response.status_code != 200:
                raise RuntimeError(f"GET operation answered {response.status_code}: {response.text[:300]}")

        return op, client.close

    return make


# --- report ----------------------------------------------------------------------------------


def median_of(results: list[Result], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in results)


def machine() -> dict[str, str]:
    import psycopg

    info = {"python": platform.python_version(), "nproc": str(os.cpu_count())}
    try:
        info["free -h"] = subprocess.run(["free", "-h"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    with psycopg.connect(with_database(os.environ["DATABASE_URL"], "postgres"), autocommit=True) as conn:
        info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
        for name in ("synchronous_commit", "fsync", "wal_sync_method", "shared_buffers", "max_connections"):
            info[name] = conn.execute(f"SHOW {name}").fetchone()[0]
    try:
        from importlib.metadata import version

        import dbos  # noqa: F401

        info["dbos"] = version("dbos")
    except ImportError:
        info["dbos"] = "not installed"
    return info


def fmt_row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def print_table(title: str, rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    print(fmt_row(header, widths))
    print(fmt_row(["-" * w for w in widths], widths))
    for row in rows:
        print(fmt_row([str(c) for c in row], widths))


def print_paired(pairs: list[paired.Paired], client_counts: list[int]) -> None:
    rows = []
    for clients in client_counts:
        mine = {pair.kinds[1]: pair for pair in pairs if pair.clients == clients}
        row: list[Any] = [clients]
        for other, target in (("floor", TARGET_VS_FLOOR), ("dbos", TARGET_VS_DBOS)):
            pair = mine.get(other)
            if pair is None:
                row += ["n/a", "n/a", "n/a"]
                continue
            row += [f"{pair.ratio:.2f}", f"{min(pair.ratios):.2f}–{max(pair.ratios):.2f}",
                    "met" if pair.ratio >= target else "MISSED"]
        floor_pair = mine.get("floor")
        row.append("n/a" if floor_pair is None else
                   f"{floor_pair.cpu_ms_per_op[0]:.2f} ÷ {floor_pair.cpu_ms_per_op[1]:.2f}")
        row.append("n/a" if floor_pair is None else
                   f"{floor_pair.pg_ms_per_op[0]:.2f} ÷ {floor_pair.pg_ms_per_op[1]:.2f}")
        rows.append(row)
    blocks, slice_seconds = len(pairs[0].blocks), pairs[0].slice_seconds
    print_table(f"Lifecycle in alternating slices with its yardstick (bench/paired.py): median of {blocks} ABBA "
                f"blocks of {slice_seconds:g} s slices", rows,
                ["clients", "÷ floor", "blocks", f"≥ {TARGET_VS_FLOOR:g}", "÷ DBOS", "blocks", f"≥ {TARGET_VS_DBOS:g}",
                 "client CPU ms/op, lifecycle ÷ floor", "PostgreSQL CPU ms/op, lifecycle ÷ floor"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    parser.add_argument("--clients", default="1,8", help="comma-separated client counts")
    parser.add_argument("--runs", type=int, default=3, help="runs of every measurement; medians are reported")
    parser.add_argument("--commit-batch", type=int, default=200, help="lifecycles in the commit count")
    parser.add_argument("--http-seconds", type=float, default=None, help="default: --seconds")
    parser.add_argument("--http-workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--processes", action="store_true",
                        help="clients are processes, as a deployment runs them (default: threads in this process)")
    parser.add_argument("--seal-every", type=float, default=1.0,
                        help="with --processes: seconds between the event sealer's runs beside the lifecycle and "
                             "floor clients (beat's EVENT_SEAL_SECONDS)")
    parser.add_argument("--paired-blocks", type=int, default=8,
                        help="with --processes: ABBA blocks of the paired measurements (0: none)")
    parser.add_argument("--paired-slice", type=float, default=0.5, help="seconds of a paired measurement's slice")
    parser.add_argument("--no-dbos", action="store_true")
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--fresh", action="store_true",
                        help="drop and recreate the bench databases first (only if their name contains 'bench')")
    args = parser.parse_args(argv)
    client_counts = [int(c) for c in args.clients.split(",") if c.strip()]
    http_seconds = args.http_seconds or args.seconds

    url = os.environ.get("DATABASE_URL", "")
    if urlsplit(url).scheme not in ("postgres", "postgresql"):
        print("bench/ledger.py measures PostgreSQL only (SQLite serializes every writer and is not a "
              "deployment target): set DATABASE_URL=postgres://postgres@127.0.0.1:5432/countersign_bench",
              file=sys.stderr)
        return 2
    bench_db = database_name(url)
    dbos_db = f"{bench_db}_dbos"
    if args.fresh and "bench" not in bench_db:
        print(f"--fresh drops the database; refusing for {bench_db!r} (its name lacks 'bench')", file=sys.stderr)
        return 2
    os.chdir(ROOT)
    ensure_database(url, fresh=args.fresh)
    if args.fresh:
        ensure_database(with_database(url, dbos_db), fresh=True)
    setup_django(url)
    ensure_fixtures(max(client_counts))
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW_TABLE)

    info = machine()
    print("machine:", json.dumps({k: v for k, v in info.items() if k != "free -h"}))
    print(f"command: DATABASE_URL={url} {' '.join([sys.executable.replace(str(ROOT) + '/', ''), *sys.argv])}")

    dbos = None
    dbos_error = ""
    if not args.no_dbos:
        try:
            dbos = Dbos(with_database(url, dbos_db, scheme="postgresql"))
        except Exception as exc:  # noqa: BLE001 - reported, the rest still runs
            dbos_error = f"{type(exc).__name__}: {exc}"
            print(f"DBOS could not run: {dbos_error}", file=sys.stderr)

    ledger_before = ledger_size()
    results: dict[tuple[str, int], list[Result]] = {}
    recordings: list[floor.Recording] = []
    phases: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for run in range(1, args.runs + 1):
        for clients in client_counts:
            plan: list[tuple[str, Callable]] = [
                ("roundtrip", roundtrip_client_factory(url)),
                ("raw", raw_client_factory(url)),
                ("lifecycle", lifecycle_client),
            ]
            if clients > 1:
                plan.append(("lifecycle, a tenant per client", partial(lifecycle_client, own_tenant=True)))
            plan += [(name, floor_client_factory(url, shape=shape, recordings=recordings))
                     for name, shape in FLOOR_SHAPES.items()]
            if dbos is not None:
                plan.append(("dbos", dbos.client))
            for name, factory in plan:
                for values in PHASES.values():
                    values.clear()
                if args.processes:
                    # The lifecycle and its floor write events: the sealer links them as beat would.
                    sealing = name.startswith(("lifecycle", "floor"))
                    result = run_processes(name, clients, args.seconds, url=url, recordings=recordings,
                                           dbos_url=with_database(url, dbos_db, scheme="postgresql"),
                                           seal_every=args.seal_every if sealing else None)
                else:
                    result = run_clients(name, clients, args.seconds, factory)
                results.setdefault((name, clients), []).append(result)
                print(f"run {run} {name:16} x{clients}: {result.ops_per_s:8.1f} ops/s  "
                      f"p50 {result.p50_ms:7.2f} ms  p99 {result.p99_ms:7.2f} ms  "
                      f"cpu {result.cpu_ms_per_op:5.2f} ms/op (sys {result.sys_ms_per_op:5.2f})"
                      + (f"  sealer {result.sealer_ms_per_op:.2f} ms/op ({result.sealed} rows)" if result.sealed else ""),
                      flush=True)
                if name.startswith("lifecycle"):
                    for phase, values in PHASES.items():
                        phases.setdefault((f"{name}: {phase}", clients), []).append(
                            (percentile(values, 50) * 1000, percentile(values, 99) * 1000))

    paired_results: list[paired.Paired] = []
    if args.processes and args.paired_blocks > 0:
        for clients in client_counts:
            for other in ("floor", *(("dbos",) if dbos is not None else ())):
                pair = paired.run(("lifecycle", other), clients, slice_seconds=args.paired_slice,
                                  blocks=args.paired_blocks, url=url, seal_every=args.seal_every,
                                  dbos_url=with_database(url, dbos_db, scheme="postgresql"))
                paired_results.append(pair)
                print(f"paired lifecycle ÷ {other:5} x{clients}: {pair.ratio:.2f} "
                      f"(blocks {min(pair.ratios):.2f}–{max(pair.ratios):.2f}), ops/s "
                      f"{statistics.median(a for a, _ in pair.blocks):.1f} ÷ "
                      f"{statistics.median(b for _, b in pair.blocks):.1f}, cpu "
                      f"{pair.cpu_ms_per_op[0]:.2f} ÷ {pair.cpu_ms_per_op[1]:.2f} ms/op, PostgreSQL "
                      f"{pair.pg_ms_per_op[0]:.2f} ÷ {pair.pg_ms_per_op[1]:.2f} ms/op", flush=True)

    ledger_after = ledger_size()
    print(f"\nledger: {ledger_before} operations before the measurements, {ledger_after} after")
    print(f"\ncounting commits over {args.commit_batch} single-threaded lifecycles ...", flush=True)
    commits = measure_lifecycle_commits(url, args.commit_batch)
    cpl = commits["commits_per_lifecycle"]
    # Read-only transactions (autocommit SELECTs) commit without a WAL flush; the ones that
    # write wait for the disk like a raw INSERT does (an atomic block, or one statement that
    # writes in autocommit). The stricter ceiling divides by those.
    write_cpl = commits["django_atomic_commits_per_lifecycle"] + commits["django_autocommit_writes_per_lifecycle"]
    commits["function_calls_per_lifecycle"] = round(measure_lifecycle_calls(args.commit_batch))
    print(json.dumps(commits, indent=1))

    dbos_commits: dict[str, Any] = {}
    if dbos is not None:
        print(f"counting DBOS commits over {args.commit_batch} workflows ...", flush=True)
        dbos_commits = measure_dbos_commits(dbos, url, dbos_db, args.commit_batch)
        print(json.dumps(dbos_commits, indent=1))

    http: dict[tuple[str, int], list[Result]] = {}
    http_sessions: list[float] = []
    if not args.no_http:
        from django.db import connections

        agent = load_agent()
        start_task(agent, owner="http-warm")  # this process's own session, before counting
        server = Server(url, args.http_workers)
        stats = Stats(url, bench_db)
        try:
            for run in range(1, args.runs + 1):
                # One client first: the service time, without queueing behind the others.
                for clients in (1, HTTP_CLIENTS):
                    tag = f"{run}-{clients}"
                    tasks = [start_task(agent, owner=f"http-{tag}-{i}") for i in range(clients)]
                    created: list[list[str]] = [[] for _ in range(clients)]
                    sessions_before = stats.settled("sessions")
                    post = run_clients("POST /tasks/{id}/calls", clients, http_seconds,
                                       http_propose_factory(server.base, tasks, created, tag=tag))
                    # A new PostgreSQL backend per request would be the cost of CONN_MAX_AGE=0.
                    http_sessions.append((stats.settled("sessions") - sessions_before) / max(1, post.ops))
                    ids = [op_id for per in created for op_id in per]
                    get = run_clients("GET /operations/{id}", clients, http_seconds,
                                      http_get_factory(server.base, ids, clients))
                    for result in (post, get):
                        http.setdefault((result.name, clients), []).append(result)
                        print(f"run {run} {result.name:22} x{clients:<2}: {result.ops_per_s:7.1f} req/s  "
                              f"p50 {result.p50_ms:7.2f} ms  p99 {result.p99_ms:7.2f} ms", flush=True)
        finally:
            server.stop()
            stats.close()
            connections.close_all()

    # --- the report: medians over runs; ratios per run, then their median ----------------------
    rows = []
    for (name, clients), rs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rows.append([name, clients, f"{median_of(rs, 'ops_per_s'):.1f}", f"{median_of(rs, 'p50_ms'):.2f}",
                     f"{median_of(rs, 'p99_ms'):.2f}", f"{median_of(rs, 'cpu_ms_per_op'):.2f}", len(rs)])
    print_table(f"Throughput and latency, medians of {args.runs} runs of {args.seconds:g} s",
                rows, ["benchmark", "clients", "ops/s", "p50 ms", "p99 ms", "client CPU ms/op", "runs"])
    rows = [[phase, clients, f"{statistics.median(p50 for p50, _ in v):.2f}",
             f"{statistics.median(p99 for _, p99 in v):.2f}"] for (phase, clients), v in sorted(phases.items(),
                                                                                            key=lambda kv: kv[0][1])]
    print_table("Where a lifecycle's time goes (medians)", rows, ["phase", "clients", "p50 ms", "p99 ms"])
    print(f"\ncommits per lifecycle: {cpl:.2f} (pg_stat_database.xact_commit); Django counted "
          f"{commits['django_transactions_per_lifecycle']:.2f} transactions "
          f"({commits['django_atomic_commits_per_lifecycle']:.2f} atomic commits + "
          f"{commits['django_autocommit_statements_per_lifecycle']:.2f} autocommit statements, "
          f"{commits['django_autocommit_writes_per_lifecycle']:.2f} of them writes), "
          f"{commits['django_statements_per_lifecycle']:.1f} statements "
          f"({commits['django_savepoint_statements_per_lifecycle']:.1f} savepoint statements)")
    if dbos_commits:
        print(f"DBOS per workflow: {dbos_commits['sqlalchemy_commits_per_workflow']:.2f} commits, "
              f"{dbos_commits['sqlalchemy_statements_per_workflow']:.1f} statements (SQLAlchemy); "
              f"pg_stat {dbos_commits['commits_per_workflow_upper_bound']:.2f} (includes its background work)")

    if recordings:
        shapes = sorted({(r.statements, len(r.transactions), r.write_commits) for r in recordings})
        print("floor: each replay sends " + "; ".join(
            f"{n} statements in {t} transactions ({w} with a commit that writes)" for n, t, w in shapes)
            + ", the lifecycle's own, recorded by each client")

    ratios: dict[str, dict[str, Any]] = {}
    ratio_rows = []
    for clients in client_counts:
        raw = results.get(("raw", clients), [])
        dbo = results.get(("dbos", clients), [])
        for variant in ("lifecycle", "lifecycle, a tenant per client", *FLOOR_SHAPES):
            life = results.get((variant, clients), [])
            if not life:
                continue
            # Ratios of figures measured side by side in one run, then their median.
            pairs = list(zip(life, raw, strict=True))
            entry: dict[str, Any] = {
                "physical_ceiling_ops_s": statistics.median(rr.ops_per_s / cpl for rr in raw),
                "lifecycle_vs_physical": statistics.median(lr.ops_per_s / (rr.ops_per_s / cpl) for lr, rr in pairs),
                "write_ceiling_ops_s": statistics.median(rr.ops_per_s / write_cpl for rr in raw),
                "lifecycle_vs_write_ceiling": statistics.median(
                    lr.ops_per_s / (rr.ops_per_s / write_cpl) for lr, rr in pairs),
            }
            if dbo:
                entry["lifecycle_vs_dbos"] = statistics.median(
                    lr.ops_per_s / dr.ops_per_s for lr, dr in zip(life, dbo, strict=True))
            floor_runs = results.get(("floor", clients), [])
            if floor_runs and variant != "floor":
                entry["lifecycle_vs_floor"] = statistics.median(
                    lr.ops_per_s / fr.ops_per_s for lr, fr in zip(life, floor_runs, strict=True))
            django_runs = results.get(("floor, through Django", clients), [])
            if django_runs and variant.startswith("lifecycle"):
                entry["lifecycle_vs_floor_through_django"] = statistics.median(
                    lr.ops_per_s / fr.ops_per_s for lr, fr in zip(life, django_runs, strict=True))
            ratios[f"{variant}@{clients}"] = entry
            vs_dbos = entry.get("lifecycle_vs_dbos")
            vs_floor = entry.get("lifecycle_vs_floor")
            vs_django = entry.get("lifecycle_vs_floor_through_django")
            targeted = variant.startswith("lifecycle")  # the floors are yardsticks, not held to targets

            def verdict(value: float | None, target: float, targeted: bool = targeted) -> str:
                return "n/a" if value is None or not targeted else ("met" if value >= target else "MISSED")

            ratio_rows.append([
                variant, clients,
                f"{entry['physical_ceiling_ops_s']:.1f}",
                f"{entry['lifecycle_vs_physical']:.2f}",
                f"{entry['lifecycle_vs_write_ceiling']:.2f}",
                "n/a" if vs_floor is None else f"{vs_floor:.2f}",
                verdict(vs_floor, TARGET_VS_FLOOR),
                "n/a" if vs_django is None else f"{vs_django:.2f}",
                "n/a" if vs_dbos is None else f"{vs_dbos:.2f}",
                verdict(vs_dbos, TARGET_VS_DBOS),
            ])
    print_table("Ratios (median of the per-run ratios)", ratio_rows,
                ["", "clients", "raw/s ÷ commits per lifecycle", "lifecycle ÷ that",
                 f"same with {write_cpl:.0f} write commits", "÷ floor", f"≥ {TARGET_VS_FLOOR:g}",
                 "÷ floor through Django", "÷ DBOS", f"≥ {TARGET_VS_DBOS:g}"])
    if paired_results:
        print_paired(paired_results, client_counts)
    if dbos_error:
        print(f"\nDBOS baseline not measured: {dbos_error}")

    if http:
        rows = [[name, clients, f"{median_of(rs, 'ops_per_s'):.1f}", f"{median_of(rs, 'p50_ms'):.2f}",
                 f"{median_of(rs, 'p99_ms'):.2f}"] for (name, clients), rs in http.items()]
        print_table(f"HTTP API (uvicorn, {args.http_workers} workers, broker in memory: proposal only), "
                    f"medians of {args.runs} runs of {http_seconds:g} s",
                    rows, ["endpoint", "clients", "req/s", "p50 ms", "p99 ms"])
        print(f"new PostgreSQL sessions per POST request: {statistics.median(http_sessions):.2f} "
              "(pg_stat_database.sessions, counted while the POSTs ran)")

    if args.json:
        args.json.write_text(json.dumps({
            "machine": info, "args": vars(args) | {"json": str(args.json)},
            "results": {f"{n}@{c}": [r.summary() for r in rs] for (n, c), rs in results.items()},
            "ledger_operations": [ledger_before, ledger_after],
            "commits": commits, "dbos_commits": dbos_commits, "dbos_error": dbos_error,
            "ratios": ratios, "paired": [pair.summary() for pair in paired_results],
            "http": {f"{n}@{c}": [r.summary() for r in rs] for (n, c), rs in http.items()},
            "http_sessions_per_post": http_sessions,
        }, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
