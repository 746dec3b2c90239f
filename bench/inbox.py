"""Benchmark of the reviewer console on PostgreSQL: inbox and detail server time at scale, and
commit-to-browser latency of a new request with 50 open inbox websockets.

    .venv/bin/python bench/inbox.py [--fresh] [--runs 3] [--requests 200] [--sockets 50] \\
        [--arrivals 40] [--live-poll 0.25]

Database `countersign_bench_reviewer_inbox` (DATABASE_URL's server; created, migrated and seeded if
empty): 100,000 operations (90,000 settled, 10,000 planned) across 2,000 tasks, and 10,000
pending approval requests (L2/L3/L4 mix, expiries spread over 24 h), all by bulk_create.

1. Server time: the Django test client in this process, logged in as a reviewer who may
   decide up to L4 (so every row is decidable, the most work per row), DEBUG off. Pages: the
   inbox (page 1; filtered by tool and tier; page 200; the htmx fragment) and the detail page of
   random pending requests. `--runs` runs of `--requests` requests each; p50/p95 per run, and
   the median of those across runs. Target: p95 ≤ 50 ms.
2. Live latency: uvicorn in a child process with the Redis channel layer
   (`CHANNEL_LAYER_URL=redis://127.0.0.1:6379/5`); `--sockets` websocket clients on the inbox
   stream (`websockets`, the reviewer's session cookie, hello `{"last_event_id": N}`). This
   process then creates `--arrivals` approval requests one by one (`approval_request_create`
   on a new planned operation) and, for each, the time from its commit returning to each
   client receiving a fragment that names the new approval ID. Target: p95 ≤ 100 ms.

`--against DIR` (server time only): the same pages with DIR's code (another checkout, e.g. the
code before a change) and this checkout's, in two children taking turns page by page, with the
ratio; the baseline that says whether a change helped on a machine too busy for absolute figures.

The live views are the tail of the event table (console/consumers.py): each consumer polls
every LIVE_POLL_SECONDS (0.25 s by default), so the poll interval is a floor under the
latency; `--live-poll` sets it for the server child. Timings are never asserted anywhere: this
machine is shared (2 cores) and noisy; read medians and repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# `--against` measures another checkout's code (the same pages, the same database) with this
# script: the child it starts imports the product code from there.
CODE = Path(os.environ.get("INBOX_BENCH_CODE", ROOT)).resolve()
if str(CODE) not in sys.path:
    sys.path.insert(0, str(CODE))

from bench.ledger import ensure_database, setup_django, with_database  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/countersign_bench_reviewer_inbox"
TENANT = "bench-inbox"
AGENT = "bench-inbox-agent"
REVIEWER = "bench-reviewer"
OPERATIONS = 100_000
PENDING = 10_000
TASKS = 2_000
BATCH = 5_000
APPROVAL_RE = re.compile(r"apr_[0-9a-z]{26}")
LIVE_LAYER = "redis://127.0.0.1:6379/5"  # --live-layer
TIMING_LOG = ROOT / "artifacts" / "logs" / "bench-inbox-live-timing.log"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# --- seed ------------------------------------------------------------------------------------


def seed() -> dict:
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils import timezone

    from approvals.defaults import ensure_policy_defaults
    from approvals.models import ApprovalRequest, Tool
    from console.lib.canonical import arguments_hash
    from console.lib.ids import derive_operation_id, new_id
    from console.models import AgentPrincipal, Membership, Role, Tenant
    from ledger.models import Operation
    from runs.models import Step, Task

    ensure_policy_defaults()
    tenant, _ = Tenant.objects.get_or_create(slug=TENANT, defaults={"name": "Inbox benchmark"})
    agent = AgentPrincipal.objects.filter(tenant=tenant, name=AGENT).first()
    if agent is None:
        agent = AgentPrincipal(tenant=tenant, name=AGENT)
        agent.set_token("bench-inbox-agent-token")
        agent.save()
        agent.allowed_tools.set(Tool.objects.all())
    user = get_user_model().objects.filter(username=REVIEWER).first()
    if user is None:
        user = get_user_model().objects.create_user(username=REVIEWER, password="bench")
        Membership.objects.create(user=user, tenant=tenant, role=Role.REVIEWER, max_tier=4)
    have = Operation.objects.filter(tenant=tenant).count()
    if have >= OPERATIONS:
        print(f"seed: already there ({have} operations)")
        return {"tenant": tenant, "agent": agent, "user": user}

    t0 = time.perf_counter()
    tools = {t.name: t for t in Tool.objects.all()}
    refund, mail = tools["payments.refund"], tools["mail.send"]
    now = timezone.now()
    rng = random.Random(7)
    tasks = [Task(task_id=new_id("task"), tenant=tenant, actor=agent, task_type=rng.choice(["refund", "support", "billing"]),
                  goal="Benchmark task", status="waiting_approval", version=3,
                  constraints={"max_amount": 5000}, created_at=now - timedelta(hours=rng.uniform(0, 48)))
             for _ in range(TASKS)]
    with transaction.atomic():
        Task.objects.bulk_create(tasks, batch_size=BATCH)
    per_task = OPERATIONS // TASKS
    steps, ops, approvals = [], [], []
    pending_left = PENDING
    for task in tasks:
        for si in range(per_task):
            step_id = f"step-{si}"
            steps.append(Step(task=task, step_id=step_id, created_at=task.created_at))
    with transaction.atomic():
        Step.objects.bulk_create(steps, batch_size=BATCH)
    step_ids = {(task_id, step_id): pk for task_id, step_id, pk in
                Step.objects.filter(task__tenant=tenant).values_list("task_id", "step_id", "pk").iterator(chunk_size=BATCH)}
    for ti, task in enumerate(tasks):
        for si in range(per_task):
            is_pending = pending_left > 0 and si < (PENDING // TASKS)
            tool = refund if (si % 3) else mail
            amount = rng.choice([30, 80, 120, 250, 400]) if tool is refund else None
            arguments = ({"order_id": f"ord-{ti}-{si}", "amount": amount, "currency": "EUR", "reason": "damaged"}
                         if tool is refund else
                         {"to": [f"c{ti}@example.com"], "subject": f"Order {ti}", "body": "Hello,\n\nYour refund."})
            tier = (4 if amount and amount > 200 else 3 if amount and amount > 50 else 1) if tool is refund else 2
            if is_pending and tier < 2:
                tier, arguments["amount"] = 3, 120
            op_id = derive_operation_id(tenant=TENANT, task_id=task.task_id, step_id=f"step-{si}", tool=tool.name)
            args_hash = arguments_hash(arguments)
            ops.append(Operation(
                operation_id=op_id, tenant=tenant, task=task, step_id=step_ids[(task.task_id, f"step-{si}")], tool=tool,
                tool_schema_version=1, principal=agent, call_id=f"call-{ti}-{si}", arguments=arguments,
                arguments_hash=args_hash, intent_hash=args_hash, idempotency_key=op_id, risk_tier=tier,
                status="planned" if is_pending else rng.choice(["confirmed"] * 8 + ["failed", "rejected"]),
                created_at=task.created_at, updated_at=task.created_at,
            ))
            if is_pending:
                pending_left -= 1
                created = now - timedelta(minutes=rng.uniform(0, 60 * 30))
                approvals.append(ApprovalRequest(
                    approval_id=new_id("apr"), tenant=tenant, task=task, operation_id=op_id, tool=tool,
                    task_type=task.task_type, call_id=f"call-{ti}-{si}",
                    arguments_hash=args_hash, tool_schema_version=1, requested_by=agent, state_version=3,
                    risk_tier=tier, escalation_reasons=[f"amount > {50 if tier == 3 else 200}"] if tier > 2 else [],
                    approvals_needed=2 if tier == 4 else 1, status="pending",
                    expires_at=now + timedelta(minutes=rng.uniform(5, 60 * 24)), created_at=created,
                ))
    with transaction.atomic():
        Operation.objects.bulk_create(ops, batch_size=BATCH)
        ApprovalRequest.objects.bulk_create(approvals, batch_size=BATCH)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")  # statistics, and the visibility map for index-only scans
    print(f"seed: {len(tasks)} tasks, {len(ops)} operations, {len(approvals)} pending approvals "
          f"in {time.perf_counter() - t0:.1f} s")
    return {"tenant": tenant, "agent": agent, "user": user}


# --- 1. server time --------------------------------------------------------------------------


def pages_to_measure(user):
    """(client, pages, headers): a logged-in test client, each page's URL maker, and the
    headers of the pages that need some; every page is warmed up."""
    from django.test import Client

    from approvals.models import ApprovalRequest

    client = Client()
    client.force_login(user)
    pending = list(ApprovalRequest.objects.filter(tenant__slug=TENANT, status="pending")
                   .values_list("approval_id", flat=True))
    rng = random.Random(11)
    agent_id = ApprovalRequest.objects.filter(tenant__slug=TENANT).values_list("requested_by_id", flat=True).first()
    some_call = rng.choice(pending)
    pages = {
        # A reference for this machine's speed at the moment: a page that does almost nothing.
        "baseline: /healthz": lambda: "/healthz",
        "inbox": lambda: "/approvals/",
        "inbox filtered (tool+tier)": lambda: "/approvals/?tool=payments.refund&tier=4",
        "inbox filtered (tool)": lambda: "/approvals/?tool=mail.send",
        "inbox filtered (task type)": lambda: "/approvals/?task_type=billing",
        "inbox filtered (tenant)": lambda: f"/approvals/?tenant={TENANT}",
        "inbox filtered (requested by)": lambda: f"/approvals/?requested_by={agent_id}",
        "inbox filtered (age 24h)": lambda: "/approvals/?age=24h",
        "inbox search (approval ID)": lambda: f"/approvals/?q={some_call}",
        "inbox all filters, page 20": lambda: (f"/approvals/?tool=payments.refund&tier=3&task_type=refund"
                                               f"&tenant={TENANT}&requested_by={agent_id}&age=24h&page=20"),
        "inbox page 200": lambda: "/approvals/?page=200",
        "inbox htmx fragment": lambda: "/approvals/?tier=3",
        "detail": lambda: f"/approvals/{rng.choice(pending)}/",
    }
    headers = {"inbox htmx fragment": {"HTTP_HX_REQUEST": "true"}}
    for name, url in pages.items():  # warm-up: templates, connections, plans
        for _ in range(5):
            assert client.get(url(), **headers.get(name, {})).status_code == 200
    return client, pages, headers


def sample(client, url, headers: dict, requests: int) -> list[float]:
    samples = []
    for _ in range(requests):
        target = url()
        t = time.perf_counter()
        response = client.get(target, **headers)
        samples.append((time.perf_counter() - t) * 1000)
        assert response.status_code == 200, (target, response.status_code)
    return samples


def server_time(user, *, runs: int, requests: int) -> dict[str, list[tuple[float, float]]]:
    client, pages, headers = pages_to_measure(user)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in pages}
    for run in range(runs):
        for name, url in pages.items():
            samples = sample(client, url, headers.get(name, {}), requests)
            results[name].append((pct(samples, 50), pct(samples, 95)))
            print(f"  run {run + 1} {name:30s} p50 {pct(samples, 50):7.1f} ms  p95 {pct(samples, 95):7.1f} ms")
    return results


def filter_sql(*, rounds: int) -> list[tuple[str, float, float]]:
    """The filtered inbox's two queries (COUNT for the paginator, the page's IDs) as the inbox
    ran them before the request carried its tool and task type (joins to the 100,000
    operations and the tasks) and as it runs them now, interleaved in one loop so that both
    see the same load. Returns (filter, old p50 ms, new p50 ms)."""
    from django.db.models import QuerySet

    from approvals.models import ApprovalRequest, Tool

    tool_id = Tool.objects.get(name="payments.refund").pk
    base = ApprovalRequest.objects.filter(tenant__slug=TENANT, status="pending")
    cases = {
        "tool + tier": (base.filter(operation__tool_id=tool_id, risk_tier=4), base.filter(tool_id=tool_id, risk_tier=4)),
        "tool": (base.filter(operation__tool_id=tool_id), base.filter(tool_id=tool_id)),
        "task type": (base.filter(task__task_type="billing"), base.filter(task_type="billing")),
    }

    def run(qs: QuerySet) -> float:
        t = time.perf_counter()
        qs.count()
        list(qs.order_by("expires_at", "created_at", "approval_id").values_list("approval_id", flat=True)[:25])
        return (time.perf_counter() - t) * 1000

    out = []
    for name, (old, new) in cases.items():
        old_ms, new_ms = [], []
        for _ in range(rounds):
            old_ms.append(run(old))
            new_ms.append(run(new))
        out.append((name, pct(old_ms, 50), pct(new_ms, 50)))
    return out


# --- 2. live latency -------------------------------------------------------------------------


def session_cookie(user) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def start_server(url: str, port: int, live_poll: float) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": url, "CHANNEL_LAYER_URL": LIVE_LAYER,
           "CELERY_BROKER_URL": "memory://", "LIVE_POLL_SECONDS": str(live_poll), "DEBUG": "false",
           "PORT": str(port), "LOG_LEVEL": "WARNING"}
    log = open(ROOT / "artifacts" / "logs" / "bench-inbox-uvicorn.log", "w")  # noqa: SIM115
    # The consumers log each delivery's stage timestamps (console.live.timing) to a file.
    TIMING_LOG.unlink(missing_ok=True)
    log_config = ROOT / "artifacts" / "logs" / "bench-inbox-logging.json"
    log_config.write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"bare": {"format": "%(message)s"}},
        "handlers": {"timing": {"class": "logging.FileHandler", "filename": str(TIMING_LOG), "formatter": "bare"}},
        "loggers": {"console.live.timing": {"level": "DEBUG", "handlers": ["timing"], "propagate": False}},
    }))
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                             "--port", str(port), "--lifespan", "off", "--log-level", "warning",
                             "--log-config", str(log_config)],
                            cwd=CODE, env=env, stdout=log, stderr=subprocess.STDOUT)
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("uvicorn did not start; see artifacts/logs/bench-inbox-uvicorn.log")


class Sockets:
    """N websocket clients in one asyncio loop (own thread), recording when each first sees
    each approval ID."""

    def __init__(self, port: int, cookie: str, n: int, last_event_id: int) -> None:
        self.port, self.cookie, self.n, self.last_event_id = port, cookie, n, last_event_id
        self.seen: list[dict[str, float]] = [{} for _ in range(n)]
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 (reported by the caller)
            self.error = exc
            self.ready.set()

    async def _client(self, index: int, opened: list) -> None:
        from websockets.asyncio.client import connect

        url = f"ws://127.0.0.1:{self.port}/ws/live/inbox/all/"
        async with connect(url, origin=f"http://127.0.0.1:{self.port}",
                           additional_headers={"Cookie": f"sessionid={self.cookie}"}, max_size=None) as ws:
            await ws.send(json.dumps({"last_event_id": self.last_event_id}))
            opened.append(index)
            if len(opened) == self.n:
                self.ready.set()
            seen = self.seen[index]
            while not self.stop.is_set():
                try:
                    message = await asyncio.wait_for(ws.recv(), timeout=0.5)
                except TimeoutError:
                    continue
                now = time.time()  # wall clock: compared with the server process's timestamps
                for approval_id in APPROVAL_RE.findall(message):
                    seen.setdefault(approval_id, now)

    async def _main(self) -> None:
        opened: list[int] = []
        await asyncio.gather(*(self._client(i, opened) for i in range(self.n)))

    def start(self) -> Sockets:
        self.thread.start()
        if not self.ready.wait(60) or self.error is not None:
            raise RuntimeError(f"websockets did not open: {self.error!r}")
        return self


def create_request(agent, rng: random.Random, seq: int):
    from django.db import transaction

    from approvals import services
    from approvals.models import Tool
    from console.lib.canonical import arguments_hash
    from console.lib.ids import derive_operation_id
    from ledger.models import Operation
    from runs.models import Step, Task

    task = Task.objects.filter(tenant__slug=TENANT).order_by("?").first()
    tool = Tool.objects.get(name="payments.refund")
    step_id = f"live-{seq}-{rng.randrange(10**9)}"
    arguments = {"order_id": f"live-{seq}", "amount": 120, "currency": "EUR", "reason": "damaged"}
    with transaction.atomic():
        step = Step.objects.create(task=task, step_id=step_id)
        op_id = derive_operation_id(tenant=TENANT, task_id=task.task_id, step_id=step_id, tool=tool.name)
        args_hash = arguments_hash(arguments)
        operation = Operation.objects.create(
            operation_id=op_id, tenant_id=task.tenant_id, task=task, step=step, tool=tool, tool_schema_version=1,
            principal=agent, call_id=f"live-call-{seq}", arguments=arguments, arguments_hash=args_hash,
            intent_hash=args_hash, idempotency_key=op_id, risk_tier=3,
        )
        approval = services.approval_request_create(
            operation=operation, task_type=operation.task.task_type, call_id=operation.call_id, state_version=task.version, risk_tier=3,
            approvals_needed=1, ttl_seconds=3600, reasons=["amount > 50"], actor=agent.ref,
        )
    return approval.approval_id, time.time()  # after the commit returned


def live_latency(url: str, seeded: dict, *, sockets: int, arrivals: int, live_poll: float) -> dict:
    from bench.ledger import free_port
    from console.live import latest_event_id

    port = free_port()
    server = start_server(url, port, live_poll)
    try:
        clients = Sockets(port, session_cookie(seeded["user"]), sockets, latest_event_id()).start()
        time.sleep(1.0)  # let every consumer finish its catch-up before measuring
        rng = random.Random()  # unseeded: reruns against the same database need fresh steps
        latencies: list[float] = []
        commits: dict[str, float] = {}
        missing = 0
        for seq in range(arrivals):
            approval_id, committed = create_request(seeded["agent"], rng, seq)
            commits[approval_id] = committed
            deadline = time.perf_counter() + 10
            while time.perf_counter() < deadline and not all(approval_id in s for s in clients.seen):
                time.sleep(0.002)
            for s in clients.seen:
                if approval_id in s:
                    latencies.append((s[approval_id] - committed) * 1000)
                else:
                    missing += 1
            time.sleep(rng.uniform(0.2, 0.6))  # arrivals out of phase with the poll
        clients.stop.set()
        clients.thread.join(5)
        return {"latencies": latencies, "missing": missing, "commits": commits, "seen": clients.seen}
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()


STAGES = (
    ("commit → doorbell at the server", "committed", "ring"),
    ("doorbell → read of the event table starts", "ring", "read"),
    ("read starts → socket has its events", "read", "woke"),
    ("socket has events → HTML rendered (shared)", "woke", "rendered"),
    ("rendered → send() returned", "rendered", "sent"),
    ("send() returned → client received", "sent", "received"),
)


def stage_breakdown(result: dict) -> list[tuple[str, float, float]]:
    """Where the time goes, per delivery, from the consumers' timing log (console.live.timing)
    joined to the commit and receive times measured here (one clock: this machine's)."""
    from approvals.models import ApprovalRequest
    from console.models import Event

    if not TIMING_LOG.exists():
        return []
    event_of = dict(Event.objects.filter(entity=ApprovalRequest.EVENT_ENTITY, entity_id__in=list(result["commits"]),
                                         to_status="pending", from_status="")
                    .values_list("id", "entity_id"))
    samples: dict[str, list[float]] = {name: [] for name, _, _ in STAGES}
    received: dict[str, list[float]] = {}
    for seen in result["seen"]:
        for approval_id, at in seen.items():
            received.setdefault(approval_id, []).append(at)
    per_approval: dict[str, list[dict]] = {}
    for line in TIMING_LOG.read_text().splitlines():
        parts = line.split()
        if len(parts) != 7 or parts[0] != "inbox":
            continue
        ring, read, woke, rendered, sent = map(float, parts[1:6])
        for event_id in parts[6].split(","):
            approval_id = event_of.get(int(event_id))
            if approval_id is not None:
                per_approval.setdefault(approval_id, []).append(
                    {"ring": ring, "read": read, "woke": woke, "rendered": rendered, "sent": sent})
    for approval_id, lines in per_approval.items():
        committed = result["commits"][approval_id]
        arrivals = sorted(received.get(approval_id, []))
        for i, stamps in enumerate(sorted(lines, key=lambda d: d["sent"])):
            stamps = {**stamps, "committed": committed}
            if i < len(arrivals):
                stamps["received"] = arrivals[i]
            for name, start, end in STAGES:
                if start in stamps and end in stamps:
                    samples[name].append((stamps[end] - stamps[start]) * 1000)
    return [(name, pct(values, 50), pct(values, 95)) for name, values in samples.items() if values]


def main() -> None:
    global LIVE_LAYER
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", action="store_true", help="drop and re-create the database first")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="requests per page per run")
    parser.add_argument("--sockets", type=int, default=50)
    parser.add_argument("--arrivals", type=int, default=40)
    parser.add_argument("--live-poll", type=float, default=0.25, help="LIVE_POLL_SECONDS of the server child")
    parser.add_argument("--no-live", action="store_true")
    parser.add_argument("--no-server-time", action="store_true")
    parser.add_argument("--database", default="countersign_bench_reviewer_inbox",
                        help="the bench database's name on DATABASE_URL's server")
    parser.add_argument("--live-layer", default=LIVE_LAYER, help="the Redis channel layer shared with the server child")
    parser.add_argument("--against", metavar="DIR",
                        help="server time only: alternate runs of this checkout's code and DIR's (e.g. the code "
                             "before a change, `git archive REV | tar -x -C DIR`), one run of each per --runs, "
                             "and print both with their ratio")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # a child of --against
    args = parser.parse_args()
    if args.against:
        compare(args)
        return
    protocol = sys.stdout
    if args.serve:
        sys.stdout = sys.stderr  # stdout carries the protocol only

    base = os.environ.get("DATABASE_URL", DEFAULT_URL)
    url = with_database(base, args.database)
    if not url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("bench/inbox.py needs PostgreSQL")
    (ROOT / "artifacts" / "logs").mkdir(parents=True, exist_ok=True)
    ensure_database(url, fresh=args.fresh)
    os.environ["ALLOWED_HOSTS"] = "127.0.0.1,localhost,testserver"
    # This process commits the new requests: it rings the server child's doorbell on the same
    # Redis channel layer (console.doorbell.ring_doorbell_on_commit).
    LIVE_LAYER = args.live_layer
    os.environ["CHANNEL_LAYER_URL"] = LIVE_LAYER
    setup_django(url)
    seeded = seed()
    if args.serve:
        serve(seeded, protocol)
        return

    from approvals.models import ApprovalRequest
    from ledger.models import Operation

    print(f"database: {Operation.objects.filter(tenant__slug=TENANT).count()} operations, "
          f"{ApprovalRequest.objects.filter(tenant__slug=TENANT, status='pending').count()} pending approvals")
    if not args.no_server_time:
        measure_server_time(seeded, args)
    if args.no_live:
        return
    print(f"2. commit-to-browser, Redis channel layer, LIVE_POLL_SECONDS={args.live_poll}, "
          f"{args.arrivals} new requests per run; load average {os.getloadavg()[0]:.1f}")
    results = {}
    for n in (1, args.sockets):
        result = live_latency(url, seeded, sockets=n, arrivals=args.arrivals, live_poll=args.live_poll)
        results[n] = result
        latencies = result["latencies"]
        expected = n * args.arrivals
        if latencies:
            p95 = pct(latencies, 95)
            print(f"   {n:3d} socket(s): {len(latencies)}/{expected} deliveries within 10 s: "
                  f"p50 {pct(latencies, 50):.1f} ms  p95 {p95:.1f} ms  max {max(latencies):.1f} ms  "
                  f"({'meets' if p95 <= 100 else 'MISSES'} p95 ≤ 100 ms); load average {os.getloadavg()[0]:.1f}")
        for name, p50, p95 in stage_breakdown(result):
            print(f"        {name:46s} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms")
    one, many = results[1]["latencies"], results[args.sockets]["latencies"]
    if one and many:
        print(f"   ratio {args.sockets} sockets / 1 socket: p50 {pct(many, 50) / pct(one, 50):.2f}×, "
              f"p95 {pct(many, 95) / pct(one, 95):.2f}×")


def compare(args) -> None:
    """Two children, one importing the other checkout's code ("before") and one this
    checkout's ("after"), both against the same database; each page is measured by one, then
    by the other (which goes first alternates), `--requests` requests at a time, so that both
    see the same load within seconds. Per page and run: p50 and p95; then the medians."""
    trees = {"before": Path(args.against).resolve(), "after": ROOT}
    children = {}
    for label, tree in trees.items():
        command = [sys.executable, str(Path(__file__).resolve()), "--no-live", "--database", args.database, "--serve"]
        # In the tree's own directory: Celery's Django fix-up puts the working directory first on
        # sys.path, so a child started elsewhere would import that directory's apps.
        children[label] = subprocess.Popen(command, env={**os.environ, "INBOX_BENCH_CODE": str(tree)}, text=True,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tree)
    names = {label: json.loads(child.stdout.readline()) for label, child in children.items()}
    assert names["before"] == names["after"], names
    per_run: dict[str, dict[str, list[tuple[float, float]]]] = {label: {} for label in trees}
    loads = [os.getloadavg()[0]]
    try:
        for run in range(args.runs):
            for index, name in enumerate(names["after"]):
                order = list(trees) if (run + index) % 2 == 0 else list(reversed(trees))
                for label in order:
                    children[label].stdin.write(json.dumps([name, args.requests]) + "\n")
                    children[label].stdin.flush()
                    samples = json.loads(children[label].stdout.readline())
                    per_run[label].setdefault(name, []).append((pct(samples, 50), pct(samples, 95)))
            loads.append(os.getloadavg()[0])
            print(f"  run {run + 1} done; load average {loads[-1]:.1f}", flush=True)
    finally:
        for child in children.values():
            child.stdin.close()
            child.wait(30)
    print(f"server time, before ({trees['before']}) and after ({trees['after']}), interleaved page by page, "
          f"{args.runs} runs × {args.requests} requests per page each; load average {min(loads):.1f}–{max(loads):.1f}")
    print(f"   {'page':30s} {'before p50':>10s} {'p95':>8s}   {'after p50':>10s} {'p95':>8s}   before ÷ after (p50, p95)")
    for name in names["after"]:
        b50, b95 = (statistics.median(r[i] for r in per_run["before"][name]) for i in (0, 1))
        a50, a95 = (statistics.median(r[i] for r in per_run["after"][name]) for i in (0, 1))
        print(f"   {name:30s} {b50:8.1f} ms {b95:6.1f} ms   {a50:8.1f} ms {a95:6.1f} ms   "
              f"{b50 / a50:.2f}×, {b95 / a95:.2f}×")


def serve(seeded: dict, out) -> None:
    """A child of `compare`: the page names on stdout, then for each [name, n] read from stdin,
    n requests of that page and their times (ms) as one JSON line."""
    client, pages, headers = pages_to_measure(seeded["user"])
    print(json.dumps(list(pages)), file=out, flush=True)
    for line in sys.stdin:
        name, requests = json.loads(line)
        print(json.dumps(sample(client, pages[name], headers.get(name, {}), requests)), file=out, flush=True)


def measure_server_time(seeded: dict, args) -> None:
    print(f"1. server time, {args.runs} runs × {args.requests} requests per page (Django test client, in process)")
    results = server_time(seeded["user"], runs=args.runs, requests=args.requests)
    print("   medians across runs:")
    inbox_p50 = statistics.median(r[0] for r in results["inbox"])
    for name, per_run in results.items():
        p50 = statistics.median(r[0] for r in per_run)
        p95 = statistics.median(r[1] for r in per_run)
        verdict = "meets" if p95 <= 50 else "MISSES"
        print(f"   {name:30s} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  ({verdict} p95 ≤ 50 ms)  "
              f"p50 / inbox p50 {p50 / inbox_p50:.2f}")
    print(f"   load average {os.getloadavg()[0]:.1f}")
    print("   the filtered inbox's SQL (COUNT + page IDs), joined as before vs on the request's own columns, interleaved:")
    for name, old, new in filter_sql(rounds=args.requests):
        print(f"   {name:12s} before p50 {old:6.1f} ms   now p50 {new:6.1f} ms   ratio {old / new:.1f}×")


if __name__ == "__main__":
    main()
