"""The fixed cost of a request under `make run`, beside a bare Django view on the same server.

    .venv/bin/python bench/request_path.py [--fleet on,off] [--rounds 400] [--warmup 40]

Each mode starts the product as `make run` does (`manage.py run_embedded`: uvicorn serving
console.asgi, a Celery worker, beat, both sandboxes and, with `--fleet on`, the demo agent
fleet; SQLite and the file-system broker) in a temporary folder on free ports. The one change:
DJANGO_SETTINGS_MODULE is `bench.request_path_settings`, the product's settings with a URLconf
that adds two views doing nothing (`/bench/bare`, sync, and `/bench/bare-async`), so the bare
view runs in the same server process, behind the same middleware, as every product endpoint;
the product itself has no such endpoint.

Measured by one client over one keep-alive connection, one request at a time, every target once
per round in a shuffled order (so load and noise fall on all of them alike):

| target              | what                                                                   |
|---------------------|------------------------------------------------------------------------|
| floor               | a raw ASGI app (no Django) under its own uvicorn: HTTP and the server  |
| bare, async         | `/bench/bare-async`: Django's handler and middleware, nothing else     |
| bare, sync          | `/bench/bare`: the same, plus the sync view's thread                   |
| /healthz            | the product's health check (one database round trip)                   |
| API: task GET       | `GET /api/v1/tasks/{id}`: a DRF view (token, rate limit, serializer)    |
| API: call GET       | `GET /api/v1/calls/{id}` of a final call, no wait (the async long-poll) |

Then, in this process (no HTTP, no ASGI), Django's test client on `/healthz` and `/bench/bare`
against the same database: what bench/inbox.py's "server time" measures. Printed: p50/p95/p99
of each, each p50 divided by the bare sync view's, the server process's CPU while idle (what the
fleet and the server's own loops cost it) and per request; then the server's CPU per request of
each target, from a block of requests to that target alone (CPU time leaves out the time a
request waited for a core, so it holds better than latency on a loaded machine). Nothing is
asserted: the machine is shared; read the ratios, and write the load (`uptime`) beside every
figure.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.latency import TERMINAL, free_port_block, pct, start_task  # noqa: E402
from bench.procstat import cpu_seconds  # noqa: E402

TOKEN = "bench-request-path-token"


async def floor_app(scope, receive, send) -> None:
    """The floor: an ASGI app that answers every request at once (served by its own uvicorn)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def load() -> str:
    return "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def wait_for(url: str, proc: subprocess.Popen, what: str, log: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited; see {log}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not answer in 90 s; see {log}")


def find_server_pid(port: int) -> int:
    """The uvicorn child that run_embedded started on this port."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"uvicorn" in b" ".join(argv) and str(port).encode() in argv:
            return int(entry.name)
    raise RuntimeError(f"no uvicorn on port {port}")


@dataclass
class Stack:
    fleet: bool
    var: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="countersign-request-path-")))
    port: int = 0
    proc: subprocess.Popen | None = None
    floor: subprocess.Popen | None = None
    floor_port: int = 0
    server_pid: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "PORT": str(self.port), "COUNTERSIGN_VAR_DIR": str(self.var),
               "DEMO_AGENT_TOKEN": TOKEN, "COUNTERSIGN_ENV": "embedded",
               "DJANGO_SETTINGS_MODULE": "bench.request_path_settings",
               # The limiter still counts every request (as under make run), but never refuses
               # the benchmark's.
               "API_RATE_PER_TOKEN": "100000000", "API_RATE_PER_TENANT": "100000000"}
        for name in ("DATABASE_URL", "CELERY_BROKER_URL", "CHANNEL_LAYER_URL", "DEBUG", "OTEL_ENABLED",
                     "DATABASE_POOL"):
            env.pop(name, None)
        return env

    def start(self) -> Stack:
        self.port = free_port_block()
        log = self.var / "run_embedded.log"
        argv = [sys.executable, "manage.py", "run_embedded"] + ([] if self.fleet else ["--no-fleet"])
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log.open("w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(f"{self.url}/healthz", self.proc, "run_embedded", log)
        self.server_pid = find_server_pid(self.port)
        self.floor_port = free_port_block(1)
        floor_log = self.var / "floor.log"
        self.floor = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "bench.request_path:floor_app", "--host", "127.0.0.1",
             "--port", str(self.floor_port), "--log-level", "warning"],
            cwd=ROOT, stdout=floor_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(f"http://127.0.0.1:{self.floor_port}/", self.floor, "the floor server", floor_log)
        return self

    def stop(self) -> None:
        for proc, sig in ((self.floor, signal.SIGTERM), (self.proc, signal.SIGINT)):
            if proc and proc.poll() is None:
                os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(self.var, ignore_errors=True)


def final_call(client: httpx.Client) -> tuple[str, str]:
    """A task and one of its calls that is final (an L1 lookup, run at once)."""
    task_id, version, token = start_task(client, "bench-request-path")
    answer = client.post(f"/api/v1/tasks/{task_id}/calls", json={
        "call_id": "call-request-path", "step_id": "lookup-request-path", "tool": "orders.lookup",
        "arguments": {"order_id": "ord-request-path"}, "expected_version": version, "fencing_token": token,
    }).raise_for_status().json()
    status = answer.get("status", "")
    while status not in TERMINAL:
        status = client.get(f"/api/v1/calls/{answer['call_id']}", params={
            "wait": 10, "seen": status, "task_id": task_id}).raise_for_status().json().get("status", "")
    return task_id, answer["call_id"]


def measure(stack: Stack, rounds: int, warmup: int) -> tuple[dict[str, list[float]], float]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=stack.url, headers=headers, timeout=30) as client, \
            httpx.Client(base_url=f"http://127.0.0.1:{stack.floor_port}", timeout=30) as floor:
        task_id, call_id = final_call(client)
        targets = {
            "floor (raw ASGI, uvicorn)": (floor, "/"),
            "bare, async": (client, "/bench/bare-async"),
            "bare, sync": (client, "/bench/bare"),
            "/healthz": (client, "/healthz"),
            "API: task GET": (client, f"/api/v1/tasks/{task_id}"),
            "API: call GET (final)": (client, f"/api/v1/calls/{call_id}?task_id={task_id}"),
        }
        samples: dict[str, list[float]] = {name: [] for name in targets}
        order = list(targets)
        cpu_before = 0.0
        for index in range(warmup + rounds):
            if index == warmup:
                cpu_before = cpu_seconds(stack.server_pid)
            random.shuffle(order)
            for name in order:
                http, target = targets[name]
                began = time.perf_counter()
                http.get(target).raise_for_status()
                if index >= warmup:
                    samples[name].append((time.perf_counter() - began) * 1000)
        served = rounds * (len(targets) - 1)
        cpu_per_request = (cpu_seconds(stack.server_pid) - cpu_before) / served * 1000
    return samples, cpu_per_request


def cpu_by_target(stack: Stack, requests: int, idle_share: float) -> dict[str, float]:
    """The server process's CPU per request of each target, from blocks of `requests` requests
    each, less the idle share of a core over the block (the fleet's): CPU time does not count
    the time a request waited for a core, so it says more than latency on a loaded machine."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    out: dict[str, float] = {}
    with httpx.Client(base_url=stack.url, headers=headers, timeout=30) as client:
        task_id, call_id = final_call(client)
        for name, target in (("bare, async", "/bench/bare-async"), ("bare, sync", "/bench/bare"),
                             ("/healthz", "/healthz"), ("API: task GET", f"/api/v1/tasks/{task_id}"),
                             ("API: call GET (final)", f"/api/v1/calls/{call_id}?task_id={task_id}")):
            client.get(target).raise_for_status()
            cpu, began = cpu_seconds(stack.server_pid), time.monotonic()
            for _ in range(requests):
                client.get(target).raise_for_status()
            spent = cpu_seconds(stack.server_pid) - cpu - idle_share / 100 * (time.monotonic() - began)
            out[name] = spent / requests * 1000
    return out


def idle_cpu(stack: Stack, seconds: float) -> float:
    """The server process's CPU share (of one core) while nobody but the fleet calls it."""
    before, began = cpu_seconds(stack.server_pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(stack.server_pid) - before) / (time.monotonic() - began) * 100


def in_process(stack: Stack, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Django's test client in this process on the same database: no HTTP, no ASGI (as
    bench/inbox.py's server time). Django is set up here once, for the first stack's folder."""
    for name, value in stack.env.items():
        if name in ("COUNTERSIGN_VAR_DIR", "DJANGO_SETTINGS_MODULE", "COUNTERSIGN_ENV", "PORT"):
            os.environ[name] = value
    import django

    django.setup()
    from django.test import Client

    client = Client()
    targets = {"test client: bare, sync": "/bench/bare", "test client: /healthz": "/healthz"}
    samples: dict[str, list[float]] = {name: [] for name in targets}
    for index in range(warmup + rounds):
        for name, target in targets.items():
            began = time.perf_counter()
            assert client.get(target).status_code == 200
            if index >= warmup:
                samples[name].append((time.perf_counter() - began) * 1000)
    return samples


def report(title: str, samples: dict[str, list[float]]) -> None:
    bare = pct(samples["bare, sync"], 50)
    print(f"\n{title}")
    print(f"  {'target':<28} {'p50':>8} {'p95':>8} {'p99':>8}   p50 ÷ bare sync")
    for name, values in samples.items():
        p50 = pct(values, 50)
        print(f"  {name:<28} {p50:8.2f} {pct(values, 95):8.2f} {pct(values, 99):8.2f} ms   {p50 / bare:5.2f}"
              f"  (n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet", default="on,off", help="modes: on (make run), off (--no-fleet)")
    parser.add_argument("--rounds", type=int, default=400, help="measured rounds (each target once per round)")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--no-in-process", action="store_true", help="skip the test-client figures")
    parser.add_argument("--cpu-requests", type=int, default=300,
                        help="requests per target for the server's CPU per request (0: skip)")
    args = parser.parse_args()
    print(f"bench/request_path.py — {time.strftime('%Y-%m-%d %H:%M:%S')}, {load()}")
    in_process_done = args.no_in_process
    for mode in args.fleet.split(","):
        stack = Stack(fleet=mode == "on")
        try:
            stack.start()
            time.sleep(2)  # the fleet's first tasks
            idle = idle_cpu(stack, args.idle_seconds)
            began = load()
            samples, cpu_per_request = measure(stack, args.rounds, args.warmup)
            title = (f"make run, fleet {mode}: {args.rounds} rounds, one keep-alive client "
                     f"({began} → {load()})")
            if not in_process_done:
                samples.update(in_process(stack, args.rounds, args.warmup))
                in_process_done = True
            report(title, samples)
            print(f"  server process CPU: {idle:.1f} % of a core while idle (the fleet's calls and the "
                  f"server's loops), {cpu_per_request:.2f} ms per request measured")
            if args.cpu_requests:
                per_target = cpu_by_target(stack, args.cpu_requests, idle)
                print(f"  server CPU per request, {args.cpu_requests} in a row each, less the idle share: "
                      + ", ".join(f"{name} {ms:.2f} ms" for name, ms in per_target.items()))
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
