"""Notifications on the configured channels (webhook or email): reviewers hear of new pending
approval requests of their tier, of requests still undecided after a share of their time
(a reminder, then an escalation to the next tier's reviewers: `notifications_remind_due`), and
support staff hear of operations that go `manual` or `compensation_required`
(`notifications_plan_operation`, called by the ledger's transition in its transaction).

`notifications_plan(approval)` runs inside the transaction that creates the request: it writes
one `Notification` row (pending) per enabled channel of the request's tier and tenant, and
enqueues their deliveries **on commit** (a worker must not read an uncommitted row, and a
rolled-back request must announce nothing). An edit that raises a call to L4 creates a
new L4 request, so the L4 channels hear about it like any other L4 request.

Delivery (`notification_deliver`, run by the Celery task `approvals.deliver_notification`)
holds no transaction across the network call: it claims the attempt with a compare-and-set,
calls the channel, then records the outcome. A failure is kept (`errors`, `last_error`) and
the next attempt is scheduled with exponential backoff until `NOTIFICATION_MAX_ATTEMPTS`;
after that the row is `failed` — visible in the admin and on the request's page. The broker
may lose or repeat the task: a repeat of a sent row is a no-op, and
`notifications_enqueue_due` (meant for Celery beat) re-enqueues pending rows that are due.

Settings (`console/settings.py`, from the environment): `PUBLIC_BASE_URL` (absolute links in
webhooks and emails), `NOTIFICATION_MAX_ATTEMPTS`, `NOTIFICATION_BACKOFF_SECONDS` (the base),
`NOTIFICATION_BACKOFF_CAP_SECONDS`, `NOTIFICATION_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Protocol

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from approvals.models import (
    ApprovalRequest,
    ApprovalStatus,
    Notification,
    NotificationChannel,
    NotificationStatus,
)
from console.lib import safe_http
from console.models import RiskTier

MAX_ERROR_CHARS = 1000


def max_attempts() -> int:
    return int(settings.NOTIFICATION_MAX_ATTEMPTS)


def backoff_seconds(attempt: int) -> float:
    """Delay before attempt `attempt + 1`: base · 2^(attempt − 1), capped."""
    base = float(settings.NOTIFICATION_BACKOFF_SECONDS)
    cap = float(settings.NOTIFICATION_BACKOFF_CAP_SECONDS)
    return min(cap, base * (2 ** max(0, attempt - 1)))


def public_base_url() -> str:
    return str(settings.PUBLIC_BASE_URL).rstrip("/")


def approval_url(approval: ApprovalRequest) -> str:
    return public_base_url() + reverse("approvals:detail", args=[approval.approval_id])


def channels_for(approval: ApprovalRequest, *, tier: int | None = None):
    """The reviewers' channels of the request's tenant for its tier (or `tier`)."""
    return NotificationChannel.objects.filter(
        Q(tenant__isnull=True) | Q(tenant_id=approval.tenant_id), enabled=True,
        audience=NotificationChannel.Audience.REVIEWERS,
        tier=approval.risk_tier if tier is None else tier,
    ).order_by("id")


def _plan(rows: list[Notification], existing) -> list[int]:
    """Write the rows (a repeat of one already planned is skipped by its unique constraint) and
    enqueue the pending ones on commit."""
    if not rows:
        return []
    Notification.objects.bulk_create(rows, ignore_conflicts=True)
    ids = list(existing.filter(status=NotificationStatus.PENDING, attempts=0).values_list("pk", flat=True))
    transaction.on_commit(lambda: [enqueue_delivery(pk) for pk in ids])
    return ids


def notifications_plan(approval: ApprovalRequest, *, kind: str = Notification.Kind.REQUEST,
                       tier: int | None = None) -> list[int]:
    """Inside the creating transaction: one pending row per matching channel; deliveries are
    enqueued once (and only if) the transaction commits. A reminder goes to the request's tier,
    an escalation to `tier` (the next one)."""
    now = timezone.now()
    rows = [Notification(channel=channel, approval=approval, kind=kind, next_attempt_at=now)
            for channel in channels_for(approval, tier=tier)]
    return _plan(rows, Notification.objects.filter(approval=approval, kind=kind))


class NeedsPerson(Protocol):
    operation_id: str
    tenant_id: int
    status: str


def notifications_plan_operation(operation: NeedsPerson) -> list[int]:
    """Inside the transaction that moved `operation` to a status that needs a person (manual,
    compensation_required): one row per support channel of its tenant, delivered on commit."""
    now = timezone.now()
    channels = NotificationChannel.objects.filter(
        Q(tenant__isnull=True) | Q(tenant_id=operation.tenant_id), enabled=True,
        audience=NotificationChannel.Audience.SUPPORT,
    ).order_by("id")
    rows = [Notification(channel=channel, operation_id=operation.operation_id, operation_status=operation.status,
                         kind=Notification.Kind.OPERATION, next_attempt_at=now) for channel in channels]
    return _plan(rows, Notification.objects.filter(operation_id=operation.operation_id,
                                                   operation_status=operation.status))


def notifications_remind_due(*, now=None, limit: int = 200) -> int:
    """Pending requests undecided after a share of their time (`remind_at`): their tier's
    reviewers are reminded; later (`escalate_at`) the next tier's reviewers are told (an L4
    request's, L4's again). Each at most once per request, by a compare-and-set on
    `reminded_at` / `escalated_at`. Meant for Celery beat; returns the alerts planned."""
    now = now or timezone.now()
    planned = 0
    for due_field, done_field, kind in (("remind_at", "reminded_at", Notification.Kind.REMINDER),
                                        ("escalate_at", "escalated_at", Notification.Kind.ESCALATION)):
        due = ApprovalRequest.objects.filter(**{"status": ApprovalStatus.PENDING, f"{due_field}__lte": now,
                                                f"{done_field}__isnull": True, "expires_at__gt": now})
        for approval in due.order_by(due_field)[:limit]:
            with transaction.atomic():
                claimed = ApprovalRequest.objects.filter(
                    pk=approval.pk, status=ApprovalStatus.PENDING, **{f"{done_field}__isnull": True},
                ).update(**{done_field: now})
                if claimed != 1:
                    continue  # decided meanwhile, or another beat got there first
                tier = min(approval.risk_tier + 1, RiskTier.L4) if kind == Notification.Kind.ESCALATION else None
                notifications_plan(approval, kind=kind, tier=tier)
                planned += 1
    return planned


def enqueue_delivery(notification_id: int, *, countdown: float | None = None) -> None:
    from approvals.tasks import deliver_notification

    deliver_notification.apply_async(args=[notification_id], countdown=countdown)


def operation_url(operation_id: str) -> str:
    return public_base_url() + reverse("operations:detail", args=[operation_id])


def payload(notification: Notification) -> dict[str, Any]:
    """What a channel is sent: an approval request's contract fields (with `kind`: request,
    reminder or escalation), or the operation that needs a person."""
    if notification.kind == Notification.Kind.OPERATION:
        operation = notification.operation
        return {"kind": notification.kind, "operation_id": operation.operation_id, "status": notification.operation_status,
                "tool": operation.tool.name, "call_id": operation.call_id, "task_id": operation.task_id,
                "tenant": operation.tenant.slug, "url": operation_url(operation.operation_id)}
    return {**approval_payload(notification.approval), "kind": notification.kind}


def approval_payload(approval: ApprovalRequest) -> dict[str, Any]:
    return {
        "approval_id": approval.approval_id,
        "call_id": approval.call_id,
        "tool": approval.operation.tool.name,
        "tier": approval.risk_tier,
        "expires_at": approval.expires_at.isoformat(),
        "url": approval_url(approval),
        # Additional fields; the six above are the contract.
        "tenant": approval.tenant.slug,
        "operation_id": approval.operation_id,
        "task_id": approval.task_id,
        "approvals_needed": approval.approvals_needed,
        "reasons": list(approval.escalation_reasons or []),
    }


class DeliveryError(Exception):
    pass


class RefusedTarget(DeliveryError):
    """The channel's URL may not be called from here: no attempt will do better."""


def _send_webhook(channel: NotificationChannel, body: dict[str, Any]) -> None:
    # The URL was typed into the admin: sent from the worker, it must not reach the machine's own
    # services or the private network (checked on the address actually connected to).
    try:
        answer = safe_http.post(
            channel.target, content=json.dumps(body).encode(), timeout=float(settings.NOTIFICATION_TIMEOUT_SECONDS),
            headers={"Content-Type": "application/json", "User-Agent": "Countersign"},
            allow_private=settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES)
    except safe_http.RefusedAddress as exc:
        raise RefusedTarget(f"refused: {exc}") from exc
    except safe_http.SendFailed as exc:
        raise DeliveryError(str(exc)) from exc
    if not 200 <= answer.status < 300:
        raise DeliveryError(f"HTTP {answer.status}: {answer.body[:200]}")


EMAIL_SUBJECTS = {
    Notification.Kind.REQUEST: "[Countersign] L{tier} approval needed: {tool} {call_id}",
    Notification.Kind.REMINDER: "[Countersign] Reminder: L{tier} approval still undecided: {tool} {call_id}",
    Notification.Kind.ESCALATION: "[Countersign] Escalated: L{tier} approval nobody decided: {tool} {call_id}",
}


def _operation_email(body: dict[str, Any]) -> tuple[str, list[str]]:
    status = body["status"].replace("_", " ")
    subject = f"[Countersign] Operation {status}: {body['tool']} {body['call_id']}"
    return subject, [f"Operation {body['operation_id']} ({body['tool']}, call {body['call_id']}, "
                     f"task {body['task_id']}) is {status} and needs a person.", "", f"Open it: {body['url']}"]


def _send_email(channel: NotificationChannel, body: dict[str, Any]) -> None:
    if body.get("kind") == Notification.Kind.OPERATION:
        subject, lines = _operation_email(body)
        _deliver_email(channel, subject, lines)
        return
    subject = EMAIL_SUBJECTS.get(body.get("kind"), EMAIL_SUBJECTS[Notification.Kind.REQUEST]).format(**body)
    lines = [
        f"An L{body['tier']} call needs {body['approvals_needed']} approval(s).",
        "",
        f"Tool: {body['tool']}",
        f"Call: {body['call_id']}",
        f"Task: {body['task_id']}",
        f"Expires: {body['expires_at']}",
        *[f"Why: {r}" for r in body["reasons"]],
        "",
        f"Review it: {body['url']}",
    ]
    _deliver_email(channel, subject, lines)


def _deliver_email(channel: NotificationChannel, subject: str, lines: list[str]) -> None:
    try:
        send_mail(subject, "\n".join(lines), None, [channel.target], fail_silently=False)
    except Exception as exc:  # any transport error is a failed attempt, recorded
        raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc


SENDERS = {
    NotificationChannel.Kind.WEBHOOK: _send_webhook,
    NotificationChannel.Kind.EMAIL: _send_email,
}


def notification_deliver(*, notification_id: int) -> Notification | None:
    """One delivery attempt. Returns the row as recorded (None if it does not exist).

    Claim (compare-and-set on attempts) → send, outside any transaction → record. Two copies of
    the task racing for one row: only one claims the attempt; the other returns.
    """
    notification = (
        Notification.objects.select_related("channel", "approval__operation__tool", "approval__tenant",
                                            "operation__tool", "operation__tenant")
        .filter(pk=notification_id).first()
    )
    if notification is None or notification.status != NotificationStatus.PENDING:
        return notification
    attempt = notification.attempts + 1
    claimed = Notification.objects.filter(
        pk=notification.pk, status=NotificationStatus.PENDING, attempts=notification.attempts
    ).update(attempts=F("attempts") + 1)
    if claimed != 1:
        return Notification.objects.filter(pk=notification_id).first()
    error, final = "", False
    try:
        sender = SENDERS.get(notification.channel.kind)
        if sender is None:
            raise DeliveryError(f"unknown channel kind {notification.channel.kind!r}")
        sender(notification.channel, payload(notification))
    except DeliveryError as exc:
        error = str(exc)[:MAX_ERROR_CHARS] or "delivery failed"
        final = isinstance(exc, RefusedTarget)
    now = timezone.now()
    if not error:
        Notification.objects.filter(pk=notification.pk).update(status=NotificationStatus.SENT, sent_at=now, next_attempt_at=None)
    else:
        with transaction.atomic():
            row = Notification.objects.select_for_update().get(pk=notification.pk)
            row.errors = [*row.errors, {"attempt": attempt, "at": now.isoformat(), "error": error}]
            row.last_error = error
            if final or attempt >= max_attempts():
                row.status, row.next_attempt_at = NotificationStatus.FAILED, None
            else:
                row.next_attempt_at = now + timedelta(seconds=backoff_seconds(attempt))
            row.save(update_fields=["errors", "last_error", "status", "next_attempt_at"])
    return Notification.objects.filter(pk=notification_id).first()


def operators_alert(*, subject: str, body: dict[str, Any]) -> list[str]:
    """An operational alert (not an approval) to the channels that cover every tenant, each
    target once: the webhook gets `body` as JSON, the email its fields as lines. Sent now, by the
    caller's process, with no transaction open; returns the errors (logged by the caller)."""
    errors = []
    seen = set()
    for channel in NotificationChannel.objects.filter(tenant__isnull=True, enabled=True).order_by("id"):
        if (channel.kind, channel.target) in seen:
            continue
        seen.add((channel.kind, channel.target))
        try:
            if channel.kind == NotificationChannel.Kind.WEBHOOK:
                _send_webhook(channel, {"subject": subject, **body})
            else:
                text = "\n".join(f"{key}: {value}" for key, value in body.items())
                send_mail(subject, text, None, [channel.target], fail_silently=False)
        except Exception as exc:  # noqa: BLE001 - one channel's failure does not stop the others
            errors.append(f"{channel}: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS])
    return errors


def notifications_enqueue_due(*, now=None, limit: int = 500) -> int:
    """Re-enqueue pending deliveries that are due (a lost broker message, a worker that died).
    Meant for Celery beat; a duplicate enqueue is harmless (the claim above)."""
    now = now or timezone.now()
    ids = list(
        Notification.objects.filter(status=NotificationStatus.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at").values_list("pk", flat=True)[:limit]
    )
    for pk in ids:
        enqueue_delivery(pk)
    return len(ids)
