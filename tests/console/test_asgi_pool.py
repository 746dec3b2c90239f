"""console.asgi: the web server's connection pool retries a lost database every second, not
after psycopg_pool's 1, 2, 4, 8… s (which kept the API silent for ~15 s after a restart)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


QUIET_CHECKOUT_PROBE = """
from psycopg_pool import ConnectionPool
round_trip = ConnectionPool.check_connection
checked = []
def counted(conn):
    checked.append(conn.info.backend_pid)
    return round_trip(conn)
ConnectionPool.check_connection = staticmethod(counted)
import console.asgi
import psycopg
from django.db import connections
pool = connections["default"].pool
pool.open(wait=True)
conn = pool.getconn(); first = conn.info.backend_pid; pool.putconn(conn)
conn = pool.getconn(); again = conn.info.backend_pid; pool.putconn(conn)
quiet = list(checked)
with psycopg.connect(DSN, autocommit=True) as admin:  # and wait until that backend has exited
    admin.execute("SELECT pg_terminate_backend(%s, 10000)", [again])
conn = pool.getconn()
print(quiet, first == again, checked[len(quiet):] == [again], conn.execute("SELECT 1").fetchone()[0], conn.info.backend_pid != again)
"""


@pytest.mark.django_db
def test_a_quiet_pooled_connection_leaves_the_pool_without_a_round_trip_and_a_dead_one_is_replaced():
    """The web server's pool checks a connection as it leaves the pool (CONN_HEALTH_CHECKS) with a
    round trip only when the server sent something since the connection went back (a backend
    terminated, a database restarted): a request that gives its connection back around a
    provider call and takes one again pays no round trip for it."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the pool is PostgreSQL's")
    params = connection.settings_dict
    url = f"postgres://{params['USER']}@{params['HOST']}:{params['PORT']}/{params['NAME']}"
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "console.settings"}
    env.pop("DATABASE_POOL", None)
    probe = f"DSN = {url!r}\n" + QUIET_CHECKOUT_PROBE
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[] True True 1 True"
