"""`python -m ledger.chaos.worker <celery args>`: a Celery worker (or beat) whose clocks may be off.

COUNTERSIGN_CHAOS_CLOCK_SKEW (seconds, e.g. "30" or "-30") shifts `time.time` and Django's
`timezone.now` in this process and its pool children only — `faketime` without installing it.
COUNTERSIGN_CHAOS_POLLING_INTERVAL and COUNTERSIGN_CHAOS_KEYPREFIX add broker transport options.
The patch runs before Django or Celery is imported, so model field defaults (`default=timezone.now`)
capture the skewed clock too. Without the variable it is a plain `celery -A console worker`.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

SKEW_ENV = "COUNTERSIGN_CHAOS_CLOCK_SKEW"
POLL_ENV = "COUNTERSIGN_CHAOS_POLLING_INTERVAL"
PREFIX_ENV = "COUNTERSIGN_CHAOS_KEYPREFIX"


def install_skew(seconds: float) -> None:
    if not seconds:
        return
    real_time = time.time

    def skewed_time() -> float:
        return real_time() + seconds

    time.time = skewed_time

    from django.utils import timezone

    real_now = timezone.now

    def skewed_now():
        return real_now() + timedelta(seconds=seconds)

    timezone.now = skewed_now


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


def main() -> None:
    install_skew(float(os.environ.get(SKEW_ENV) or 0))
    extra = transport_options_from_env()
    if extra:
        from console.celery import app

        app.conf.broker_transport_options = {**app.conf.broker_transport_options, **extra}
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", "-A", "console", *sys.argv[1:]]
    celery_main()


if __name__ == "__main__":
    main()
