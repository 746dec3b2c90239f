"""What building one call's answer costs in this process: `ledger.api._call_body`, the body a
long-poll answers with once the doorbell has woken it (and, `--look`, the one it answers with
when the call needed no waiting, from the call read with its operation).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cs_bench_answer \\
        .venv/bin/python bench/answer.py [--calls 300] [--rounds 3]

Proposes `--calls` calls of `bench.noop` (run at once) and dispatches each inline (confirmed,
one attempt), then builds each call's answer, `--rounds` times. Printed per round: the median
and p90 wall time and CPU (`time.thread_time`) of one answer, the statements it sent, and the
load average. Nothing is asserted.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--look", action="store_true", help="answer from the call read with its operation")
    args = parser.parse_args(argv)
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        parser.error("DATABASE_URL must name a PostgreSQL database")
    bench_ledger.ensure_database(url)
    bench_ledger.setup_django(url)
    bench_ledger.ensure_fixtures()

    from django.db import connection
    from django.test import RequestFactory
    from django.test.utils import CaptureQueriesContext

    from ledger import api as ledger_api
    from ledger.models import Call
    from ledger.selectors import call_for_principal

    one, close = bench_ledger.lifecycle_runner(0)
    prefix = f"a{time.time_ns()}-"
    for n in range(args.calls):
        one(f"{prefix}{n}", f"{prefix}{n}")
    calls = list(Call.objects.filter(call_id__startswith=prefix))
    agent = bench_ledger.load_agent()
    request = RequestFactory().get("/api/v1/calls/x")

    def answer(call) -> None:
        if args.look:
            call = call_for_principal(principal=agent, call_id=call.call_id, task_id=call.task_id)
            ledger_api._call_body(call, request, fresh=False)
        else:
            ledger_api._call_body(call, request)

    with CaptureQueriesContext(connection) as queries:
        answer(calls[0])
    print(f"{'look (call read, then the answer)' if args.look else 'answer'}: {len(queries)} statements")
    for round_ in range(1, args.rounds + 1):
        walls, cpus = [], []
        for call in calls:
            wall, cpu = time.perf_counter(), time.thread_time()
            answer(call)
            cpus.append(time.thread_time() - cpu)
            walls.append(time.perf_counter() - wall)
        q = statistics.quantiles
        print(f"round {round_}: wall p50 {statistics.median(walls) * 1e3:.2f} ms, p90 {q(walls, n=10)[-1] * 1e3:.2f} ms;"
              f" CPU p50 {statistics.median(cpus) * 1e3:.2f} ms, p90 {q(cpus, n=10)[-1] * 1e3:.2f} ms;"
              f" load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
