"""The environment variables a chaos worker reads (chaos/worker.py, chaos/worker_app.py) and the
stack sets (chaos/stack.py). No Django here: the worker reads them before loading it."""

from __future__ import annotations

import os

SKEW_ENV = "COUNTERSIGN_CHAOS_CLOCK_SKEW"
POLL_ENV = "COUNTERSIGN_CHAOS_POLLING_INTERVAL"
PREFIX_ENV = "COUNTERSIGN_CHAOS_KEYPREFIX"


def transport_options_from_env() -> dict:
    """The file-system broker polls once a second by default, and with prefetch 1 a worker then
    takes at most one message a second: fewer than beat's sweeps at SWEEP_SECONDS=0.5. On a
    shared Redis, a key prefix keeps one stack's queues from another's (same queue names)."""
    extra: dict = {}
    if os.environ.get(POLL_ENV):
        extra["polling_interval"] = float(os.environ[POLL_ENV])
    if os.environ.get(PREFIX_ENV):
        extra["global_keyprefix"] = os.environ[PREFIX_ENV]
    return extra
