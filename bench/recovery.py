"""Recovery time after a worker is killed while idle, per pool, measured with real processes.

    .venv/bin/python bench/recovery.py [--runs 3] [--stall-seconds 5]

Each run starts one worker (and beat) with the pool under test, SIGKILLs every process of it
once while idle — each prefork child (the deadlock: the replacements block on the queue lock a
dead child held), or the threads pool's only process — then proposes five run-at-once refunds
and times until all five are `confirmed`. The supervisor is the chaos stack's, which runs the
same `supervise()` as `make run`, restarting a worker that exited or that is alive but stalled
for --stall-seconds (WORKER_STALL_SECONDS is 30 by default in `make run`).
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

setup("countersign-bench-recovery-")

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from chaos.stack import ChaosStack, database_url_for, pool_pids  # noqa: E402
from chaos.world import REFUND, ensure_world, kill, order, propose  # noqa: E402
from console.lib.procs import wait_until  # noqa: E402
from ledger.models import Operation, OperationStatus  # noqa: E402


def one_run(pool: str, concurrency: int, stall_seconds: float, world) -> tuple[float, list[str]]:
    broker = settings.CELERY_BROKER_URL
    stack = ChaosStack(database_url=database_url_for(connection.settings_dict),
                       broker_url=broker if broker.startswith(("redis://", "amqp://")) else None,
                       workers=1, pool=pool, concurrency=concurrency, restart_stalled=True,
                       stall_seconds=stall_seconds)
    with stack:
        worker = stack.worker_children[0]
        children = pool_pids(worker)
        for pid in children:
            kill(pid)
            wait_until(lambda pid=pid: pid not in pool_pids(worker) and len(pool_pids(worker)) == len(children),
                       timeout=30, what="a replacement child")
        if not children:
            kill(worker.popen.pid)
        started = time.perf_counter()
        ids = [propose(world, tool=REFUND, order_id=order()).operation_id for _ in range(5)]
        wait_until(lambda: Operation.objects.filter(pk__in=ids, status=OperationStatus.CONFIRMED).count() == 5,
                   timeout=300, what="five confirmed", interval=0.05)
        return time.perf_counter() - started, list(stack.restarts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stall-seconds", type=float, default=5.0)
    args = parser.parse_args()
    call_command("migrate", interactive=False, verbosity=0)
    world = ensure_world()
    figures: dict[str, list[float]] = {"prefork -c 2": [], "threads -c 4": []}
    for run in range(args.runs):
        for label, pool, n in (("prefork -c 2", "prefork", 2), ("threads -c 4", "threads", 4)):
            seconds, restarts = one_run(pool, n, args.stall_seconds, world)
            figures[label].append(seconds)
            print(f"run {run + 1} {label}: five confirmed {seconds:.1f} s after the kills; restarts: {restarts}",
                  flush=True)
    print(f"\n{connection.vendor}, broker {settings.CELERY_BROKER_URL.split('://')[0]}, "
          f"stall {args.stall_seconds:.0f} s, median of {args.runs} runs")
    for label, values in figures.items():
        print(f"{label:<14}{statistics.median(values):>8.1f} s")


if __name__ == "__main__":
    main()
