"""Two processes of one restarted agent create its task at the same moment: one task."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from runs import services
from runs.models import Task

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="needs PostgreSQL row locks"),
    pytest.mark.timeout(120),
]


def test_concurrent_creates_with_one_key_make_one_task(agent):
    barrier = threading.Barrier(4)
    answers, failures = [], []

    def create():
        try:
            barrier.wait()
            task, _ = services.task_create_or_get(principal=agent, idempotency_key="thread-1",
                                                  task_type="refund", goal="Refund")
            answers.append(task.task_id)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(set(answers)) == 1 and len(answers) == 4
    assert Task.objects.count() == 1
