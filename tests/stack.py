"""The product as it runs: an ASGI server, a real Celery worker and the sandbox providers, all
against the test database, for browser tests that follow a call from the agent API to the
provider's effect log."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

from console.lib.procs import Child, wait_until
from sandbox.process import SandboxProcess
from tests.asgi import REPO, AsgiServer, test_database_url
from tests.conftest import AGENT_TOKEN

TERMINAL = {"confirmed", "failed", "rejected", "expired", "cancelled", "manual", "compensation_required"}


class FullStack:
    def __init__(self, *, worker_queues: str = "fast,slow", env: dict[str, str] | None = None,
                 beat: bool = False) -> None:
        self.var = Path(tempfile.mkdtemp(prefix="countersign-stack-"))
        self.worker_queues = worker_queues
        self.extra_env = env or {}
        self.payments: SandboxProcess | None = None
        self.mail: SandboxProcess | None = None
        self.server: AsgiServer | None = None
        self.worker: Child | None = None
        # Beat, for tests that need the sweeper's schedule (reconciliation of unknown outcomes).
        self.beat: Child | None = None
        self.with_beat = beat

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
        if self.with_beat:
            self.beat = Child("stack-beat", [sys.executable, "-m", "celery", "-A", "console", "beat", "-l", "warning",
                                             "-s", str(self.var / "celerybeat-schedule")], env=env)
            self.beat.start(log_dir=REPO / "artifacts" / "logs")
        self.server = AsgiServer(env=env).start()
        wait_until(lambda: self.worker.alive, timeout=5, what="the worker")
        return self

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        for part in (self.server, self.beat, self.worker, self.payments, self.mail):
            if part is not None:
                part.stop()


class HttpAgent:
    """An agent using the HTTP API with its bearer token, as any agent would. A write is retried
    when the connection breaks or a balancer has no server for a moment (503): each is
    idempotent by its call ID, so the retry gets the same answer from the ledger."""

    def __init__(self, base_url: str, token: str = AGENT_TOKEN) -> None:
        self.http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def post(self, path: str, body: dict) -> dict:
        for _ in range(40):
            try:
                response = self.http.post(path, json=body)
            except httpx.TransportError:
                time.sleep(0.25)
                continue
            if response.status_code == 503:
                time.sleep(0.25)
                continue
            assert response.status_code < 300, response.text
            return response.json()
        raise AssertionError(f"{path} never answered")

    def running_task(self, **contract) -> tuple[str, int, int]:
        task = self.post("/api/v1/tasks", {"task_type": "refund", "goal": "Refund the broken kettle", **contract})
        token = self.post(f"/api/v1/tasks/{task['task_id']}/lease", {"owner": "agent-1", "ttl_seconds": 600})[
            "fencing_token"]
        version = task["version"]
        for to in ("planning", "running"):
            version = self.post(f"/api/v1/tasks/{task['task_id']}/transition",
                                {"to": to, "expected_version": version, "fencing_token": token})["version"]
        return task["task_id"], version, token

    def refund(self, task: tuple[str, int, int], *, order_id: str, amount: float) -> dict:
        task_id, version, token = task
        return self.post(f"/api/v1/tasks/{task_id}/calls", {
            "call_id": f"call-{order_id}", "step_id": f"refund-{order_id}", "tool": "payments.refund",
            "arguments": {"order_id": order_id, "amount": amount, "currency": "EUR", "reason": "broken"},
            "expected_version": version, "fencing_token": token})

    def final(self, call_id: str, task_id: str, *, budget: float = 120) -> dict:
        """Long-polls the call until nothing more will happen to it."""
        deadline = time.monotonic() + budget
        answer: dict = {}
        while time.monotonic() < deadline:
            try:
                answer = self.http.get(f"/api/v1/calls/{call_id}", params={"wait": 5, "task_id": task_id}).json()
            except (httpx.TransportError, ValueError):
                time.sleep(0.25)
                continue
            if answer.get("status") in TERMINAL:
                return answer
        raise AssertionError(f"{call_id} never became final: {answer}")


def descendants(pid: int) -> dict[int, str]:
    """pid → command line of every process whose ancestry leads to pid."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    tree = {}
    for child in found:
        try:
            tree[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return tree
