"""Instructions per lifecycle, counted by valgrind's callgrind: the client's CPU in a figure
that no load on the machine moves.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cs_bench_instructions \\
        .venv/bin/python bench/instructions.py [--lifecycles 100] [--baseline COMMIT]

On a shared machine the CPU time of the same code drifts by a third within minutes (other
tenants' load, frequency), which swamps a change of 10 %. Callgrind counts the instructions the
process executes instead: the same code, inputs and environment give the same count, whatever
else runs. String hashing is seeded alike in every run (PYTHONHASHSEED=0 unless it is set), so
that the layout of dicts and sets does not differ from one run to the next.

One lifecycle is `bench/ledger.py`'s (`call_propose` with `dispatch_here`, which claims in the
proposal's transaction, then `dispatcher.settle`: the in-process no-op provider, the receipt), in
one thread, as a client runs it. Each
tree is run twice under callgrind, after the same start-up and warm-up: once with no lifecycle
and once with `--lifecycles`; the difference divided by `--lifecycles` is printed. With
`--baseline`, that commit is checked out in a temporary git worktree and measured the same way,
on a database of its own (its migrations may differ), and the ratio is printed. The two runs of
a tree go side by side (one per core); valgrind slows Python about fifty times, so a run of 100
lifecycles takes a few minutes. Needs valgrind (Debian's package) and PostgreSQL. Nothing is
asserted.

With `--target request` a lifecycle is what the web server does for a waiting agent's call
instead: `POST /api/v1/tasks/{id}/calls?wait=10` sent straight into `console.asgi.application`
(the server's whole Django side: kept request threads, handler, middleware, the agent API, the
proposal, its dispatch in the request, the answer; not uvicorn's HTTP parsing), on an event loop
in the process, as uvicorn would call it; the in-memory channel layer takes the rings.

With `--business-key` the tool names a business object (the `step` argument, a new one per
call), as a refund names its order: each dispatch then also takes the object's lock and checks
that no other operation on it is in flight. Without it the tool has none.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 20


def child(root: str, lifecycles: int, prepare: bool, target: str, business_key: bool) -> None:
    """In the measured process: this tree's modules first, then the lifecycles."""
    sys.path.insert(0, root)
    os.chdir(root)
    from bench import ledger

    url = os.environ["DATABASE_URL"]
    if prepare:
        ledger.ensure_database(url)
        ledger.setup_django(url)
        ledger.ensure_fixtures()
        from approvals.models import Tool

        # Set both ways: the database outlives a run, and the fixtures leave this field alone.
        Tool.objects.filter(name=ledger.TOOL).update(business_key="step" if business_key else "")
        return
    if target == "request":
        requests(ledger, url, lifecycles)
        return
    ledger.setup_django(url)

    def body() -> None:
        op, close = ledger.lifecycle_client(0)
        for _ in range(WARM_UP + lifecycles):
            op()
        close()

    # On a thread of its own, as bench/ledger.py measures: the lifecycle's services are sync code.
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()


def requests(ledger, url: str, lifecycles: int) -> None:
    """`lifecycles` waiting agents' calls through the web server's application, after the warm-up."""
    import asyncio
    import json

    os.environ.update({"DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "console.settings", "DEBUG": "false",
                       "LOG_LEVEL": "WARNING", "CELERY_BROKER_URL": "memory://", "CHANNEL_LAYER_URL": "memory://"})
    os.environ.pop("DATABASE_POOL", None)  # the server's own default (console.asgi)
    import console.asgi

    agent = ledger.load_agent()
    run = ledger.start_task(agent, owner="bench-instructions")
    headers = [(b"host", b"localhost"), (b"content-type", b"application/json"),
               (b"authorization", f"Bearer {ledger.AGENT_TOKEN}".encode())]
    path = f"/api/v1/tasks/{run.task_id}/calls"

    async def post(n: int) -> None:
        body = json.dumps({"call_id": f"r{n}", "step_id": f"r{n}", "tool": ledger.TOOL, "arguments": {"n": n, "step": f"r{n}"},
                           "expected_version": run.version, "fencing_token": run.fencing_token}).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"wait=10",
                 "root_path": "", "headers": [*headers, (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("localhost", 80)}
        sent: list[dict] = []
        delivered = asyncio.Event()
        answered = asyncio.Event()

        async def receive() -> dict:
            if not delivered.is_set():
                delivered.set()
                return {"type": "http.request", "body": body, "more_body": False}
            await answered.wait()  # connected until the answer is sent, as a waiting agent is
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                answered.set()

        await console.asgi.application(scope, receive, send)
        answer = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
        if sent[0]["status"] != 201 or answer.get("status") != "confirmed":
            raise RuntimeError(f"call r{n} answered {sent[0]['status']}: {answer}")

    async def calls() -> None:
        for n in range(WARM_UP + lifecycles):
            await post(n)

    asyncio.run(calls())


def counted(root: Path, url: str, lifecycles: int, target: str) -> int:
    """Instructions of one process that starts, warms up and runs `lifecycles` lifecycles."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, str(Path(__file__)),
         "--child", str(root), "--lifecycles", str(lifecycles), "--target", target],
        env={"PYTHONHASHSEED": "0", **os.environ, "DATABASE_URL": url}, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {root} failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(found.group(1))


def per_lifecycle(root: Path, url: str, lifecycles: int, target: str, business_key: bool) -> float:
    subprocess.run([sys.executable, str(Path(__file__)), "--child", str(root), "--prepare",
                    *(["--business-key"] if business_key else [])],
                   env={**os.environ, "DATABASE_URL": url}, check=True)
    counts: dict[int, int] = {}

    def run(n: int) -> None:
        counts[n] = counted(root, url, n, target)

    threads = [threading.Thread(target=run, args=(n,)) for n in (0, lifecycles)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(counts) != 2:
        raise RuntimeError(f"a callgrind run of {root} failed")
    return (counts[lifecycles] - counts[0]) / lifecycles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lifecycles", type=int, default=100)
    parser.add_argument("--baseline", help="a commit to measure beside this tree")
    parser.add_argument("--target", choices=("lifecycle", "request"), default="lifecycle",
                        help="the services' lifecycle, or the web server's request for a waiting agent's call")
    parser.add_argument("--business-key", action="store_true",
                        help="the tool names a business object per call, as a refund names its order")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.lifecycles, args.prepare, args.target, args.business_key)
        return 0

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        parser.error("DATABASE_URL must name a PostgreSQL database")
    if shutil.which("valgrind") is None:
        parser.error("needs valgrind (apt-get install -y valgrind)")
    sys.path.insert(0, str(ROOT))
    from bench.ledger import database_name, with_database

    unit = "lifecycle" if args.target == "lifecycle" else "request"
    this = per_lifecycle(ROOT, url, args.lifecycles, args.target, args.business_key)
    print(f"this tree: {this / 1e6:.3f} M instructions per {unit} ({args.lifecycles} {unit}s)")
    if args.baseline:
        with tempfile.TemporaryDirectory(prefix="cs-baseline-") as folder:
            tree = Path(folder) / "tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), args.baseline],
                           check=True, capture_output=True)
            try:
                before = per_lifecycle(tree, with_database(url, database_name(url) + "_baseline"), args.lifecycles,
                                       args.target, args.business_key)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        print(f"baseline {args.baseline}: {before / 1e6:.3f} M instructions per {unit}")
        print(f"this tree ÷ baseline: {this / before:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
