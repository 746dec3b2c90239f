"""Celery tasks of the approvals app: notification delivery with retries."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from approvals.models import NotificationStatus


@shared_task(name="approvals.deliver_notification", acks_late=True, reject_on_worker_lost=True)
def deliver_notification(notification_id: int) -> str:
    """One attempt; on failure the next one is scheduled from the row's `next_attempt_at`
    (exponential backoff), until the row is sent or failed."""
    from approvals import notifications

    row = notifications.notification_deliver(notification_id=notification_id)
    if row is None:
        return "missing"
    if row.status == NotificationStatus.PENDING and row.next_attempt_at is not None:
        delay = max(0.0, (row.next_attempt_at - timezone.now()).total_seconds())
        notifications.enqueue_delivery(row.pk, countdown=delay)
    return row.status


@shared_task(name="approvals.enqueue_due_notifications")
def enqueue_due_notifications() -> int:
    """Beat: reminders and escalations that fell due, then deliveries that are due."""
    from approvals import notifications

    notifications.notifications_remind_due()
    return notifications.notifications_enqueue_due()
