"""`python -m chaos.worker <celery args>`: a Celery worker (or beat) for the chaos harness.

Before Celery or the product is loaded, in this order:
1. COUNTERSIGN_CHAOS_CLOCK_SKEW (seconds, e.g. "30" or "-30") shifts `time.time` and Django's
   `timezone.now` in this process and its pool children only — `faketime` without installing it.
   It must come before Django's models are imported, so model field defaults
   (`default=timezone.now`) capture the skewed clock too.
2. The chaos seam hook goes into `ledger.seams` (chaos/seams.py), so the dispatcher's seams can
   block a worker the harness armed; the prefork pool children inherit it.
Then it runs `celery -A chaos.worker_app`: the product's app with the broker transport options
the stack asks for (chaos/worker_app.py). Nothing here imports Django's settings or models, and
neither may anything this module imports at the top.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

from chaos import seams
from chaos.worker_env import SKEW_ENV


def install_skew(seconds: float) -> None:
    if not seconds:
        return
    real_time = time.time

    def skewed_time() -> float:
        return real_time() + seconds

    time.time = skewed_time

    # Imported only now: the time.time patch above comes first. django.utils.timezone loads no
    # settings and no models.
    from django.utils import timezone

    real_now = timezone.now

    def skewed_now():
        return real_now() + timedelta(seconds=seconds)

    timezone.now = skewed_now


def main() -> None:
    install_skew(float(os.environ.get(SKEW_ENV) or 0))
    seams.install()
    print(f"{seams.HOOK_INSTALLED} (seams enabled: {os.environ.get(seams.SEAM_ENV) or 'none'})",
          file=sys.stderr, flush=True)
    # Celery is imported only after the clock patch, as the product's app is (through -A).
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", "-A", "chaos.worker_app", *sys.argv[1:]]
    celery_main()


if __name__ == "__main__":
    main()
