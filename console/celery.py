"""The Celery app. Tracing is set up where tasks run: in each prefork child after the fork (a batch
span processor does not survive fork), in the worker's own process for the threads pool."""

from __future__ import annotations

import os

from celery import Celery
from celery.concurrency import get_implementation
from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
)
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


@worker_init.connect
def _init_tracing_without_fork(sender=None, **_kwargs) -> None:
    # Sent in the main process before any pool starts; a prefork pool's children set up their own.
    if sender is not None and get_implementation(sender.pool_cls).__module__ != "celery.concurrency.prefork":
        _init_tracing()


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_tracing(**_kwargs) -> None:
    from console.tracing import shutdown_tracing

    shutdown_tracing()
