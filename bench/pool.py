"""Dispatch throughput of one Celery worker per pool choice, measured side by side.

    .venv/bin/python bench/pool.py [--operations 200] [--runs 3] [--pools prefork:2,threads:4,threads:8]
    DATABASE_URL=postgres://… CELERY_BROKER_URL=redis://… .venv/bin/python bench/pool.py …

Each run proposes N run-at-once refunds (the chaos harness's `chaos.refund` tool against the
payments sandbox, a real HTTP provider), with their dispatch messages going nowhere; then
starts one worker with the pool under test (and no beat), publishes the N dispatches at once
and times until the last is `confirmed`. Pools are interleaved run by run, so a noisy
neighbour hurts them all alike. Prints operations per second (median of the runs) per pool.
On SQLite the database is a fresh file; on PostgreSQL the configured database is migrated.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.django_env import setup  # noqa: E402 - after the path is set

setup("countersign-bench-pool-")

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from chaos.stack import ChaosStack, database_url_for  # noqa: E402
from chaos.world import REFUND, ensure_world, order, propose  # noqa: E402
from console.celery import app as celery_app  # noqa: E402
from console.lib.procs import wait_until  # noqa: E402
from ledger.models import Operation, OperationStatus  # noqa: E402
from ledger.tasks import enqueue_dispatch  # noqa: E402


def proposed_without_dispatch(world, count: int) -> list[str]:
    saved = celery_app.conf.broker_url
    celery_app.conf.broker_url = "memory://"
    celery_app._pool = None
    try:
        return [propose(world, tool=REFUND, order_id=order()).operation_id for _ in range(count)]
    finally:
        celery_app.conf.broker_url = saved
        celery_app._pool = None


def one_run(pool: str, concurrency: int, world, count: int) -> float:
    ids = proposed_without_dispatch(world, count)
    broker = settings.CELERY_BROKER_URL
    stack = ChaosStack(database_url=database_url_for(connection.settings_dict),
                       broker_url=broker if broker.startswith(("redis://", "amqp://")) else None,
                       workers=1, beat=False, pool=pool, concurrency=concurrency)
    with stack:
        started = time.perf_counter()
        for operation_id in ids:
            enqueue_dispatch(operation_id)
        wait_until(lambda: Operation.objects.filter(pk__in=ids, status=OperationStatus.CONFIRMED).count() == count,
                   timeout=600, what=f"{count} operations confirmed", interval=0.02)
        return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--operations", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pools", default="prefork:2,threads:4,threads:8", help="pool:concurrency, comma-separated")
    args = parser.parse_args()
    call_command("migrate", interactive=False, verbosity=0)
    world = ensure_world()
    pools = [(name, int(n)) for name, n in (item.split(":") for item in args.pools.split(","))]
    figures: dict[tuple[str, int], list[float]] = {pool: [] for pool in pools}
    for run in range(args.runs):
        for pool in pools:
            rate = one_run(*pool, world, args.operations)
            figures[pool].append(rate)
            print(f"run {run + 1} {pool[0]} -c {pool[1]}: {rate:.1f} operations/s", flush=True)
    print(f"\n{connection.vendor}, broker {settings.CELERY_BROKER_URL.split('://')[0]}, "
          f"{args.operations} operations, median of {args.runs} runs")
    print(f"{'pool':<16}{'operations/s':>14}")
    for (name, n), rates in figures.items():
        print(f"{f'{name} -c {n}':<16}{statistics.median(rates):>14.1f}")


if __name__ == "__main__":
    main()
