"""The supervisor: restarts the server, exits cleanly, and leaves nothing behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx

from sandbox import client
from sandbox.process import SandboxProcess


def is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is dead for our purposes once it is reaped or a zombie.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_sigterm_stops_the_supervisor_and_its_server() -> None:
    proc = SandboxProcess.start("payments", hang_seconds=1, die_with_parent=True)
    server_pid = client.wait_healthy(proc.base_url)["pid"]

    code = proc.stop()

    assert code == 0
    client.wait_for(lambda: is_gone(server_pid), timeout=5, what="the server process to exit")


def test_sigkill_of_the_supervisor_takes_the_server_with_it() -> None:
    proc = SandboxProcess.start("mail", hang_seconds=1, die_with_parent=True)
    server_pid = client.wait_healthy(proc.base_url)["pid"]

    proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(timeout=5)

    client.wait_for(lambda: is_gone(server_pid), timeout=5, what="PR_SET_PDEATHSIG to kill it")
    proc.stop()


def test_effects_survive_a_restart_of_the_whole_provider(tmp_path: Path) -> None:
    db = tmp_path / "payments.sqlite3"
    with SandboxProcess.start(
        "payments", db_path=db, hang_seconds=1, die_with_parent=True
    ) as first:
        response = httpx.post(
            f"{first.base_url}/refunds",
            headers={"Idempotency-Key": "k-1"},
            json={"order_id": "o-1", "amount": 5, "currency": "EUR", "reason": "r"},
        )
        assert response.status_code == 201

    with SandboxProcess.start(
        "payments", db_path=db, hang_seconds=1, die_with_parent=True
    ) as second:
        assert [e["key"] for e in client.effects(second.base_url)] == ["k-1"]
        replay = httpx.post(
            f"{second.base_url}/refunds",
            headers={"Idempotency-Key": "k-1"},
            json={"order_id": "o-1", "amount": 5, "currency": "EUR", "reason": "r"},
        )
        assert replay.headers["Idempotent-Replayed"] == "true"
