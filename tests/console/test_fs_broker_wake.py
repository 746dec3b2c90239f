"""The embedded broker wakes its consumers: real Celery workers on the file-system transport,
with the fallback listing and kombu's polling both a minute apart (tests/console/fs_broker_worker.py),
run a task another process publishes while they wait, within the half-minute these tests allow.

A message is published only once the worker's main thread is blocked waiting on its bells: it
listed the folder before the message existed, so nothing but a datagram can bring it back
before the minute is up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from console.lib.procs import PROJECT_ROOT, wait_until
from tests.console.fs_broker_worker import make_app

PICKUP_TIMEOUT = 30  # generous for a loaded machine, and half the workers' fallback
START_TIMEOUT = 90


def waiting_on_bells(pid: int, tid: int | None = None) -> bool:
    """The thread (the main one by default) sleeps in poll(2): the consumer's wait for a bell.
    kombu's own consumer sleeps in nanosleep instead, between listings."""
    path = f"/proc/{pid}/task/{tid}/wchan" if tid else f"/proc/{pid}/wchan"
    try:
        return Path(path).read_text().startswith(("poll_schedule_timeout", "do_poll", "do_sys_poll"))
    except OSError:
        return False


class Worker:
    def __init__(self, folder: Path, queue: str) -> None:
        self.queue = queue
        self.node = f"{queue}-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        self.log = open(folder / f"worker-{queue}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.console.fs_broker_worker", "worker", "-Q", queue,
             "-c", "1", "-l", "warning", "--without-mingle", "--without-gossip", "-n", self.node],
            cwd=PROJECT_ROOT, env={**os.environ, "FS_BROKER_TEST_FOLDER": str(folder)},
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_idle(self) -> None:
        def idle() -> bool:
            assert self.proc.poll() is None, f"the {self.queue} worker exited; see {self.log.name}"
            return waiting_on_bells(self.proc.pid)

        wait_until(idle, timeout=START_TIMEOUT, what=f"the {self.queue} worker to wait on its bells")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsb")
    for name in ("queue", "control", "processed", "done"):
        (folder / name).mkdir()
    workers = {queue: Worker(folder, queue) for queue in ("alpha", "beta")}
    publisher = make_app(folder)
    try:
        yield folder, workers, publisher
    finally:
        publisher.pool.force_close_all()
        for worker in workers.values():
            worker.stop()


def publish(publisher, queue: str) -> str:
    name = f"{queue}-{uuid.uuid4().hex[:8]}"
    publisher.send_task("fs_broker_test.touch", args=[name], queue=queue)
    return name


def ran_by(folder: Path, name: str) -> int:
    marker = folder / "done" / name
    wait_until(marker.exists, timeout=PICKUP_TIMEOUT, what=f"task {name} to run")
    return int(marker.read_text())


def test_a_task_published_to_a_waiting_worker_wakes_it(broker):
    folder, workers, publisher = broker
    workers["alpha"].wait_idle()
    assert ran_by(folder, publish(publisher, "alpha")) == workers["alpha"].proc.pid


def test_each_worker_is_woken_for_its_own_queue(broker):
    folder, workers, publisher = broker
    for worker in workers.values():
        worker.wait_idle()
    assert ran_by(folder, publish(publisher, "beta")) == workers["beta"].proc.pid
    workers["alpha"].wait_idle()
    assert ran_by(folder, publish(publisher, "alpha")) == workers["alpha"].proc.pid


def test_a_worker_with_its_prefetch_full_takes_the_next_task_when_it_acks(broker):
    # One task at a time (-c 1, prefetch 1): the two behind the first wait in the folder, with
    # no publisher left to ring, until the ack frees the window.
    folder, workers, publisher = broker
    workers["alpha"].wait_idle()
    names = [publish(publisher, "alpha") for _ in range(3)]
    assert {ran_by(folder, name) for name in names} == {workers["alpha"].proc.pid}


def test_a_broadcast_wakes_the_worker_and_its_reply_wakes_the_caller(broker):
    # Remote control goes through the control folder's fanout table to the worker's own
    # pidbox queue, and the reply to a queue this process consumes, with the same fallback.
    _folder, workers, publisher = broker
    workers["beta"].wait_idle()
    replies = publisher.control.ping(destination=[workers["beta"].node], timeout=PICKUP_TIMEOUT, limit=1)
    assert [list(reply) for reply in replies] == [[workers["beta"].node]]
