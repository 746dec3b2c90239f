"""The events doorbell's cost in the committing thread: commits that each write one event, with
the ring (`console.doorbell._ring`, after commit) and without it, interleaved.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x CHANNEL_LAYER_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/ring.py --commits 300 --database-name cs_bench_ring

The database named is created (dropped first if it exists) on the server of DATABASE_URL, or,
without a PostgreSQL DATABASE_URL, as a SQLite file in a temporary folder. Run outside any server
process (as a Celery worker or a command commits). Printed per commit, with and without the ring:
wall time (p50, mean), the committing thread's CPU (`time.thread_time`) and the process's
(`time.process_time`, which includes a thread that sends the ring for it), and the connections
the channel layer's Redis accepted meanwhile (`INFO stats`). Nothing is asserted: read the
differences, and write the load (`uptime`) beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def redis_connections() -> int | None:
    url = os.environ.get("CHANNEL_LAYER_URL", "")
    if not url.startswith("redis"):
        return None
    import redis

    return redis.Redis.from_url(url).info("stats")["total_connections_received"]


def prepare(database_name: str) -> None:
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith("postgres"):
        import psycopg

        base, _, _ = url.rpartition("/")
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database_name}"')
            conn.execute(f'CREATE DATABASE "{database_name}"')
        os.environ["DATABASE_URL"] = f"{base}/{database_name}"
    else:
        folder = Path(tempfile.mkdtemp(prefix="countersign-ring-"))
        os.environ["COUNTERSIGN_VAR_DIR"] = str(folder)
        os.environ["DATABASE_URL"] = f"sqlite:///{folder / (database_name + '.sqlite3')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=300, help="commits of each kind")
    parser.add_argument("--database-name", default="cs_bench_ring")
    args = parser.parse_args()
    prepare(args.database_name)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    from console.lib import transitions
    from console.models import Event, Tenant

    call_command("migrate", verbosity=0)
    tenant = Tenant.objects.create(slug="bench", name="Bench")
    ring = transitions.ring_doorbell_on_commit

    def commit(n: int, ringing: bool) -> tuple[float, float, float]:
        transitions.ring_doorbell_on_commit = ring if ringing else (lambda: None)
        wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
        with transaction.atomic():
            transitions.record_event(entity="task", entity_id=f"t{n}", tenant_id=tenant.id,
                                     kind=Event.Kind.CREATED, to_status="queued", actor="bench")
        return time.perf_counter() - wall, time.thread_time() - thread, time.process_time() - process

    for n in range(20):  # warm-up: connections, the ring's loop
        commit(n, n % 2 == 0)
    time.sleep(0.5)
    results: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    connections_before = redis_connections()
    process_before = time.process_time()
    for n in range(args.commits):
        for ringing in (True, False) if n % 2 else (False, True):
            results[ringing].append(commit(1000 + 2 * n + ringing, ringing))
    time.sleep(0.5)  # rings still being sent are counted below
    connections_after = redis_connections()
    print(f"{args.commits} commits of each kind, layer {os.environ.get('CHANNEL_LAYER_URL', 'memory://')}, "
          f"database {os.environ['DATABASE_URL'].partition(':')[0]}; load {os.getloadavg()[0]:.2f}")
    print(f"{'':12} {'wall p50':>9} {'wall mean':>10} {'thread CPU':>11} {'process CPU':>12}  (ms per commit)")
    for ringing in (True, False):
        walls, threads, processes = zip(*results[ringing], strict=True)
        print(f"{'ring' if ringing else 'no ring':12} {statistics.median(walls) * 1e3:9.3f} "
              f"{statistics.fmean(walls) * 1e3:10.3f} {statistics.fmean(threads) * 1e3:11.3f} "
              f"{statistics.fmean(processes) * 1e3:12.3f}")
    print(f"process CPU over the whole loop: {(time.process_time() - process_before) * 1e3:.1f} ms")
    if connections_before is not None:
        print(f"Redis connections accepted during the loop: {connections_after - connections_before}")


if __name__ == "__main__":
    main()
