"""What a person waits for in each way of running the product: the first call after it starts,
and a reviewer's approval until the call is confirmed — under `make run` (embedded: SQLite, the
file-system broker, one server and one worker) and under `make cluster` (production settings on
PostgreSQL and Redis, two servers behind the balancer, a fast and a slow worker, beat).

    .venv/bin/python bench/waits.py [--approvals 8] [--calls 8] [--modes run,run-postgres,cluster]

Each mode is started as its users start it (`manage.py run_embedded --no-fleet`, `manage.py
run_cluster`) in a directory of its own (and, for the cluster, a database of its own, dropped
afterwards). Then, through the agent client (`countersign`) and a reviewer's logged-in browser
session (plain HTTP: the login form, then the approval page's Approve form):

- **first call**: the first run-at-once refund after the product answers `/healthz` (the cluster:
  after its banner), proposal sent → final answer, then as many again for the warm figure;
- with the cluster, the same warm calls sent to its first server itself (what the balancer adds);
  `run-postgres` runs make run's processes on the cluster's PostgreSQL and Redis (what the
  storage and broker add, apart from the cluster's other processes);
- **approve → confirmed**: a refund held for approval, the agent long-polling it; the reviewer
  posts Approve; from that request's start until the agent holds `confirmed` (and the approve
  request's own time).

The cluster needs PostgreSQL and Redis (`DATABASE_URL`'s server, default 127.0.0.1:5432;
`CELERY_BROKER_URL`'s, databases 6 and 7: the test suite's workers and its cluster test use
others). Nothing is asserted: record figures, with the machine's load, in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
from countersign import Client

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from console.lib.procs import free_port_block, interrupt  # noqa: E402
from console.management.commands.run_cluster import drop_database, ensure_database  # noqa: E402

PASSWORD = "bench-waits-" + secrets.token_hex(6)
REFUND = {"currency": "EUR", "reason": "broken"}
TITLES = {"run": "make run", "run-postgres": "make run on PostgreSQL + Redis (for comparison)",
          "cluster": "make cluster"}
HELD_AMOUNT, RUN_AT_ONCE_AMOUNT = 120, 30  # the default policy: over 100 EUR a reviewer decides


def postgres_url(name: str) -> str:
    parts = urlsplit(os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres")
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", "", ""))


def redis_url(db: int) -> str:
    parts = urlsplit(os.environ.get("CELERY_BROKER_URL", "") or "redis://127.0.0.1:6379/0")
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", "", ""))


class Running:
    """One way of running the product, started as its users start it."""

    def __init__(self, mode: str) -> None:
        # The server (or the balancer), the sandboxes, the cluster's two servers.
        self.mode, self.port = mode, free_port_block((0, 1, 2, 3, 10, 11), start=23000, step=137)
        self.var = Path(tempfile.mkdtemp(prefix=f"countersign-waits-{mode}-"))
        self.log_path = self.var / "product.log"
        self.database = postgres_url(f"cs_bench_waits_{os.getpid()}") if mode != "run" else ""
        self.proc: subprocess.Popen | None = None

    def start(self) -> Running:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "CHANNEL_LAYER_URL")}
        env.update({"PORT": str(self.port), "COUNTERSIGN_ENV": "embedded", "API_RATE_PER_TOKEN": "0",
                    "API_RATE_PER_TENANT": "0"})
        if self.database:
            drop_database(self.database)
            ensure_database(self.database)
            env.update({"DATABASE_URL": self.database, "CELERY_BROKER_URL": redis_url(6),
                        "CHANNEL_LAYER_URL": redis_url(7)})
        if self.mode == "cluster":
            env.update({"CLUSTER_VAR_DIR": str(self.var / "cluster"), "COUNTERSIGN_ADMIN_PASSWORD": PASSWORD})
            command = ["manage.py", "run_cluster"]
        else:
            env.update({"COUNTERSIGN_VAR_DIR": str(self.var), "DEMO_PASSWORD": PASSWORD})
            command = ["manage.py", "run_embedded", "--no-fleet"]
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen([sys.executable, *command], cwd=ROOT, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.started = time.monotonic()
        deadline = self.started + 240
        while "Ctrl-C stops everything" not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.mode} did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        self.ready = time.monotonic()
        if self.mode != "cluster":
            self.token = re.search(r"Bearer ([^)\s]+)", self.log_path.read_text()).group(1)
        else:
            self.token = (self.var / "cluster" / "agent_token").read_text().strip()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server_url(self) -> str:
        """The cluster's first server itself (the balancer is `url`)."""
        return f"http://127.0.0.1:{self.port + 10}"

    def stop(self) -> None:
        if self.proc is not None:
            interrupt(self.proc)
        self.log.close()
        if self.database:
            drop_database(self.database)


def reviewer_session(url: str) -> httpx.Client:
    """A reviewer logged in through the login form, as a browser does (the CSRF cookie and field)."""
    http = httpx.Client(base_url=url, timeout=60, follow_redirects=False)
    http.get("/accounts/login/")
    response = http.post("/accounts/login/", data={"username": "admin", "password": PASSWORD,
                                                   "csrfmiddlewaretoken": http.cookies["csrftoken"]},
                         headers={"Referer": f"{url}/accounts/login/"})
    if response.status_code != 302:
        raise RuntimeError(f"login failed: {response.status_code} {response.text[:300]}")
    return http


def approve(http: httpx.Client, url: str, approval_id: str) -> float:
    """Opens the approval page (what the reviewer reads), then posts Approve; when it was sent."""
    page = http.get(f"/approvals/{approval_id}/").text
    arguments_hash = re.search(r'name="arguments_hash" value="([0-9a-f]*)"', page)
    began = time.monotonic()
    response = http.post(f"/approvals/{approval_id}/approve/", data={
        "reason": "bench", "arguments_hash": arguments_hash.group(1) if arguments_hash else "",
        "csrfmiddlewaretoken": http.cookies["csrftoken"]}, headers={"Referer": f"{url}/approvals/{approval_id}/"})
    if response.status_code != 302:
        raise RuntimeError(f"approve failed: {response.status_code} {response.text[:300]}")
    return began


def run_at_once(task, run: str, n: int) -> float:
    """One refund the gate runs at once, proposed and awaited through the client: its seconds."""
    began = time.monotonic()
    answer = task.call_answer("payments.refund", {"order_id": f"ord-{run}-{n}", "amount": RUN_AT_ONCE_AMOUNT, **REFUND},
                              step_id=f"refund-{n}")
    if answer["status"] != "confirmed":
        raise RuntimeError(f"a run-at-once call ended {answer['status']}: {answer}")
    return time.monotonic() - began


def measure(running: Running, calls: int, approvals: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"start-up": [running.ready - running.started], "first call": [],
                                       "warm calls": [], "one server": [], "approve → confirmed": [],
                                       "approve request": []}
    run = secrets.token_hex(3)
    with Client(running.url, running.token) as client:
        task = client.start_task(key=f"bench-waits-{run}", task_type="refund", goal="Refund the broken kettles",
                                 constraints={"max_tool_calls": 10 * (calls + approvals)})
        figures["first call"].append(run_at_once(task, run, 0))
        figures["warm calls"] += [run_at_once(task, run, n) for n in range(1, calls + 1)]
        if running.mode == "cluster":
            # The same calls sent to the first server itself, past the balancer: what the balancer adds.
            with Client(running.server_url, running.token) as direct:
                straight = direct.start_task(key=f"bench-waits-{run}-s1", task_type="refund", goal="Refund",
                                             constraints={"max_tool_calls": 10 * calls})
                figures["one server"] += [run_at_once(straight, f"{run}-s1", n) for n in range(calls + 1)][1:]
                straight.close()
        reviewer = reviewer_session(running.url)
        for n in range(approvals):
            step = f"held-{n}"
            proposed = task.propose("payments.refund", {"order_id": f"ord-{run}-h{n}", "amount": HELD_AMOUNT, **REFUND},
                                    step_id=step)
            if proposed["decision"]["outcome"] != "awaiting_approval":
                raise RuntimeError(f"not held for a reviewer: {proposed}")
            answered: dict[str, float | dict] = {}

            def wait(call_id=proposed["call_id"], answered=answered) -> None:
                answer = task.wait(call_id, timeout=60)
                answered["at"], answered["answer"] = time.monotonic(), answer

            waiter = threading.Thread(target=wait)
            waiter.start()
            time.sleep(0.3)  # the agent's poll is waiting (a bench, not a test: no condition to read)
            began = approve(reviewer, running.url, proposed["approval_id"])
            figures["approve request"].append(time.monotonic() - began)
            waiter.join(timeout=90)
            if answered.get("answer", {}).get("status") != "confirmed":
                raise RuntimeError(f"an approved call did not end confirmed: {answered}")
            figures["approve → confirmed"].append(answered["at"] - began)
        task.close()
    return figures


def ms(values: list[float]) -> str:
    values = [v * 1000 for v in values]
    if len(values) == 1:
        return f"{values[0]:8.1f} ms"
    return f"p50 {statistics.median(values):8.1f}  max {max(values):8.1f} ms (n={len(values)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="run,cluster",
                        help="of run, run-postgres (make run's processes on the cluster's PostgreSQL and Redis), cluster")
    parser.add_argument("--calls", type=int, default=8, help="warm run-at-once calls after the first")
    parser.add_argument("--approvals", type=int, default=8)
    args = parser.parse_args(argv)
    print(f"bench/waits.py — {time.strftime('%Y-%m-%d %H:%M:%S')}, load average {os.getloadavg()}")
    for mode in args.modes.split(","):
        running = Running(mode)
        try:
            running.start()
            figures = measure(running, args.calls, args.approvals)
        finally:
            running.stop()
        print(f"\n{TITLES[mode]}  (log: {running.log_path})")
        print(f"  started (command → ready)    {ms(figures['start-up'])}")
        print(f"  first call after start       {ms(figures['first call'])}")
        print(f"  warm run-at-once calls       {ms(figures['warm calls'])}")
        if figures["one server"]:
            print(f"  the same, to one server      {ms(figures['one server'])}")
        print(f"  approve → confirmed          {ms(figures['approve → confirmed'])}")
        print(f"  the approve request itself   {ms(figures['approve request'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
