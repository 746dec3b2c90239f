"""Decision webhooks to agents: `call.decided` and `call.final`, signed per Standard Webhooks.

An agent principal may have a webhook URL and a signing secret (by reference: the name of an
environment variable or setting holding `whsec_…`; admin). Then every move of one of its
operations that decides a held call (approved, rejected, expired, cancelled — by a person, the
sweeper or the dispatcher's re-check) is a `call.decided` event, and every move into a final status a `call.final` event.

Outbox: `webhooks_plan` runs inside the transaction that moved the operation (called by
`ledger.services`) and writes the event row, with the body as of that commit; the delivery is
enqueued on commit. A crash after the commit loses nothing: beat re-enqueues due rows
(`webhooks_enqueue_due`). A rollback takes the row with it.

Delivery (`webhook_deliver`, the Celery task `ledger.deliver_webhook`) holds no transaction
across the network: claim the attempt (compare-and-set on `attempts`, pushing `next_attempt_at`
past the timeout so a crash mid-send is retried by beat, and a duplicate message is a no-op),
send, record the attempt. 2xx: delivered. 410 Gone: the receiver asks for no more; the event
fails and the agent's webhook is disabled until an admin clears it. A URL refused (not http(s),
a non-public address where those are not allowed) or a missing secret: failed at once, since
retrying changes nothing. Anything else (another status, a redirect — never followed —, a
timeout, a connection error): retried with exponential backoff and jitter until
WEBHOOK_MAX_ATTEMPTS.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from approvals.tools import credential
from console.lib import safe_http, sql, standard_webhooks
from console.models import AgentPrincipal
from ledger import tasks
from ledger.answers import answer_json
from ledger.models import (
    OPERATION_TERMINAL,
    Operation,
    OperationStatus,
    WebhookDelivery,
    WebhookEvent,
    WebhookEventKind,
    WebhookStatus,
)
from ledger.queries import RECEIVES_WEBHOOKS_SQL
from ledger.selectors import read_detail

MAX_ERROR_CHARS = 500
USER_AGENT = "Countersign-Webhooks/1"

# The moves that decide a held call (from → to). A call the gate ran at once, or refused, was
# answered in the proposal itself: no call.decided for it.
_HELD = (OperationStatus.PLANNED, OperationStatus.AUTHORIZED)
DECIDING_MOVES = frozenset({
    (OperationStatus.PLANNED, OperationStatus.AUTHORIZED),  # approved
    *((held, to) for held in _HELD for to in (OperationStatus.REJECTED, OperationStatus.EXPIRED,
                                              OperationStatus.CANCELLED)),
})


def _kinds(from_status: str, to: str) -> list[str]:
    kinds = []
    if (from_status, to) in DECIDING_MOVES:
        kinds.append(WebhookEventKind.DECIDED)
    if to in OPERATION_TERMINAL:
        kinds.append(WebhookEventKind.FINAL)
    return kinds


def makes_events(from_status: str, to: str) -> bool:
    """Does this move make webhook events, for an agent that takes them?"""
    return bool(_kinds(from_status, to))


def receives_webhooks(operation: Operation) -> sql.Unless:
    """The statement that finds the operation's agent if it takes webhooks: a move that writes
    no events of its own passes it as `unless` (console.lib.transitions)."""
    return RECEIVES_WEBHOOKS_SQL, [operation.principal_id]


def _receives(principal_id: int) -> bool:
    # A statement written by hand (prepared on PostgreSQL): every move that makes events asks it.
    connection = sql.connection_for(AgentPrincipal)
    return sql.fetchone(connection, RECEIVES_WEBHOOKS_SQL, [principal_id]) is not None


def webhooks_plan(operation: Operation, *, from_status: str, to: str) -> list[int]:
    """Inside the transaction that moved `operation` from `from_status` to `to`: the events
    this move is, for its agent if it has a webhook; delivered once (and only if) it commits."""
    kinds = _kinds(from_status, to)
    if not kinds or not _receives(operation.principal_id):
        return []
    # The answer as it stands after the move; the ids below never change.
    data = answer_json(read_detail(operation.pk, call_id=operation.call_id), base_url=str(settings.PUBLIC_BASE_URL))
    now = timezone.now()
    events = WebhookEvent.objects.bulk_create([
        WebhookEvent(webhook_id=f"msg_{uuid.uuid4().hex}", tenant_id=operation.tenant_id,
                     principal_id=operation.principal_id, operation_id=operation.pk, call_id=operation.call_id,
                     kind=kind, operation_status=to,
                     payload={"type": kind, "timestamp": now.isoformat(), "data": data}, next_attempt_at=now)
        for kind in kinds
    ])
    ids = [event.pk for event in events]
    transaction.on_commit(lambda: [tasks.enqueue_webhook(pk) for pk in ids])
    return ids


# --------------------------------------------------------------------------------- delivery


def backoff_seconds(attempt: int, *, rng: random.Random | None = None) -> float:
    """The wait after failed attempt `attempt`: base · 2^(attempt − 1), capped, of which up to
    half is random (receivers that came back are not hit by every sender at once)."""
    base = float(settings.WEBHOOK_BACKOFF_SECONDS)
    cap = float(settings.WEBHOOK_BACKOFF_CAP_SECONDS)
    delay = min(cap, base * (2 ** max(0, attempt - 1)))
    return delay / 2 + (rng or random).uniform(0, delay / 2)


def body_bytes(event: WebhookEvent) -> bytes:
    return json.dumps(event.payload, separators=(",", ":"), ensure_ascii=False).encode()


class _Permanent(Exception):
    """Retrying would change nothing: the URL is refused, the secret missing or invalid."""


def _send(event: WebhookEvent, principal: AgentPrincipal) -> safe_http.Answer:
    secret = credential(principal.webhook_secret_ref) if principal.webhook_secret_ref else None
    if secret is None:
        raise _Permanent(f"the signing secret {principal.webhook_secret_ref or '(no name given)'} is not set "
                         "in the worker's environment")
    body = body_bytes(event)
    try:
        signed = standard_webhooks.headers(secret, msg_id=event.webhook_id, timestamp=int(timezone.now().timestamp()),
                                           body=body)
    except standard_webhooks.InvalidSecret as exc:
        raise _Permanent(f"the signing secret {principal.webhook_secret_ref}: {exc}") from exc
    try:
        return safe_http.post(
            principal.webhook_url, content=body, timeout=float(settings.WEBHOOK_TIMEOUT_SECONDS),
            allow_private=bool(settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES),
            headers={"Content-Type": "application/json", "User-Agent": USER_AGENT, **signed})
    except safe_http.RefusedAddress as exc:
        raise _Permanent(f"refused: {exc}") from exc


def webhook_deliver(*, event_pk: int, now=None) -> tuple[WebhookEvent | None, bool]:
    """One attempt, if one is due. Returns the event as recorded (None if it does not exist)
    and whether this call made the attempt (only that one schedules the next: a duplicate
    message must not multiply)."""
    now = now or timezone.now()
    event = WebhookEvent.objects.select_related("principal").filter(pk=event_pk).first()
    if event is None or event.status != WebhookStatus.PENDING:
        return event, False
    if event.next_attempt_at is not None and event.next_attempt_at > now:
        return event, False  # an early duplicate of the message: the attempt is not due yet
    number = event.attempts + 1
    # A worker that dies mid-send leaves the row due again after the timeout: beat retries it.
    lease = timedelta(seconds=float(settings.WEBHOOK_TIMEOUT_SECONDS) * 2 + 5)
    claimed = WebhookEvent.objects.filter(pk=event.pk, status=WebhookStatus.PENDING, attempts=event.attempts).update(
        attempts=F("attempts") + 1, next_attempt_at=now + lease)
    if claimed != 1:
        return WebhookEvent.objects.filter(pk=event_pk).first(), False
    principal = event.principal
    started = timezone.now()
    answer: safe_http.Answer | None = None
    error, permanent = "", False
    if principal.webhook_disabled_at is not None or not principal.webhook_url:
        error, permanent = "the agent's webhook is disabled or removed", True
    else:
        try:
            answer = _send(event, principal)
        except _Permanent as exc:
            error, permanent = str(exc), True
        except safe_http.SendFailed as exc:
            error = str(exc)
    _record(event, principal, number=number, started=started, answer=answer, error=error, permanent=permanent)
    return WebhookEvent.objects.filter(pk=event_pk).first(), True


def _record(event: WebhookEvent, principal: AgentPrincipal, *, number: int, started, answer: safe_http.Answer | None,
            error: str, permanent: bool) -> None:
    now = timezone.now()
    gone = answer is not None and answer.status == 410
    delivered = answer is not None and 200 <= answer.status < 300
    if answer is not None and not delivered:
        error = f"HTTP {answer.status}" + (" (redirect not followed)" if 300 <= answer.status < 400 else "") + (
            ": the receiver asked for no more (410 Gone); the agent's webhook is disabled" if gone else "")
    error = error[:MAX_ERROR_CHARS]
    final_failure = permanent or gone or (not delivered and number >= int(settings.WEBHOOK_MAX_ATTEMPTS))
    next_at = None if delivered or final_failure else now + timedelta(seconds=backoff_seconds(number))
    with transaction.atomic():
        WebhookDelivery.objects.create(
            event=event, number=number, url=principal.webhook_url[:500], started_at=started,
            status_code=answer.status if answer is not None else None, error=error,
            response_body=answer.body[:500] if answer is not None else "",
            duration_ms=answer.duration_ms if answer is not None else round((now - started).total_seconds() * 1000),
            next_retry_at=next_at)
        if delivered:
            fields = {"status": WebhookStatus.DELIVERED, "delivered_at": now, "next_attempt_at": None, "last_error": ""}
        elif final_failure:
            fields = {"status": WebhookStatus.FAILED, "next_attempt_at": None, "last_error": error}
        else:
            fields = {"next_attempt_at": next_at, "last_error": error}
        WebhookEvent.objects.filter(pk=event.pk, attempts=number).update(**fields)
        if gone:
            AgentPrincipal.objects.filter(pk=principal.pk, webhook_disabled_at__isnull=True).update(
                webhook_disabled_at=now)


def webhooks_enqueue_due(*, now=None, limit: int = 500) -> int:
    """Re-enqueue pending events that are due (a lost broker message, a worker that died while
    sending). Meant for Celery beat; a duplicate enqueue is harmless (the claim above)."""
    now = now or timezone.now()
    ids = list(WebhookEvent.objects.filter(status=WebhookStatus.PENDING, next_attempt_at__lte=now)
               .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
    for pk in ids:
        tasks.enqueue_webhook(pk)
    return len(ids)

