"""Alerts on the existing notification channels: support hears when an operation needs a person
(manual, compensation_required); an approval not decided within a share of its time reminds its
tier's reviewers, then escalates to the next tier's — both shown on the approval page."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from approvals import notifications
from approvals.models import ApprovalRequest, Notification, NotificationChannel
from approvals.tasks import enqueue_due_notifications
from ledger import decisions
from ledger import services as ledger_services
from ledger.models import OperationStatus
from tests.factories import make_pending_approval
from tests.fixtures.support import make_operation

pytestmark = pytest.mark.django_db

S = OperationStatus


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.PUBLIC_BASE_URL = "https://countersign.example"
    settings.APPROVAL_REMIND_SHARE = 0.5
    settings.APPROVAL_ESCALATE_SHARE = 0.8


def support_channel(target: str = "support@example.com", **fields) -> NotificationChannel:
    return NotificationChannel.objects.create(audience="support", tier=None, kind="email", target=target, **fields)


def reviewer_channel(tier: int, target: str) -> NotificationChannel:
    return NotificationChannel.objects.create(tier=tier, kind="email", target=target)


# ------------------------------------------------------------------------ operations for support


@pytest.mark.parametrize("status", [S.MANUAL, S.COMPENSATION_REQUIRED])
def test_support_is_told_when_an_operation_needs_a_person(agent, status, eager_celery,
                                                          django_capture_on_commit_callbacks):
    support_channel()
    reviewer_channel(3, "reviewers@example.com")
    with django_capture_on_commit_callbacks(execute=True):
        operation = make_operation(agent, status=status)
    [row] = Notification.objects.filter(operation_id=operation.operation_id)
    assert (row.kind, row.operation_status, row.status, row.approval_id) == ("operation", status, "sent", None)
    [message] = [m for m in mail.outbox if m.to == ["support@example.com"]]
    assert status.replace("_", " ") in message.subject and operation.call_id in message.subject
    assert f"https://countersign.example/operations/{operation.operation_id}/" in message.body
    assert not any(m.to == ["reviewers@example.com"] for m in mail.outbox)


def test_each_move_that_needs_a_person_is_told_once(agent, django_capture_on_commit_callbacks):
    support_channel()
    operation = make_operation(agent, status=S.MANUAL)
    ledger_services.operation_require_compensation(operation_id=operation.operation_id, actor="t", reason="r")
    statuses = sorted(Notification.objects.filter(operation_id=operation.operation_id)
                      .values_list("operation_status", flat=True))
    assert statuses == [S.COMPENSATION_REQUIRED, S.MANUAL]


def test_a_support_channel_of_another_tenant_hears_nothing_and_hears_no_approvals(agent, other_tenant):
    support_channel(tenant=other_tenant)
    mine = support_channel("mine@example.com")
    make_operation(agent, status=S.MANUAL)
    make_pending_approval(agent, risk_tier=3)
    assert list(Notification.objects.values_list("channel_id", "kind")) == [(mine.pk, "operation")]


def test_a_reviewer_channel_needs_a_tier_and_a_support_channel_none(db):
    with pytest.raises(ValidationError, match="tier"):
        NotificationChannel(audience="reviewers", tier=None, kind="email", target="a@example.com").full_clean()
    with pytest.raises(ValidationError, match="tier"):
        NotificationChannel(audience="support", tier=3, kind="email", target="a@example.com").full_clean()
    NotificationChannel(audience="support", tier=None, kind="email", target="a@example.com").full_clean()


# ------------------------------------------------------------------- approvals nobody decides


def test_an_undecided_approval_reminds_its_tier_then_escalates_to_the_next(agent):
    l3 = reviewer_channel(3, "l3@example.com")
    l4 = reviewer_channel(4, "l4@example.com")
    approval = make_pending_approval(agent, risk_tier=3, ttl_seconds=100)
    start = approval.created_at
    assert notifications.notifications_remind_due(now=start + timedelta(seconds=49)) == 0
    assert list(Notification.objects.values_list("channel_id", "kind")) == [(l3.pk, "request")]

    assert notifications.notifications_remind_due(now=start + timedelta(seconds=51)) == 1
    assert notifications.notifications_remind_due(now=start + timedelta(seconds=52)) == 0  # once
    reminders = list(Notification.objects.filter(kind="reminder").values_list("channel_id", flat=True))
    assert reminders == [l3.pk]

    assert notifications.notifications_remind_due(now=start + timedelta(seconds=81)) == 1
    escalations = list(Notification.objects.filter(kind="escalation").values_list("channel_id", flat=True))
    assert escalations == [l4.pk]
    approval = ApprovalRequest.objects.get(pk=approval.pk)
    assert approval.reminded_at is not None and approval.escalated_at is not None


def test_a_decided_approval_is_neither_reminded_nor_escalated(agent, reviewer):
    reviewer_channel(3, "l3@example.com")
    approval = make_pending_approval(agent, risk_tier=3, ttl_seconds=100)
    decisions.approval_approve(approval_id=approval.approval_id, reviewer=reviewer)
    later = approval.created_at + timedelta(seconds=90)
    assert notifications.notifications_remind_due(now=later) == 0
    assert not Notification.objects.exclude(kind="request").exists()


def test_a_reminder_is_delivered_with_what_it_is(agent, eager_celery, django_capture_on_commit_callbacks):
    reviewer_channel(3, "l3@example.com")
    approval = make_pending_approval(agent, risk_tier=3, ttl_seconds=100)
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        notifications.notifications_remind_due(now=approval.created_at + timedelta(seconds=60))
    [message] = mail.outbox
    assert message.subject.startswith("[Countersign] Reminder:") and approval.call_id in message.subject
    assert f"https://countersign.example/approvals/{approval.approval_id}/" in message.body


def test_the_beat_task_sends_reminders_too(agent, monkeypatch):
    reviewer_channel(3, "l3@example.com")
    approval = make_pending_approval(agent, risk_tier=3, ttl_seconds=100)
    ApprovalRequest.objects.filter(pk=approval.pk).update(remind_at=timezone.now() - timedelta(seconds=1))
    monkeypatch.setattr(notifications, "enqueue_delivery", lambda pk, countdown=None: None)

    enqueue_due_notifications()
    assert Notification.objects.filter(approval=approval, kind="reminder").exists()


def test_the_approval_page_shows_the_reminder_and_the_escalation(client, reviewer, agent):
    reviewer_channel(3, "l3@example.com")
    reviewer_channel(4, "l4@example.com")
    approval = make_pending_approval(agent, risk_tier=3, ttl_seconds=100)
    notifications.notifications_remind_due(now=approval.created_at + timedelta(seconds=90))
    client.force_login(reviewer)
    page = client.get(reverse("approvals:detail", args=[approval.approval_id])).content.decode()
    assert 'id="approval-reminded"' in page and 'id="approval-escalated"' in page
    assert "escalated to L4 reviewers" in page
    assert page.count('class="notification-kind"') == 3


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_beats_at_once_remind_exactly_once(agent, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL")
    monkeypatch.setattr(notifications, "enqueue_delivery", lambda pk, countdown=None: None)
    reviewer_channel(3, "l3@example.com")
    approval = make_pending_approval(agent, risk_tier=3, ttl_seconds=100)
    due = approval.created_at + timedelta(seconds=60)
    barrier = threading.Barrier(2)
    planned: list[object] = []

    def beat():
        try:
            barrier.wait(timeout=10)
            planned.append(notifications.notifications_remind_due(now=due))
        except Exception as exc:  # recorded and asserted below
            planned.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=beat) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(planned) == [0, 1]
    assert Notification.objects.filter(approval=approval, kind="reminder").count() == 1
