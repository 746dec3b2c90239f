"""The processes a chaos trial runs against: N Celery workers (the product's pool unless told),
beat (the sweeper, every SWEEP_SECONDS) and both sandbox providers, on a given database and
broker, with the protocol's clocks shortened so a trial takes seconds, not minutes.

The harness process publishes to the same broker (the in-process Celery app is pointed at it
for the stack's life) and talks to the same database through Django's configured connection.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.db import connection as db_connection

from chaos import seams
from chaos.pgproxy import ProxyControl
from chaos.worker_env import POLL_ENV, PREFIX_ENV, SKEW_ENV
from console.celery import app as celery_app
from console.lib.procs import Child, http_ok, python, supervise, wait_until
from ledger.liveness import worker_stalled
from sandbox.process import SandboxProcess

# Short clocks: a lost dispatch is re-enqueued after 2 s, a silent worker is `unknown` 2 s after
# its 1 s tool timeout, reconciliation gives up (→ manual) after 10 s.
CLOCKS = {
    "DISPATCH_GRACE_SECONDS": "2",
    "REDISPATCH_AFTER_SECONDS": "2",
    "RECONCILE_WINDOW_SECONDS": "10",
    "SWEEP_SECONDS": "0.5",
    "WORKER_HEARTBEAT_SECONDS": "1",
}
TOOL_TIMEOUT_SECONDS = 1.0
# Longer than the tool timeout, so a hanging provider is a client-side timeout.
HANG_SECONDS = 3.0


def database_url_for(db: dict) -> str:
    """A DATABASE_URL naming the database Django is connected to (the test database in tests)."""
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


@dataclass
class ChaosStack:
    database_url: str
    broker_url: str | None = None  # None: a file-system broker in the stack's own folder
    workers: int = 2
    # The worker pool: None for the product's own (CELERY_WORKER_POOL, CELERY_WORKER_CONCURRENCY:
    # threads, where the seam scenarios' "blocked pool child" is the worker process itself), or
    # e.g. "prefork" with `concurrency` children (scenario 13).
    pool: str | None = None
    concurrency: int = 1  # with an explicit pool
    # Restart a worker that is alive but makes no progress while due work waits, as `make run`
    # does (ledger/liveness.py); off for the seam scenarios, which hold workers on purpose.
    restart_stalled: bool = False
    stall_seconds: float = 5.0
    worker_skews: tuple[float, ...] = ()  # seconds per worker (scenario 9); missing = 0
    beat: bool = True
    hang_seconds: float = HANG_SECONDS
    # Scenario 6: the workers (and the API server) reach PostgreSQL through chaos/pgproxy.py,
    # which the harness can tell to cut connections mid-commit. The harness itself connects directly.
    db_proxy: bool = False
    api_server: bool = False  # a uvicorn serving the agent API, for trials that go through HTTP
    mcp_server: bool = False  # the chaos MCP server (chaos/mcp_upstream.py), for MCP tool trials
    var_dir: Path = field(init=False)
    marker_dir: Path = field(init=False)
    payments: SandboxProcess | None = field(init=False, default=None)
    mail: SandboxProcess | None = field(init=False, default=None)
    worker_children: list[Child] = field(init=False, default_factory=list)
    beat_child: Child | None = field(init=False, default=None)
    proxy_child: Child | None = field(init=False, default=None)
    proxy: ProxyControl | None = field(init=False, default=None)
    server_child: Child | None = field(init=False, default=None)
    api_url: str | None = field(init=False, default=None)
    mcp_child: Child | None = field(init=False, default=None)
    mcp_url: str | None = field(init=False, default=None)
    _children_database_url: str | None = field(init=False, default=None)
    _saved_broker: tuple | None = field(init=False, default=None)
    restarts: list[str] = field(init=False, default_factory=list)
    _stopping: threading.Event = field(init=False, default_factory=threading.Event)
    _watchdog: threading.Thread | None = field(init=False, default=None)
    # Queues are named fast/slow for every stack: on a shared Redis each stack prefixes its keys.
    key_prefix: str = field(init=False, default_factory=lambda: f"chaos-{uuid.uuid4().hex[:8]}:")

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> ChaosStack:
        self.var_dir = Path(tempfile.mkdtemp(prefix="countersign-chaos-"))
        self.marker_dir = self.var_dir / "markers"
        for folder in ("broker/queue", "broker/processed", "sandbox", "logs", "markers"):
            (self.var_dir / folder).mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        logs = self.var_dir / "logs"
        with open(logs / "payments.log", "ab") as payments_log, open(logs / "mail.log", "ab") as mail_log:
            self.payments = SandboxProcess.start(
                "payments", db_path=self.var_dir / "sandbox" / "payments.sqlite3",
                hang_seconds=self.hang_seconds, die_with_parent=True, stderr=payments_log)
            self.mail = SandboxProcess.start(
                "mail", db_path=self.var_dir / "sandbox" / "mail.sqlite3",
                hang_seconds=self.hang_seconds, die_with_parent=True, stderr=mail_log)
        if self.db_proxy:
            self._start_proxy(logs)
        if self.mcp_server:
            port = _free_port()
            self.mcp_child = Child("mcp", python("-m", "chaos.mcp_upstream", "--effects", str(self.mcp_effects_path),
                                                 "--port", str(port), "--hang", str(self.hang_seconds)))
            self.mcp_child.start(log_dir=logs)
            self.mcp_url = f"http://127.0.0.1:{port}/mcp"
            wait_until(http_ok(self.mcp_url), timeout=30, what="the chaos MCP server")
        env = self.child_env()
        run = self.key_prefix.strip(":").split("-")[-1]
        for i in range(self.workers):
            skew = self.worker_skews[i] if i < len(self.worker_skews) else 0
            argv = python("-m", "chaos.worker", "worker", "-Q", "fast,slow",
                          "-l", "info", "-n", f"chaos{i}-{run}@%h",
                          "--without-gossip", "--without-mingle", "--without-heartbeat")
            # By the environment, not -P: Celery takes `-P prefork` for its default and lets the
            # configured pool (CELERY_WORKER_POOL) win over it.
            pool = {"CELERY_WORKER_POOL": self.pool, "CELERY_WORKER_CONCURRENCY": str(self.concurrency)} if self.pool else {}
            child = Child(f"worker{i}", argv, env={**env, SKEW_ENV: str(skew), **pool})
            self.worker_children.append(child.start(log_dir=logs))
        if self.beat:
            self.beat_child = Child("beat", python("-m", "chaos.worker", "beat", "-l", "info",
                                                   "-s", str(self.var_dir / "celerybeat-schedule")), env=env)
            self.beat_child.start(log_dir=logs)
        if self.api_server:
            port = _free_port()
            # With the seam hook: the server runs the dispatches of the agents that wait.
            self.server_child = Child("server", python("-m", "chaos.server", "console.asgi:application", "--host",
                                                       "127.0.0.1", "--port", str(port), "--lifespan", "off",
                                                       "--log-level", "warning"), env=env)
            self.server_child.start(log_dir=logs)
            self.api_url = f"http://127.0.0.1:{port}"
            wait_until(http_ok(f"{self.api_url}/healthz"), timeout=60, what="the API server")
        self._point_app_at_broker()
        for child in self.worker_children:
            wait_until(lambda child=child: _log_has(child, "ready."), timeout=60, what=f"{child.name} ready")
            # Without the hook the dispatcher's seams are no-ops: a scenario that arms one would
            # wait for a block that never comes, so say it here, once, instead.
            if not _log_has(child, seams.HOOK_INSTALLED):
                raise RuntimeError(f"{child.name} did not install the chaos seam hook; see {child.log_path}")
        self._watchdog = threading.Thread(target=self._watch, name="chaos-watchdog", daemon=True)
        self._watchdog.start()

    def _start_proxy(self, logs: Path) -> None:
        url = urlsplit(self.database_url)
        if url.scheme not in ("postgres", "postgresql"):
            raise ValueError("the database proxy (scenario 6) needs PostgreSQL")
        self.proxy_child = Child("pgproxy", python("-m", "chaos.pgproxy", "--upstream",
                                                   f"{url.hostname or '127.0.0.1'}:{url.port or 5432}"))
        self.proxy_child.start(log_dir=logs)
        wait_until(lambda: _log_has(self.proxy_child, "pgproxy ready"), timeout=30, what="the database proxy")
        ready = re.search(r"pgproxy ready port=(\d+) control=(\d+)", self.proxy_child.log_path.read_text())
        port, control = int(ready.group(1)), int(ready.group(2))
        self.proxy = ProxyControl(control)
        netloc = f"{url.username or 'postgres'}{':' + url.password if url.password else ''}@127.0.0.1:{port}"
        self._children_database_url = urlunsplit((url.scheme, netloc, url.path, url.query, ""))

    def _watch(self) -> None:
        """Restart a worker or beat whose main process died, as `run_embedded` does. Not the
        faults the scenarios inject (they kill pool children, which Celery replaces): crashes
        the stack did not cause, e.g. kombu's file-system transport reading a message file its
        publisher has not written yet (JSONDecodeError, "Unrecoverable error")."""
        checked = 0.0
        try:
            while not self._stopping.wait(0.5):
                check_stall = self.restart_stalled and time.monotonic() - checked >= 1.0
                if check_stall:
                    checked = time.monotonic()
                supervise([*self.worker_children, *([self.beat_child] if self.beat_child else []),
                           *([self.server_child] if self.server_child else [])],
                          log_dir=self.var_dir / "logs",
                          stalled=lambda child, check=check_stall: check and self._worker_stalled(child),
                          on_restart=lambda child, why: self.restarts.append(f"{child.name} {why}"))
        finally:
            db_connection.close()  # this thread's own; a test database cannot be dropped while open

    def _worker_stalled(self, child: Child) -> bool:
        # A worker (re)started less than a stall period ago has had no chance to progress.
        if child not in self.worker_children or self._stopping.is_set() or child.uptime < self.stall_seconds:
            return False
        try:
            return worker_stalled(self.node_name(child), stall_seconds=self.stall_seconds,
                                  started_after=datetime.fromtimestamp(child.started_wall, UTC))
        except Exception:  # noqa: BLE001 - the database may be away (scenario 6); not the worker's fault
            return False

    def node_name(self, child: Child) -> str:
        index = self.worker_children.index(child)
        run = self.key_prefix.strip(":").split("-")[-1]
        return f"chaos{index}-{run}@{socket.gethostname()}"

    def stop(self) -> None:
        self._stopping.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)
        self._restore_app_broker()
        for child in [*([self.server_child] if self.server_child else []), *self.worker_children,
                      *([self.beat_child] if self.beat_child else []), *([self.proxy_child] if self.proxy_child else []),
                      *([self.mcp_child] if self.mcp_child else [])]:
            # Nothing the stack stopped (SIGSTOP) may keep a child from dying.
            _signal_session(child, signal.SIGCONT)
            child.stop(timeout=5)
        for sandbox in (self.mail, self.payments):
            if sandbox is not None:
                sandbox.stop()
        if self.is_redis:
            _drop_keys(self.resolved_broker_url, self.key_prefix)
        if os.environ.get("COUNTERSIGN_CHAOS_KEEP") != "1":
            shutil.rmtree(self.var_dir, ignore_errors=True)

    def __enter__(self) -> ChaosStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- configuration -------------------------------------------------------------------------

    @property
    def mcp_effects_path(self) -> Path:
        return self.var_dir / "sandbox" / "mcp-effects.jsonl"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def is_redis(self) -> bool:
        return self.resolved_broker_url.startswith(("redis://", "rediss://"))

    def child_env(self) -> dict[str, str]:
        env = {
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "DATABASE_URL": self._children_database_url or self.database_url,
            "CELERY_BROKER_URL": self.resolved_broker_url,
            "COUNTERSIGN_VAR_DIR": str(self.var_dir),
            "SANDBOX_PAYMENTS_URL": self.payments.base_url,
            "SANDBOX_MAIL_URL": self.mail.base_url,
            "SANDBOX_MAIL_SMTP_PORT": str(self.mail.smtp_port),
            "OTEL_ENABLED": "0",
            "LOG_LEVEL": "WARNING",
            seams.SEAM_ENV: "all",
            seams.MARKER_ENV: str(self.marker_dir),
            POLL_ENV: "0.05",
            PREFIX_ENV: self.key_prefix if self.is_redis else "",
            **CLOCKS,
        }
        # A Redis broker shared with other runs: a database of our own is the caller's business;
        # a short visibility timeout is not wanted here (scenario 7 makes duplicates itself).
        env.pop("TEST_DATABASE_NAME", None)
        return env

    def _broker_options(self) -> dict:
        if self.resolved_broker_url.startswith("filesystem://"):
            queue = str(self.var_dir / "broker" / "queue")
            return {"data_folder_in": queue, "data_folder_out": queue,
                    "processed_folder": str(self.var_dir / "broker" / "processed"), "store_processed": False}
        # The workers read the same variable (console/settings.py).
        options = {"visibility_timeout": int(os.environ.get("CELERY_VISIBILITY_TIMEOUT") or 3600)}
        if self.is_redis:
            options["global_keyprefix"] = self.key_prefix
        return options

    def _point_app_at_broker(self) -> None:
        conf = celery_app.conf
        self._saved_broker = (conf.broker_url, conf.broker_transport_options, conf.task_always_eager)
        conf.broker_url = self.resolved_broker_url
        conf.broker_transport_options = self._broker_options()
        conf.task_always_eager = False
        _reset_producer_pool(celery_app)

    def _restore_app_broker(self) -> None:
        if self._saved_broker is None:
            return
        conf = celery_app.conf
        conf.broker_url, conf.broker_transport_options, conf.task_always_eager = self._saved_broker
        _reset_producer_pool(celery_app)
        self._saved_broker = None

    # -- what scenarios do to the processes ----------------------------------------------------

    def arm(self, seam_name: str, operation_id: str) -> None:
        seams.arm(self.marker_dir, seam_name, operation_id)

    def wait_blocked(self, seam_name: str, operation_id: str, *, timeout: float = 30.0) -> int:
        """The pid of the pool child blocked at the seam for this operation."""
        wait_until(lambda: seams.blocked_pid(self.marker_dir, seam_name, operation_id) is not None,
                   timeout=timeout, what=f"a worker at {seam_name} for {operation_id}")
        return seams.blocked_pid(self.marker_dir, seam_name, operation_id)

    def release(self, seam_name: str, operation_id: str) -> None:
        seams.release(self.marker_dir, seam_name, operation_id)

    def logs(self) -> dict[str, str]:
        return {path.name: path.read_text(errors="replace")[-4000:]
                for path in sorted((self.var_dir / "logs").glob("*.log"))}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_has(child: Child, text: str) -> bool:
    if child.popen is not None and child.popen.poll() is not None:
        # The stack's folder is removed when it stops: the log's end goes with the error.
        try:
            tail = child.log_path.read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            tail = "(no log)"
        raise RuntimeError(f"{child.name} exited with {child.popen.returncode}; the end of {child.log_path}:\n{tail}")
    try:
        return text in child.log_path.read_text(errors="replace")
    except FileNotFoundError:
        return False


def _signal_session(child: Child, sig: int) -> None:
    if child.popen is None:
        return
    try:
        os.killpg(child.popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _drop_keys(url: str, prefix: str) -> None:
    """Leftover messages (late duplicates, re-enqueues) of this stack's queues."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"{prefix}*", count=500):
            client.delete(key)
    except redis.RedisError:
        pass
    finally:
        client.close()


def _reset_producer_pool(app) -> None:
    # What Celery does after a fork: the next publish opens a connection from the new conf.
    app._pool = None
    try:
        app.__dict__["amqp"]._producer_pool = None
    except (AttributeError, KeyError):
        pass



def pool_pids(child: Child) -> list[int]:
    """The pool processes a Celery worker's main process forked (none for a threads pool)."""
    if not child.alive:
        return []
    pids: list[int] = []
    for task in Path(f"/proc/{child.popen.pid}/task").glob("*"):
        try:
            pids.extend(int(pid) for pid in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
    return sorted(set(pids))
