"""Celery tasks of the ledger. The broker is at-least-once and possibly lossy: every task is a
no-op when the ledger says there is nothing to do, and the sweeper re-enqueues what was lost."""

from __future__ import annotations

import os
import socket

from celery import shared_task


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def enqueue_dispatch(operation_id: str, *, queue: str = "fast", countdown: float | None = None) -> None:
    """Publish a dispatch. Call only after the authorizing transaction committed (on_commit)."""
    dispatch_operation.apply_async(args=[operation_id], queue=queue, countdown=countdown)


def enqueue_reconcile(operation_id: str, *, queue: str = "slow") -> None:
    reconcile_operation.apply_async(args=[operation_id], queue=queue)


@shared_task(name="ledger.dispatch_operation", acks_late=True, reject_on_worker_lost=True)
def dispatch_operation(operation_id: str) -> str:
    from ledger.dispatcher import run_dispatch

    return run_dispatch(operation_id, worker=worker_name())


@shared_task(name="ledger.reconcile_operation", acks_late=True, reject_on_worker_lost=True)
def reconcile_operation(operation_id: str) -> str:
    from ledger.reconcile import run_reconcile

    return run_reconcile(operation_id, worker=worker_name())


@shared_task(name="ledger.sweep")
def sweep() -> dict:
    from ledger.sweeper import run_sweep

    return run_sweep()


@shared_task(name="ledger.query_provider")
def query_provider(operation_id: str, requested_by: str) -> str:
    """Ask the provider about an operation's key for support staff and record the answer as an
    evidence event (kind `provider_answer`); changes no status, so a duplicate is harmless."""
    from ledger.support import provider_query_run

    return provider_query_run(operation_id=operation_id, actor=requested_by).to_status
