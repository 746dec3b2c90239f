"""The event log's sealing: at each writer's commit (the product) against a batched sealer.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cs_bench_sealing \\
        .venv/bin/python bench/sealing.py [--clients 8] [--seconds 4] [--runs 2] [--interval 1]

The product seals every event into its tenant's hash chain at the writer's commit: a deferred
trigger locks the chain's head row, links the rows, moves the head, and the lock is held until
the commit's WAL flush ends. A tenant's writing commits therefore follow one another, each
waiting for the one before to reach the disk. This bench measures what that costs `bench/ledger.py`'s
lifecycle and floor (client processes, one tenant and a tenant each), against the other design:
the trigger off, and one sealer process that every `--interval` seconds links every committed
row not sealed yet, in one transaction per batch. That sealer is a prototype written here to
measure the design (it is not the product's code); its CPU is counted, and every chain is
verified after each measurement (the links, as `audit_verify` checks them), so a prototype that
broke a chain would show.

The two modes alternate on one database, `--runs` times; the sealer has sealed every row before
the trigger is turned back on. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import ledger  # noqa: E402 - after the path is set

TRIGGERS = ("ledger_event_seal", "ledger_event_note_chain")
UNSEALED_INDEX = "bench_event_unsealed"
BATCH = 10_000


def chain_name(tenant_id: int | None) -> str:
    return "none" if tenant_id is None else f"tenant:{tenant_id}"


def seal_pending(conn) -> int:
    """Links every committed row not sealed yet (up to BATCH) into its chain, in id order within
    the batch, in one transaction: the heads locked in the chains' order, the rows updated from
    one VALUES list. Returns the rows sealed."""
    with conn.transaction():
        rows = conn.execute(
            "SELECT id, tenant_id, content_hash FROM ledger_event WHERE chain_seq IS NULL ORDER BY id LIMIT %s",
            [BATCH]).fetchall()
        if not rows:
            return 0
        by_chain: dict[str, list[tuple[int, str]]] = {}
        for event_id, tenant_id, content in rows:
            by_chain.setdefault(chain_name(tenant_id), []).append((event_id, content))
        links: list[tuple[int, int, str, str]] = []
        heads: list[tuple[str, int, str]] = []
        for chain in sorted(by_chain):
            seq, prev = conn.execute(
                "INSERT INTO console_eventchainhead (chain, seq, hash) VALUES (%s, 0, '') "
                "ON CONFLICT (chain) DO UPDATE SET seq = console_eventchainhead.seq RETURNING seq, hash",
                [chain]).fetchone()
            for event_id, content in by_chain[chain]:
                seq += 1
                link = hashlib.sha256(f"countersign-link-v1|{chain}|{seq}|{event_id}|{prev}|{content}"
                                      .encode()).hexdigest()
                links.append((event_id, seq, prev, link))
                prev = link
            heads.append((chain, seq, prev))
        values = ", ".join(["(%s::bigint, %s::bigint, %s, %s)"] * len(links))
        conn.execute(f"UPDATE ledger_event e SET chain_seq = v.seq, prev_hash = v.prev, hash = v.link "
                     f"FROM (VALUES {values}) AS v(id, seq, prev, link) WHERE e.id = v.id",
                     [part for link in links for part in link])
        for chain, seq, link in heads:
            conn.execute("UPDATE console_eventchainhead SET seq = %s, hash = %s WHERE chain = %s", [seq, link, chain])
    return len(rows)


def _sealer(url: str, interval: float, stop, results) -> None:
    """The sealer process: a batch every `interval` seconds until stopped, then the rest."""
    import psycopg

    sealed = batches = 0
    with psycopg.connect(url, autocommit=True) as conn:
        times0 = os.times()
        while not stop.wait(interval):
            count = seal_pending(conn)
            sealed, batches = sealed + count, batches + (1 if count else 0)
        times1 = os.times()
        while count := seal_pending(conn):
            sealed += count
    results.put((sealed, batches, (times1.user - times0.user) + (times1.system - times0.system)))


def set_mode(url: str, batched: bool) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        state = "DISABLE" if batched else "ENABLE"
        for trigger in TRIGGERS:
            conn.execute(f"ALTER TABLE ledger_event {state} TRIGGER {trigger}")
        if batched:
            conn.execute(f"CREATE INDEX IF NOT EXISTS {UNSEALED_INDEX} ON ledger_event (id) WHERE chain_seq IS NULL")
        else:
            conn.execute(f"DROP INDEX IF EXISTS {UNSEALED_INDEX}")


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
    import multiprocessing

    os.chdir(ROOT)
    ledger.ensure_database(url, fresh=True)
    ledger.setup_django(url)
    ledger.ensure_fixtures(args.clients)
    print("machine:", {k: v for k, v in ledger.machine().items() if k != "free -h"})
    print(f"command: DATABASE_URL={url} {' '.join([sys.executable.replace(str(ROOT) + '/', ''), *sys.argv])}")

    context = multiprocessing.get_context("spawn")
    kinds = ("lifecycle", "lifecycle, a tenant per client", "floor")
    rows = []
    for run in range(1, args.runs + 1):
        for batched in (False, True):
            mode = f"batched every {args.interval:g} s" if batched else "at commit"
            set_mode(url, batched)
            for kind in kinds:
                stop, results = context.Event(), context.Queue()
                sealer = None
                if batched:
                    sealer = context.Process(target=_sealer, args=(url, args.interval, stop, results), daemon=True)
                    sealer.start()
                result = ledger.run_processes(kind, args.clients, args.seconds, url=url, dbos_url="",
                                              recordings=[])
                sealed = batches = 0
                sealer_cpu = 0.0
                if sealer is not None:
                    stop.set()
                    sealed, batches, sealer_cpu = results.get(timeout=300)
                    sealer.join(timeout=60)
                whole = verify()
                per_op = sealer_cpu * 1000 / result.ops if result.ops else 0.0
                rows.append((run, mode, kind, result, per_op, sealed, batches, whole))
                print(f"run {run} {mode:20} {kind:32} {result.ops_per_s:7.1f}/s  p50 {result.p50_ms:6.2f}  "
                      f"p99 {result.p99_ms:6.2f} ms  client CPU {result.cpu_ms_per_op:.2f} ms/op  "
                      f"sealer CPU {per_op:.2f} ms/op ({sealed} rows, {batches} batches)  chains {whole}",
                      flush=True)
                time.sleep(1.0)
    set_mode(url, False)

    print(f"\n{args.clients} client processes, medians of {args.runs} runs (ops/s; the sealer's CPU per lifecycle)")
    for kind in kinds:
        cells = []
        for mode in ("at commit", f"batched every {args.interval:g} s"):
            rates = sorted(r[3].ops_per_s for r in rows if r[1] == mode and r[2] == kind)
            sealer = sorted(r[4] for r in rows if r[1] == mode and r[2] == kind)
            cells.append(f"{mode}: {rates[len(rates) // 2]:7.1f}/s (+{sealer[len(sealer) // 2]:.2f} ms sealer)")
        print(f"  {kind:32} " + "   ".join(cells))
    print("chains after every measurement:", "whole" if all(r[7] == "whole" for r in rows) else "BROKEN")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
