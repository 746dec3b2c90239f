"""The event log's sealing: after commit by the sealer (the product) against at each writer's commit.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cs_bench_sealing \\
        .venv/bin/python bench/sealing.py [--clients 8] [--seconds 4] [--runs 2] [--interval 1]

The product's writers leave their event rows unsealed, and the sealer (`audit.seal_pending`,
run by beat every EVENT_SEAL_SECONDS) links them into their tenants' hash chains, a batch per
transaction. Before, a deferred trigger sealed each writer's rows at its commit: it locked the
chain's head row and held it through the commit's WAL flush, so a tenant's writing commits
followed one another. This bench measures both on `bench/ledger.py`'s lifecycle and floor
(client processes, one tenant and a tenant each): the product, with one sealer process running
`seal_pending` every `--interval` seconds (its CPU counted), and the old design, its triggers put
back from their migrations. Every chain's links are checked after each measurement.

The two modes alternate on one database, `--runs` times; every row is sealed before the triggers
go back on. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import ledger  # noqa: E402 - after the path is set

UNSEALED_INDEX = 'CREATE INDEX IF NOT EXISTS "event_unsealed" ON "ledger_event" ("id") WHERE "chain_seq" IS NULL'


def set_mode(url: str, at_commit: bool) -> None:
    """The old design (the sealing triggers of migrations 0006 and 0007, every row sealed first,
    no index of unsealed rows) or the product's (as migration 0011 leaves it)."""
    import psycopg

    from console.lib import audit

    # The migrations that installed sealing at commit, and the one that took it out (Django set up).
    chain = importlib.import_module("console.migrations.0006_event_hash_chain")
    lock_order = importlib.import_module("console.migrations.0007_event_chain_lock_order")
    after_commit = importlib.import_module("console.migrations.0011_event_sealed_after_commit")
    if at_commit:
        audit.seal_pending()
    with psycopg.connect(url, autocommit=True) as conn:
        if at_commit:
            conn.execute(chain.POSTGRES)
            conn.execute(lock_order.POSTGRES)
            conn.execute('DROP INDEX IF EXISTS "event_unsealed"')
        else:
            conn.execute(after_commit.POSTGRES_DROP)
            conn.execute(UNSEALED_INDEX)


def verify() -> str:
    """Every chain's links, as `audit_verify` checks them: no row left unsealed, the sequence
    without gap or repeat, each row's hash over its place and content hash, naming the hash of
    the row before, the head on the last row. Not the content hashes: the floor's replayed rows
    carry the content hash recorded with other IDs (the floor writes the rows' cost, not their
    meaning), so they would fail that check in either mode."""
    from console.lib import audit
    from console.models import Event, EventChainHead

    breaks = []
    if Event.objects.filter(chain_seq__isnull=True).exists():
        breaks.append("rows left unsealed")
    for tenant_id in audit.chains():
        chain = audit.chain_of(tenant_id)
        seq, prev = 0, ""
        rows = Event.objects.filter(tenant_id=tenant_id, chain_seq__isnull=False).order_by("chain_seq").only(
            "id", "tenant_id", "chain_seq", "prev_hash", "hash", "content_hash")
        for row in rows.iterator(chunk_size=5000):
            seq += 1
            if row.chain_seq != seq or row.prev_hash != prev or row.hash != audit.link_hash(row):
                breaks.append(f"{chain} at event #{row.id}")
                break
            prev = row.hash
        else:
            head = EventChainHead.objects.filter(chain=chain).first()
            if head is not None and (head.seq, head.hash) != (seq, prev):
                breaks.append(f"{chain}: the head is not on the last row")
    return "whole" if not breaks else "; ".join(breaks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between the sealer's batches")
    args = parser.parse_args(argv)
    url = os.environ.get("DATABASE_URL", "")
    if urlsplit(url).scheme not in ("postgres", "postgresql") or "bench" not in ledger.database_name(url):
        print("set DATABASE_URL to a PostgreSQL database whose name contains 'bench' (it is dropped first)",
              file=sys.stderr)
        return 2
    os.chdir(ROOT)
    ledger.ensure_database(url, fresh=True)
    ledger.setup_django(url)
    ledger.ensure_fixtures(args.clients)
    print("machine:", {k: v for k, v in ledger.machine().items() if k != "free -h"})
    print(f"command: DATABASE_URL={url} {' '.join([sys.executable.replace(str(ROOT) + '/', ''), *sys.argv])}")

    kinds = ("lifecycle", "lifecycle, a tenant per client", "floor")
    rows = []
    for run in range(1, args.runs + 1):
        for batched in (False, True):
            mode = f"after commit, every {args.interval:g} s" if batched else "at commit"
            set_mode(url, at_commit=not batched)
            for kind in kinds:
                result = ledger.run_processes(kind, args.clients, args.seconds, url=url, dbos_url="", recordings=[],
                                              seal_every=args.interval if batched else None)
                sealed, per_op = result.sealed, result.sealer_ms_per_op
                whole = verify()
                rows.append((run, mode, kind, result, per_op, sealed, whole))
                print(f"run {run} {mode:20} {kind:32} {result.ops_per_s:7.1f}/s  p50 {result.p50_ms:6.2f}  "
                      f"p99 {result.p99_ms:6.2f} ms  client CPU {result.cpu_ms_per_op:.2f} ms/op  "
                      f"sealer CPU {per_op:.2f} ms/op ({sealed} rows)  chains {whole}",
                      flush=True)
                time.sleep(1.0)
    set_mode(url, at_commit=False)

    print(f"\n{args.clients} client processes, medians of {args.runs} runs (ops/s; the sealer's CPU per lifecycle)")
    for kind in kinds:
        cells = []
        for mode in ("at commit", f"after commit, every {args.interval:g} s"):
            rates = sorted(r[3].ops_per_s for r in rows if r[1] == mode and r[2] == kind)
            sealer = sorted(r[4] for r in rows if r[1] == mode and r[2] == kind)
            cells.append(f"{mode}: {rates[len(rates) // 2]:7.1f}/s (+{sealer[len(sealer) // 2]:.2f} ms sealer)")
        print(f"  {kind:32} " + "   ".join(cells))
    print("chains after every measurement:", "whole" if all(r[6] == "whole" for r in rows) else "BROKEN")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
