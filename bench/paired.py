"""Two kinds of clients measured in alternating slices of one run, for a ratio that drift cannot move.

`bench/ledger.py` measures each kind of client for a few seconds, one after the other. On a quiet
machine the floor's throughput moved by a fifth from one run to the next (checkpoints, the
database growing, neighbours), more than the gap the ratio measures. Here both kinds' client
processes start together and warm up; then only one kind runs at a time, for `slice_seconds`,
in ABBA blocks (A, B, B, A), so that a drift slower than a block hits both kinds alike. Each
block gives one ratio: A's operations per second over B's, each over its own two slices. The
report is the median of the blocks' ratios, with their range.

A slice ends when its kind's clients have finished the operation in hand, so its time holds the
tail; both kinds are measured the same way. The event sealer runs beside them throughout, as
beat runs it, sealing both kinds' rows.
"""

from __future__ import annotations

import gc
import os
import statistics
import threading
import time
from dataclasses import dataclass

# A block runs kind A, then B twice, then A again.
BLOCK = (0, 1, 1, 0)
TIMEOUT = 300.0


@dataclass
class Paired:
    kinds: tuple[str, str]
    clients: int
    slice_seconds: float
    blocks: list[tuple[float, float]]  # ops/s of each kind, per block
    cpu_ms_per_op: tuple[float, float]
    p50_ms: tuple[float, float]
    p99_ms: tuple[float, float]
    # PostgreSQL's CPU (all its processes) per operation in each kind's slices: the server's
    # share of an operation, which the clients' CPU leaves out.
    pg_ms_per_op: tuple[float, float] = (0.0, 0.0)

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in self.blocks]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    def summary(self) -> dict:
        return {"kinds": list(self.kinds), "clients": self.clients, "slice_seconds": self.slice_seconds,
                "blocks_ops_per_s": self.blocks, "ratios": self.ratios, "ratio_median": self.ratio,
                "cpu_ms_per_op": list(self.cpu_ms_per_op), "p50_ms": list(self.p50_ms), "p99_ms": list(self.p99_ms),
                "pg_ms_per_op": list(self.pg_ms_per_op)}


def block_rates(ops: list[list[int]], durations: list[list[float]]) -> list[tuple[float, float]]:
    """Per ABBA block, each kind's operations per second over its two slices of the block:
    `ops[k][s]` and `durations[k][s]` are kind k's operations and seconds in its slice s."""
    blocks = len(durations[0]) // 2
    return [tuple(sum(ops[k][2 * b:2 * b + 2]) / sum(durations[k][2 * b:2 * b + 2]) for k in (0, 1))
            for b in range(blocks)]


def _client(kind_index: int, kind: str, index: int, url: str, dbos_url: str, slices: int, ready, start, end,
            ended, results) -> None:
    """One client process of one kind: warm, then one loop of operations per slice of its kind."""
    from bench import floor, ledger

    ledger.setup_django(url)
    recording: list[floor.Recording] = []
    per_slice: list[list[float]] = []
    cpu, error = 0.0, ""
    teardown = None
    try:
        op, teardown = ledger.process_client_factory(kind, url, dbos_url, recording)(index)
        op()  # warm, untimed
        gc.freeze()  # as the product's servers and workers do
        ready.wait(TIMEOUT)
        times0 = os.times()
        clock = time.perf_counter
        for _ in range(slices):
            start.wait(TIMEOUT)
            latencies: list[float] = []
            while not ended.is_set():
                began = clock()
                op()
                latencies.append(clock() - began)
            end.wait(TIMEOUT)
            per_slice.append(latencies)
        times1 = os.times()
        cpu = (times1.user - times0.user) + (times1.system - times0.system)
    except threading.BrokenBarrierError:
        error = "another process failed"
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        error = f"{type(exc).__name__}: {exc}"
        for barrier in (ready, start, end):
            barrier.abort()
    finally:
        if teardown is not None:
            teardown()
    results.put((kind_index, index, per_slice, cpu, error))


def run(kinds: tuple[str, str], clients: int, *, slice_seconds: float, blocks: int, url: str, dbos_url: str,
        seal_every: float | None) -> Paired:
    """`clients` processes of each kind, measured in `blocks` ABBA blocks of `slice_seconds` slices."""
    import multiprocessing

    from bench import ledger
    from bench.procstat import postgres_sample, spent

    context = multiprocessing.get_context("spawn")
    slices = 2 * blocks  # each kind's
    ready = context.Barrier(2 * clients + 1)
    start = [context.Barrier(clients + 1) for _ in kinds]
    end = [context.Barrier(clients + 1) for _ in kinds]
    ended = [context.Event() for _ in kinds]
    results = context.Queue()
    children = [context.Process(target=_client, name=f"{kind}-{i}", daemon=True,
                                args=(k, kind, i, url, dbos_url, slices, ready, start[k], end[k], ended[k], results))
                for k, kind in enumerate(kinds) for i in range(clients)]
    sealer = None
    if seal_every is not None:
        seal_ready, seal_stop, seal_done, sealer_results = (context.Barrier(2), context.Event(), context.Event(),
                                                            context.Queue())
        sealer = context.Process(target=ledger.sealer_process, name="sealer", daemon=True,
                                 args=(url, seal_every, seal_ready, seal_stop, seal_done, sealer_results))
        children.append(sealer)
    for child in children:
        child.start()
    durations: list[list[float]] = [[], []]
    pg_seconds = [0.0, 0.0]
    try:
        ready.wait(TIMEOUT)
        if sealer is not None:
            seal_ready.wait(TIMEOUT)
        for k in BLOCK * blocks:
            pg_before = postgres_sample()  # between slices: the clients wait at the barrier
            start[k].wait(TIMEOUT)
            began = time.perf_counter()
            time.sleep(slice_seconds)
            ended[k].set()
            end[k].wait(TIMEOUT)
            durations[k].append(time.perf_counter() - began)
            pg_seconds[k] += spent(pg_before, postgres_sample())[0]
            ended[k].clear()
    except threading.BrokenBarrierError:
        # A client failed (its report says why): the others are let go.
        for barrier in (ready, *start, *end):
            barrier.abort()
    finally:
        if sealer is not None:
            seal_stop.set()
            seal_done.set()
    reports = [results.get(timeout=TIMEOUT) for _ in range(len(kinds) * clients)]
    if sealer is not None:
        sealer_results.get(timeout=TIMEOUT)
    for child in children:
        child.join(timeout=60)
    failed = [report[-1] for report in reports if report[-1]]
    if failed:
        first = next((error for error in failed if error != "another process failed"), failed[0])
        raise RuntimeError(f"{kinds[0]} paired with {kinds[1]}, {clients} clients each, failed: {first}")

    ops = [[0] * slices for _ in kinds]
    latencies: list[list[float]] = [[], []]
    cpu = [0.0, 0.0]
    for k, _index, per_slice, seconds, _error in reports:
        for s, values in enumerate(per_slice):
            ops[k][s] += len(values)
            latencies[k] += values
        cpu[k] += seconds
    return Paired(
        kinds=kinds, clients=clients, slice_seconds=slice_seconds, blocks=block_rates(ops, durations),
        cpu_ms_per_op=tuple(cpu[k] / max(1, sum(ops[k])) * 1000 for k in range(2)),
        p50_ms=tuple(ledger.percentile(latencies[k], 50) * 1000 for k in range(2)),
        p99_ms=tuple(ledger.percentile(latencies[k], 99) * 1000 for k in range(2)),
        pg_ms_per_op=tuple(pg_seconds[k] / max(1, sum(ops[k])) * 1000 for k in range(2)),
    )
