"""The worker pool survives a kill at any moment. A prefork child killed while idle dies holding
its inqueue's lock (billiard's SimpleQueue.get_payload takes it before blocking on the pipe);
the replacement child reuses that queue and blocks on the lock for ever, while the worker's main
process looks alive. Here every process of a worker started with the product's own pool settings
is SIGKILLed once while idle, and calls proposed afterwards must still run."""

from __future__ import annotations

import signal

import pytest

from chaos import scenarios
from chaos.stack import pool_pids
from chaos.world import REFUND, kill, order, propose, wait_status
from console.lib.procs import wait_until
from ledger.models import OperationStatus
from tests.chaos.conftest import start_stack

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def product_pool_stack(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        running = start_stack(workers=1, pool=None)
    yield running
    running.stop()


def kill_every_worker_process_once(stack) -> None:
    """Each pool child once, waiting for its replacement; a pool without children (threads)
    loses its only process, the worker's main one."""
    worker = stack.worker_children[0]
    children = pool_pids(worker)
    for pid in children:
        kill(pid, signal.SIGKILL)
        wait_until(lambda pid=pid: pid not in pool_pids(worker) and len(pool_pids(worker)) == len(children),
                   timeout=30, what="a replacement pool child")
    if not children:
        kill(worker.popen.pid, signal.SIGKILL)


def test_calls_proposed_after_every_worker_process_was_killed_while_idle_all_run(product_pool_stack):
    world = scenarios.ensure_world()
    kill_every_worker_process_once(product_pool_stack)

    proposed = [propose(world, tool=REFUND, order_id=order()) for _ in range(5)]

    for p in proposed:
        wait_status(p.operation_id, {OperationStatus.CONFIRMED}, timeout=90,
                    what=f"{p.operation_id} confirmed (logs: {product_pool_stack.logs()})")
