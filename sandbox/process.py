"""Start and stop a sandbox provider as a subprocess (pytest fixtures, ``make run``, chaos).

Ports default to 0: the provider's supervisor binds them and reports what it got on its first
stdout line, so there is no window in which another process can steal a "free" port.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from sandbox.client import wait_healthy

Kind = Literal["payments", "mail"]

# The directory that contains the ``ledger`` package: the child runs ``python -m`` from there.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class SandboxProcess:
    kind: Kind
    host: str
    http_port: int
    smtp_port: int | None
    db_path: Path
    popen: subprocess.Popen[bytes]
    pid: int = field(init=False)
    _tmpdir: tempfile.TemporaryDirectory[str] | None = None

    def __post_init__(self) -> None:
        self.pid = self.popen.pid

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @classmethod
    def start(
        cls,
        kind: Kind,
        *,
        host: str = "127.0.0.1",
        http_port: int = 0,
        smtp_port: int = 0,
        db_path: str | os.PathLike[str] | None = None,
        hang_seconds: float = 30.0,
        die_with_parent: bool = False,
        stderr: IO[Any] | int | None = None,
        ready_timeout: float = 15.0,
        extra_args: list[str] | None = None,
    ) -> SandboxProcess:
        """Start a provider and return once it answers ``/_health``.

        ``die_with_parent`` makes the provider exit when the *thread* that called this exits
        (Linux PR_SET_PDEATHSIG semantics): right for a test session's main thread, wrong if
        you start it from a short-lived worker thread.
        """
        tmpdir = None
        if db_path is None:
            tmpdir = tempfile.TemporaryDirectory(prefix=f"sandbox-{kind}-")
            db_path = Path(tmpdir.name) / f"{kind}.sqlite3"
        db = Path(db_path)
        cmd = [
            sys.executable,
            "-m",
            f"sandbox.{kind}",
            "--host",
            host,
            "--db",
            str(db),
            "--hang-seconds",
            str(hang_seconds),
        ]
        if kind == "payments":
            cmd += ["--port", str(http_port)]
        else:
            cmd += ["--http-port", str(http_port), "--smtp-port", str(smtp_port)]
        if die_with_parent:
            cmd += ["--parent-pid", str(os.getpid())]
        cmd += extra_args or []
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")])
        )
        env["PYTHONUNBUFFERED"] = "1"
        popen = subprocess.Popen(
            cmd,
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
        try:
            ready = _read_ready_line(popen, timeout=ready_timeout)
            proc = cls(
                kind=kind,
                host=host,
                http_port=int(ready["http_port"]),
                smtp_port=ready.get("smtp_port"),
                db_path=db,
                popen=popen,
                _tmpdir=tmpdir,
            )
            wait_healthy(proc.base_url, timeout=ready_timeout)
        except BaseException:
            _terminate(popen, timeout=5.0)
            if tmpdir is not None:
                tmpdir.cleanup()
            raise
        return proc

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM the supervisor (it kills its server), SIGKILL if it does not go in time."""
        code = _terminate(self.popen, timeout=timeout)
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
        return code

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_ready_line(popen: subprocess.Popen[bytes], *, timeout: float) -> dict[str, Any]:
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(popen.stdout, selectors.EVENT_READ)
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"sandbox did not report its ports within {timeout}s")
            if selector.select(remaining):
                chunk = os.read(popen.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(f"sandbox exited before it was ready (code {popen.wait()})")
                buffer += chunk
    return dict(json.loads(buffer.split(b"\n", 1)[0]))


def _terminate(popen: subprocess.Popen[bytes], *, timeout: float) -> int | None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            popen.kill()  # its server child has PR_SET_PDEATHSIG and dies with it
            popen.wait()
    if popen.stdout is not None:
        popen.stdout.close()
    return popen.returncode
