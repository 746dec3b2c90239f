"""The product as it runs: an ASGI server, a real Celery worker and the sandbox providers, all
against the test database, for browser tests that follow a call from the agent API to the
provider's effect log."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from console.lib.procs import Child, wait_until
from sandbox.process import SandboxProcess
from tests.asgi import REPO, AsgiServer, test_database_url


class FullStack:
    def __init__(self, *, worker_queues: str = "fast,slow", env: dict[str, str] | None = None) -> None:
        self.var = Path(tempfile.mkdtemp(prefix="countersign-stack-"))
        self.worker_queues = worker_queues
        self.extra_env = env or {}
        self.payments: SandboxProcess | None = None
        self.mail: SandboxProcess | None = None
        self.server: AsgiServer | None = None
        self.worker: Child | None = None

    def start(self) -> FullStack:
        # Longer than the tools' 5 s client timeout, so a "timeout" fault really times out.
        self.payments = SandboxProcess.start("payments", hang_seconds=8, die_with_parent=True)
        self.mail = SandboxProcess.start("mail", hang_seconds=3, die_with_parent=True)
        broker = os.environ.get("CELERY_BROKER_URL", "")
        env = {
            "DATABASE_URL": test_database_url(),
            # Redis when the run has one (CI); else the file-system broker in our own folder.
            "CELERY_BROKER_URL": broker if broker.startswith("redis") else "filesystem://",
            "COUNTERSIGN_VAR_DIR": str(self.var),
            "SANDBOX_PAYMENTS_URL": self.payments.base_url,
            "SANDBOX_MAIL_URL": self.mail.base_url,
            "SANDBOX_MAIL_SMTP_PORT": str(self.mail.smtp_port),
            "DISPATCH_GRACE_SECONDS": "2",
            **self.extra_env,
        }
        self.worker = Child("stack-worker", [sys.executable, "-m", "celery", "-A", "console", "worker", "-Q",
                                             self.worker_queues, "-c", "2", "-l", "warning",
                                             "-n", f"stack-{os.getpid()}@%h"], env=env)
        self.worker.start(log_dir=REPO / "artifacts" / "logs")
        self.server = AsgiServer(env=env).start()
        wait_until(lambda: self.worker.alive, timeout=5, what="the worker")
        return self

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        for part in (self.server, self.worker, self.payments, self.mail):
            if part is not None:
                part.stop()
