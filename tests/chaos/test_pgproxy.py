"""The chaos database proxy (chaos/pgproxy.py) against the real PostgreSQL: a commit cut
before the server sees it is rolled back, one cut after is kept though the client got an error,
and a "restarting" proxy refuses new connections with 57P03."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from chaos.pgproxy import ProxyControl
from console.lib.procs import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="a proxy in front of PostgreSQL"),
    pytest.mark.timeout(60),
]


@pytest.fixture
def proxy():
    db = settings.DATABASES["default"]
    child = subprocess.Popen([sys.executable, "-m", "chaos.pgproxy", "--upstream",
                              f"{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}"],
                             stdout=subprocess.PIPE, text=True)
    try:
        port, control = map(int, re.findall(r"=(\d+)", child.stdout.readline()))
        dsn = (f"host=127.0.0.1 port={port} user={db.get('USER') or 'postgres'} dbname={db['NAME']}"
               + (f" password={db['PASSWORD']}" if db.get("PASSWORD") else ""))
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE IF NOT EXISTS chaos_proxy_probe (value text)")
        yield dsn, ProxyControl(control)
    finally:
        child.kill()
        child.wait()
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS chaos_proxy_probe")


def committed(value: str) -> bool:
    with connection.cursor() as cursor:  # the test's own connection: straight to the server
        cursor.execute("SELECT count(*) FROM chaos_proxy_probe WHERE value = %s", [value])
        return cursor.fetchone()[0] == 1


def insert_and_commit(dsn: str, value: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO chaos_proxy_probe VALUES (%s)", [value])
        conn.commit()


def insert_in_autocommit(dsn: str, value: str) -> None:
    """One statement outside any transaction block: its Sync is its commit."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO chaos_proxy_probe VALUES (%s)", [value])


# A statement in autocommit is its own transaction, committed with its Sync: cut as a COMMIT is.
@pytest.mark.parametrize("write", [insert_and_commit, insert_in_autocommit], ids=["in a block", "in autocommit"])
@pytest.mark.parametrize(("mode", "lands"), [("before", False), ("reply", True)])
def test_a_commit_cut_by_the_proxy_fails_for_the_client_and_lands_only_if_forwarded(proxy, mode, lands, write):
    dsn, control = proxy
    value = f"v-{uuid.uuid4().hex}"
    control.arm("cut", ["chaos_proxy_probe", value], mode=mode)
    with pytest.raises(psycopg.OperationalError):
        write(dsn, value)
    assert control.fired("cut")["mode"] == mode
    assert committed(value) is lands


def test_a_begin_in_autocommit_is_not_a_commit(proxy):
    dsn, control = proxy
    value = f"v-{uuid.uuid4().hex}"
    control.arm("cut", ["chaos_proxy_probe", value], mode="before")
    conn = psycopg.connect(dsn, autocommit=True)
    with pytest.raises(psycopg.OperationalError), conn.transaction():
        conn.execute("INSERT INTO chaos_proxy_probe VALUES (%s)", [value])
        # BEGIN and the statement went through: the rule waits for the COMMIT.
        assert control.fired("cut") is None
    assert control.fired("cut")["mode"] == "before"
    assert not committed(value)


def accepts_connections(dsn: str) -> bool:
    try:
        psycopg.connect(dsn).close()
    except psycopg.OperationalError:
        return False
    return True


def test_other_transactions_pass_and_a_restart_refuses_new_connections_for_a_while(proxy):
    dsn, control = proxy
    insert_and_commit(dsn, "unrelated")  # no rule armed
    control.arm("cut", ["chaos_proxy_probe", "target"], mode="reply", refuse_seconds=1.0)
    bystander = psycopg.connect(dsn)
    with pytest.raises(psycopg.OperationalError):
        insert_and_commit(dsn, "target")
    with pytest.raises(psycopg.OperationalError, match="starting up"):
        psycopg.connect(dsn)
    with pytest.raises(psycopg.OperationalError):  # severed with the rest, as by a restart
        bystander.execute("SELECT 1")
    wait_until(lambda: accepts_connections(dsn), timeout=10, what="the proxy to accept connections again")
    insert_and_commit(dsn, "after")
    assert committed("unrelated") and committed("target") and committed("after")
