"""Instructions per lifecycle, counted by valgrind's callgrind: the client's CPU in a figure
that no load on the machine moves.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/cs_bench_instructions \\
        .venv/bin/python bench/instructions.py [--lifecycles 100] [--baseline COMMIT]

On a shared machine the CPU time of the same code drifts by a third within minutes (other
tenants' load, frequency), which swamps a change of 10 %. Callgrind counts the instructions the
process executes instead: the same code, inputs and environment give the same count, whatever
else runs.

One lifecycle is `bench/ledger.py`'s (`call_propose` with `dispatch_here`, then `run_dispatch`:
the claim, the in-process no-op provider, the receipt), in one thread, as a client runs it. Each
tree is run twice under callgrind, after the same start-up and warm-up: once with no lifecycle
and once with `--lifecycles`; the difference divided by `--lifecycles` is printed. With
`--baseline`, that commit is checked out in a temporary git worktree and measured the same way,
on a database of its own (its migrations may differ), and the ratio is printed. The two runs of
a tree go side by side (one per core); valgrind slows Python about fifty times, so a run of 100
lifecycles takes a few minutes. Needs valgrind (Debian's package) and PostgreSQL. Nothing is
asserted.
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


def child(root: str, lifecycles: int, prepare: bool) -> None:
    """In the measured process: this tree's modules first, then the lifecycles."""
    sys.path.insert(0, root)
    os.chdir(root)
    from bench import ledger

    url = os.environ["DATABASE_URL"]
    if prepare:
        ledger.ensure_database(url)
    ledger.setup_django(url)
    if prepare:
        ledger.ensure_fixtures()
        return

    def body() -> None:
        op, close = ledger.lifecycle_client(0)
        for _ in range(WARM_UP + lifecycles):
            op()
        close()

    # On a thread of its own, as bench/ledger.py measures: the lifecycle's services are sync code.
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()


def counted(root: Path, url: str, lifecycles: int) -> int:
    """Instructions of one process that starts, warms up and runs `lifecycles` lifecycles."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, str(Path(__file__)),
         "--child", str(root), "--lifecycles", str(lifecycles)],
        env={**os.environ, "DATABASE_URL": url}, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {root} failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(found.group(1))


def per_lifecycle(root: Path, url: str, lifecycles: int) -> float:
    subprocess.run([sys.executable, str(Path(__file__)), "--child", str(root), "--prepare"],
                   env={**os.environ, "DATABASE_URL": url}, check=True)
    counts: dict[int, int] = {}

    def run(n: int) -> None:
        counts[n] = counted(root, url, n)

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
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.lifecycles, args.prepare)
        return 0

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        parser.error("DATABASE_URL must name a PostgreSQL database")
    if shutil.which("valgrind") is None:
        parser.error("needs valgrind (apt-get install -y valgrind)")
    sys.path.insert(0, str(ROOT))
    from bench.ledger import database_name, with_database

    this = per_lifecycle(ROOT, url, args.lifecycles)
    print(f"this tree: {this / 1e6:.3f} M instructions per lifecycle ({args.lifecycles} lifecycles)")
    if args.baseline:
        with tempfile.TemporaryDirectory(prefix="cs-baseline-") as folder:
            tree = Path(folder) / "tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), args.baseline],
                           check=True, capture_output=True)
            try:
                before = per_lifecycle(tree, with_database(url, database_name(url) + "_baseline"), args.lifecycles)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        print(f"baseline {args.baseline}: {before / 1e6:.3f} M instructions per lifecycle")
        print(f"this tree ÷ baseline: {this / before:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
