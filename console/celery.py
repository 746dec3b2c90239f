"""The Celery app. Tracing is set up where tasks run: in each prefork child after the fork (a batch
span processor does not survive fork), in the worker's own process for the threads pool."""

from __future__ import annotations

import gc
import os
import time

from celery import Celery
from celery.concurrency import get_implementation
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from kombu.transport import TRANSPORT_ALIASES

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

# filesystem:// (embedded mode) publishes atomically; see console/lib/fs_broker.py.
TRANSPORT_ALIASES["filesystem"] = "console.lib.fs_broker:Transport"

app = Celery("countersign")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Celery's Django fix-up closes every database connection before and after each task unless
# this is set: every dispatch then paid for a new PostgreSQL connection (a backend process,
# authentication, the session's settings) and started without its prepared statements. The
# fix-up now closes them after this many tasks (it counts the hooks before and after each);
# the hooks below close a connection that broke or was left in a transaction at once, and
# check one that sat idle before a task uses it.
DB_REUSE_TASKS = 1000
IDLE_CHECK_SECONDS = 1.0
app.conf["CELERY_DB_REUSE_MAX"] = DB_REUSE_TASKS
_IDLE_SINCE = "countersign_idle_since"  # on each connection (one per thread): when its last task ended


@task_prerun.connect
def _check_idle_connections(task=None, **_kwargs) -> None:
    from django.db import connections

    if task is None or getattr(task.request, "is_eager", False):
        return  # run inline by its caller, on the caller's connection and transaction
    now = time.monotonic()
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and now - conn.__dict__.get(_IDLE_SINCE, now) >= IDLE_CHECK_SECONDS:
            # Django pings it (when CONN_HEALTH_CHECKS is on) before its first query, and
            # reconnects if the server dropped it meanwhile.
            conn.health_check_done = False


@task_postrun.connect
def _close_unusable_connections(task=None, **_kwargs) -> None:
    from django.db import connections

    if task is None or getattr(task.request, "is_eager", False):
        return
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"] or conn.in_atomic_block:
            conn.close()
        elif conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()
        conn.__dict__[_IDLE_SINCE] = time.monotonic()


@worker_process_init.connect
def _init_tracing(**_kwargs) -> None:
    from console.tracing import setup_tracing

    setup_tracing(instrument_celery=True)


@worker_init.connect
def _init_tracing_without_fork(sender=None, **_kwargs) -> None:
    # Sent in the main process before any pool starts; a prefork pool's children set up their own.
    if sender is not None and get_implementation(sender.pool_cls).__module__ != "celery.concurrency.prefork":
        _init_tracing()


@worker_ready.connect
@worker_process_init.connect
def _freeze_startup_objects(**_kwargs) -> None:
    # What start-up made (Django, the tasks, tracing) lives as long as the process: out of the
    # collector's sight, a full collection walks only what tasks made since, instead of holding
    # the GIL for every object of every import. Where tasks run: the worker's own process once
    # ready (threads pool), each prefork child after its set-up.
    gc.freeze()


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_tracing(**_kwargs) -> None:
    from console.tracing import shutdown_tracing

    shutdown_tracing()
