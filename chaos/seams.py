"""The chaos harness's hook at the dispatcher's seams (ledger/seams.py): freeze a worker at an
exact point of the protocol, so the harness can kill or stop it there.

`install()` puts `block_at_seam` into `ledger.seams` in this process; chaos/worker.py does so in
every worker it starts, before Celery forks the pool. The hook returns at once unless the
environment variable COUNTERSIGN_CHAOS_SEAM names the seam (comma-separated, or "all"), and it
blocks only if the harness left an *arm* file for this operation in COUNTERSIGN_CHAOS_MARKER_DIR,
so only the trial's operation blocks, and only once (a redelivered message passes). Taking the arm
is an atomic rename, so two workers never both take it.

Blocked, the worker writes `<seam>-<operation_id>` with its pid (the prefork pool child, the
process to SIGKILL or SIGSTOP) and waits until the harness kills it or writes
`release-<seam>-<operation_id>`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ledger import seams as ledger_seams
from ledger.seams import SEAMS

SEAM_ENV = "COUNTERSIGN_CHAOS_SEAM"
MARKER_ENV = "COUNTERSIGN_CHAOS_MARKER_DIR"
# A chaos worker prints this once the hook is in; the stack refuses to run trials on a worker
# without it (a scenario that arms a seam would otherwise wait for a block that never comes).
HOOK_INSTALLED = "chaos: seam hook installed"


def install() -> None:
    """Make the dispatcher's seams block here, in this process and the children it forks."""
    ledger_seams.install(block_at_seam)


def block_at_seam(name: str, operation_id: str) -> None:
    enabled = os.environ.get(SEAM_ENV)
    if not enabled or (enabled != "all" and name not in enabled.split(",")):
        return
    folder = os.environ.get(MARKER_ENV)
    if not folder:
        return
    base = Path(folder)
    arm = base / arm_name(name, operation_id)
    taken = base / f"taken-{name}-{operation_id}-{os.getpid()}"
    try:
        os.rename(arm, taken)
    except FileNotFoundError:
        return  # not armed for this operation, or another delivery took it already
    marker = base / f"{name}-{operation_id}"
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(str(os.getpid()))
    os.rename(tmp, marker)
    release = base / f"release-{name}-{operation_id}"
    while not release.exists():
        time.sleep(0.02)


def arm_name(name: str, operation_id: str) -> str:
    return f"arm-{name}-{operation_id}"


def arm(marker_dir: Path, name: str, operation_id: str) -> None:
    if name not in SEAMS:
        raise ValueError(f"unknown seam {name!r}; known: {', '.join(SEAMS)}")
    (marker_dir / arm_name(name, operation_id)).write_text("")


def blocked_pid(marker_dir: Path, name: str, operation_id: str) -> int | None:
    """The pid blocked at the seam for this operation, once it got there."""
    try:
        text = (marker_dir / f"{name}-{operation_id}").read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.strip() else None


def release(marker_dir: Path, name: str, operation_id: str) -> None:
    (marker_dir / f"release-{name}-{operation_id}").write_text("")
