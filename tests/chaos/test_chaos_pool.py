"""The worker pool survives a kill at any moment. A prefork child killed while idle dies holding
its inqueue's lock (billiard's SimpleQueue.get_payload takes it before blocking on the pipe);
the replacement child reuses that queue and blocks on the lock for ever, while the worker's main
process looks alive. Here every process of a worker started with the product's own pool settings
is SIGKILLed once while idle, and calls proposed afterwards must still run."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from chaos import scenarios
from chaos.stack import pool_pids
from chaos.world import REFUND, kill, order, propose, wait_status
from console.lib.procs import wait_until
from ledger.models import OperationStatus, WorkerHeartbeat
from tests.chaos.conftest import start_stack

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def product_pool_stack(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        running = start_stack(workers=1, pool=None)
    yield running
    running.stop()


def cpu_ticks(pid: int) -> int:
    """The CPU time a process has used, in clock ticks (user + system, /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def wait_idle(pid: int, *, quiet: float = 0.5) -> None:
    """Until the process has used no CPU for `quiet` seconds: blocked, waiting for work. A pool
    child still starting up (Django's set-up, slow on a loaded machine) holds no queue lock yet,
    so killing it then is not the kill this test is about."""
    seen = {"ticks": cpu_ticks(pid), "since": time.monotonic()}

    def idle() -> bool:
        ticks = cpu_ticks(pid)
        if ticks != seen["ticks"]:
            seen.update(ticks=ticks, since=time.monotonic())
        return time.monotonic() - seen["since"] >= quiet

    wait_until(idle, timeout=60, what=f"process {pid} idle")


def kill_every_worker_process_once(stack) -> None:
    """Each pool child once when idle, waiting for its replacement; a pool without children
    (threads) loses its only process, the worker's main one."""
    worker = stack.worker_children[0]
    children = pool_pids(worker)
    for pid in children:
        if not stack.is_redis:
            # billiard's plain pool (the file-system transport): the child to kill is the one
            # blocked on the shared queue. Celery's event-loop pool (Redis) gives each child its
            # own queues, and its children are never quite idle: any moment will do there.
            wait_idle(pid)
        kill(pid, signal.SIGKILL)
        wait_until(lambda pid=pid: pid not in pool_pids(worker) and len(pool_pids(worker)) == len(children),
                   timeout=30, what="a replacement pool child")
    if not children:
        kill(worker.popen.pid, signal.SIGKILL)


def five_calls_all_confirm(stack) -> None:
    world = scenarios.ensure_world()
    proposed = [propose(world, tool=REFUND, order_id=order()) for _ in range(5)]
    for p in proposed:
        wait_status(p.operation_id, {OperationStatus.CONFIRMED}, timeout=90,
                    what=f"{p.operation_id} confirmed (restarts: {stack.restarts}; logs: {stack.logs()})")


def test_calls_proposed_after_every_worker_process_was_killed_while_idle_all_run(product_pool_stack):
    scenarios.ensure_world()
    kill_every_worker_process_once(product_pool_stack)

    five_calls_all_confirm(product_pool_stack)

    # The restarted worker says so in its heartbeat, with the tasks it finished.
    heartbeat = WorkerHeartbeat.objects.get(name=product_pool_stack.node_name(product_pool_stack.worker_children[0]))
    wait_until(lambda: WorkerHeartbeat.objects.get(pk=heartbeat.pk).progressed_at is not None, timeout=10,
               what="the worker's progress recorded")
    assert heartbeat.pool == "thread" and heartbeat.queues == ["fast", "slow"]


@pytest.fixture
def deadlocked_prefork_stack(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        running = start_stack(workers=1, pool="prefork", concurrency=2, restart_stalled=True)
    yield running
    running.stop()


def test_a_prefork_pool_deadlocked_by_killed_children_is_restarted_by_its_supervisor(deadlocked_prefork_stack):
    """Prefork is still a choice (CELERY_WORKER_POOL): its deadlock is then found by progress —
    the worker's heartbeat says alive, due work waits, no task finishes — and the supervisor
    (the same code as make run's) restarts the worker."""
    stack = deadlocked_prefork_stack
    scenarios.ensure_world()
    kill_every_worker_process_once(stack)

    five_calls_all_confirm(stack)

    if not stack.is_redis:
        # The file-system transport has no event loop, so the pool is billiard's plain one, whose
        # children share one inqueue: the deadlock. With Redis, Celery's event-loop pool gives each
        # child its own queues and replaces a dead child's, and nothing needs restarting.
        assert stack.restarts == ["worker0 is alive but made no progress"]
