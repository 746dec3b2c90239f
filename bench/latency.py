"""What an agent waits for: one auto-run tool call through Countersign, proposed and awaited until
final, beside the same read sent straight to the provider, in one run.

    .venv/bin/python bench/latency.py [--modes embedded,postgres] [--calls 60] [--agents 1,16]

Each mode starts the product as `make run` does (`manage.py run_embedded --no-fleet`: ASGI
server, Celery worker, beat, both sandboxes) in a temporary folder on free ports:

- `embedded`: SQLite and the file-system broker (the defaults);
- `postgres`: PostgreSQL (a fresh database, `--database-name`, on DATABASE_URL's server)
  and Redis (`--redis`, databases 12 and 13 unless `--redis-dbs`).

A scripted agent (one thread per agent, one task each) proposes `orders.lookup` (L1, run at
once by the gate) and waits until the call is final as the Python client does: the proposal
itself waits (`POST …/calls?wait=`), so a call run at once is one request, and a call still open
after it is long-polled (`GET /api/v1/calls/{id}?wait=&until=final`). `--wait-until final`: the
proposal answers at once and one poll waits (the client before `?wait=` on proposals);
`--wait-until change`: one poll per status on the way, each naming the last status seen; after
each call it sends `GET /orders/{id}` straight to the payments sandbox and `GET /healthz` to the
server. Printed per mode and agent count: p50/p95/p99 of the call through Countersign, of the
direct call and of `/healthz`, the overhead (through − direct), and where the time went, from the
ledger's own timestamps (same machine, same clock):

| stage    | from → to                                                                    |
|----------|------------------------------------------------------------------------------|
| propose  | request sent → operation created (the proposal's request, up to its insert)   |
| pickup   | operation created → claimed (`dispatched` event): the commit, publish, broker, worker; next to nothing in the request's own dispatch, whose call is inserted `dispatched` |
| provider | attempt started → finished (the adapter's HTTP call)                          |
| receipt  | attempt finished → `confirmed` event                                         |
| wake     | `confirmed` event → the agent holds the final answer (the waiting request's answer) |

The floor of the mode is printed first (a committed one-row write, a Redis publish → subscriber
hop, `/healthz`), and beside each run of several agents the same floor from as many threads at
once, each with its own connections: what the machine does for that many concurrent clients
doing only the minimum, to judge "N agents within 2× of one" against.

On PostgreSQL + Redis every agent also sends each call through the pipeline floor
(`bench/pipeline_floor.py`: the same processes and hops, a bare ASGI app and a bare worker,
three commits and two Redis hops, no Django or Celery), interleaved with the product's call and
the direct read: "floor's overhead" is what this architecture costs on this machine at the
moment of the run. The product dispatches such a call in the request that proposed it
(ledger/request_dispatch.py), so the floor's server does the same too (`/call-here`: the
call inserted already claimed, one commit, then the provider read and the receipt in the
server, no broker): "its overhead" is the yardstick for the product's overhead now; the broker's floor stays beside it, for calls a worker runs.

Nothing is asserted: the machine is shared and noisy; read medians, repeat, and record figures
with the machine's load in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.ledger import ensure_database, with_database  # noqa: E402
from bench.pipeline_floor import Pipeline  # noqa: E402

TERMINAL = {"confirmed", "failed", "rejected", "expired", "cancelled", "manual", "compensation_required"}
TOKEN = "bench-latency-token"
STAGES = ("propose", "pickup", "provider", "receipt", "wake")
WAIT_UNTIL = "proposal"  # --wait-until


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def free_port_block(size: int = 4) -> int:
    """A port P with P..P+size-1 all free (the server takes P, the sandboxes P+1..P+3)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + size >= 65535:
            continue
        taken = False
        for port in range(base, base + size):
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    taken = True
                    break
        if not taken:
            return base
    raise RuntimeError("no block of free ports")


@dataclass
class Stack:
    mode: str
    database_url: str | None
    redis: str
    redis_dbs: tuple[int, int] = (12, 13)  # broker, channel layer
    var: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="countersign-latency-")))
    port: int = 0
    proc: subprocess.Popen | None = None

    def start(self) -> Stack:
        self.port = free_port_block()
        env = {**os.environ, "PORT": str(self.port), "COUNTERSIGN_VAR_DIR": str(self.var),
               "DEMO_AGENT_TOKEN": TOKEN, "COUNTERSIGN_ENV": "embedded",
               # The bench measures waiting, not the API's rate limits (0: off).
               "API_RATE_PER_TOKEN": "0", "API_RATE_PER_TENANT": "0"}
        for name in ("DATABASE_URL", "CELERY_BROKER_URL", "CHANNEL_LAYER_URL"):
            env.pop(name, None)
        if self.mode == "postgres":
            env["DATABASE_URL"] = self.database_url
            env["CELERY_BROKER_URL"] = f"{self.redis}/{self.redis_dbs[0]}"
            env["CHANNEL_LAYER_URL"] = f"{self.redis}/{self.redis_dbs[1]}"
        log = open(self.var / "run_embedded.log", "w")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen([sys.executable, "manage.py", "run_embedded", "--no-fleet"], cwd=ROOT,
                                     env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"run_embedded exited; see {self.var / 'run_embedded.log'}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError("the server did not answer /healthz in 90 s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def payments_url(self) -> str:
        return f"http://127.0.0.1:{self.port + 1}"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.var, ignore_errors=True)


# --- the ledger's timestamps -----------------------------------------------------------------

STAGE_SQL = """
SELECT o.operation_id, o.created_at,
       (SELECT min(e.created_at) FROM ledger_event e WHERE e.entity = 'operation'
           AND e.entity_id = o.operation_id AND e.to_status = 'dispatched'),
       (SELECT min(a.started_at) FROM ledger_attempt a WHERE a.operation_id = o.operation_id),
       (SELECT min(a.finished_at) FROM ledger_attempt a WHERE a.operation_id = o.operation_id),
       (SELECT min(e.created_at) FROM ledger_event e WHERE e.entity = 'operation'
           AND e.entity_id = o.operation_id AND e.to_status = 'confirmed')
FROM ledger_operation o WHERE o.operation_id IN ({marks})
"""


def as_epoch(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def ledger_times(stack: Stack, operation_ids: list[str]) -> dict[str, tuple]:
    rows: list[tuple] = []
    for start in range(0, len(operation_ids), 500):
        chunk = operation_ids[start:start + 500]
        if stack.mode == "postgres":
            import psycopg

            with psycopg.connect(stack.database_url.replace("postgres://", "postgresql://", 1)) as conn:
                rows += conn.execute(STAGE_SQL.format(marks=", ".join(["%s"] * len(chunk))), chunk).fetchall()
        else:
            conn = sqlite3.connect(stack.var / "countersign.sqlite3")
            try:
                rows += conn.execute(STAGE_SQL.format(marks=", ".join(["?"] * len(chunk))), chunk).fetchall()
            finally:
                conn.close()
    return {row[0]: tuple(as_epoch(value) for value in row[1:]) for row in rows}


# --- the scripted agent ----------------------------------------------------------------------


@dataclass
class Sample:
    operation_id: str
    sent: float
    answered: float
    final: float
    status: str
    direct_ms: float
    healthz_ms: float
    polls: int = 0
    floor_ms: float | None = None  # the same call through the pipeline floor (PostgreSQL + Redis)
    floor_here_ms: float | None = None  # the same call through the floor's dispatch in the request


def start_task(client: httpx.Client, name: str) -> tuple[str, int, int]:
    task = client.post("/api/v1/tasks", json={
        "task_type": "order_lookup", "goal": "Look orders up", "inputs": {},
        "success_criteria": [], "constraints": {"max_tool_calls": 100_000},
        "versions": {"workflow": "bench-latency", "model": "scripted", "prompt": "v1"},
    }).raise_for_status().json()
    task_id, version = task["task_id"], task["version"]
    token = client.post(f"/api/v1/tasks/{task_id}/lease",
                        json={"owner": name, "ttl_seconds": 3600}).raise_for_status().json()["fencing_token"]
    for to in ("planning", "running"):
        version = client.post(f"/api/v1/tasks/{task_id}/transition", json={
            "to": to, "expected_version": version, "fencing_token": token}).raise_for_status().json()["version"]
    return task_id, version, token


def one_call(client: httpx.Client, direct: httpx.Client, task: tuple[str, int, int], tag: str,
             floor: httpx.Client | None = None) -> Sample:
    task_id, version, token = task
    sent = time.time()
    answer = client.post(f"/api/v1/tasks/{task_id}/calls", params={"wait": 10} if WAIT_UNTIL == "proposal" else None,
                         json={"call_id": f"call-{tag}", "step_id": f"lookup-{tag}", "tool": "orders.lookup",
                               "arguments": {"order_id": f"ord-{tag}"}, "expected_version": version,
                               "fencing_token": token}).raise_for_status().json()
    answered = time.time()
    status = answer.get("status", "")
    polls = 0
    # As the Python client waits after the proposal (`until=final`): one poll that the server
    # answers once the call is final. `change`: a poll per status on the way, each naming the
    # last one seen.
    while status not in TERMINAL:
        query = {"seen": status} if WAIT_UNTIL == "change" else {"until": "final"}
        body = client.get(f"/api/v1/calls/{answer['call_id']}",
                          params={"wait": 10, "task_id": task_id, **query}).raise_for_status().json()
        status = body.get("status", "")
        polls += 1
    final = time.time()
    began = time.perf_counter()
    direct.get(f"/orders/ord-{tag}").raise_for_status()
    direct_ms = (time.perf_counter() - began) * 1000
    began = time.perf_counter()
    client.get("/healthz").raise_for_status()
    healthz_ms = (time.perf_counter() - began) * 1000
    floor_ms = floor_here_ms = None
    if floor is not None:
        floor_ms, floor_here_ms = (_floor_call(floor, path, tag) for path in ("/call", "/call-here"))
    return Sample(answer["operation_id"], sent, answered, final, status, direct_ms, healthz_ms, polls, floor_ms,
                  floor_here_ms)


def _floor_call(floor: httpx.Client, path: str, tag: str) -> float:
    began = time.perf_counter()
    assert floor.post(path, json={"order_id": f"ord-{tag}"}).raise_for_status().json()["status"] == "confirmed"
    return (time.perf_counter() - began) * 1000


def in_threads(count: int, work: Callable[[int], list]) -> list:
    """`work(i)` for i in 0..count-1, each in a thread of its own, started together: their
    results in one list (the first error raised here)."""
    results: list[list] = [[] for _ in range(count)]
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def run(index: int) -> None:
        try:
            start.wait()
            results[index] = work(index)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [value for values in results for value in values]


def run_agents(stack: Stack, agents: int, calls: int, warmup: int, pipeline: Pipeline | None = None) -> list[Sample]:
    def agent(index: int) -> list[Sample]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=stack.url, headers=headers, timeout=30) as client, \
                httpx.Client(base_url=stack.payments_url, timeout=30) as direct, \
                httpx.Client(base_url=pipeline.url if pipeline else stack.url, timeout=30) as floor:
            task = start_task(client, f"bench-{agents}-{index}")
            run = f"{agents}x{index}-{time.time_ns()}"
            samples = [one_call(client, direct, task, f"{run}-{i}", floor if pipeline else None)
                       for i in range(warmup + calls)]
        return samples[warmup:]

    return in_threads(agents, agent)


def report(mode: str, agents: int, samples: list[Sample], times: dict[str, tuple]) -> None:
    through = [(s.final - s.sent) * 1000 for s in samples]
    direct = [s.direct_ms for s in samples]
    healthz = [s.healthz_ms for s in samples]
    overhead = [t - d for t, d in zip(through, direct, strict=True)]
    not_confirmed = sum(1 for s in samples if s.status != "confirmed")
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    for sample in samples:
        created, claimed, started, finished, confirmed = times.get(sample.operation_id, (None,) * 5)
        if created:
            stages["propose"].append((created - sample.sent) * 1000)
        if created and claimed:
            stages["pickup"].append((claimed - created) * 1000)
        if started and finished:
            stages["provider"].append((finished - started) * 1000)
        if finished and confirmed:
            stages["receipt"].append((confirmed - finished) * 1000)
        if confirmed:
            stages["wake"].append((sample.final - confirmed) * 1000)

    def line(label: str, values: list[float]) -> str:
        return (f"  {label:<22} p50 {pct(values, 50):8.1f}  p95 {pct(values, 95):8.1f}  "
                f"p99 {pct(values, 99):8.1f} ms  (n={len(values)})")

    polls = sum(s.polls for s in samples) / len(samples) if samples else float("nan")
    print(f"\n{mode}, {agents} agent(s), {len(samples)} calls, {polls:.2f} polls per call"
          + (f", {not_confirmed} not confirmed" if not_confirmed else ""))
    print(line("through Countersign", through))
    print(line("direct to provider", direct))
    print(line("overhead", overhead))
    floors = [(s.floor_ms, s.floor_here_ms, s.direct_ms) for s in samples if s.floor_ms is not None]
    if floors:
        print(line("pipeline floor", [f for f, _, _ in floors]))
        print(line("floor's overhead", [f - d for f, _, d in floors]))
        print(line("in-request floor", [h for _, h, _ in floors]))
        print(line("its overhead", [h - d for _, h, d in floors]))
    print(line("/healthz", healthz))
    print("  where the time went:")
    for name in STAGES:
        print(line(f"  {name}", stages[name]))


# --- the floor, measured in the same run ---------------------------------------------------


def _commits(stack: Stack, rounds: int) -> list[float]:
    times: list[float] = []
    if stack.mode == "postgres":
        import psycopg

        with psycopg.connect(stack.database_url.replace("postgres://", "postgresql://", 1)) as conn:
            for _ in range(rounds):
                began = time.perf_counter()
                conn.execute("INSERT INTO bench_latency_floor (at) VALUES (%s)", [time.time()])
                conn.commit()
                times.append((time.perf_counter() - began) * 1000)
        return times
    conn = sqlite3.connect(stack.var / "floor.sqlite3", isolation_level=None, timeout=30)
    try:
        for _ in range(rounds):
            began = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor (at) VALUES (?)", [time.time()])
            conn.execute("COMMIT")
            times.append((time.perf_counter() - began) * 1000)
    finally:
        conn.close()
    return times


def _redis_hops(stack: Stack, rounds: int, channel: str) -> list[float]:
    import redis

    times: list[float] = []
    client = redis.Redis.from_url(f"{stack.redis}/{stack.redis_dbs[1]}")
    subscriber = client.pubsub()
    subscriber.subscribe(channel)
    subscriber.get_message(timeout=1)
    for _ in range(rounds):
        began = time.perf_counter()
        client.publish(channel, b"ring")
        while subscriber.get_message(timeout=1) is None:
            pass
        times.append((time.perf_counter() - began) * 1000)
    subscriber.close()
    client.close()
    return times


def _healthz(stack: Stack, rounds: int) -> list[float]:
    times: list[float] = []
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        for _ in range(rounds):
            began = time.perf_counter()
            client.get("/healthz").raise_for_status()
            times.append((time.perf_counter() - began) * 1000)
    return times


def _prepare_floor(stack: Stack) -> None:
    if stack.mode == "postgres":
        import psycopg

        with psycopg.connect(stack.database_url.replace("postgres://", "postgresql://", 1)) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS bench_latency_floor (id serial PRIMARY KEY, at double precision)")
            conn.commit()
    else:
        conn = sqlite3.connect(stack.var / "floor.sqlite3", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, at REAL)")
        conn.close()


def measure_floor(stack: Stack, rounds: int = 60, agents: int = 1) -> dict[str, list[float]]:
    """What any design with these parts pays at least: a Redis publish → subscriber hop (the
    broker's and the doorbell's), one committed write on the mode's database (the proposal, the
    claim and the receipt each commit once), and `/healthz` (an ASGI round trip with one read).

    With `agents` > 1, the same rounds from that many threads at once, each with its own
    connections, one part at a time (all commit, then all hop, then all ask `/healthz`): what the
    machine does for that many concurrent clients doing only the minimum, to judge the agents'
    figures against."""
    _prepare_floor(stack)
    parts: list[tuple[str, Callable[[int], list[float]]]] = [("commit", lambda i: _commits(stack, rounds))]
    if stack.mode == "postgres":
        parts.append(("redis hop", lambda i: _redis_hops(stack, rounds, f"bench-latency-floor-{i}")))
    parts.append(("/healthz", lambda i: _healthz(stack, rounds)))
    return {name: in_threads(agents, part) for name, part in parts}


def report_floor(mode: str, floor: dict[str, list[float]], *, agents: int = 1) -> None:
    who = "nothing else running in the bench" if agents == 1 else f"from {agents} threads at once"
    rounds = len(floor["commit"]) // agents
    print(f"\n{mode}, the floor with {agents} agent(s) ({rounds} rounds each, {who})")
    for name, values in floor.items():
        print(f"  {name:<22} p50 {pct(values, 50):8.1f}  p99 {pct(values, 99):8.1f} ms")
    # A call that is proposed, claimed and confirmed commits three times, is answered over HTTP
    # once when the proposal waits (else twice: the proposal, the final poll) and crosses Redis
    # twice (broker, doorbell).
    requests = 1 if WAIT_UNTIL == "proposal" else 2
    for label, q in (("p50", 50), ("p99", 99)):
        hop = pct(floor["redis hop"], q) if "redis hop" in floor else 0.0
        least = 3 * pct(floor["commit"], q) + requests * pct(floor["/healthz"], q) + 2 * hop
        parts = f"3 commits + {requests} × /healthz" + (" + 2 Redis hops" if hop else "; the file broker's wake not counted")
        print(f"  {'overhead floor':<22} {label} {least:8.1f} ms  ("
              + (parts if label == "p50" else "the same parts, each at its p99") + ")")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="embedded,postgres")
    parser.add_argument("--calls", type=int, default=60, help="measured calls per agent")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--agents", default="1,16")
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/countersign"))
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--redis-dbs", default="12,13", help="the broker's and the channel layer's databases")
    parser.add_argument("--database-name", default="countersign_bench_latency")
    parser.add_argument("--wait-until", choices=("proposal", "final", "change"), default="proposal",
                        help="how the agent waits: in the proposal (?wait=, as the Python client), in one "
                             "poll until=final, or in one poll per status (seen=)")
    args = parser.parse_args()
    global WAIT_UNTIL
    WAIT_UNTIL = args.wait_until
    agent_counts = [int(n) for n in args.agents.split(",")]
    print(f"bench/latency.py — {time.strftime('%Y-%m-%d %H:%M:%S')}, load average {os.getloadavg()}, "
          f"the agent waits until {args.wait_until}")
    for mode in args.modes.split(","):
        database_url = None
        if mode == "postgres":
            database_url = with_database(args.database_url, args.database_name)
            ensure_database(database_url, fresh=True)
        broker_db, layer_db = (int(n) for n in args.redis_dbs.split(","))
        stack = Stack(mode, database_url, args.redis, (broker_db, layer_db)).start()
        pipeline = None
        try:
            if mode == "postgres":
                pipeline = Pipeline(database_url, f"{args.redis}/{broker_db}", stack.payments_url).start()
            report_floor(mode, measure_floor(stack))
            for agents in agent_counts:
                samples = run_agents(stack, agents, args.calls, args.warmup, pipeline)
                report(mode, agents, samples, ledger_times(stack, [s.operation_id for s in samples]))
                if agents > 1:
                    # Beside the agents' figures: the same floor from as many concurrent clients.
                    report_floor(mode, measure_floor(stack, agents=agents), agents=agents)
        finally:
            if pipeline:
                pipeline.stop()
            stack.stop()


if __name__ == "__main__":
    main()
