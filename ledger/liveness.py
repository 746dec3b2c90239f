"""Liveness measured by progress, not by process existence.

A worker can be alive and make no progress: a prefork pool whose children block on a lock a
killed child held, a frozen process (SIGSTOP), a broker connection that stopped delivering.
So each worker records two things in `WorkerHeartbeat`:

- `seen_at`, every WORKER_HEARTBEAT_SECONDS, from a thread of the worker's main process: it is
  alive;
- `progressed_at`, when a task finishes (at most once a second per process): it makes progress.

Due work is what a worker should be doing now: `authorized` and `retry_safe` operations past
their backoff, and `unknown` ones whose reconciliation is due. The product is **stalled** when
due work has waited longer than WORKER_STALL_SECONDS and no live worker has progressed for that
long; a given worker is stalled when due work has waited that long and it has not progressed
since (nor started). `make run`'s supervisor restarts a stalled worker; `manage.py
worker_health` and `/healthz/workers` answer the same question for an orchestrator; beat raises
a `LivenessAlert` (sent to the operators' notification channels) when the oldest due operation
is older than LIVENESS_ALERT_SECONDS, and clears it when it is young again. Beat, not a worker,
watches: the workers are what may be stuck.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime

from celery.signals import beat_init, task_postrun, worker_ready, worker_shutdown
from django.conf import settings
from django.db import close_old_connections
from django.db.models import F, Q
from django.utils import timezone

from approvals import notifications
from ledger.models import LivenessAlert, Operation, OperationStatus, WorkerHeartbeat

logger = logging.getLogger(__name__)
PROGRESS_WRITE_SECONDS = 1.0
DUE_SAMPLE = 200


# -- what the workers record -------------------------------------------------------------------

def heartbeat_register(*, name: str, pool: str, queues: list[str], now: datetime | None = None) -> None:
    """A worker started (or restarted): its row is reset, so its stall clock starts now."""
    now = now or timezone.now()
    WorkerHeartbeat.objects.update_or_create(name=name, defaults={
        "hostname": socket.gethostname(), "pid": os.getpid(), "pool": pool, "queues": sorted(queues),
        "started_at": now, "seen_at": now, "progressed_at": None,
    })


def heartbeat_seen(*, name: str, now: datetime | None = None) -> None:
    WorkerHeartbeat.objects.filter(name=name).update(seen_at=now or timezone.now())


def heartbeat_progressed(*, name: str, tasks: int = 1, now: datetime | None = None) -> None:
    now = now or timezone.now()
    WorkerHeartbeat.objects.filter(name=name).update(progressed_at=now, seen_at=now,
                                                     tasks_done=F("tasks_done") + tasks)


# -- what is due -------------------------------------------------------------------------------

def _due_since(operation: dict) -> datetime:
    if operation["status"] == OperationStatus.UNKNOWN:
        return operation["next_reconcile_at"]
    return max(filter(None, (operation["updated_at"], operation["not_before"])))


def due_work(now: datetime) -> tuple[int, float | None]:
    """(how many operations are due, seconds the oldest has waited)."""
    query = Operation.objects.filter(
        Q(status__in=[OperationStatus.AUTHORIZED, OperationStatus.RETRY_SAFE])
        & (Q(not_before__isnull=True) | Q(not_before__lte=now))
        | Q(status=OperationStatus.UNKNOWN, next_reconcile_at__lte=now)
    )
    # The oldest by updated_at are the candidates; a backoff or a reconcile slot can only make
    # an operation due later than its last change.
    sample = list(query.order_by("updated_at").values("status", "updated_at", "not_before", "next_reconcile_at")
                  [:DUE_SAMPLE])
    if not sample:
        return 0, None
    oldest = min(_due_since(row) for row in sample)
    # Counted after the sample: operations that moved on in between are simply not counted.
    return max(len(sample), query.count()), max(0.0, (now - oldest).total_seconds())


# -- the verdict -------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerState:
    name: str
    pool: str
    queues: list[str]
    pid: int
    alive: bool
    seen_seconds_ago: float
    progressed_seconds_ago: float | None
    tasks_done: int
    stalled: bool


@dataclass(frozen=True)
class Liveness:
    checked_at: str
    due_operations: int
    oldest_due_seconds: float | None
    stall_seconds: float
    alert_seconds: float
    stalled: bool
    alert_open: bool
    workers: list[WorkerState] = field(default_factory=list)

    @property
    def live_workers(self) -> list[WorkerState]:
        return [worker for worker in self.workers if worker.alive]

    @property
    def healthy(self) -> bool:
        return bool(self.live_workers) and not self.stalled

    def as_dict(self) -> dict:
        return {**asdict(self), "healthy": self.healthy}


def _ago(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


def liveness_report(now: datetime | None = None, *, stall_seconds: float | None = None) -> Liveness:
    now = now or timezone.now()
    stall = float(stall_seconds or settings.WORKER_STALL_SECONDS)
    alive_within = 3 * float(settings.WORKER_HEARTBEAT_SECONDS)
    due_count, oldest = due_work(now)
    waiting_too_long = oldest is not None and oldest > stall
    workers = []
    for row in WorkerHeartbeat.objects.order_by("name"):
        alive = _ago(now, row.seen_at) <= alive_within
        last_move = max(filter(None, (row.started_at, row.progressed_at)))
        workers.append(WorkerState(
            name=row.name, pool=row.pool, queues=list(row.queues), pid=row.pid, alive=alive,
            seen_seconds_ago=_ago(now, row.seen_at), progressed_seconds_ago=_ago(now, row.progressed_at),
            tasks_done=row.tasks_done, stalled=alive and waiting_too_long and _ago(now, last_move) > stall,
        ))
    live = [w for w in workers if w.alive]
    stalled = waiting_too_long and all(w.stalled for w in live)
    return Liveness(
        checked_at=now.isoformat(), due_operations=due_count, oldest_due_seconds=oldest, stall_seconds=stall,
        alert_seconds=float(settings.LIVENESS_ALERT_SECONDS), stalled=stalled,
        alert_open=LivenessAlert.objects.filter(cleared_at__isnull=True).exists(), workers=workers,
    )


def worker_stalled(name: str, now: datetime | None = None, *, stall_seconds: float | None = None,
                   started_after: datetime | None = None) -> bool:
    """For a supervisor: this worker is alive by its heartbeat, due work has waited longer than
    WORKER_STALL_SECONDS, and the worker finished no task for that long. `started_after`: when
    the supervisor started the worker's process; a row registered before then is a previous
    process's (this one has not registered yet, e.g. slow to start under load): not stalled."""
    if started_after is not None and WorkerHeartbeat.objects.filter(name=name, started_at__lt=started_after).exists():
        return False
    return any(w.name == name and w.stalled for w in liveness_report(now, stall_seconds=stall_seconds).workers)


# -- the alert ---------------------------------------------------------------------------------

def liveness_alert_check(now: datetime | None = None) -> LivenessAlert | None:
    """Raise an alert (once per episode) when the oldest due operation is older than
    LIVENESS_ALERT_SECONDS, and send it to the operators' channels after the commit; clear the
    open alert once it is not. Returns the alert raised now, if any."""
    now = now or timezone.now()
    report = liveness_report(now)
    late = report.oldest_due_seconds is not None and report.oldest_due_seconds > report.alert_seconds
    if not late:
        LivenessAlert.objects.filter(cleared_at__isnull=True).update(cleared_at=now)
        return None
    if report.alert_open:
        return None
    alert = LivenessAlert.objects.create(
        raised_at=now, oldest_due_seconds=report.oldest_due_seconds, due_count=report.due_operations,
        detail={"workers": [asdict(w) for w in report.workers], "stalled": report.stalled},
    )
    errors = notifications.operators_alert(
        subject=f"Countersign: {report.due_operations} due operation(s), the oldest waiting "
                f"{report.oldest_due_seconds:.0f} s",
        body={"kind": "liveness", "raised_at": now.isoformat(), "due_operations": report.due_operations,
              "oldest_due_seconds": round(report.oldest_due_seconds, 1),
              "workers": [{"name": w.name, "alive": w.alive, "progressed_seconds_ago": w.progressed_seconds_ago}
                          for w in report.workers]},
    )
    if errors:
        # Kept on the alert (visible in the admin) and logged; the alert is not sent again.
        for error in errors:
            logger.warning("liveness alert not delivered: %s", error)
        LivenessAlert.objects.filter(pk=alert.pk).update(detail={**alert.detail, "delivery_errors": errors})
    return alert


# -- wiring into the worker and beat processes (Celery signals) ----------------------------------

class _Progress:
    """Finished tasks of this process, written at most once a second."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending = 0
        self.written = 0.0

    def note(self, name: str) -> None:
        with self.lock:
            self.pending += 1
            if time.monotonic() - self.written < PROGRESS_WRITE_SECONDS:
                return
            tasks, self.pending, self.written = self.pending, 0, time.monotonic()
        try:
            heartbeat_progressed(name=name, tasks=tasks)
        except Exception:  # noqa: BLE001 - a heartbeat never fails a task
            logger.warning("could not record the worker's progress", exc_info=True)


_progress = _Progress()
_stopping = threading.Event()


def _every(seconds: float, what: str, action) -> None:
    while not _stopping.wait(seconds):
        try:
            close_old_connections()
            action()
        except Exception:  # noqa: BLE001 - the database may be away for a while; try again
            logger.warning("%s failed", what, exc_info=True)


def _start_thread(name: str, seconds: float, action) -> None:
    _stopping.clear()
    threading.Thread(target=_every, args=(seconds, name, action), name=name, daemon=True).start()


@worker_ready.connect
def _on_worker_ready(sender=None, **_kwargs) -> None:
    name = sender.hostname
    pool = type(sender.controller.pool).__module__.rsplit(".", 1)[-1]
    queues = [queue.name for queue in sender.task_consumer.queues] if sender.task_consumer else []
    heartbeat_register(name=name, pool=pool, queues=queues)
    _start_thread("worker-heartbeat", float(settings.WORKER_HEARTBEAT_SECONDS),
                  lambda: heartbeat_seen(name=name))


@worker_shutdown.connect
def _on_worker_shutdown(**_kwargs) -> None:
    _stopping.set()


@task_postrun.connect
def _on_task_postrun(sender=None, **_kwargs) -> None:
    hostname = getattr(getattr(sender, "request", None), "hostname", None)
    if hostname:
        _progress.note(hostname)


@beat_init.connect
def _on_beat_init(**_kwargs) -> None:
    _start_thread("liveness-watch", float(settings.LIVENESS_CHECK_SECONDS), liveness_alert_check)
