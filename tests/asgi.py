"""An ASGI server (uvicorn, websockets included) in a child process against the test database.

pytest-django's `live_server` speaks WSGI only; live views need websockets. The child reads the
same settings with DATABASE_URL pointing at the test database, so tests that commit data
(`django_db(transaction=True)`) see it served.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from django.conf import settings

from console.lib.procs import Child, http_ok, wait_until

REPO = Path(__file__).resolve().parents[1]


def test_database_url() -> str:
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AsgiServer:
    def __init__(self, *, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        child_env = {
            "DATABASE_URL": test_database_url(),
            "CELERY_BROKER_URL": os.environ.get("CELERY_BROKER_URL", "memory://"),
            "LIVE_POLL_SECONDS": "0.1",
            "PORT": str(self.port),
            # The browser tests lift Django's async-safety guard in this process; the server
            # must keep it, or an ORM call on its event loop would go unnoticed.
            "DJANGO_ALLOW_ASYNC_UNSAFE": "",
            **(env or {}),
        }
        self.child = Child("asgi", [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host",
                                    "127.0.0.1", "--port", str(self.port), "--lifespan", "on",
                                    "--log-level", "warning"], env=child_env)

    def start(self) -> AsgiServer:
        self.child.start(log_dir=REPO / "artifacts" / "logs")
        wait_until(lambda: not self.child.alive or http_ok(f"{self.url}/healthz")(), timeout=30,
                   what="the ASGI server")
        if not self.child.alive:
            raise RuntimeError(f"the ASGI server exited; see {self.child.log_path}")
        return self

    def stop(self) -> None:
        self.child.stop()
