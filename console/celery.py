"""The Celery app. Worker processes set up tracing after fork (a batch span processor does not survive fork)."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown
from kombu.transport import TRANSPORT_ALIASES

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

# filesystem:// (embedded mode) publishes atomically; see console/lib/fs_broker.py.
TRANSPORT_ALIASES["filesystem"] = "console.lib.fs_broker:Transport"

app = Celery("countersign")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect
def _init_tracing(**_kwargs) -> None:
    from console.tracing import setup_tracing

    setup_tracing(instrument_celery=True)


@worker_process_shutdown.connect
def _flush_tracing(**_kwargs) -> None:
    from console.tracing import shutdown_tracing

    shutdown_tracing()
