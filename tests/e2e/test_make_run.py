"""`make run`'s command end to end: the whole embedded product comes up from nothing, the demo
fleet's calls reach the sandbox providers and its traces reach the console, and Ctrl-C leaves
nothing running."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from console.lib.procs import wait_until
from tests.stack import descendants

REPO = Path(__file__).resolve().parents[2]


def four_free_ports() -> int:
    for base in range(20000, 60000, 97):
        sockets = []
        try:
            for offset in range(4):
                sock = socket.socket()
                sock.bind(("127.0.0.1", base + offset))
                sockets.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no four consecutive free ports")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def count(db: Path, sql: str) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute(sql).fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.timeout(240)
def test_the_embedded_product_runs_serves_works_and_stops_cleanly(tmp_path):
    port = four_free_ports()
    var = tmp_path / "var"
    env = {
        **os.environ,
        "PORT": str(port), "COUNTERSIGN_VAR_DIR": str(var), "COUNTERSIGN_ENV": "embedded",
        "DATABASE_URL": f"sqlite:///{var / 'countersign.sqlite3'}",
        "CELERY_BROKER_URL": "filesystem://", "CHANNEL_LAYER_URL": "memory://",
        "SANDBOX_PAYMENTS_URL": f"http://127.0.0.1:{port + 1}", "SANDBOX_MAIL_URL": f"http://127.0.0.1:{port + 2}",
        "SANDBOX_MAIL_SMTP_PORT": str(port + 3), "SWEEP_SECONDS": "1",
    }
    log = (tmp_path / "run.log").open("wb")
    proc = subprocess.Popen([sys.executable, "manage.py", "run_embedded", "--fleet-interval", "0.5"], cwd=REPO,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                return httpx.get(f"{base}/accounts/login/", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=90, what="the login page")
        # The banner follows the server's first answer to the runner's own health check.
        wait_until(lambda: "Countersign is running at" in (tmp_path / "run.log").read_text(), timeout=10,
                   what="the banner")
        # DEBUG is off by default: static files are still served, and errors are the product's pages.
        assert httpx.get(f"{base}/static/console/app.css", timeout=5).status_code == 200
        missing = httpx.get(f"{base}/no-such-page/", timeout=5)
        assert missing.status_code == 404 and "Back to the console" in missing.text  # not the debug page
        assert "Content-Security-Policy" in httpx.get(f"{base}/accounts/login/", timeout=5).headers
        db = var / "countersign.sqlite3"
        confirmed_refunds = (
            "SELECT count(*) FROM ledger_operation o JOIN approvals_tool t ON o.tool_id = t.id"
            " WHERE t.name = 'payments.refund' AND o.status = 'confirmed'"
        )
        wait_until(lambda: count(db, confirmed_refunds) >= 1, timeout=120, what="a refund to be confirmed")
        wait_until(lambda: count(db, "SELECT count(*) FROM runs_span WHERE task_id IS NOT NULL") >= 1,
                   timeout=60, what="the fleet's spans to be ingested")
        effects = httpx.get(f"http://127.0.0.1:{port + 1}/effects", timeout=5).json()
        assert effects, "the payments sandbox committed nothing"
        keys = [effect["key"] for effect in effects]
        assert len(keys) == len(set(keys)), "a payment effect was committed twice for one key"
        tree = descendants(proc.pid)
        assert len(tree) >= 6  # server, worker (+pool), beat, fleet, two sandboxes (+servers)
    finally:
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            proc.wait(timeout=60)
        finally:
            log.close()
    wait_until(lambda: not any(alive(pid) for pid in tree), timeout=20, what="every child to stop")
    assert "Stopped." in (tmp_path / "run.log").read_text()
