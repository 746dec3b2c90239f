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
    # The arguments' text for logs and monitors, given: Celery's own (saferepr) is a third of
    # a publish's CPU, for one string.
    dispatch_operation.apply_async(args=[operation_id], queue=queue, countdown=countdown,
                                   argsrepr=repr([operation_id]), kwargsrepr="{}")


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


def enqueue_webhook(event_pk: int, *, countdown: float | None = None) -> None:
    """Publish a webhook delivery. Call only after the event's transaction committed."""
    deliver_webhook.apply_async(args=[event_pk], countdown=countdown)


@shared_task(name="ledger.deliver_webhook", acks_late=True, reject_on_worker_lost=True)
def deliver_webhook(event_pk: int) -> str:
    """One attempt; a retry is scheduled from the row's `next_attempt_at` (backoff with jitter).
    A lost message is found again by beat (`enqueue_due_webhooks`)."""
    from django.utils import timezone

    from ledger.webhooks import webhook_deliver

    event, attempted = webhook_deliver(event_pk=event_pk)
    if event is None:
        return "missing"
    if attempted and event.status == "pending" and event.next_attempt_at is not None:
        enqueue_webhook(event.pk, countdown=max(0.0, (event.next_attempt_at - timezone.now()).total_seconds()))
    return event.status


@shared_task(name="ledger.enqueue_due_webhooks")
def enqueue_due_webhooks() -> int:
    """Beat: webhook deliveries that are due and whose message was lost."""
    from ledger.webhooks import webhooks_enqueue_due

    return webhooks_enqueue_due()
