"""Child processes that die with their parent: the embedded run command and the end-to-end
tests start the server, Celery worker and beat, and the sandboxes with this."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # A new session, so a terminal's Ctrl-C reaches only the parent, which stops the children
    # in order; and SIGKILL on parent death, so nothing is left running even if it is killed.
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the parent's own shutdown still stops the children


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen | None = None
    log_path: Path | None = None
    started_at: float = 0.0  # time.monotonic() of the last start
    started_wall: float = 0.0  # time.time() of the last start: to compare with what the child records

    @property
    def uptime(self) -> float:
        return time.monotonic() - self.started_at

    def start(self, *, log_dir: Path | None = None) -> Child:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.started_at, self.started_wall = time.monotonic(), time.time()
        stdout = None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            self.log_path = log_dir / f"{self.name}.log"
            stdout = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its life
        self.popen = subprocess.Popen(
            self.argv, cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=stdout, stderr=subprocess.STDOUT if stdout else None, preexec_fn=_die_with_parent,
        )
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None:
            return
        if self.alive:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait()
        # Reap grandchildren (e.g. prefork pool processes) left in its session.
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def interrupt(popen: subprocess.Popen, *, timeout: float = 60.0) -> None:
    """Ctrl-C for a command started in a session of its own (make run, make cluster): SIGINT,
    then SIGKILL to its whole group if it has not stopped within `timeout`."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGINT)
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)


def free_port_block(offsets: tuple[int, ...], *, start: int = 21000, step: int = 131) -> int:
    """A base port P with every P + offset free on 127.0.0.1: the product and its sandboxes take
    a block (P..P+3 under make run; make cluster's servers also P+10 and P+11)."""
    for base in range(start, 60000, step):
        if first_taken_port([base + offset for offset in offsets]) is None:
            return base
    raise RuntimeError("no free block of ports")


def first_taken_port(ports: list[int]) -> int | None:
    """The first of these ports on 127.0.0.1 that something already listens on, if any."""
    for number in ports:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", number))
            except OSError:
                return number
    return None


def supervise(children: list[Child], *, log_dir: Path | None, stalled: Callable[[Child], bool] = lambda child: False,
              on_restart: Callable[[Child, str], None] = lambda child, why: None) -> None:
    """One round of supervision: start again a child that exited, and stop and start again one
    that is alive but `stalled` (e.g. a worker whose pool no longer runs tasks)."""
    for child in children:
        if not child.alive:
            on_restart(child, f"exited ({child.popen.returncode if child.popen else None})")
            child.start(log_dir=log_dir)
        elif stalled(child):
            on_restart(child, "is alive but made no progress")
            child.stop(timeout=5)
            child.start(log_dir=log_dir)


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def http_ok(url: str) -> Callable[[], bool]:
    import httpx

    def check() -> bool:
        try:
            return httpx.get(url, timeout=1.0).status_code < 500
        except httpx.HTTPError:
            return False

    return check


def supervise_until(stopping: Callable[[], bool], children: list[Child], *, log_dir: Path,
                    stalled: Callable[[Child], bool], say: Callable[[str], None]) -> None:
    """The run commands' loop: twice a second, `supervise` the children until `stopping()`."""
    while not stopping():
        supervise(children, log_dir=log_dir, stalled=stalled,
                  on_restart=lambda child, why: say(f"{child.name} {why}; restarting it. See {child.log_path}."))
        time.sleep(0.5)


def stop_all(children: list[Child], others: list, say: Callable[[str], None]) -> None:
    """Children in reverse order of start (the server before the workers it feeds), then the rest."""
    say("Stopping…")
    for child in reversed(children):
        child.stop()
    for other in others:
        other.stop()
    say("Stopped.")
