"""A tiny supervisor: own the listening sockets, run the server in a child, restart it when it dies.

The server must be able to die for real (``fault-crash`` calls ``os._exit`` mid-request), so it
runs in a forked child. The supervisor binds the sockets itself and the child inherits them:
during a restart, new connections wait in the kernel's backlog instead of being refused, and
``--port 0`` works because the supervisor prints the ports it got before any child runs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

PR_SET_PDEATHSIG = 1

# Restart at once after a crash, but back off if the child keeps dying at start-up (say, a
# broken database file) instead of spinning.
_QUICK_DEATH_SECONDS = 1.0
_MAX_BACKOFF_SECONDS = 2.0


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--db", required=True, help="SQLite file for effects (created if missing)")
    parser.add_argument(
        "--hang-seconds",
        type=float,
        default=30.0,
        help="how long a fault-timeout-* request is held (clients should time out earlier)",
    )
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="exit when this process (the one that started us) dies",
    )
    parser.add_argument("--verbose", action="store_true", help="log every HTTP request")


def bind(host: str, port: int) -> socket.socket:
    sock = socket.create_server((host, port), backlog=128)  # sets SO_REUSEADDR on POSIX
    sock.set_inheritable(True)
    return sock


def die_with_parent(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent thread exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _child_main(serve: Callable[[int], None], generation: int, supervisor_pid: int) -> None:
    die_with_parent(signal.SIGKILL)
    # The supervisor may have died between fork() and prctl(): then nobody would ever kill us.
    if os.getppid() != supervisor_pid:
        os._exit(1)
    # Forked children inherit the supervisor's Python-level handlers; shutdown is the
    # supervisor's job (it sends SIGTERM), so a terminal's Ctrl-C is left to it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(generation)


def supervise(
    *,
    service: str,
    ports: dict[str, int],
    serve: Callable[[int], None],
    parent_pid: int | None = None,
) -> int:
    """Run ``serve(generation)`` in a child until SIGTERM/SIGINT; returns the exit status."""
    stopping = threading.Event()
    child: multiprocessing.process.BaseProcess | None = None

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        if child is not None and child.pid is not None:
            try:
                os.kill(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if parent_pid is not None:
        die_with_parent(signal.SIGTERM)
        if os.getppid() != parent_pid:
            return 1

    # The one line on stdout: process.py reads it to learn the ports (they may have been 0).
    print(
        json.dumps({"event": "listening", "service": service, "pid": os.getpid(), **ports}),
        flush=True,
    )

    # fork: the child needs the inherited listening sockets and starts in milliseconds; the
    # supervisor has no threads, so forking it is safe.
    ctx = multiprocessing.get_context("fork")
    generation, backoff = 0, 0.0
    while not stopping.is_set():
        started = time.monotonic()
        child = ctx.Process(
            target=_child_main, args=(serve, generation, os.getpid()), name=f"{service}-sandbox"
        )
        child.start()
        if stopping.is_set():  # a signal between the check above and start()
            os.kill(child.pid, signal.SIGTERM)  # type: ignore[arg-type]
        child.join()
        if stopping.is_set():
            break
        lived = time.monotonic() - started
        sys.stderr.write(
            f"sandbox {service}: server pid {child.pid} exited with {child.exitcode} "
            f"after {lived:.2f}s; restarting\n"
        )
        backoff = (
            min(max(backoff * 2, 0.05), _MAX_BACKOFF_SECONDS)
            if lived < _QUICK_DEATH_SECONDS
            else 0.0
        )
        if backoff:
            stopping.wait(backoff)
        generation += 1

    if child is not None and child.is_alive():
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join()
    return 0
