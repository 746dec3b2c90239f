"""`make run`: the whole product on one machine with nothing to install but Python.

SQLite (WAL), a Celery worker and beat on the file-system broker, the sandbox providers, the
ASGI server and the demo agent fleet, as children of this process. Ctrl-C stops them all.
"""

from __future__ import annotations

import signal
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from console.demo import ensure_demo_data
from console.lib.procs import (
    Child,
    first_taken_port,
    http_ok,
    python,
    stop_all,
    supervise_until,
    wait_until,
)
from ledger.liveness import worker_stalled
from sandbox.process import SandboxProcess

WORKER_NODE = "embedded@%h"


def _refuse_taken_ports(port: int, smtp_port: int) -> None:
    """Say which port is taken, and how to choose others, before anything starts."""
    taken = first_taken_port([port, port + 1, port + 2, smtp_port])
    if taken is not None:
        raise CommandError(
            f"Port {taken} is in use; start on other ports with PORT=<n> make run "
            f"(the server takes PORT, the sandboxes PORT+1 to PORT+3; now PORT={port})."
        )


def _stall_check(worker_node: str):
    """The worker is restarted when it is alive but due work waits and it finished nothing for
    WORKER_STALL_SECONDS (ledger/liveness.py); asked once per heartbeat interval."""
    last = {"at": 0.0}

    def stalled(child: Child) -> bool:
        if (child.name != "worker" or child.uptime < settings.WORKER_STALL_SECONDS
                or time.monotonic() - last["at"] < settings.WORKER_HEARTBEAT_SECONDS):
            return False
        last["at"] = time.monotonic()
        try:
            return worker_stalled(worker_node, started_after=datetime.fromtimestamp(child.started_wall, UTC))
        except Exception:  # noqa: BLE001 - the database being away is not the worker's fault
            return False

    return stalled


class Command(BaseCommand):
    help = "Run Countersign in embedded mode (server, worker, beat, sandboxes, demo fleet)."

    def add_arguments(self, parser):
        parser.add_argument("--no-fleet", action="store_true", help="Do not start the demo agent fleet.")
        parser.add_argument("--fleet-interval", type=float, default=4.0, help="Seconds between the fleet's tasks.")

    def handle(self, *args, no_fleet: bool = False, fleet_interval: float = 4.0, **options):
        if not settings.EMBEDDED:
            raise CommandError("run_embedded is for embedded mode; see the README for the distributed mode.")
        _refuse_taken_ports(settings.PORT, settings.SANDBOX_MAIL_SMTP_PORT)
        var: Path = settings.VAR_DIR
        for folder in ("broker/queue", "broker/processed", "sandbox", "logs"):
            (var / folder).mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        ensure_demo_data()

        port = settings.PORT
        stopping = False

        def request_stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)

        sandboxes: list[SandboxProcess] = []
        children: list[Child] = []
        logs = var / "logs"
        try:
            sandboxes.append(SandboxProcess.start(
                "payments", http_port=port + 1, db_path=var / "sandbox" / "payments.sqlite3",
                hang_seconds=8, die_with_parent=True))
            sandboxes.append(SandboxProcess.start(
                "mail", http_port=port + 2, smtp_port=settings.SANDBOX_MAIL_SMTP_PORT,
                db_path=var / "sandbox" / "mail.sqlite3", hang_seconds=8, die_with_parent=True))
            children = [
                Child("worker", python("-m", "celery", "-A", "console", "worker", "-Q", "fast,slow",
                                       "-l", "warning", "-n", WORKER_NODE)),
                Child("beat", python("-m", "celery", "-A", "console", "beat", "-l", "warning",
                                     "-s", str(var / "celerybeat-schedule"))),
                Child("server", python("-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                                       "--port", str(port), "--lifespan", "on", "--log-level", "warning")),
            ]
            if not no_fleet:
                children.append(Child("fleet", python("manage.py", "demo_fleet", "--url", f"http://127.0.0.1:{port}",
                                                       "--interval", str(fleet_interval))))
            for child in children:
                child.start(log_dir=logs)
            wait_until(http_ok(f"http://127.0.0.1:{port}/healthz"), timeout=30, what="the server")
            self._banner(port, logs)
            supervise_until(lambda: stopping, children, log_dir=logs, stalled=_stall_check(WORKER_NODE.replace("%h", socket.gethostname())),
                            say=self.stderr.write)
        finally:
            stop_all(children, sandboxes, say=self.stdout.write)

    def _banner(self, port: int, logs: Path) -> None:
        password = settings.DEMO_PASSWORD
        self.stdout.write(self.style.SUCCESS(f"\nCountersign is running at http://127.0.0.1:{port}\n"))
        self.stdout.write(
            f"  Log in as admin, reviewer (up to L3), senior (up to L4) or support; password: {password}\n"
            f"  Agent API: http://127.0.0.1:{port}/api/v1/  (Authorization: Bearer {settings.DEMO_AGENT_TOKEN})\n"
            f"  API docs:  http://127.0.0.1:{port}/api/docs/\n"
            f"  Sandboxes: payments http://127.0.0.1:{port + 1}/effects · mail http://127.0.0.1:{port + 2}/effects\n"
            f"  Logs:      {logs}/\n"
            "  Ctrl-C stops everything.\n"
        )
        self.stdout.flush()  # stdout may be a file or a pipe: the banner is for now, not at exit
