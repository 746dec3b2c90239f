"""What /proc says a process (or PostgreSQL, all its processes) spent: CPU seconds and context
switches, read before and after a measurement by the benches that run other processes."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU of the process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def process_sample(pid: int) -> tuple[float, int, int]:
    """A process's CPU seconds, voluntary and involuntary context switches: of all its threads
    (a thread's switches are in its own status file; a thread that ended takes its own)."""
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            lines = (task / "status").read_text().splitlines()
        except OSError:
            continue  # ended meanwhile
        status = dict(line.split(":", 1) for line in lines if ":" in line)
        voluntary += int(status["voluntary_ctxt_switches"])
        involuntary += int(status["nonvoluntary_ctxt_switches"])
    return cpu_seconds(pid), voluntary, involuntary


def postgres_sample() -> dict[int, tuple[float, int, int]]:
    """process_sample of each of this machine's PostgreSQL processes, by pid; `spent` turns two
    of them into what was spent in between."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            found[int(entry.name)] = process_sample(int(entry.name))
        except (OSError, KeyError, ValueError):
            continue  # gone meanwhile
    return found


def spent(before: dict[int, tuple[float, int, int]], after: dict[int, tuple[float, int, int]]) -> tuple[float, int, int]:
    """What the processes of `after` spent since `before` (a process started in between: all of
    its own). One that ended in between is left out: its counters went with it, and taking its
    last ones away from the sum would make it smaller than what the others spent."""
    total = [0.0, 0, 0]
    for pid, sample in after.items():
        base = before.get(pid, (0.0, 0, 0))
        total = [t + a - b for t, a, b in zip(total, sample, base, strict=True)]
    return total[0], total[1], total[2]
