"""Notifications of new pending requests per tier: rows in the creating transaction, deliveries
on commit through Celery, retries with backoff, every failure recorded."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.admin.utils import quote
from django.core import mail
from django.db import transaction
from django.urls import reverse

from approvals import notifications
from approvals.models import ApprovalRequest, Notification, NotificationChannel
from console.models import Tenant
from ledger import decisions
from tests.factories import make_pending_approval
from tests.ledger.test_decisions_edit import propose, refund

pytestmark = pytest.mark.django_db

CONTRACT_KEYS = {"approval_id", "call_id", "tool", "tier", "expires_at", "url"}


class Receiver:
    """A real local webhook endpoint (stdlib http.server in a thread) that answers 500 to the
    first `fail_first` requests and 204 afterwards, keeping every body it was sent."""

    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    receiver.bodies.append(body)
                    failing = len(receiver.bodies) <= receiver.fail_first
                self.send_response(500 if failing else 204)
                self.end_headers()
                if failing:
                    self.wfile.write(b"try again later")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _quick_backoff(settings):
    settings.NOTIFICATION_BACKOFF_SECONDS = 0.01
    settings.NOTIFICATION_MAX_ATTEMPTS = 3
    settings.PUBLIC_BASE_URL = "https://countersign.example"


def channel(tier: int, kind: str, target: str, **fields) -> NotificationChannel:
    return NotificationChannel.objects.create(tier=tier, kind=kind, target=target, **fields)


def test_a_new_request_plans_one_delivery_per_enabled_channel_of_its_tier_and_tenant(
        agent, tenant, other_tenant, django_capture_on_commit_callbacks, monkeypatch):
    mine = channel(3, "webhook", "http://127.0.0.1:9/a")
    everyone = channel(3, "email", "oncall@example.com")  # no tenant: every tenant
    channel(4, "email", "l4@example.com")
    channel(3, "email", "off@example.com", enabled=False)
    channel(3, "email", "globex@example.com", tenant=other_tenant)
    mine.tenant = tenant
    mine.save()
    enqueued: list[int] = []
    monkeypatch.setattr(notifications, "enqueue_delivery", lambda pk, countdown=None: enqueued.append(pk))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        approval = make_pending_approval(agent, risk_tier=3)
        rows = list(Notification.objects.filter(approval=approval).order_by("channel_id"))
        assert [n.channel for n in rows] == [mine, everyone]
        assert {n.status for n in rows} == {"pending"} and {n.attempts for n in rows} == {0}
        assert enqueued == []  # nothing leaves before commit
    for callback in callbacks:
        callback()
    assert sorted(enqueued) == sorted(n.pk for n in rows)


def test_a_rolled_back_request_announces_nothing(agent, django_capture_on_commit_callbacks, monkeypatch):
    channel(3, "email", "oncall@example.com")
    enqueued: list[int] = []
    monkeypatch.setattr(notifications, "enqueue_delivery", lambda pk, countdown=None: enqueued.append(pk))

    class Boom(Exception):
        pass

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(Boom), transaction.atomic():
        make_pending_approval(agent, risk_tier=3)
        raise Boom
    assert enqueued == [] and not Notification.objects.exists()


def test_a_failed_webhook_is_retried_with_backoff_and_every_attempt_is_recorded(
        agent, eager_celery, django_capture_on_commit_callbacks):
    with Receiver(fail_first=1) as receiver:
        hook = channel(3, "webhook", receiver.url)
        with django_capture_on_commit_callbacks(execute=True):
            approval = make_pending_approval(agent, risk_tier=3)
    row = Notification.objects.get(channel=hook, approval=approval)
    assert (row.status, row.attempts, row.next_attempt_at) == ("sent", 2, None)
    assert row.sent_at is not None
    assert [e["attempt"] for e in row.errors] == [1]
    assert row.errors[0]["error"].startswith("HTTP 500") and row.last_error.startswith("HTTP 500")
    assert len(receiver.bodies) == 2 and receiver.bodies[0] == receiver.bodies[1]
    body = receiver.bodies[-1]
    assert CONTRACT_KEYS <= set(body)
    assert (body["approval_id"], body["call_id"], body["tool"], body["tier"]) == (
        approval.approval_id, approval.call_id, "payments.refund", 3)
    assert body["url"] == f"https://countersign.example/approvals/{approval.approval_id}/"
    assert body["expires_at"] == approval.expires_at.isoformat()


def test_a_webhook_that_never_answers_ends_failed_after_the_maximum_attempts(
        agent, eager_celery, django_capture_on_commit_callbacks):
    with Receiver(fail_first=99) as receiver:
        hook = channel(3, "webhook", receiver.url)
        with django_capture_on_commit_callbacks(execute=True):
            approval = make_pending_approval(agent, risk_tier=3)
    row = Notification.objects.get(channel=hook, approval=approval)
    assert (row.status, row.attempts, row.next_attempt_at) == ("failed", 3, None)
    assert [e["attempt"] for e in row.errors] == [1, 2, 3]
    assert len(receiver.bodies) == 3


def test_an_unreachable_webhook_is_a_recorded_failure_not_a_crash(agent):
    hook = channel(3, "webhook", "http://127.0.0.1:9/nothing-listens")
    approval = make_pending_approval(agent, risk_tier=3)
    row = notifications.notification_deliver(notification_id=Notification.objects.get(channel=hook).pk)
    assert (row.status, row.attempts) == ("pending", 1)
    assert "ConnectError" in row.last_error
    assert row.next_attempt_at is not None
    assert approval.approval_id == row.approval_id


def test_email_goes_through_djangos_mail_with_a_link(agent, eager_celery, django_capture_on_commit_callbacks):
    channel(4, "email", "seniors@example.com")
    with django_capture_on_commit_callbacks(execute=True):
        approval = make_pending_approval(agent, risk_tier=4)
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["seniors@example.com"]
    assert "L4" in message.subject and approval.call_id in message.subject
    assert f"https://countersign.example/approvals/{approval.approval_id}/" in message.body
    assert Notification.objects.get(approval=approval).status == "sent"


def test_an_email_transport_error_is_recorded(agent, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", 9
    channel(3, "email", "oncall@example.com")
    make_pending_approval(agent, risk_tier=3)
    row = notifications.notification_deliver(notification_id=Notification.objects.get().pk)
    assert row.status == "pending" and row.attempts == 1
    assert "ConnectionRefusedError" in row.last_error or "Errno" in row.last_error


def test_a_repeated_task_for_a_sent_notification_sends_nothing(agent, eager_celery,
                                                               django_capture_on_commit_callbacks):
    channel(3, "email", "oncall@example.com")
    with django_capture_on_commit_callbacks(execute=True):
        make_pending_approval(agent, risk_tier=3)
    row = Notification.objects.get()
    from approvals.tasks import deliver_notification

    assert deliver_notification.delay(row.pk).get() == "sent"
    assert len(mail.outbox) == 1
    assert Notification.objects.get().attempts == 1


def test_due_pending_deliveries_are_enqueued_again(agent, monkeypatch):
    channel(3, "email", "oncall@example.com")
    make_pending_approval(agent, risk_tier=3)  # on_commit never ran: a lost message
    enqueued: list[int] = []
    monkeypatch.setattr(notifications, "enqueue_delivery", lambda pk, countdown=None: enqueued.append(pk))
    assert notifications.notifications_enqueue_due() == 1
    assert enqueued == [Notification.objects.get().pk]


def test_backoff_is_exponential_and_capped(settings):
    settings.NOTIFICATION_BACKOFF_SECONDS = 2
    settings.NOTIFICATION_BACKOFF_CAP_SECONDS = 10
    assert [notifications.backoff_seconds(n) for n in (1, 2, 3, 4, 5)] == [2, 4, 8, 10, 10]


def test_an_edit_that_raises_a_call_to_l4_notifies_the_l4_channel(
        agent, senior, eager_celery, django_capture_on_commit_callbacks):
    channel(4, "email", "seniors@example.com")
    l3 = propose(agent, amount=120)
    with django_capture_on_commit_callbacks(execute=True):
        result = decisions.approval_edit_and_approve(approval_id=l3.approval_id, reviewer=senior,
                                                    arguments=refund(250), reason="full order")
    assert [m.to for m in mail.outbox] == [["seniors@example.com"]]
    assert result.new.call_id in mail.outbox[0].subject
    assert Notification.objects.get().approval_id == result.new.approval_id


def test_the_detail_page_shows_each_delivery_and_its_last_error(client, reviewer, agent):
    hook = channel(3, "webhook", "http://127.0.0.1:9/nothing-listens")
    approval = make_pending_approval(agent, risk_tier=3)
    notifications.notification_deliver(notification_id=Notification.objects.get(channel=hook).pk)
    client.force_login(reviewer)
    body = client.get(reverse("approvals:detail", args=[approval.approval_id])).content.decode()
    row = Notification.objects.get()
    assert f'id="notification-{row.pk}"' in body
    assert "ConnectError" in body and "http://127.0.0.1:9/nothing-listens" in body


def test_notifications_are_read_only_in_the_admin_and_channels_editable(admin_client, agent):
    hook = channel(3, "email", "oncall@example.com")
    make_pending_approval(agent, risk_tier=3)
    row = Notification.objects.get()
    assert admin_client.get(reverse("admin:approvals_notification_changelist")).status_code == 200
    page = admin_client.get(reverse("admin:approvals_notification_change", args=[row.pk]))
    assert page.status_code == 200 and b'name="status"' not in page.content
    assert admin_client.get(reverse("admin:approvals_notification_add")).status_code == 403
    assert admin_client.get(reverse("admin:approvals_notificationchannel_change", args=[hook.pk])).status_code == 200
    approval_page = admin_client.get(reverse("admin:approvals_approvalrequest_change", args=[quote(row.approval_id)]))
    assert approval_page.status_code == 200 and b"oncall@example.com" in approval_page.content
    assert ApprovalRequest.objects.count() == 1 and Tenant.objects.count() == 1


def test_a_channel_target_that_cannot_be_delivered_to_is_refused_by_validation(db):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        NotificationChannel(tier=3, kind="webhook", target="ftp://example.com/x").full_clean()
    with pytest.raises(ValidationError):
        NotificationChannel(tier=3, kind="email", target="not-an-address").full_clean()
    NotificationChannel(tier=3, kind="webhook", target="https://hooks.example.com/x").full_clean()
    NotificationChannel(tier=3, kind="email", target="oncall@example.com").full_clean()


def test_an_operators_alert_goes_to_each_all_tenant_channel_once_and_reports_failures(tenant):
    with Receiver() as good, Receiver(fail_first=1) as failing:
        channel(1, "webhook", good.url)
        channel(4, "webhook", good.url)  # the same target at another tier: told once
        channel(2, "webhook", failing.url)
        channel(1, "webhook", "http://127.0.0.1:9/unreachable", enabled=False)
        channel(1, "webhook", good.url + "?tenant", tenant=tenant)  # a tenant's own channel: not an operator's

        errors = notifications.operators_alert(subject="Countersign: 3 due", body={"kind": "liveness", "due": 3})

    assert good.bodies == [{"subject": "Countersign: 3 due", "kind": "liveness", "due": 3}]
    assert len(failing.bodies) == 1
    assert len(errors) == 1 and "HTTP 500" in errors[0]


def test_a_webhook_channel_to_a_private_address_is_refused_unless_allowed(agent, settings):
    """A channel's URL is typed into the admin; sent from the worker it must not reach the
    machine's own services or the private network (the same rule as agents' webhooks)."""
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    with Receiver() as receiver:
        hook = channel(3, "webhook", receiver.url)
        make_pending_approval(agent, risk_tier=3)
        row = notifications.notification_deliver(notification_id=Notification.objects.get(channel=hook).pk)
    assert receiver.bodies == []
    assert row.status == "failed" and "non-public address" in row.last_error, row.last_error
