"""Benchmark of OTLP trace ingest (`POST /v1/traces`) against Arize Phoenix fed the same batches
in the same run, and of the render time of a run page with a 2,000-span trace.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/countersign_bench_otlp \\
        .venv/bin/python bench/otlp.py --phoenix-python /tmp/phoenix-venv/bin/python \\
        [--fresh] [--batches 50] [--batch-spans 100] [--clients 4] [--runs 3] [--sqlite] [--browser]

Phoenix (`pip install arize-phoenix`) lives in its own venv, never the project's; it is started
as a subprocess (`python -m phoenix.server.main serve`) with a temporary working directory, its
default SQLite storage and free ports, and stopped at the end. Without `--phoenix-python`, or if
it does not start, Countersign is measured alone and the reason is printed.

In every run one set of OTLP/protobuf `ExportTraceServiceRequest` batches is built (fresh trace
and span IDs, GenAI attributes, gzip) and the same bytes are sent to every target, interleaved so
that a noisy neighbour hurts them all alike:

- Countersign: uvicorn (`console.asgi:application`, `--lifespan off`) with 1 and 2 workers on
  PostgreSQL; with `--sqlite` also 1 worker on a SQLite file (the development set-up).
- Phoenix: its OTLP/HTTP receiver on its HTTP port.

N client threads (httpx) POST the batches as fast as they are answered. Per target: request
latency p50/p95, *accepted* spans/s (spans ÷ time from the first send until the last answer) and
*queryable* spans/s (spans ÷ time from the first send until all of them can be read back: for
Countersign the rows in `runs_span`, for Phoenix the project's span count through its GraphQL
API, polled after the last answer). What counts is what a user can rely on: the queryable
figure, and Countersign ÷ Phoenix on it is the ratio held against the target (≥ 2).

Then the run page: a 2,000-span trace linked to one task is ingested, and `GET /runs/<task_id>/`
is timed in-process with Django's test client (logged-in member): the full page, and the live
poll an open tab makes every 3 s while the run is active, when nothing arrived and when 10 spans
did; with `--browser` also Chromium's time until the waterfall is drawn, through Playwright
against the uvicorn server.

Prints medians of the runs and the ratios. Timings are never asserted in tests: the machines are
shared and noisy.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import queue
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.ledger import (  # noqa: E402 - after the path set-up, like a script must
    database_name,
    ensure_database,
    free_port,
    percentile,
    print_table,
    with_database,
)

TENANT = "bench-otlp"
AGENT = "bench-otlp-agent"
AGENT_TOKEN = "bench-otlp-agent-token"
USER = "bench-otlp-viewer"
PHOENIX_PROJECT = "countersign-bench"
TARGET_VS_PHOENIX = 2.0
PROTOBUF = "application/x-protobuf"
MODELS = ["gpt-4o-mini", "claude-sonnet-4", "gemini-2.0-flash"]
TOOLS = ["search_orders", "refund_payment", "send_email", "lookup_customer"]


# --- the batches -----------------------------------------------------------------------------


def _attrs(items: dict[str, Any]):
    from opentelemetry.proto.common.v1 import common_pb2

    out = []
    for key, value in items.items():
        if isinstance(value, bool):
            any_value = common_pb2.AnyValue(bool_value=value)
        elif isinstance(value, int):
            any_value = common_pb2.AnyValue(int_value=value)
        elif isinstance(value, float):
            any_value = common_pb2.AnyValue(double_value=value)
        else:
            any_value = common_pb2.AnyValue(string_value=str(value))
        out.append(common_pb2.KeyValue(key=key, value=any_value))
    return out


def build_trace(rng: random.Random, *, spans: int, task_id: str, t0_ns: int,
                steps: int = 10) -> tuple[bytes, list]:
    """One agent trace of `spans` spans: a root `invoke_agent`, `steps` step spans under it, and
    under each step alternating `chat <model>` (token usage, messages) and `execute_tool <tool>`
    (tool call ID) spans. Returns the trace ID and the Span messages."""
    from opentelemetry.proto.trace.v1 import trace_pb2

    trace_id = rng.randbytes(16)
    out: list = []
    clock = t0_ns

    def span(name: str, parent: bytes, start: int, end: int, attributes: dict[str, Any], kind: int = 1,
             error: bool = False):
        span_id = rng.randbytes(8)
        out.append(trace_pb2.Span(
            trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=name, kind=kind,
            start_time_unix_nano=start, end_time_unix_nano=end, attributes=_attrs(attributes),
            status=trace_pb2.Status(code=2 if error else 1, message="tool timed out" if error else ""),
        ))
        return span_id

    steps = max(1, min(steps, spans - 1))
    per_step = max(0, spans - 1 - steps)
    root_index = len(out)
    root = span("invoke_agent support-bot", b"", clock, clock + 1, {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "support-bot",
        "countersign.task_id": task_id, "openinference.span.kind": "AGENT",
    }, kind=2)
    for step in range(steps):
        children = per_step // steps + (1 if step < per_step % steps else 0)
        step_start = clock
        step_id = f"s{step + 1}"
        step_index = len(out)
        step_span = span(f"step {step_id}", root, step_start, step_start + 1, {
            "countersign.task_id": task_id, "countersign.step_id": step_id, "openinference.span.kind": "CHAIN",
        })
        for child in range(children):
            duration = rng.randint(5, 900) * 1_000_000
            if child % 2 == 0:
                model = rng.choice(MODELS)
                span(f"chat {model}", step_span, clock, clock + duration, {
                    "gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": model,
                    "gen_ai.response.model": model, "gen_ai.usage.input_tokens": rng.randint(200, 8000),
                    "gen_ai.usage.output_tokens": rng.randint(10, 1200), "gen_ai.request.temperature": 0.2,
                    "gen_ai.response.finish_reasons": "tool_calls",
                    "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [
                        {"type": "text", "content": f"Refund order {rng.randint(1, 10**6)} for customer "
                         f"{rng.randint(1, 10**5)}, " + "x" * rng.randint(50, 300)}]}]),
                    "countersign.task_id": task_id, "countersign.step_id": step_id,
                    "openinference.span.kind": "LLM", "llm.model_name": model,
                }, kind=3)
            else:
                tool = rng.choice(TOOLS)
                span(f"execute_tool {tool}", step_span, clock, clock + duration, {
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.id": f"call_{rng.randbytes(6).hex()}",
                    "countersign.task_id": task_id, "countersign.step_id": step_id,
                    "openinference.span.kind": "TOOL",
                }, error=rng.random() < 0.02)
            clock += duration
        clock += 1_000_000
        out[step_index].end_time_unix_nano = max(clock, step_start + 1)
    out[root_index].end_time_unix_nano = clock
    return trace_id, out


def export_request(span_list: list, *, service: str = "support-bot") -> bytes:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    request = trace_service_pb2.ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(
        resource=resource_pb2.Resource(attributes=_attrs({
            "service.name": service, "service.version": "1.4.2", "deployment.environment": "bench",
            "openinference.project.name": PHOENIX_PROJECT, "telemetry.sdk.language": "python",
        })),
        scope_spans=[trace_pb2.ScopeSpans(scope=common_pb2.InstrumentationScope(name="bench.otlp", version="1"),
                                          spans=span_list)],
    )])
    return request.SerializeToString()


def build_batches(*, seed: int, batches: int, batch_spans: int, task_id: str) -> list[bytes]:
    """`batches` gzip'd requests of `batch_spans` spans each, each one trace (fresh IDs)."""
    rng = random.Random(seed)
    t0 = time.time_ns() - 3600 * 10**9
    out = []
    for n in range(batches):
        _, spans = build_trace(rng, spans=batch_spans, task_id=task_id, t0_ns=t0 + n * 10**9,
                               steps=max(1, batch_spans // 20))
        out.append(gzip.compress(export_request(spans), compresslevel=6))
    return out


# --- targets ---------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    url: str  # the OTLP/HTTP traces endpoint
    headers: dict[str, str]
    count: Callable[[], int]  # spans queryable now
    reset: Callable[[], None] = lambda: None
    stop: Callable[[], None] = lambda: None
    poll_interval: float = 0.05
    written: Callable[[], int] | None = None  # rows in the store, if it differs from `count`


class Uvicorn:
    def __init__(self, database_url: str, workers: int, log_dir: Path) -> None:
        from console.lib.procs import Child, http_ok, python, wait_until

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.child = Child(
            name=f"uvicorn-{workers}w-{self.port}",
            argv=python("-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                        "--port", str(self.port), "--lifespan", "off", "--workers", str(workers),
                        "--no-access-log", "--log-level", "warning"),
            env={"DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "console.settings",
                 "CELERY_BROKER_URL": "memory://", "DEBUG": "false", "LOG_LEVEL": "WARNING"},
        ).start(log_dir=log_dir)
        try:
            wait_until(http_ok(self.base + "/healthz"), timeout=90, what="uvicorn /healthz")
        except TimeoutError:
            self.stop()
            raise

    def stop(self) -> None:
        self.child.stop()


class Phoenix:
    """`phoenix serve` from its own venv: temporary working dir (so its default SQLite file is
    new), free HTTP and gRPC ports, stopped at the end."""

    def __init__(self, python_path: str, log_dir: Path) -> None:
        from console.lib.procs import Child, wait_until

        self.working_dir = Path(tempfile.mkdtemp(prefix="phoenix-bench-"))
        self.port, self.grpc_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.version = subprocess.run(
            [python_path, "-c", "import importlib.metadata as m; print(m.version('arize-phoenix'))"],
            capture_output=True, text=True, timeout=120, check=True).stdout.strip()
        self.child = Child(
            name="phoenix",
            argv=[python_path, "-m", "phoenix.server.main", "serve"],
            env={"PHOENIX_WORKING_DIR": str(self.working_dir), "PHOENIX_PORT": str(self.port),
                 "PHOENIX_GRPC_PORT": str(self.grpc_port), "PHOENIX_HOST": "127.0.0.1",
                 "PHOENIX_TELEMETRY_ENABLED": "false"},
        ).start(log_dir=log_dir)
        self.log_path = self.child.log_path
        try:
            wait_until(self._healthy, timeout=180, what="Phoenix to answer GraphQL", interval=0.5)
        except TimeoutError:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path else ""
            self.stop()
            raise RuntimeError(f"Phoenix did not become healthy: {tail}") from None

    def _healthy(self) -> bool:
        if not self.child.alive:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path else ""
            raise RuntimeError(f"Phoenix exited with {self.child.popen.returncode}: {tail}")
        try:
            self.count()
            return True
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def count(self) -> int:
        """Spans of the bench project that Phoenix's API can return now (GraphQL, the API its UI
        reads); 0 before the project exists."""
        import httpx

        response = httpx.post(self.base + "/graphql", timeout=30, json={
            "query": "{ projects { edges { node { name recordCount } } } }"})
        response.raise_for_status()
        payload = response.json()
        if payload.get("errors"):
            raise RuntimeError(f"Phoenix GraphQL: {payload['errors']}")
        for edge in payload["data"]["projects"]["edges"]:
            if edge["node"]["name"] == PHOENIX_PROJECT:
                return int(edge["node"]["recordCount"])
        return 0

    def written(self) -> int:
        """Rows in Phoenix's SQLite file, read directly: tells a write backlog from an API lag."""
        path = self.working_dir / "phoenix.db"
        if not path.exists():
            return 0
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as conn:
            project = conn.execute("SELECT id FROM projects WHERE name = ?", [PHOENIX_PROJECT]).fetchone()
            if project is None:
                return 0
            return conn.execute("SELECT count(*) FROM spans JOIN traces ON spans.trace_rowid = traces.id"
                                " WHERE traces.project_rowid = ?", [project[0]]).fetchone()[0]

    def rest_count(self, limit: int = 1000) -> int:
        """The same count through the REST span endpoint, paged (a cross-check, slower)."""
        import httpx

        total, cursor = 0, None
        while True:
            params: dict[str, Any] = {"limit": limit}
            if cursor:
                params["cursor"] = cursor
            response = httpx.get(f"{self.base}/v1/projects/{PHOENIX_PROJECT}/spans", params=params, timeout=60)
            response.raise_for_status()
            body = response.json()
            total += len(body.get("data", []))
            cursor = body.get("next_cursor")
            if not cursor:
                return total

    def stop(self) -> None:
        self.child.stop()


# --- one measurement -------------------------------------------------------------------------


@dataclass
class Result:
    target: str
    clients: int
    spans: int
    requests: int
    accepted_s: float  # first send → last answer
    queryable_s: float  # first send → all spans readable (inf if the drain timed out)
    queryable_spans: int
    latencies: list[float] = field(repr=False)
    failures: int = 0
    written_s: float | None = None  # first send → all rows in the store (Phoenix: its SQLite file)

    @property
    def accepted_per_s(self) -> float:
        return self.spans / self.accepted_s if self.accepted_s else 0.0

    @property
    def queryable_per_s(self) -> float:
        return self.queryable_spans / self.queryable_s if self.queryable_s else 0.0

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies, 50) * 1000

    @property
    def p95_ms(self) -> float:
        return percentile(self.latencies, 95) * 1000

    def summary(self) -> dict[str, Any]:
        return {"target": self.target, "clients": self.clients, "spans": self.spans, "requests": self.requests,
                "accepted_s": round(self.accepted_s, 3), "queryable_s": round(self.queryable_s, 3),
                "queryable_spans": self.queryable_spans, "accepted_spans_per_s": round(self.accepted_per_s, 1),
                "queryable_spans_per_s": round(self.queryable_per_s, 1), "p50_ms": round(self.p50_ms, 2),
                "p95_ms": round(self.p95_ms, 2), "failures": self.failures,
                "written_s": None if self.written_s is None else round(self.written_s, 3)}


def send(target: Target, batches: list[bytes], batch_spans: int, *, clients: int,
         drain_timeout: float) -> Result:
    """POST every batch once with `clients` threads, then poll until all spans are queryable."""
    import httpx

    target.reset()
    before = target.count()
    written_before = target.written() if target.written else 0
    work: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    for body in batches:
        work.put(body)
    latencies: list[list[float]] = [[] for _ in range(clients)]
    failures: list[str] = []
    barrier = threading.Barrier(clients + 1)
    headers = {"Content-Type": PROTOBUF, "Content-Encoding": "gzip", **target.headers}

    def worker(index: int) -> None:
        with httpx.Client(timeout=120, headers=headers) as client:
            client.get(target.url.rsplit("/v1/", 1)[0] + "/")  # connect before the clock starts
            barrier.wait()
            mine, clock = latencies[index], time.perf_counter
            while True:
                try:
                    body = work.get_nowait()
                except queue.Empty:
                    return
                started = clock()
                try:
                    response = client.post(target.url, content=body)
                    ok = response.status_code == 200
                    detail = "" if ok else f"{response.status_code}: {response.text[:200]}"
                except httpx.HTTPError as exc:
                    ok, detail = False, repr(exc)
                mine.append(clock() - started)
                if not ok:
                    failures.append(detail)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    accepted = time.perf_counter() - t0
    expected = before + len(batches) * batch_spans
    deadline = time.monotonic() + drain_timeout
    written_at: float | None = None
    seen = target.count()
    while seen < expected and time.monotonic() < deadline:
        if target.written and written_at is None and target.written() >= written_before + expected - before:
            written_at = time.perf_counter() - t0
        time.sleep(target.poll_interval)
        seen = target.count()
    queryable = time.perf_counter() - t0 if seen >= expected else float("inf")
    if target.written and written_at is None and queryable != float("inf"):
        written_at = queryable
    if failures:
        print(f"  {target.name}: {len(failures)} failed requests, first: {failures[0]}", file=sys.stderr)
    flat = [x for per in latencies for x in per]
    return Result(target=target.name, clients=clients, spans=len(batches) * batch_spans, requests=len(flat),
                  accepted_s=accepted, queryable_s=queryable if queryable != float("inf") else drain_timeout,
                  queryable_spans=min(seen, expected) - before, latencies=flat, failures=len(failures),
                  written_s=written_at)


# --- Countersign set-up ----------------------------------------------------------------------


def prepare(database_url: str) -> dict[str, Any]:
    """Migrate and create the tenant, agent (token), member user and a running task. In this
    process (PostgreSQL, for the render measurements) or a child (`--prepare`, SQLite)."""
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ.setdefault("DEBUG", "false")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from console.models import AgentPrincipal, Membership, Role, Tenant
    from runs import services as run_services

    tenant, _ = Tenant.objects.get_or_create(slug=TENANT, defaults={"name": "Benchmark OTLP"})
    agent = AgentPrincipal.objects.filter(tenant=tenant, name=AGENT).first() or AgentPrincipal(tenant=tenant,
                                                                                                name=AGENT)
    agent.set_token(AGENT_TOKEN)
    agent.is_active = True
    agent.save()
    user, _ = get_user_model().objects.get_or_create(username=USER)
    Membership.objects.get_or_create(user=user, tenant=tenant, role=Role.SUPPORT)
    task = run_services.task_create(principal=agent, task_type="bench-otlp", goal="Benchmark OTLP ingest")
    return {"tenant_id": tenant.id, "task_id": task.task_id}


def pg_target(name: str, server: Uvicorn, database_url: str, tenant_id: int) -> Target:
    import psycopg

    conn = psycopg.connect(database_url, autocommit=True)
    lock = threading.Lock()

    def count() -> int:
        with lock:
            return conn.execute("SELECT count(*) FROM runs_span WHERE tenant_id = %s", [tenant_id]).fetchone()[0]

    def reset() -> None:
        with lock:
            conn.execute("DELETE FROM runs_span WHERE tenant_id = %s", [tenant_id])
            conn.execute("VACUUM ANALYZE runs_span")

    def stop() -> None:
        conn.close()
        server.stop()

    return Target(name=name, url=server.base + "/v1/traces", headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
                  count=count, reset=reset, stop=stop)


def sqlite_target(name: str, server: Uvicorn, path: Path, tenant_id: int) -> Target:
    def count() -> int:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as conn:
            return conn.execute("SELECT count(*) FROM runs_span WHERE tenant_id = ?", [tenant_id]).fetchone()[0]

    def reset() -> None:
        conn = sqlite3.connect(path, timeout=30)
        try:
            conn.execute("DELETE FROM runs_span WHERE tenant_id = ?", [tenant_id])
            conn.commit()
        finally:
            conn.close()

    return Target(name=name, url=server.base + "/v1/traces", headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
                  count=count, reset=reset, stop=server.stop)


# --- the run page ----------------------------------------------------------------------------


def measure_render(*, spans: int, repeats: int, base: str | None, browser: bool) -> dict[str, Any]:
    """Ingest one `spans`-span trace linked to a new task (through the same parser and service
    as the endpoint), then time the run page in-process with the test client: the full page;
    the live poll of an open tab when nothing arrived (204) and when 10 spans arrived (JSON of
    those 10 and the step summary); the view's data work alone. With `browser`, Chromium's load
    of the live page until the waterfall is drawn."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from console.models import AgentPrincipal
    from runs import services as run_services
    from runs.models import ModelPrice, Span, Task
    from runs.otlp import parse_protobuf
    from runs.spans import spans_ingest
    from runs.views import run_detail_context
    from runs.waterfall import trace_rows

    agent = AgentPrincipal.objects.select_related("tenant").get(tenant__slug=TENANT, name=AGENT)
    for n, model in enumerate(MODELS):  # made-up prices: the page prices every chat span
        ModelPrice.objects.get_or_create(model=model, tenant=None, defaults={
            "input_per_million": n + 1, "output_per_million": 4 * (n + 1), "valid_from": datetime(2026, 1, 1, tzinfo=UTC)})
    task = run_services.task_create(principal=agent, task_type="bench-otlp", goal="Render a 2,000-span run")
    rng = random.Random(2000)
    t0_ns = time.time_ns() - 7200 * 10**9
    root_id, span_list = build_trace(rng, spans=spans, task_id=task.task_id, t0_ns=t0_ns, steps=20)
    late = span_list[-10:]  # held back: they arrive while the page is open
    for start in range(0, len(span_list) - len(late), 500):
        parsed = parse_protobuf(export_request(span_list[start:min(start + 500, len(span_list) - len(late))]))
        spans_ingest(principal=agent, spans=parsed.spans)
    client = Client()
    client.force_login(get_user_model().objects.get(username=USER))
    url = f"/runs/{task.task_id}/"
    out: dict[str, Any] = {"task_id": task.task_id}

    def timed(fn: Callable[[], Any]) -> list[float]:
        fn()  # warm: template loading, first connection
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return times

    def get_page() -> None:
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} answered {response.status_code}")
        out["html_bytes"] = len(response.content)
        html = response.content.decode()
        out["cursor"] = int(html.split('data-cursor="', 1)[1].split('"', 1)[0])
        out["held"] = int(html.split('data-total="', 1)[1].split('"', 1)[0])

    def poll(status: int, key: str) -> Callable[[], None]:
        def get() -> None:
            response = client.get(url + "trace/", {"after": out["cursor"], "known": out["held"]})
            if response.status_code != status:
                raise RuntimeError(f"GET {url}trace/ answered {response.status_code}, not {status}")
            out[key] = len(response.content)
        return get

    task = Task.objects.get(task_id=task.task_id)
    out["page"] = timed(get_page)
    out["poll_idle"] = timed(poll(204, "poll_idle_bytes"))
    spans_ingest(principal=agent, spans=parse_protobuf(export_request(late)).spans)
    out["spans"] = Span.objects.filter(task=task).count()
    out["poll_new"] = timed(poll(200, "poll_new_bytes"))
    out["context"] = timed(lambda: run_detail_context(task))
    out["span_query"] = timed(lambda: trace_rows(task))
    with CaptureQueriesContext(connection) as queries:
        get_page()
    out["page_queries"] = len(queries.captured_queries)
    if browser and base:
        out["browser"] = measure_browser(base + url, client.cookies[settings.SESSION_COOKIE_NAME].value,
                                         settings.SESSION_COOKIE_NAME, repeats)
    return out


def measure_browser(url: str, session: str, cookie_name: str, repeats: int) -> dict[str, Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        return {"error": f"playwright not importable: {exc}"}
    flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run"]
    wall, dcl, load = [], [], []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=flags)
            try:
                context = browser.new_context()
                context.add_cookies([{"name": cookie_name, "value": session, "url": url.split("/runs/")[0]}])
                page = context.new_page()
                for n in range(repeats + 1):
                    started = time.perf_counter()
                    response = page.goto(url, wait_until="load", timeout=120_000)
                    page.wait_for_selector("#run-waterfall[data-rendered]", state="attached", timeout=120_000)
                    elapsed = time.perf_counter() - started
                    if response is None or response.status != 200:
                        raise RuntimeError(f"browser GET answered {response.status if response else None}")
                    timing = page.evaluate("() => { const t = performance.getEntriesByType('navigation')[0];"
                                           " return [t.domContentLoadedEventEnd, t.loadEventEnd]; }")
                    if n:  # the first is a warm-up
                        wall.append(elapsed)
                        dcl.append(timing[0] / 1000)
                        load.append(timing[1] / 1000)
                    page.goto("about:blank")
            finally:
                browser.close()
    except Exception as exc:  # noqa: BLE001 - reported, the rest still stands
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"wall": wall, "dom_content_loaded": dcl, "load_event": load}


# --- report ----------------------------------------------------------------------------------


def machine(url: str) -> dict[str, str]:
    import psycopg

    info = {"python": platform.python_version(), "nproc": str(os.cpu_count()),
            "cpu": next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("model name")), "?")}
    try:
        info["loadavg"] = Path("/proc/loadavg").read_text().split(" 1")[0].strip()
    except OSError:
        pass
    with psycopg.connect(with_database(url, "postgres"), autocommit=True) as conn:
        info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
        for name in ("synchronous_commit", "fsync", "shared_buffers"):
            info[name] = conn.execute(f"SHOW {name}").fetchone()[0]
    return info


def ms(values: list[float], pct: float) -> str:
    return f"{percentile(values, pct) * 1000:,.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phoenix-python", help="python of a venv with arize-phoenix (not the project's)")
    parser.add_argument("--batches", type=int, default=50, help="batches per measurement (the same to every target)")
    parser.add_argument("--batch-spans", type=int, default=100, help="spans per batch")
    parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients")
    parser.add_argument("--runs", type=int, default=3, help="runs of every measurement; medians are reported")
    parser.add_argument("--workers", default="1,2", help="uvicorn worker counts on PostgreSQL")
    parser.add_argument("--sqlite", action="store_true", help="also Countersign on SQLite, 1 worker")
    parser.add_argument("--drain-timeout", type=float, default=300.0, help="seconds to wait until queryable")
    parser.add_argument("--render-spans", type=int, default=2000)
    parser.add_argument("--render-repeats", type=int, default=10)
    parser.add_argument("--browser", action="store_true", help="also Chromium's load time (Playwright)")
    parser.add_argument("--no-ingest", action="store_true", help="only the run page")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--fresh", action="store_true",
                        help="drop and recreate the bench database first (only if its name contains 'bench')")
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)  # child: SQLite set-up
    args = parser.parse_args(argv)

    url = os.environ.get("DATABASE_URL", "")
    if args.prepare:
        print(json.dumps(prepare(url)))
        return 0
    if urlsplit(url).scheme not in ("postgres", "postgresql") or "bench" not in database_name(url):
        print("set DATABASE_URL=postgres://postgres@127.0.0.1:5432/countersign_bench_otlp "
              "(a PostgreSQL database whose name contains 'bench')", file=sys.stderr)
        return 2
    os.chdir(ROOT)
    ensure_database(url, fresh=args.fresh)
    fixtures = prepare(url)
    info = machine(url)
    log_dir = Path(tempfile.mkdtemp(prefix="countersign-bench-otlp-"))
    print("machine:", json.dumps(info))
    print(f"command: DATABASE_URL={url} {' '.join([sys.executable.replace(str(ROOT) + '/', ''), *sys.argv])}")
    print(f"logs: {log_dir}")

    targets: list[Target] = []
    servers: dict[int, Uvicorn] = {}
    phoenix: Phoenix | None = None
    phoenix_error = ""
    try:
        for workers in [int(w) for w in args.workers.split(",") if w.strip()]:
            servers[workers] = Uvicorn(url, workers, log_dir)
            targets.append(pg_target(f"Countersign PG, {workers} worker{'s' if workers > 1 else ''}",
                                     servers[workers], url, fixtures["tenant_id"]))
        if args.sqlite and not args.no_ingest:
            path = log_dir / "bench-otlp.sqlite3"
            sqlite_url = f"sqlite:///{path}"
            done = subprocess.run([sys.executable, __file__, "--prepare"], env={**os.environ, "DATABASE_URL": sqlite_url},
                                  capture_output=True, text=True, timeout=600)
            if done.returncode:
                raise RuntimeError(f"SQLite set-up failed: {done.stderr[-2000:]}")
            sqlite_tenant = json.loads(done.stdout.strip().splitlines()[-1])["tenant_id"]
            targets.append(sqlite_target("Countersign SQLite, 1 worker", Uvicorn(sqlite_url, 1, log_dir), path,
                                         sqlite_tenant))
        if args.phoenix_python and not args.no_ingest:
            try:
                started = time.perf_counter()
                phoenix = Phoenix(args.phoenix_python, log_dir)
                print(f"Phoenix {phoenix.version} healthy after {time.perf_counter() - started:.1f} s "
                      f"(working dir {phoenix.working_dir})")
                targets.append(Target(name=f"Phoenix {phoenix.version}", url=phoenix.base + "/v1/traces",
                                      headers={}, count=phoenix.count, stop=phoenix.stop, poll_interval=0.25,
                                      written=phoenix.written))
            except Exception as exc:  # noqa: BLE001 - reported, Countersign is still measured
                phoenix_error = f"{type(exc).__name__}: {exc}"
                print(f"Phoenix could not run: {phoenix_error}", file=sys.stderr)
        elif not args.no_ingest:
            phoenix_error = "no --phoenix-python given"

        results: dict[str, list[Result]] = {t.name: [] for t in targets}
        if not args.no_ingest:
            warm = build_batches(seed=0, batches=2, batch_spans=args.batch_spans, task_id=fixtures["task_id"])
            for target in targets:
                send(target, warm, args.batch_spans, clients=1, drain_timeout=args.drain_timeout)
            for run in range(1, args.runs + 1):
                batches = build_batches(seed=run, batches=args.batches, batch_spans=args.batch_spans,
                                        task_id=fixtures["task_id"])
                size = sum(len(b) for b in batches) / len(batches)
                print(f"\nrun {run}: {args.batches} batches × {args.batch_spans} spans, {size / 1024:.1f} KiB "
                      f"gzip'd each, {args.clients} clients")
                order = targets if run % 2 else list(reversed(targets))
                for target in order:
                    result = send(target, batches, args.batch_spans, clients=args.clients,
                                  drain_timeout=args.drain_timeout)
                    results[target.name].append(result)
                    print(f"  {target.name:34} accepted {result.accepted_per_s:8,.0f}/s in {result.accepted_s:6.2f} s"
                          f"  queryable {result.queryable_per_s:8,.0f}/s in {result.queryable_s:6.2f} s"
                          f" ({result.queryable_spans}/{result.spans})  p50 {result.p50_ms:7.1f} ms"
                          f"  p95 {result.p95_ms:7.1f} ms"
                          + (f"  (rows in its SQLite file after {result.written_s:.2f} s)" if result.written_s else ""))
            if phoenix is not None:
                try:
                    print(f"Phoenix cross-check: REST /v1/projects/{PHOENIX_PROJECT}/spans returns "
                          f"{phoenix.rest_count()} spans, GraphQL recordCount {phoenix.count()}")
                except Exception as exc:  # noqa: BLE001
                    print(f"Phoenix REST cross-check failed: {exc!r}")

        render_base = servers[max(servers)].base if servers else None
        render = measure_render(spans=args.render_spans, repeats=args.render_repeats, base=render_base,
                                browser=args.browser)
    finally:
        for target in targets:
            target.stop()

    # --- tables ---
    if results and any(results.values()):
        med = statistics.median
        rows = []
        for name, rs in results.items():
            rows.append([name, f"{med(r.accepted_per_s for r in rs):,.0f}", f"{med(r.queryable_per_s for r in rs):,.0f}",
                         f"{med(r.p50_ms for r in rs):,.1f}", f"{med(r.p95_ms for r in rs):,.1f}",
                         f"{med(r.queryable_s - r.accepted_s for r in rs):,.2f}",
                         str(sum(r.failures for r in rs))])
        print_table(f"OTLP ingest: medians of {args.runs} runs, {args.batches} × {args.batch_spans} spans, "
                    f"{args.clients} clients", rows,
                    ["target", "accepted spans/s", "queryable spans/s", "p50 ms", "p95 ms",
                     "s from last 200 to queryable", "failed requests"])
        phoenix_name = next((n for n in results if n.startswith("Phoenix")), None)
        if phoenix_name:
            ratio_rows = []
            for name, rs in results.items():
                if name == phoenix_name:
                    continue
                pairs = list(zip(rs, results[phoenix_name], strict=True))
                q = statistics.median(a.queryable_per_s / b.queryable_per_s for a, b in pairs)
                acc = statistics.median(a.accepted_per_s / b.accepted_per_s for a, b in pairs)
                p95 = statistics.median(a.p95_ms / b.p95_ms for a, b in pairs)
                ratio_rows.append([name, f"{q:.2f}", "met" if q >= TARGET_VS_PHOENIX else "MISSED", f"{acc:.2f}",
                                   f"{p95:.2f}"])
            print_table("Ratios against Phoenix (median of the per-run ratios)", ratio_rows,
                        ["", "queryable spans/s ÷ Phoenix", f"≥ {TARGET_VS_PHOENIX:g}", "accepted ÷ Phoenix",
                         "p95 ÷ Phoenix (lower is better)"])
    if phoenix_error:
        print(f"\nPhoenix not measured: {phoenix_error}")

    print(f"\nRun page with {render['spans']} spans ({render.get('html_bytes', 0) / 1024:,.0f} KiB HTML, "
          f"{render['page_queries']} queries; live poll {render.get('poll_idle_bytes', 0)} B when nothing arrived, "
          f"{render.get('poll_new_bytes', 0) / 1024:,.1f} KiB with 10 new spans), {args.render_repeats} requests each")
    rrows = [[what, ms(render[key], 50), ms(render[key], 95)] for what, key in [
        ("GET /runs/<id>/ (test client, full page)", "page"),
        ("GET /runs/<id>/trace/, nothing new (the 3 s poll, 204)", "poll_idle"),
        ("GET /runs/<id>/trace/, 10 new spans (JSON)", "poll_new"),
        ("run_detail_context() alone (queries + cost + rows)", "context"),
        ("the span query alone", "span_query")]]
    browser = render.get("browser")
    if browser and "error" not in browser:
        rrows += [["Chromium: goto → waterfall drawn (wall)", ms(browser["wall"], 50), ms(browser["wall"], 95)],
                  ["Chromium: DOMContentLoaded", ms(browser["dom_content_loaded"], 50),
                   ms(browser["dom_content_loaded"], 95)],
                  ["Chromium: loadEventEnd", ms(browser["load_event"], 50), ms(browser["load_event"], 95)]]
    print_table("Render time", rrows, ["", "p50 ms", "p95 ms"])
    if browser and "error" in browser:
        print(f"browser not measured: {browser['error']}")

    if args.json:
        args.json.write_text(json.dumps({
            "machine": info, "args": {k: str(v) for k, v in vars(args).items()},
            "results": {n: [r.summary() for r in rs] for n, rs in results.items()},
            "phoenix_error": phoenix_error, "render": render,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
