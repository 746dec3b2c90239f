"""How fast `audit_verify` checks a hash chain, and that its memory stays flat.

    .venv/bin/python bench/audit_verify.py [--events 100000] [--runs 3] [--chunk 2000]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/countersign_bench_audit .venv/bin/python bench/audit_verify.py

Without DATABASE_URL: a fresh SQLite file. With it: that PostgreSQL database (created and
migrated if missing). Writes `--events` events into one tenant's chain (tenant `bench-audit`,
created if missing; 1,000 events per transaction, sealed by the database's trigger as the
application's are), unless the chain already holds that many, then times `verify_chain` over
it `--runs` times. Prints events/s per run and their median, and Python's peak traced memory
during the last run next to the same for a run over a tenth of the events (flat: about the
same; growing with the chain: about ten times). The floor for reading: the same rows fetched
in the same pages with nothing computed (`read only`). Nothing is asserted; figures go in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import django_env  # noqa: E402 - after the path is set

SLUG = "bench-audit"
BATCH = 1000


def ensure_database() -> None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        return
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def fill(tenant_id: int, events: int) -> None:
    from django.db import transaction

    from console.lib.transitions import event_row, record_events
    from console.models import Event

    have = Event.objects.filter(tenant_id=tenant_id).count()
    started = time.perf_counter()
    while have < events:
        n = min(BATCH, events - have)
        with transaction.atomic():
            record_events([event_row(entity="task", entity_id=f"bench-{have + i}", tenant_id=tenant_id,
                                     kind=Event.Kind.CREATED, to_status="running", actor="agent:bench",
                                     evidence={"i": have + i, "note": "a benchmark event"})
                           for i in range(n)])
        have += n
    print(f"chain holds {have} events (written in {time.perf_counter() - started:.1f} s)")


def read_only(tenant_id: int, chunk: int) -> int:
    """The same pages `verify_chain` reads, nothing checked: the floor of reading."""
    from console.lib import audit
    from console.models import Event

    return sum(1 for _ in audit._pages(Event.objects.filter(tenant_id=tenant_id, chain_seq__isnull=False), chunk))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=2000)
    args = parser.parse_args()

    ensure_database()
    django_env.setup("countersign-bench-audit-")
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from console.lib import audit
    from console.models import Event, Tenant

    tenant, _ = Tenant.objects.get_or_create(slug=SLUG, defaults={"name": "Bench audit"})
    small = Tenant.objects.get_or_create(slug=f"{SLUG}-tenth", defaults={"name": "Bench audit, a tenth"})[0]
    fill(tenant.pk, args.events)
    fill(small.pk, args.events // 10)
    total = Event.objects.filter(tenant_id=tenant.pk).count()

    rates, floors = [], []
    for run in range(args.runs):
        started = time.perf_counter()
        read = read_only(tenant.pk, args.chunk)
        floors.append(read / (time.perf_counter() - started))
        started = time.perf_counter()
        broken = audit.verify_chain(tenant.pk, chunk_size=args.chunk)
        rates.append(total / (time.perf_counter() - started))
        print(f"run {run + 1}: verify {rates[-1]:,.0f} events/s ({'whole' if broken is None else broken}); "
              f"read only {floors[-1]:,.0f} events/s")

    peaks = {}
    for label, tenant_id in (("tenth", small.pk), ("full", tenant.pk)):
        tracemalloc.start()
        audit.verify_chain(tenant_id, chunk_size=args.chunk)
        peaks[label] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    from django.db import connection

    print(f"database: {connection.vendor}; chain: {total} events; chunk: {args.chunk}")
    print(f"verify: median {statistics.median(rates):,.0f} events/s; read only: median "
          f"{statistics.median(floors):,.0f} events/s")
    print(f"peak traced memory: {peaks['tenth'] / 1e6:.1f} MB over {total // 10} events, "
          f"{peaks['full'] / 1e6:.1f} MB over {total}")


if __name__ == "__main__":
    main()
