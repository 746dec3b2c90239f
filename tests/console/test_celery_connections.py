"""The worker keeps its database connection from task to task (console/celery.py), and drops
one that broke or was left inside a transaction."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.db import DEFAULT_DB_ALIAS, connections

from console import celery as worker

pytestmark = pytest.mark.django_db(transaction=True)

TASK = SimpleNamespace(request=SimpleNamespace(is_eager=False))
EAGER = SimpleNamespace(request=SimpleNamespace(is_eager=True))


@pytest.fixture
def connection():
    """The thread's own connection object: the hooks keep their mark in its attributes, which
    django.db.connection (a proxy) would not show."""
    return connections[DEFAULT_DB_ALIAS]


def run_task(fixup: DjangoWorkerFixup, connection) -> None:
    """What a worker does around a task: the fix-up's hooks and ours, a query in between."""
    fixup.on_task_prerun(TASK)
    worker._check_idle_connections(task=TASK)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    fixup.on_task_postrun(TASK)
    worker._close_unusable_connections(task=TASK)


def test_tasks_in_a_row_run_on_one_database_connection(connection):
    fixup = DjangoWorkerFixup(worker.app)
    connection.ensure_connection()
    first = connection.connection

    for _ in range(5):
        run_task(fixup, connection)

    assert fixup.db_reuse_max == worker.DB_REUSE_TASKS
    assert connection.connection is first


def test_a_connection_left_inside_a_transaction_is_closed_after_its_task(connection):
    connection.ensure_connection()
    connection.set_autocommit(False)

    worker._close_unusable_connections(task=TASK)

    assert connection.connection is None


def test_a_task_run_inline_leaves_its_callers_connection_alone(connection):
    connection.ensure_connection()
    connection.set_autocommit(False)
    try:
        worker._close_unusable_connections(task=EAGER)
        assert connection.connection is not None
    finally:
        connection.set_autocommit(True)


def test_a_connection_idle_for_a_while_is_checked_before_the_next_task_uses_it(connection):
    connection.ensure_connection()
    connection.health_check_done = True
    connection.__dict__[worker._IDLE_SINCE] = time.monotonic() - worker.IDLE_CHECK_SECONDS - 1

    worker._check_idle_connections(task=TASK)

    assert connection.health_check_done is False


def test_a_connection_used_a_moment_ago_is_not_checked_again(connection):
    connection.ensure_connection()
    connection.health_check_done = True
    connection.__dict__[worker._IDLE_SINCE] = time.monotonic()

    worker._check_idle_connections(task=TASK)

    assert connection.health_check_done is True
