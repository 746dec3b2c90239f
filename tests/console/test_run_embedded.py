"""`make run` (the run_embedded command): a port already taken is named in one sentence, with
how to pick another, before anything starts (a probe got a traceback); the worker is restarted
when it is alive but stalled, not before it had a stall period of its own."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from console.lib.procs import Child
from console.management.commands.run_embedded import _stall_check
from ledger.models import Operation, OperationStatus, WorkerHeartbeat
from tests.factories import make_operation


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture
def taken_port():
    """A port held open by the test whose two lower neighbours are free: the command checks
    PORT to PORT+3, so a neighbour that some other program happens to hold would be named
    first (CI once met exactly that)."""
    for _ in range(50):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        if port > 1026 and _is_free(port - 1) and _is_free(port - 2):
            break
        sock.close()
    else:
        pytest.fail("no port with two free neighbours below it")
    with sock:
        sock.listen()
        yield port


@pytest.mark.parametrize("offset", [0, 1, 2])
def test_a_taken_port_is_named_with_how_to_choose_another(settings, tmp_path, taken_port, offset):
    settings.EMBEDDED = True
    settings.VAR_DIR = tmp_path
    settings.PORT = taken_port - offset

    with pytest.raises(CommandError) as raised:
        call_command("run_embedded", "--no-fleet")

    message = str(raised.value)
    assert f"Port {taken_port} is in use" in message
    assert "PORT=" in message
    assert not (tmp_path / "logs").exists()  # nothing was started



@pytest.mark.django_db
def test_the_worker_is_judged_stalled_only_after_a_stall_period_of_its_own(settings, agent):
    settings.WORKER_STALL_SECONDS = 30
    settings.WORKER_HEARTBEAT_SECONDS = 0.1
    now = timezone.now()
    operation = make_operation(agent, status=OperationStatus.AUTHORIZED)
    Operation.objects.filter(pk=operation.pk).update(updated_at=now - timedelta(seconds=120))
    WorkerHeartbeat.objects.create(name="embedded@box", started_at=now - timedelta(seconds=600), seen_at=now)
    worker, server = Child("worker", []), Child("server", [])
    stalled = _stall_check("embedded@box")

    worker.started_at = server.started_at = time.monotonic()
    assert not stalled(worker)  # just (re)started: it has had no chance yet

    worker.started_at = server.started_at = time.monotonic() - 60
    assert stalled(worker)
    assert not stalled(server)  # only the worker is judged by its progress
