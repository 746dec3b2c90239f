"""Where one dispatch's time goes in the worker: a per-stage timeline, run in-process.

The worker's side of an agent's wait is `ledger.dispatcher.run_dispatch`: the claim (the
policy's generation, the locked operation, the re-checks, the move to `dispatched`), its
commit and the hooks that run after it, the fencing check, the adapter's HTTP call, the
receipt and its commit and hooks. This script proposes `orders.lookup` calls (run at once)
against a payments sandbox it starts, runs each dispatch in this process exactly as a worker
thread does, and prints the median and p90 of every stage, wall and CPU
(`time.thread_time`), with the statements each sent. It also prints the ledger's own
"provider" stage (attempt started → finished, as `bench/latency.py` computes it) and the same
read sent straight to the sandbox on the same client, so the gap between the two can be read
off the stages between them.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cs_bench_stages \\
    CHANNEL_LAYER_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/dispatch_stages.py --calls 200

Set CHANNEL_LAYER_URL to a Redis URL to include the events doorbell's ring as a worker rings
it (the default in-memory layer skips it outside the server).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.ledger import ensure_database, setup_django  # noqa: E402


class Timeline:
    """Inclusive wall and CPU time per stage, per dispatch; stages nest (a stack)."""

    def __init__(self) -> None:
        self.runs: list[dict[str, list[float]]] = []
        self.order: list[str] = []
        self.depth: dict[str, int] = {}
        self.stack: list[str] = []
        self.current: dict[str, list[float]] | None = None

    def start(self) -> None:
        self.current = defaultdict(lambda: [0.0, 0.0, 0])

    def stop(self) -> None:
        self.runs.append(dict(self.current))
        self.current = None

    @contextmanager
    def stage(self, name: str):
        if self.current is None:
            yield
            return
        path = "/".join([*self.stack, name])
        if path not in self.depth:
            self.order.append(path)
            self.depth[path] = len(self.stack)
        self.stack.append(name)
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.stack.pop()
            if self.current is not None:
                cell = self.current[path]
                cell[0] += time.perf_counter() - wall
                cell[1] += time.thread_time() - cpu

    def count_statement(self) -> None:
        if self.current is not None and self.stack:
            self.current["/".join(self.stack)][2] += 1

    def wrap(self, owner, attribute: str, name: str | None = None) -> None:
        original = getattr(owner, attribute)
        timeline = self

        def wrapped(*args, **kwargs):
            with timeline.stage(name or attribute):
                return original(*args, **kwargs)

        wrapped.__wrapped__ = original
        setattr(owner, attribute, wrapped)


def _pct(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def instrument(timeline: Timeline) -> None:
    from django.db import connection

    import console.doorbell
    from ledger import dispatcher, services
    from ledger.adapters import http as http_adapters
    from ledger.adapters.payments import OrderLookupAdapter

    # The claim's parts (inside its transaction).
    timeline.wrap(dispatcher, "_lock_for_claim", "claim statement (operation, tool, agent, configuration)")
    timeline.wrap(dispatcher, "_held", "stops and pause")
    timeline.wrap(dispatcher, "_revalidate", "re-checks (signature, gate)")
    timeline.wrap(services, "operation_dispatch", "move to dispatched (+event, attempt)")
    timeline.wrap(dispatcher, "_claim", "claim")
    timeline.wrap(dispatcher, "_call_provider", "call provider")
    timeline.wrap(dispatcher, "_record", "record")
    timeline.wrap(OrderLookupAdapter, "execute", "adapter.execute")
    timeline.wrap(http_adapters, "_body", "parse body")
    # The doorbell is looked up by identity in the commit hooks: wrap the module's function.
    timeline.wrap(console.doorbell, "_ring", "doorbell ring")

    # The fencing check is the one statement `_call_provider` sends before the adapter.
    from console.lib import sql

    original_fetchone = sql.fetchone

    def fetchone(conn, query, params=()):
        name = "fencing check" if query == dispatcher._STILL_MINE_SQL else "statement"
        with timeline.stage(name):
            return original_fetchone(conn, query, params)

    sql.fetchone = fetchone

    original_commit = connection.commit
    original_hooks = connection.run_and_clear_commit_hooks

    def commit():
        with timeline.stage("COMMIT"):
            return original_commit()

    def hooks():
        with timeline.stage("on_commit hooks"):
            return original_hooks()

    connection.commit = commit
    connection.run_and_clear_commit_hooks = hooks

    def count(execute, query, params, many, context):
        timeline.count_statement()
        return execute(query, params, many, context)

    connection.execute_wrappers.append(count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--database-url", default=os.environ.get(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cs_bench_stages"))
    parser.add_argument("--fresh", action="store_true", help="drop and re-create the database first")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile the timed dispatches (cProfile) and print the N largest")
    parser.add_argument("--sort", default="tottime", help="the profile's order (tottime, cumtime)")
    args = parser.parse_args(argv)

    from sandbox.process import SandboxProcess

    payments = SandboxProcess.start("payments", die_with_parent=True)
    try:
        os.environ["SANDBOX_PAYMENTS_URL"] = payments.base_url
        url = args.database_url
        if url.startswith("postgres"):
            ensure_database(url, fresh=args.fresh)
        setup_django(url)
        return run(args, payments.base_url)
    finally:
        payments.stop()


def run(args, base_url: str) -> int:
    from django.conf import settings
    from django.db import connection

    from bench.ledger import start_task
    from console.demo import ensure_demo_data
    from ledger.adapters.http import client
    from ledger.dispatcher import run_dispatch
    from ledger.models import Attempt
    from ledger.proposals import call_propose

    agent = ensure_demo_data()
    run_ = start_task(agent, owner="stages")
    timeline = Timeline()
    instrument(timeline)
    provider_ms: list[float] = []
    direct_ms: list[float] = []
    seen = {"version": run_.version}

    profiler = cProfile.Profile() if args.profile else None

    def one(n: int, timed: bool) -> None:
        proposal = call_propose(
            principal=agent, task_id=run_.task_id, call_id=f"c{n}-{time.time_ns()}", step_id=f"s{n}",
            tool_name="orders.lookup", arguments={"order_id": f"ord-{n}"}, expected_version=seen["version"],
            fencing_token=run_.fencing_token)
        if timed:
            timeline.start()
            if profiler:
                profiler.enable()
        with timeline.stage("run_dispatch"):
            result = run_dispatch(proposal.operation_id, worker="stages")
        if timed:
            if profiler:
                profiler.disable()
            timeline.stop()
        if result != "confirmed":
            raise RuntimeError(f"dispatch ended {result}")
        attempt = Attempt.objects.get(operation_id=proposal.operation_id)
        started = time.perf_counter()
        client().get(f"{base_url}/orders/ord-{n}", timeout=5).raise_for_status()
        if timed:
            direct_ms.append((time.perf_counter() - started) * 1000)
            provider_ms.append((attempt.finished_at - attempt.started_at).total_seconds() * 1000)

    for n in range(args.warmup):
        one(n, timed=False)
    for n in range(args.warmup, args.warmup + args.calls):
        one(n, timed=True)

    if profiler:
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.profile)
    print(f"{connection.vendor}, channel layer {settings.CHANNEL_LAYER_URL.split('://')[0]}, "
          f"{args.calls} dispatches after {args.warmup}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'stage (inclusive)':<58} {'wall p50':>9} {'p90':>7} {'cpu p50':>8} {'stmts':>6}")
    for path in timeline.order:
        walls = [run[path][0] * 1000 for run in timeline.runs if path in run]
        cpus = [run[path][1] * 1000 for run in timeline.runs if path in run]
        stmts = [run[path][2] for run in timeline.runs if path in run]
        label = "  " * timeline.depth[path] + path.rsplit("/", 1)[-1]
        if len(walls) < len(timeline.runs):
            label += f" ({len(walls)}/{len(timeline.runs)})"
        print(f"{label:<58} {statistics.median(walls):9.2f} {_pct(walls, 90):7.2f} "
              f"{statistics.median(cpus):8.2f} {statistics.median(stmts):6.0f}")
    print("self time (inclusive less the stages inside it), p50 ms wall / cpu:")
    for path in timeline.order:
        children = [c for c in timeline.order if c.startswith(path + "/") and c.count("/") == path.count("/") + 1]
        if not children:
            continue
        own = [(run[path][0] - sum(run.get(c, (0, 0))[0] for c in children)) * 1000 for run in timeline.runs]
        own_cpu = [(run[path][1] - sum(run.get(c, (0, 0))[1] for c in children)) * 1000 for run in timeline.runs]
        print(f"  {path:<56} {statistics.median(own):9.2f} {statistics.median(own_cpu):8.2f}")
    print(f"ledger's provider stage (attempt started → finished): p50 {statistics.median(provider_ms):.2f} ms, "
          f"p90 {_pct(provider_ms, 90):.2f}")
    print(f"the same read straight to the sandbox (shared client): p50 {statistics.median(direct_ms):.2f} ms, "
          f"p90 {_pct(direct_ms, 90):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
