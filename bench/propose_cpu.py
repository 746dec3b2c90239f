"""CPU of one proposal in this process, on PostgreSQL: the service call and the whole request.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cs_bench_propose \\
        .venv/bin/python bench/propose_cpu.py [--count 2000] [--rounds 3] [--profile service|request|dispatched]

Two targets, each `--count` proposals of calls the gate runs at once (a new step and call ID
each, one task), `--rounds` times, interleaved:

- service: `call_propose` as a proposal without `wait` runs it, with its on-commit publish of
  the dispatch (to Celery's in-memory broker). (bench/ledger.py's lifecycle proposes with
  `dispatch_here`, as a waiting agent's call is run, and publishes nothing.)
- request: `POST /api/v1/tasks/{id}/calls` through Django's test client (no HTTP, no ASGI):
  the middleware, authentication, rate limit, DRF parsing and serializers, the service call and
  the response.
- dispatched: the same request with `?wait=`, so the request dispatches the call itself
  (ledger/request_dispatch.py: the claim in the proposal's transaction, the provider — here the
  in-process no-op — and the receipt) and answers `confirmed`: everything a waiting agent's call costs the server's CPU.

Printed: `time.process_time` per proposal (CPU, which leaves out the waits for the database and
for a core, so it holds on a loaded machine better than latency), the median of the rounds, and
the load; then the function calls per proposal (Python and built-in, counted with
`sys.setprofile` in this thread), which do not depend on the load at all. `--profile` runs one more block of the target under pyinstrument (from PyPI) and prints
its tree. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import ledger as bench_ledger  # noqa: E402 - after the path is set


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", choices=("service", "request", "dispatched"))
    args = parser.parse_args(argv)

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        parser.error("DATABASE_URL must name a PostgreSQL database")
    bench_ledger.ensure_database(url)
    # The server's connections come from a pool (console.asgi): a request that gives its
    # connection back (the dispatch does, for the provider call) takes one again from it.
    os.environ.setdefault("DATABASE_POOL", "10")
    bench_ledger.setup_django(url)
    bench_ledger.ensure_fixtures()
    os.environ.setdefault("RATE_LIMIT_ENABLED", "true")

    from django.test import Client

    from ledger.proposals import call_propose

    agent = bench_ledger.load_agent()
    run = bench_ledger.start_task(agent, owner="bench-cpu")
    seq = itertools.count(1)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {bench_ledger.AGENT_TOKEN}")

    def service() -> None:
        n = next(seq)
        proposal = call_propose(principal=agent, task_id=run.task_id, call_id=f"s{n}", step_id=f"s{n}",
                                tool_name=bench_ledger.TOOL, arguments={"n": n}, expected_version=run.version,
                                fencing_token=run.fencing_token)
        if not proposal.created:
            raise RuntimeError(f"proposal s{n}: {proposal.decision}")

    def post(query: str, status: str) -> None:
        n = next(seq)
        response = client.post(f"/api/v1/tasks/{run.task_id}/calls{query}", {
            "call_id": f"r{n}", "step_id": f"r{n}", "tool": bench_ledger.TOOL, "arguments": {"n": n},
            "expected_version": run.version, "fencing_token": run.fencing_token,
        }, content_type="application/json")
        if response.status_code != 201 or response.json()["status"] != status:
            raise RuntimeError(f"POST calls{query} answered {response.status_code}: {response.content[:300]!r}")

    def request() -> None:
        post("", "authorized")

    def dispatched() -> None:
        post("?wait=10", "confirmed")

    targets = {"service": service, "request": request, "dispatched": dispatched}
    for target in targets.values():
        for _ in range(50):  # warm: the gate's configuration, prepared statements, caches
            target()
    cpu: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(args.rounds):
        for name, target in targets.items():
            started = time.process_time()
            for _ in range(args.count):
                target()
            cpu[name].append((time.process_time() - started) / args.count * 1000)
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {args.count} proposals x {args.rounds}")
    for name, values in cpu.items():
        print(f"{name:8} CPU ms/proposal: median {statistics.median(values):.3f}  "
              f"({', '.join(f'{v:.3f}' for v in values)})")

    # Function calls per proposal (Python and built-in, this thread): the same on a loaded
    # machine as on a quiet one, so a before/after pair holds whatever the neighbours do.
    for name, target in targets.items():
        counted = [0]

        def count(frame, event, arg, counted=counted) -> None:
            if event in ("call", "c_call"):
                counted[0] += 1

        sys.setprofile(count)
        for _ in range(200):
            target()
        sys.setprofile(None)
        print(f"{name:8} function calls/proposal: {counted[0] / 200:.0f}")

    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0002)
        target = targets[args.profile]
        with profiler:
            for _ in range(args.count):
                target()
        print(profiler.output_text(unicode=True, color=False, show_all=False))
    from django.db import connections

    connections.close_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
