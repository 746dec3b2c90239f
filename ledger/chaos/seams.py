"""Points in the dispatcher where the chaos harness can freeze a worker, then kill or stop it.

`seam(name, operation_id)` is a no-op unless the environment variable COUNTERSIGN_CHAOS_SEAM
names the seam (comma-separated, or "all"): production workers never set it and pay one dict
lookup. A chaos worker additionally needs an *arm* file for this operation in
COUNTERSIGN_CHAOS_MARKER_DIR, so only the trial's operation blocks, and only once (a redelivered
message passes). Taking the arm is an atomic rename, so two workers never both take it.

Blocked, the worker writes `<seam>-<operation_id>` with its pid (the prefork pool child, the
process to SIGKILL or SIGSTOP) and waits until the harness kills it or writes
`release-<seam>-<operation_id>`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SEAM_ENV = "COUNTERSIGN_CHAOS_SEAM"
MARKER_ENV = "COUNTERSIGN_CHAOS_MARKER_DIR"
SEAMS = ("before_dispatch_commit", "before_provider_call", "after_provider_call")


def seam(name: str, operation_id: str) -> None:
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
