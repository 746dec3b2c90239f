"""The console's periodic work, run by Celery beat."""

from __future__ import annotations

from celery import shared_task

from console.lib import audit


@shared_task(name="console.seal_events")
def seal_events() -> int:
    """Links the event rows committed since the last run into their hash chains (PostgreSQL),
    every EVENT_SEAL_SECONDS; how many."""
    return audit.seal_pending()
