"""`make cluster`, driven as its users would: the distributed mode with production settings on
PostgreSQL and Redis — two ASGI servers behind the balancer, a fast and a slow worker, one beat.

A reviewer's browser on server A sees a call proposed through server B arrive live and approves
it; the worker dispatches it once. Then a burst of run-at-once refunds through the balancer
while one server and the fast worker are SIGKILLed: every call ends confirmed with exactly one
effect at the provider, nothing lost, nothing doubled.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection  # noqa: F401 - read by the skipif condition
from playwright.sync_api import expect

from console.lib.procs import free_port_block, interrupt, wait_until
from console.management.commands.run_cluster import drop_database
from sandbox.client import effects
from tests.stack import HttpAgent, descendants

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the distributed mode runs on PostgreSQL"),
    pytest.mark.timeout(420),
]
REPO = Path(__file__).resolve().parents[2]
PASSWORD = "cluster-test-passphrase-5512"
CLUSTER_PORTS = (0, 1, 2, 3, 10, 11)  # the balancer, the sandboxes, the two servers


def cluster_redis_databases() -> tuple[int, int]:
    """Two Redis databases from the top of the range, one pair per test worker: the tests' own
    start from the bottom (tests/parallel.py)."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    return 14 - 2 * worker, 15 - 2 * worker


def redis_url(db: int) -> str:
    broker = os.environ.get("CELERY_BROKER_URL", "")
    parts = urlsplit(broker if broker.startswith("redis") else "redis://127.0.0.1:6379/0")
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", "", ""))


def database_url(name: str) -> str:
    from django.db import connection as conn

    settings = conn.settings_dict
    user = settings.get("USER") or "postgres"
    return f"postgres://{user}@{settings.get('HOST') or '127.0.0.1'}:{settings.get('PORT') or 5432}/{name}"


def main_process(root: int, *fragments: str) -> int:
    """The one process (not a child of another match) whose command line holds every fragment."""
    tree = descendants(root)
    matches = {pid for pid, cmd in tree.items() if all(fragment in cmd for fragment in fragments)}
    parents = {pid: int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in matches}
    [pid] = [pid for pid in matches if parents[pid] not in matches]
    return pid


class Cluster:
    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port_block(CLUSTER_PORTS)
        self.var = tmp_path / "cluster"
        self.database = database_url(f"cs_cluster_{os.getpid()}")
        self.log_path = tmp_path / "cluster.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Cluster:
        drop_database(self.database)
        broker_db, layer_db = cluster_redis_databases()
        env = {**os.environ, "PORT": str(self.port), "CLUSTER_VAR_DIR": str(self.var),
               "DATABASE_URL": self.database, "CELERY_BROKER_URL": redis_url(broker_db), "CHANNEL_LAYER_URL": redis_url(layer_db),
               "COUNTERSIGN_ADMIN_PASSWORD": PASSWORD, "COUNTERSIGN_ENV": "embedded", "SWEEP_SECONDS": "1"}
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen([sys.executable, "manage.py", "run_cluster"], cwd=REPO, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: "Ctrl-C stops everything" in self.log_path.read_text() or self.proc.poll() is not None,
                   timeout=180, what="the cluster's banner", interval=0.5)
        assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
        self.token = (self.var / "agent_token").read_text().strip()
        return self

    def url(self, offset: int = 0) -> str:
        return f"http://127.0.0.1:{self.port + offset}"

    def stop(self) -> None:
        if self.proc is not None:
            interrupt(self.proc)
        self.log.close()
        drop_database(self.database)


@pytest.fixture
def cluster(tmp_path):
    running = Cluster(tmp_path).start()
    yield running
    running.stop()


def test_a_call_proposed_on_one_server_is_approved_live_on_the_other_and_survives_kills(cluster, page, screenshot):
    server_a, server_b = cluster.url(10), cluster.url(11)
    page.goto(server_a + "/accounts/login/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    page.goto(server_a + "/approvals/")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")

    through_b = HttpAgent(server_b, cluster.token)
    task = through_b.running_task(constraints={"max_tool_calls": 100})
    proposal = through_b.refund(task, order_id=f"ord-cluster-{uuid.uuid4().hex[:6]}", amount=120)
    assert proposal["decision"]["outcome"] == "awaiting_approval"
    row = page.locator(f"#approval-{proposal['approval_id']}")
    expect(row).to_be_visible(timeout=15_000)  # proposed on B, arrived live on A
    page.keyboard.press("j")
    expect(row).to_have_class(re.compile(r"\bis-selected\b"))
    page.keyboard.press("Enter")
    expect(page.locator("#approve-button")).to_be_visible()
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "connected")  # the page's script runs
    page.keyboard.press("a")
    expect(page.locator("#operation-status .badge")).to_have_text("confirmed", timeout=60_000)
    screenshot(page, "cluster-approved-on-a-proposed-on-b")
    assert len(effects(cluster.url(1), key=proposal["operation_id"])) == 1

    # A burst through the balancer; one server and the fast worker die in the middle of it.
    balanced = HttpAgent(cluster.url(), cluster.token)
    burst_task = balanced.running_task(constraints={"max_tool_calls": 100})
    orders = [f"ord-burst-{uuid.uuid4().hex[:6]}-{n}" for n in range(20)]
    proposals = []
    for n, order in enumerate(orders):
        proposals.append(balanced.refund(burst_task, order_id=order, amount=30))
        if n == 7:
            os.kill(main_process(cluster.proc.pid, "uvicorn", f"--port {cluster.port + 10}"), signal.SIGKILL)
            os.kill(main_process(cluster.proc.pid, "celery", "-Q fast"), signal.SIGKILL)
    finals = [balanced.final(p["call_id"], burst_task[0]) for p in proposals]

    assert [answer["status"] for answer in finals] == ["confirmed"] * len(orders)
    for answer in proposals:
        assert len(effects(cluster.url(1), key=answer["operation_id"])) == 1
    log = cluster.log_path.read_text()
    assert "server-1 exited" in log and "worker-fast exited" in log  # the supervisor brought them back
