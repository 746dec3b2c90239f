"""`make cluster`: the distributed mode on one machine, with production settings, as the README's
distributed section describes it — PostgreSQL and Redis, two ASGI servers behind a small TCP
balancer that passes websockets, a worker for the fast queue and one for the slow queue, one beat,
and the sandbox providers. A child that exits is restarted, so killing a server or a worker
shows what a deployment does.

Everything runs over plain HTTP on 127.0.0.1, so the session cookie is not marked secure; the
rest are production settings (DEBUG off, password validators, no demo identities: the first
admin and an agent come from `manage.py setup`).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from psycopg import sql

from console.lib.procs import (
    Child,
    first_taken_port,
    http_ok,
    python,
    stop_all,
    supervise_until,
    wait_until,
)
from sandbox.process import SandboxProcess

DEFAULT_DATABASE = "postgres://postgres@127.0.0.1:5432/countersign_cluster"
DEFAULT_BROKER = "redis://127.0.0.1:6379/1"
DEFAULT_LAYER = "redis://127.0.0.1:6379/0"
SERVER_OFFSETS = (10, 11)  # the ASGI servers listen on PORT+10 and PORT+11; the balancer on PORT
TOKEN_RE = re.compile(r"Agent token \(shown once; store it now\): (\S+)")


def _secret(path: Path, make) -> str:
    """A value generated once and kept in the cluster's folder (readable by its owner only)."""
    if not path.exists():
        path.write_text(make())
        path.chmod(0o600)
    return path.read_text().strip()


def ensure_database(url: str) -> None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin_url = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(url: str) -> None:
    """Drops the database (benches and tests that start a cluster on a database of their own)."""
    parts = urlsplit(url)
    admin_url = urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(parts.path.lstrip("/"))))


def cluster_environment(port: int, var: Path) -> dict[str, str]:
    database = os.environ.get("DATABASE_URL", "")
    broker = os.environ.get("CELERY_BROKER_URL", "")
    layer = os.environ.get("CHANNEL_LAYER_URL", "")
    database = database if database.startswith("postgres") else DEFAULT_DATABASE
    broker = broker if broker.startswith(("redis", "amqp")) else DEFAULT_BROKER
    layer = layer if layer.startswith("redis") else DEFAULT_LAYER
    origins = [f"http://{host}:{p}" for host in ("127.0.0.1", "localhost")
               for p in (port, *(port + offset for offset in SERVER_OFFSETS))]
    return {
        "COUNTERSIGN_ENV": "production",
        "DEBUG": "false",
        "SECRET_KEY": _secret(var / "secret_key", lambda: secrets.token_urlsafe(50)),
        "AUDIT_SIGNING_KEY": _secret(var / "audit_signing_key", lambda: secrets.token_hex(32)),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "CSRF_TRUSTED_ORIGINS": ",".join(origins),
        "SESSION_COOKIE_SECURE": "false",
        "PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
        "COUNTERSIGN_VAR_DIR": str(var),
        "DATABASE_URL": database,
        "CELERY_BROKER_URL": broker,
        "CHANNEL_LAYER_URL": layer,
        "PORT": str(port),
        "SANDBOX_PAYMENTS_URL": f"http://127.0.0.1:{port + 1}",
        "SANDBOX_MAIL_URL": f"http://127.0.0.1:{port + 2}",
        "SANDBOX_MAIL_SMTP_PORT": str(port + 3),
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
    }


def _stall_probe(env: dict[str, str]):
    """A worker is restarted when the documented probe (`manage.py worker_health --worker`, run
    with the cluster's settings, as an orchestrator would) says it is alive but stalled (exit 1).
    Asked once per stall period per worker, and only after a stall period since its start."""
    asked: dict[str, float] = {}

    def stalled(child: Child) -> bool:
        if not child.name.startswith("worker-") or child.uptime < settings.WORKER_STALL_SECONDS:
            return False
        if time.monotonic() - asked.get(child.name, 0.0) < settings.WORKER_STALL_SECONDS:
            return False
        asked[child.name] = time.monotonic()
        node = f"{child.name.removeprefix('worker-')}@{socket.gethostname()}"
        probe = subprocess.run(python("manage.py", "worker_health", "--worker", node), cwd=settings.BASE_DIR,
                               env={**os.environ, **env}, capture_output=True, timeout=60)
        return probe.returncode == 1

    return stalled


class Command(BaseCommand):
    help = "Run the distributed mode locally (production settings, PostgreSQL, Redis, 2 servers, 2 workers)."

    def add_arguments(self, parser):
        parser.add_argument("--admin", default="admin", help="Username of the first admin (created by setup).")
        parser.add_argument("--tenant", default="acme")

    def handle(self, *args, admin: str, tenant: str, **options):
        port = settings.PORT
        taken = first_taken_port([port, port + 1, port + 2, port + 3, *(port + offset for offset in SERVER_OFFSETS)])
        if taken is not None:
            raise CommandError(f"Port {taken} is in use; start on other ports with PORT=<n> make cluster (the "
                               f"balancer takes PORT, the sandboxes PORT+1 to PORT+3, the servers PORT+10 and "
                               f"PORT+11; now PORT={port}).")
        var = Path(os.environ.get("CLUSTER_VAR_DIR", str(settings.BASE_DIR / "var" / "cluster")))
        logs = var / "logs"
        for folder in (logs, var / "sandbox", var / "mail"):
            folder.mkdir(parents=True, exist_ok=True)
        env = cluster_environment(port, var)
        try:
            ensure_database(env["DATABASE_URL"])
        except psycopg.OperationalError as exc:
            raise CommandError(f"PostgreSQL is not reachable at {env['DATABASE_URL']}: {exc}") from exc
        password = os.environ.get("COUNTERSIGN_ADMIN_PASSWORD") or _secret(
            var / "admin_password", lambda: secrets.token_urlsafe(12))
        setup = subprocess.run(
            python("manage.py", "setup", "--no-input", "--tenant", tenant, "--admin", admin, "--agent", "cluster-agent"),
            cwd=settings.BASE_DIR, env={**os.environ, **env, "COUNTERSIGN_ADMIN_PASSWORD": password},
            capture_output=True, text=True)
        if setup.returncode != 0:
            raise CommandError(f"manage.py setup failed:\n{setup.stderr[-3000:]}")
        if found := TOKEN_RE.search(setup.stdout):
            _secret(var / "agent_token", lambda: found.group(1))
        token_file = var / "agent_token"
        token = token_file.read_text().strip() if token_file.exists() else "(rotate cluster-agent's token in the admin)"

        stopping = False

        def request_stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        sandboxes: list[SandboxProcess] = []
        children: list[Child] = []
        try:
            sandboxes.append(SandboxProcess.start(
                "payments", http_port=port + 1, db_path=var / "sandbox" / "payments.sqlite3",
                hang_seconds=8, die_with_parent=True))
            sandboxes.append(SandboxProcess.start(
                "mail", http_port=port + 2, smtp_port=port + 3, db_path=var / "sandbox" / "mail.sqlite3",
                hang_seconds=8, die_with_parent=True))
            servers = [port + offset for offset in SERVER_OFFSETS]
            children = [
                *(Child(f"server-{n}", python("-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                                              "--port", str(p), "--lifespan", "on", "--log-level", "warning"), env=env)
                  for n, p in enumerate(servers, start=1)),
                Child("balancer", python("-m", "console.lib.tcpproxy", "--listen", str(port),
                                         *(arg for p in servers for arg in ("--backend", f"127.0.0.1:{p}"))), env=env),
                Child("worker-fast", python("-m", "celery", "-A", "console", "worker", "-Q", "fast",
                                            "-l", "info", "-n", "fast@%h"), env=env),
                Child("worker-slow", python("-m", "celery", "-A", "console", "worker", "-Q", "slow",
                                            "-l", "info", "-n", "slow@%h"), env=env),
                Child("beat", python("-m", "celery", "-A", "console", "beat", "-l", "warning",
                                     "-s", str(var / "celerybeat-schedule")), env=env),
            ]
            for child in children:
                child.start(log_dir=logs)
            for p in (*servers, port):
                wait_until(http_ok(f"http://127.0.0.1:{p}/healthz"), timeout=60, what=f"the server on port {p}")
            self._banner(port, servers, admin, password, token, logs)
            supervise_until(lambda: stopping, children, log_dir=logs, stalled=_stall_probe(env),
                            say=self.stderr.write)
        finally:
            stop_all(children, sandboxes, say=self.stdout.write)

    def _banner(self, port: int, servers: list[int], admin: str, password: str, token: str, logs: Path) -> None:
        self.stdout.write(self.style.SUCCESS(f"\nCountersign (distributed, production settings) at http://127.0.0.1:{port}\n"))
        self.stdout.write(
            f"  Servers:   {', '.join(f'http://127.0.0.1:{p}' for p in servers)} (behind the balancer on {port})\n"
            f"  Log in as {admin}, password: {password}\n"
            f"  Agent API: http://127.0.0.1:{port}/api/v1/  (Authorization: Bearer {token})\n"
            f"  Workers:   fast and slow queues; one beat. Logs: {logs}/\n"
            "  Ctrl-C stops everything.\n"
        )
        self.stdout.flush()
