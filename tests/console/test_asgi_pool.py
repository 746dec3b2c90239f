"""console.asgi: the web server's connection pool retries a lost database every second, not
after psycopg_pool's 1, 2, 4, 8… s (which kept the API silent for ~15 s after a restart)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = ("import console.asgi; from psycopg_pool.base import AttemptWithBackoff as A; "
         "a = A(timeout=300); delays = []\n"
         "for _ in range(5):\n    a.update_delay(0.0); delays.append(round(a.delay, 1))\n"
         "print(delays)")


def delays_under(database_url: str) -> str:
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "console.settings"}
    env.pop("DATABASE_POOL", None)
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120, check=True)
    return result.stdout.strip().splitlines()[-1]


def test_the_web_servers_pool_retries_about_every_second():
    # The pool is created lazily: importing the ASGI app connects to nothing.
    delays = ast.literal_eval(delays_under("postgres://nobody@127.0.0.1:9/none"))
    assert all(0.85 <= d <= 1.15 for d in delays), delays


def test_without_a_pool_the_library_is_left_alone(tmp_path):
    delays = ast.literal_eval(delays_under(f"sqlite:///{tmp_path / 'db.sqlite3'}"))
    assert delays[-1] > 8, delays  # psycopg_pool's own doubling
