"""Whole-system benchmark: agents as processes, over HTTP, to N ASGI servers and M Celery workers
on PostgreSQL and Redis, with every effect counted at the payments sandbox; beside it, in the
same run, DBOS doing the same provider call in a workflow step with as many processes.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cs_bench_system \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/5 CHANNEL_LAYER_URL=redis://127.0.0.1:6379/4 \\
        .venv/bin/python bench/system.py [--seconds 5] [--agents 1,4,8,16] [--servers 1,2] [--workers 1,2]

(needs `pip install -e '.[bench]'` for DBOS; figures in docs/benchmarks.md.)

Countersign: each agent is a spawned process with its own task; it proposes `bench.refund` (the
payments sandbox's refund adapter, L0 write, native idempotency: the gate runs it at once) with
`POST /api/v1/tasks/{id}/calls?wait=10` (as the Python client: the proposal answers once the call
is final), and long-polls `GET /api/v1/calls/{id}?until=final` only while the call is still open.
Agents are spread over the servers; the servers run with production settings as `make cluster`
starts them; the workers consume the fast queue, and one beat schedules what production's does
(the event log's sealer every second among it).

The floor: the same agents POST the refund to `bench/pipeline_floor.py`'s bare ASGI server under
the same uvicorn (`/refund-here`: the call committed already claimed, the refund POSTed, the
receipt committed, the answer), with nothing else in it; what Countersign spends above it on the
same machine, in the same run, is its code's.

DBOS: each process runs a workflow whose one step POSTs the same refund to the same sandbox
(idempotency key: the workflow ID); its system database on the same PostgreSQL server. And the
provider alone: the same processes POSTing the refund straight to the sandbox, the ceiling that
neither can pass.

For each grid cell (servers × workers) and agent count, both are measured one after the other;
with `--rounds R`, R times, every other round in the opposite order (ABBA), and the ratio is the
median of the rounds' own ratios, so that a drift of the machine favours neither system.
A call counts when it was final (`confirmed`) inside the measured window; latency is
propose → final as the agent saw it. Afterwards the sandbox's effect log is read: every
confirmed call must have exactly one effect (duplicates and missing ones are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOOL = "bench.refund"
TENANT = "bench-system"
AGENT = "bench-system-agent"
AGENT_TOKEN = "bench-system-agent-token"
FINAL = {"confirmed", "failed", "rejected", "expired", "cancelled", "manual", "compensation_required"}
TARGET_VS_DBOS = 1.0
REFUND = {"amount": 1.0, "currency": "EUR", "reason": "bench"}


@dataclass
class Point:
    system: str
    servers: int
    workers: int
    agents: int
    seconds: float
    load: str
    calls: list[dict[str, Any]] = field(repr=False)  # {"order_id", "status", "latency", "in_window"}
    duplicates: int = 0
    missing: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # the product's processes: CPU seconds in the window
    # Their context switches in the window: (voluntary, involuntary). Many involuntary ones per
    # call: threads taken off a core while runnable (the GIL handed over, the cores overbooked).
    switches: dict[str, tuple[int, int]] = field(default_factory=dict)
    round: int = 0  # with --rounds: which round of the agent count

    @property
    def confirmed(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["status"] == "confirmed" and c["in_window"]]

    @property
    def per_s(self) -> float:
        return len(self.confirmed) / self.seconds

    def pct_ms(self, q: float) -> float:
        values = sorted(c["latency"] for c in self.confirmed)
        if not values:
            return float("nan")
        rank = max(1, -(-len(values) * q // 100))
        return values[int(rank) - 1] * 1000

    def line(self) -> str:
        others = Counter(c["status"] for c in self.calls if c["status"] != "confirmed")
        return (f"{self.system:11} servers={self.servers} workers={self.workers} agents={self.agents:2}: "
                f"{self.per_s:7.1f} confirmed/s  p50 {self.pct_ms(50):7.1f} ms  p99 {self.pct_ms(99):7.1f} ms  "
                f"effects: duplicates {self.duplicates} missing {self.missing}"
                f"{'  other: ' + dict(others).__repr__() if others else ''}  (load {self.load})"
                + (f"\n{'':11} CPU per confirmed call: " + ", ".join(
                    f"{name} {seconds * 1000 / len(self.confirmed):.2f} ms" for name, seconds in self.cpu.items())
                   if self.cpu and self.confirmed else "")
                + (f"\n{'':11} context switches per confirmed call (voluntary/involuntary): " + ", ".join(
                    f"{name} {vol / len(self.confirmed):.1f}/{invol / len(self.confirmed):.1f}"
                    for name, (vol, invol) in self.switches.items())
                   if self.switches and self.confirmed else ""))

    def summary(self) -> dict[str, Any]:
        return {"system": self.system, "servers": self.servers, "workers": self.workers, "agents": self.agents,
                "confirmed": len(self.confirmed), "confirmed_per_s": round(self.per_s, 1),
                "p50_ms": round(self.pct_ms(50), 1), "p99_ms": round(self.pct_ms(99), 1),
                "duplicates": self.duplicates, "missing": self.missing, "load": self.load, "round": self.round,
                "cpu_ms_per_call": {name: round(seconds * 1000 / max(1, len(self.confirmed)), 2)
                                    for name, seconds in self.cpu.items()}}


STAGES_SQL = """
SELECT count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY d.at - o.created_at),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY d.at - o.created_at),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY a.finished_at - a.started_at),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY f.at - a.finished_at)
FROM ledger_operation o
JOIN ledger_attempt a ON a.operation_id = o.operation_id AND a.number = 1
CROSS JOIN LATERAL (SELECT min(e.created_at) AS at FROM ledger_event e WHERE e.entity = 'operation'
                    AND e.entity_id = o.operation_id AND e.to_status = 'dispatched') d
CROSS JOIN LATERAL (SELECT min(e.created_at) AS at FROM ledger_event e WHERE e.entity = 'operation'
                    AND e.entity_id = o.operation_id AND e.to_status = 'confirmed') f
WHERE o.call_id LIKE %s AND o.status = 'confirmed'
"""


def stages(url: str, tag: str) -> str:
    """Where a point's calls spent their time, from the ledger's own timestamps (medians):
    pickup = operation created → `dispatched` event (the commit, the publish, the broker, a
    worker taking the task and its claim); attempt = the worker's attempt start → finish around
    the provider call; receipt = finish → `confirmed` event."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        count, pickup, pickup99, attempt, receipt = conn.execute(STAGES_SQL, [tag + "-%"]).fetchone()
    if not count:
        return "stages: none"

    def ms(value) -> str:
        return "n/a" if value is None else f"{value.total_seconds() * 1000:.1f}"

    return (f"stages ({count} calls): pickup p50 {ms(pickup)} ms p99 {ms(pickup99)} ms, "
            f"attempt p50 {ms(attempt)} ms, receipt p50 {ms(receipt)} ms")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- set-up (this process, Django) -------------------------------------------------------------


def prepare(url: str) -> None:
    """Migrates the bench database and installs the bench tenant, its agent (no request limit:
    the bench measures capacity, not the limiter) and `bench.refund`, L0 with no escalation."""
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from approvals.defaults import REFUND_SCHEMA, ensure_policy_defaults
    from approvals.models import Tool
    from console.models import AgentPrincipal, Tenant

    call_command("migrate", verbosity=0, interactive=False)
    ensure_policy_defaults()
    tool, _ = Tool.objects.update_or_create(name=TOOL, defaults=dict(
        adapter="payments.refund", kind=Tool.Kind.WRITE, idempotency=Tool.Idempotency.NATIVE, base_tier=0,
        json_schema=REFUND_SCHEMA, business_key="order_id", queue=Tool.Queue.FAST, timeout_seconds=5,
        retryable_errors=["rate_limited", "unavailable", "connect"], max_attempts=4, enabled=True,
        description="Benchmark: a refund through the payments sandbox, run at once."))
    tool.escalation_rules.all().delete()
    tenant, _ = Tenant.objects.get_or_create(slug=TENANT, defaults={"name": "Benchmark (system)"})
    tenant.api_rate_per_minute = 0
    tenant.save()
    agent = AgentPrincipal.objects.filter(tenant=tenant, name=AGENT).first() or AgentPrincipal(tenant=tenant,
                                                                                                 name=AGENT)
    agent.set_token(AGENT_TOKEN)
    agent.is_active = True
    agent.api_rate_per_minute = 0
    agent.save()
    agent.allowed_tools.add(tool)
    from django.db import connections

    connections.close_all()


# --- the product's processes ---------------------------------------------------------------


class System:
    """N uvicorn servers and M Celery workers (fast queue) with production settings, as
    `make cluster` runs them, against the bench database, Redis and the payments sandbox."""

    def __init__(self, env: dict[str, str], servers: int, workers: int, concurrency: int, pool: str,
                 logs: Path) -> None:
        from console.lib.procs import Child, python

        self.ports = [free_port() for _ in range(servers)]
        self.children = [
            Child(f"bench-server-{n}", python("-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                                              "--port", str(port), "--lifespan", "on", "--log-level", "warning"),
                  env=env)
            for n, port in enumerate(self.ports, start=1)
        ] + [
            Child(f"bench-worker-{n}", python("-m", "celery", "-A", "console", "worker", "-Q", "fast", "-P", pool,
                                              "-c", str(concurrency), "-l", "warning", "-n",
                                              f"bench{n}-{os.getpid()}@%h"), env=env)
            for n in range(1, workers + 1)
        ] + [
            # Production's schedule: the sealer of the event log, the sweep. Its tasks go to the
            # default (fast) queue, which the workers consume.
            Child("bench-beat", python("-m", "celery", "-A", "console", "beat", "-l", "warning",
                                       "-s", str(logs / f"celerybeat-schedule-{os.getpid()}")), env=env),
        ]
        self.logs = logs
        self.pool = pool

    def start(self) -> System:
        from console.lib.procs import http_ok, wait_until

        for child in self.children:
            child.start(log_dir=self.logs)
        for port in self.ports:
            wait_until(http_ok(f"http://127.0.0.1:{port}/healthz"), timeout=90, what=f"the server on {port}")
        time.sleep(3)  # the workers' consumers connect to the broker
        return self

    @property
    def pids(self) -> dict[str, int]:
        """The processes whose CPU is measured: the servers, and the workers with a thread pool
        (a prefork worker's children do the work, and /proc counts a parent's own CPU only)."""
        return {child.name: child.popen.pid for child in self.children
                if "server" in child.name or self.pool == "threads"}

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def stop(self) -> None:
        for child in self.children:
            child.stop()


def product_env(url: str, var: Path, payments_url: str) -> dict[str, str]:
    """`make cluster`'s production settings, pointed at the bench database and sandbox."""
    from console.management.commands.run_cluster import cluster_environment

    port = free_port()
    env = cluster_environment(port, var)
    env.update({"DATABASE_URL": url, "SANDBOX_PAYMENTS_URL": payments_url, "LOG_LEVEL": "WARNING"})
    return env


# --- clients (spawned processes) -----------------------------------------------------------------


def countersign_agent(index: int, base_url: str, tag: str, barrier, stop, results) -> None:
    """One agent: a task of its own, then refunds proposed and awaited one after the other."""
    import httpx

    http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {AGENT_TOKEN}"}, timeout=60)

    def post(path: str, body: dict, params: dict | None = None) -> dict:
        response = http.post(path, json=body, params=params)
        if response.status_code >= 300:
            raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
        return response.json()

    calls: list[dict[str, Any]] = []
    error = ""
    try:
        task = post("/api/v1/tasks", {"task_type": "bench", "goal": "Benchmark the whole system"})
        task_id = task["task_id"]
        token = post(f"/api/v1/tasks/{task_id}/lease", {"owner": f"agent-{index}", "ttl_seconds": 3600})[
            "fencing_token"]
        version = task["version"]
        for to in ("planning", "running"):
            version = post(f"/api/v1/tasks/{task_id}/transition",
                           {"to": to, "expected_version": version, "fencing_token": token})["version"]

        def one(n: int) -> dict[str, Any]:
            order_id = f"{tag}-a{index}-{n}"
            started = time.monotonic()
            answer = post(f"/api/v1/tasks/{task_id}/calls", {
                "call_id": order_id, "step_id": order_id, "tool": TOOL, "arguments": {"order_id": order_id, **REFUND},
                "expected_version": version, "fencing_token": token}, params={"wait": 10})
            status = answer.get("status", "")
            while status not in FINAL:
                answer = http.get(f"/api/v1/calls/{order_id}",
                                  params={"wait": 10, "until": "final", "task_id": task_id}).json()
                status = answer.get("status", "")
            ended = time.monotonic()
            return {"order_id": order_id, "status": status, "latency": ended - started, "ended": ended}

        drive(one, barrier, stop, calls)
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        error = f"{type(exc).__name__}: {exc}"
        barrier.abort()
    results.put((calls, error))


def drive(one, barrier, stop, calls: list[dict[str, Any]]) -> None:
    """One call untimed (connections, caches), then calls one after the other until stopped."""
    one(0)
    barrier.wait()
    n = 1
    while not stop.is_set():
        calls.append(one(n))
        n += 1


def provider_agent(index: int, payments_url: str, tag: str, barrier, stop, results) -> None:
    """The provider alone: the same refund POSTed straight to the sandbox, nothing in between."""
    _refund_poster(index, payments_url, "/refunds", tag, barrier, stop, results, keyed=True)


def floor_agent(index: int, floor_url: str, tag: str, barrier, stop, results) -> None:
    """The floor: the same refund through the bare server's dispatch in the request (which
    sends the order as the idempotency key itself)."""
    _refund_poster(index, floor_url, "/refund-here", tag, barrier, stop, results, keyed=False)


def _refund_poster(index: int, base_url: str, path: str, tag: str, barrier, stop, results, *, keyed: bool) -> None:
    """An agent POSTing the refund to `path` one call after the other; a call confirms when the
    answer is 2xx. `keyed`: the order goes as the Idempotency-Key header."""
    import httpx

    http = httpx.Client(base_url=base_url, timeout=60)
    calls: list[dict[str, Any]] = []
    error = ""

    def one(n: int) -> dict[str, Any]:
        order_id = f"{tag}-a{index}-{n}"
        started = time.monotonic()
        http.post(path, json={"order_id": order_id, **REFUND},
                  headers={"Idempotency-Key": order_id} if keyed else None).raise_for_status()
        ended = time.monotonic()
        return {"order_id": order_id, "status": "confirmed", "latency": ended - started, "ended": ended}

    try:
        drive(one, barrier, stop, calls)
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        error = f"{type(exc).__name__}: {exc}"
        barrier.abort()
    results.put((calls, error))


def dbos_agent(index: int, system_url: str, payments_url: str, tag: str, barrier, stop, results) -> None:
    """One process running DBOS workflows one after the other; the workflow's one step POSTs the
    refund to the sandbox with the workflow ID as idempotency key."""
    import logging

    import httpx
    from dbos import DBOS, SetWorkflowID

    logging.getLogger("dbos").setLevel(logging.WARNING)
    http = httpx.Client(base_url=payments_url, timeout=5)

    @DBOS.step()
    def refund(order_id: str) -> str:
        response = http.post("/refunds", json={"order_id": order_id, **REFUND},
                             headers={"Idempotency-Key": order_id})
        response.raise_for_status()
        return response.json()["id"]

    @DBOS.workflow()
    def refund_workflow(order_id: str) -> str:
        return refund(order_id)

    calls: list[dict[str, Any]] = []
    error = ""
    try:
        # An executor ID of its own: under the default one ("local") each process launched would
        # recover, and run again, the workflows the others have in flight.
        DBOS(config={"name": "countersign-bench-system", "system_database_url": system_url,
                     "log_level": "WARNING", "executor_id": f"{tag}-a{index}",
                     # One workflow at a time and DBOS's background threads: a pool of 20 per
                     # process (the default) would run the shared server out of connections.
                     "sys_db_pool_size": 2})
        DBOS.launch()

        def one(n: int) -> dict[str, Any]:
            order_id = f"{tag}-a{index}-{n}"
            started = time.monotonic()
            with SetWorkflowID(order_id):
                refund_workflow(order_id)
            ended = time.monotonic()
            return {"order_id": order_id, "status": "confirmed", "latency": ended - started, "ended": ended}

        drive(one, barrier, stop, calls)
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        error = f"{type(exc).__name__}: {exc}"
        barrier.abort()
    finally:
        DBOS.destroy()
    results.put((calls, error))


def run_agents(target, args_for, agents: int, seconds: float, watch: dict[str, int] | None = None,
               during=None) -> tuple[list[dict[str, Any]], float, dict[str, float], dict[str, tuple[int, int]]]:
    """Spawns the agents, waits until all are warm, lets them run `seconds`, collects their calls.
    Returns the calls (marked in_window when final before the stop), the window's length, and
    the CPU seconds and context switches each process of `watch` (name: pid) had in the window,
    with PostgreSQL's processes as "postgres". `during()` is called as the window opens."""
    import multiprocessing
    import threading

    from bench.procstat import postgres_sample, process_sample, spent

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(agents + 1)
    stop = context.Event()
    results = context.Queue()
    children = [context.Process(target=target, args=(*args_for(i), barrier, stop, results), daemon=True)
                for i in range(agents)]
    for child in children:
        child.start()
    try:
        barrier.wait(timeout=300)
    except threading.BrokenBarrierError:
        pass
    started = time.monotonic()
    before = {name: process_sample(pid) for name, pid in (watch or {}).items()}
    postgres_before = postgres_sample() if watch else {}
    if during is not None:
        during()
    if not barrier.broken:
        stop.wait(seconds)
    window_end = time.monotonic()
    after = {name: process_sample(pid) for name, pid in (watch or {}).items()}
    if watch:
        before["postgres"], after["postgres"] = (0.0, 0, 0), spent(postgres_before, postgres_sample())
    cpu = {name: after[name][0] - sample[0] for name, sample in before.items()}
    switches = {name: (after[name][1] - sample[1], after[name][2] - sample[2]) for name, sample in before.items()}
    stop.set()
    reports = [results.get(timeout=300) for _ in children]
    for child in children:
        child.join(timeout=60)
    errors = [error for _, error in reports if error]
    if errors:
        raise RuntimeError(f"{target.__name__} with {agents} agents failed: {errors[0]}")
    calls = [call for found, _ in reports for call in found]
    for call in calls:
        call["in_window"] = call["ended"] <= window_end
    return calls, window_end - started, cpu, switches


# --- effects -----------------------------------------------------------------------------------


def check_effects(point: Point, effects: Counter) -> None:
    """Every confirmed call (in the window or not) has exactly one effect at the sandbox."""
    for call in point.calls:
        count = effects.get(call["order_id"], 0)
        if call["status"] == "confirmed":
            point.missing += count == 0
            point.duplicates += max(0, count - 1)
        else:
            point.duplicates += count  # a call that did not confirm must not have paid


def sandbox_effects(payments_url: str) -> Counter:
    from sandbox.client import effects

    return Counter(effect["payload"]["order_id"] for effect in effects(payments_url, timeout=60))


# --- main --------------------------------------------------------------------------------------


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def machine_info(url: str) -> dict[str, Any]:
    import psycopg

    info: dict[str, Any] = {"python": platform.python_version(), "nproc": os.cpu_count()}
    with psycopg.connect(url) as conn:
        info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
        info["synchronous_commit"] = conn.execute("SHOW synchronous_commit").fetchone()[0]
    try:
        from importlib.metadata import version

        info["dbos"] = version("dbos")
    except Exception:  # noqa: BLE001 - not installed
        info["dbos"] = "not installed"
    return info


def measure(name: str, *, servers: int, workers: int, agents: int, round_: int, tag: str, seconds: float, url: str,
            system: System, floor, dbos_url: str, provider_url: str, profiles: Path | None = None) -> Point:
    """`agents` agent processes against one system for `seconds`: "countersign", "floor", "dbos"
    or "provider" (the sandbox alone)."""
    cpu: dict[str, float] = {}
    switches: dict[str, tuple[int, int]] = {}
    if name == "countersign":
        during = None
        if profiles is not None:
            def during():
                profile_servers(system, profiles / f"{tag}", seconds)
        calls, elapsed, cpu, switches = run_agents(
            countersign_agent, lambda i: (i, system.urls[i % len(system.urls)], tag), agents, seconds, system.pids,
            during=during)
        print("           ", stages(url, tag), flush=True)
    elif name == "floor":
        calls, elapsed, cpu, switches = run_agents(floor_agent, lambda i: (i, floor.url, tag), agents, seconds,
                                                   {"floor-server": floor.procs[-1].pid})
    elif name == "dbos":
        calls, elapsed, _, _ = run_agents(dbos_agent, lambda i: (i, dbos_url, provider_url, tag), agents, seconds)
    else:
        calls, elapsed, _, _ = run_agents(provider_agent, lambda i: (i, provider_url, tag), agents, seconds)
    return Point(name, servers, workers, agents, elapsed, load(), calls, cpu=cpu, switches=switches, round=round_)


def profile_servers(system: System, prefix: Path, seconds: float) -> None:
    """py-spy samples each server's on-CPU stacks for the window (without pausing it), as
    collapsed stacks in `prefix`-<server>.txt: rounds of the same process side by side."""
    import shutil
    import subprocess

    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    for child_name, pid in system.pids.items():
        if "server" in child_name:
            subprocess.Popen([py_spy, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
                              "--rate", "200", "--nonblocking", "--format", "raw",
                              "--output", f"{prefix}-{child_name}.txt"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    parser.add_argument("--agents", default="1,4,8,16", help="comma-separated agent process counts (the ramp)")
    parser.add_argument("--servers", default="1,2", help="comma-separated ASGI server counts")
    parser.add_argument("--workers", default="1,2", help="comma-separated Celery worker counts")
    parser.add_argument("--concurrency", type=int, default=2, help="processes per Celery worker (-c)")
    parser.add_argument("--pool", default="prefork", choices=["prefork", "threads"],
                        help="Celery worker pool (-P); prefork is what `make cluster` runs")
    parser.add_argument("--no-dbos", action="store_true")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip the floor (bench/pipeline_floor.py's bare server, the same refund)")
    parser.add_argument("--no-provider", action="store_true",
                        help="skip the provider alone (agents POSTing straight to the sandbox)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of every system at each agent count, in ABBA order; ratios are the median of "
                             "the rounds' ratios")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--profile-servers", type=Path, metavar="DIR",
                        help="py-spy each server through each of Countersign's windows (collapsed stacks in DIR)")
    args = parser.parse_args(argv)
    if args.profile_servers is not None:
        args.profile_servers.mkdir(parents=True, exist_ok=True)

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        parser.error("DATABASE_URL must name a PostgreSQL database (e.g. .../cs_bench_system)")
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not broker.startswith("redis"):
        parser.error("CELERY_BROKER_URL must name a Redis database")

    from bench.ledger import ensure_database

    ensure_database(url, fresh=False)
    dbos_url = with_database(url, urlsplit(url).path.lstrip("/") + "_dbos")
    if not args.no_dbos:
        ensure_database(dbos_url, fresh=True)
    prepare(url)

    from sandbox.process import SandboxProcess

    var = Path(tempfile.mkdtemp(prefix="countersign-bench-system-"))
    payments = SandboxProcess.start("payments", db_path=var / "payments.sqlite3", hang_seconds=8,
                                    die_with_parent=True)
    env = product_env(url, var, payments.base_url)
    print("machine:", json.dumps(machine_info(url)))
    print("command:", " ".join(["DATABASE_URL=" + url, "CELERY_BROKER_URL=" + broker, sys.executable, *sys.argv]))
    print(f"Redis: broker {broker}, layer {env['CHANNEL_LAYER_URL']}; sandbox {payments.base_url}")
    run = secrets.token_hex(3)
    points: list[Point] = []
    floor = None
    if not args.no_floor:
        from bench.pipeline_floor import Pipeline

        floor = Pipeline(url, broker, payments.base_url).start()
    try:
        for servers in ints(args.servers):
            for workers in ints(args.workers):
                system = System(env, servers, workers, args.concurrency, args.pool, var / "logs").start()
                try:
                    for agents in ints(args.agents):
                        names = ["countersign", *(["floor"] if floor is not None else []),
                                 *([] if args.no_dbos else ["dbos"]), *([] if args.no_provider else ["provider"])]
                        for round_ in range(args.rounds):
                            # ABBA…: every other round runs the systems in the opposite order, so a drift
                            # of the machine during a round favours none of them.
                            measured = [
                                measure(name, servers=servers, workers=workers, agents=agents, round_=round_,
                                        tag=f"{name[:2]}{run}s{servers}w{workers}n{agents}r{round_}",
                                        seconds=args.seconds, url=url, system=system, floor=floor,
                                        dbos_url=dbos_url, provider_url=payments.base_url,
                                        profiles=args.profile_servers)
                                for name in (names if round_ % 2 == 0 else names[::-1])]
                            points.extend(measured)
                            effects = sandbox_effects(payments.base_url)
                            for point in measured:
                                check_effects(point, effects)
                                print(point.line(), flush=True)
                finally:
                    system.stop()
    finally:
        if floor is not None:
            floor.stop()
        payments.stop()
    report(points)
    if args.json:
        args.json.write_text(json.dumps([p.summary() for p in points], indent=2))
    return 0


def report(points: list[Point]) -> None:
    """Countersign ÷ DBOS per agent count (the median of the rounds' ratios, each of a round's
    two measurements), then each system at its best agent count (median rate over the rounds)."""
    rounds = 1 + max((p.round for p in points), default=0)
    print(f"\nCountersign ÷ DBOS (confirmed/s, measured one after the other at each agent count"
          f"{f'; median of {rounds} rounds in ABBA order, with their range' if rounds > 1 else ''}):")
    by_key = {(p.system, p.servers, p.workers, p.agents, p.round): p for p in points}
    counts = sorted({(p.servers, p.workers, p.agents) for p in points if p.system == "countersign"})
    for servers, workers, agents in counts:
        pairs = [(by_key[("countersign", servers, workers, agents, r)], by_key.get(("dbos", servers, workers, agents, r)))
                 for r in range(rounds) if ("countersign", servers, workers, agents, r) in by_key]
        pairs = [(cs, dbos) for cs, dbos in pairs if dbos is not None and dbos.per_s]
        if not pairs:
            continue
        ratios = [cs.per_s / dbos.per_s for cs, dbos in pairs]
        spread = f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else ""
        print(f"  servers={servers} workers={workers} agents={agents:2}: "
              f"{statistics.median(cs.per_s for cs, _ in pairs):7.1f} / "
              f"{statistics.median(d.per_s for _, d in pairs):7.1f} = {statistics.median(ratios):5.2f}{spread}   "
              f"p99 {statistics.median(cs.pct_ms(99) for cs, _ in pairs):7.1f} ms vs "
              f"{statistics.median(d.pct_ms(99) for _, d in pairs):7.1f} ms")
    print(f"\nat saturation (the best agent count of each system, per cell"
          f"{'; medians over the rounds' if rounds > 1 else ''}):")
    cells = sorted({(p.servers, p.workers) for p in points})
    met = 0
    for cell in cells:
        rates: dict[str, dict[int, list[Point]]] = {}
        for p in points:
            if (p.servers, p.workers) == cell:
                rates.setdefault(p.system, {}).setdefault(p.agents, []).append(p)
        best: dict[str, tuple[int, float, float] | None] = {}
        for system in ("countersign", "floor", "dbos", "provider"):
            per_count = {agents: (statistics.median(p.per_s for p in ps), statistics.median(p.pct_ms(50) for p in ps),
                                  statistics.median(p.pct_ms(99) for p in ps))
                         for agents, ps in rates.get(system, {}).items()}
            agents = max(per_count, key=lambda a: per_count[a][0], default=None)
            best[system] = None if agents is None else (agents, *per_count[agents])
        cs, floor, dbos, provider = best["countersign"], best["floor"], best["dbos"], best["provider"]
        text = f"  servers={cell[0]} workers={cell[1]}: countersign {cs[1]:.1f}/s (agents={cs[0]}, " \
               f"p50 {cs[2]:.1f} ms, p99 {cs[3]:.1f} ms)"
        if dbos is not None and dbos[1]:
            ratio = cs[1] / dbos[1]
            met += ratio >= TARGET_VS_DBOS
            text += f"; dbos {dbos[1]:.1f}/s (agents={dbos[0]}, p99 {dbos[3]:.1f} ms): ÷ = {ratio:.2f}"
        if floor is not None and floor[1]:
            text += (f"; floor {floor[1]:.1f}/s (agents={floor[0]}, p99 {floor[3]:.1f} ms): "
                     f"countersign ÷ floor = {cs[1] / floor[1]:.2f}")
            if dbos is not None and dbos[1]:
                text += f", floor ÷ dbos = {floor[1] / dbos[1]:.2f}"
        if provider is not None:
            text += f"; provider alone {provider[1]:.1f}/s"
        print(text)
    bad = sum(p.duplicates + p.missing for p in points)
    print(f"effects: {'every confirmed call has exactly one effect' if not bad else f'{bad} WRONG (see above)'}")
    if any(p.system == "dbos" for p in points):
        print(f"target ≥ {TARGET_VS_DBOS:.1f}× DBOS at saturation: met in {met} of {len(cells)} cells")


if __name__ == "__main__":
    raise SystemExit(main())
