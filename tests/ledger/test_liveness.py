"""ledger.liveness: progress, not process existence, says whether the ledger moves; the alert
goes to the operators' channels once per episode."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from approvals.models import NotificationChannel
from ledger import liveness
from ledger.models import LivenessAlert, Operation, OperationStatus, WorkerHeartbeat
from tests.factories import make_operation

S = OperationStatus
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def clocks(settings):
    settings.WORKER_HEARTBEAT_SECONDS = 5
    settings.WORKER_STALL_SECONDS = 30
    settings.LIVENESS_ALERT_SECONDS = 120


def due_for(operation: Operation, seconds: float) -> None:
    Operation.objects.filter(pk=operation.pk).update(updated_at=timezone.now() - timedelta(seconds=seconds))


def worker(name: str, *, seen: float = 1, progressed: float | None = 1, started: float = 600) -> WorkerHeartbeat:
    now = timezone.now()
    return WorkerHeartbeat.objects.create(
        name=name, pool="threads", queues=["fast", "slow"], started_at=now - timedelta(seconds=started),
        seen_at=now - timedelta(seconds=seen),
        progressed_at=None if progressed is None else now - timedelta(seconds=progressed))


def test_nothing_due_and_a_live_worker_is_healthy(agent):
    make_operation(agent, status=S.CONFIRMED)
    worker("w1@host", progressed=3600)

    report = liveness.liveness_report()

    assert report.due_operations == 0 and report.oldest_due_seconds is None
    assert report.healthy and not report.stalled


def test_due_work_waiting_past_the_stall_period_with_no_progress_is_a_stall(agent):
    due_for(make_operation(agent, status=S.AUTHORIZED), 45)
    worker("w1@host", progressed=40)

    report = liveness.liveness_report()

    assert report.due_operations == 1 and 45 <= report.oldest_due_seconds < 60
    assert report.stalled and not report.healthy
    assert liveness.worker_stalled("w1@host")


def test_one_worker_progressing_keeps_the_product_live_and_names_the_other_stalled(agent):
    due_for(make_operation(agent, status=S.AUTHORIZED), 45)
    worker("stuck@host", progressed=None)
    worker("busy@host", progressed=2)

    report = liveness.liveness_report()

    assert not report.stalled and report.healthy
    assert liveness.worker_stalled("stuck@host") and not liveness.worker_stalled("busy@host")


def test_a_worker_that_just_started_is_not_stalled_before_it_had_the_time(agent):
    due_for(make_operation(agent, status=S.AUTHORIZED), 45)
    worker("fresh@host", progressed=None, started=3)

    assert not liveness.worker_stalled("fresh@host")


def test_a_restarted_worker_is_not_judged_on_its_previous_process_row(agent):
    # The supervisor restarted the worker 40 s ago; under load the new process has not yet
    # registered (its start resets the row), so the row, and its silence, are the old process's.
    due_for(make_operation(agent, status=S.AUTHORIZED), 45)
    worker("slow-start@host", progressed=None, started=600)
    restarted = timezone.now() - timedelta(seconds=40)

    assert liveness.worker_stalled("slow-start@host")
    assert not liveness.worker_stalled("slow-start@host", started_after=restarted)
    assert liveness.worker_stalled("slow-start@host", started_after=timezone.now() - timedelta(seconds=700))


def test_a_worker_whose_heartbeat_stopped_is_not_alive_and_no_live_worker_is_unhealthy(agent):
    worker("gone@host", seen=60)

    report = liveness.liveness_report()

    assert [w.alive for w in report.workers] == [False]
    assert not report.healthy


def test_due_work_counts_retries_past_their_backoff_and_reconciliations_due_only(agent):
    now = timezone.now()
    retry_now = make_operation(agent, status=S.RETRY_SAFE)
    retry_later = make_operation(agent, status=S.RETRY_SAFE)
    Operation.objects.filter(pk=retry_now.pk).update(not_before=now - timedelta(seconds=10))
    Operation.objects.filter(pk=retry_later.pk).update(not_before=now + timedelta(seconds=60))
    reconcile_due = make_operation(agent, status=S.UNKNOWN)
    Operation.objects.filter(pk=reconcile_due.pk).update(next_reconcile_at=now - timedelta(seconds=90),
                                                         updated_at=now - timedelta(seconds=500))
    make_operation(agent, status=S.PLANNED)  # waits for a person, not for a worker

    count, oldest = liveness.due_work(timezone.now())

    assert count == 2
    assert 90 <= oldest < 100  # the reconciliation's due time, not the row's last change


def test_an_alert_goes_to_the_operators_channels_once_per_episode_and_clears(agent, tenant):
    NotificationChannel.objects.create(tenant=None, tier=1, kind="email", target="ops@example.com")
    NotificationChannel.objects.create(tenant=None, tier=3, kind="email", target="ops@example.com")  # same target
    NotificationChannel.objects.create(tenant=tenant, tier=1, kind="email", target="reviewers@example.com")
    operation = make_operation(agent, status=S.AUTHORIZED)
    due_for(operation, 150)
    worker("w1@host", progressed=150)

    raised = liveness.liveness_alert_check()
    again = liveness.liveness_alert_check()

    assert raised is not None and again is None
    assert [m.to for m in mail.outbox] == [["ops@example.com"]]
    assert "the oldest waiting 150 s" in mail.outbox[0].subject
    assert "w1@host" in mail.outbox[0].body

    Operation.objects.filter(pk=operation.pk).update(status=S.CONFIRMED)
    assert liveness.liveness_alert_check() is None
    assert LivenessAlert.objects.get().cleared_at is not None
    assert len(mail.outbox) == 1


def test_a_worker_restarted_starts_its_stall_clock_again(agent):
    worker("w1@host", progressed=3600)

    liveness.heartbeat_register(name="w1@host", pool="threads", queues=["slow", "fast"])

    row = WorkerHeartbeat.objects.get()
    assert row.progressed_at is None and row.queues == ["fast", "slow"]
    assert (timezone.now() - row.started_at).total_seconds() < 60


def test_progress_moves_the_clock_and_counts_tasks(agent):
    worker("w1@host", progressed=3600)

    liveness.heartbeat_progressed(name="w1@host", tasks=3)

    row = WorkerHeartbeat.objects.get()
    assert row.tasks_done == 3 and (timezone.now() - row.progressed_at).total_seconds() < 60


def test_an_alert_that_could_not_be_delivered_keeps_the_errors(agent):
    NotificationChannel.objects.create(tenant=None, tier=1, kind="webhook", target="http://127.0.0.1:9/nobody")
    due_for(make_operation(agent, status=S.AUTHORIZED), 150)

    liveness.liveness_alert_check()

    (error,) = LivenessAlert.objects.get().detail["delivery_errors"]
    assert "ConnectError" in error
