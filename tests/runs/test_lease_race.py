"""Two workers, one task: real threads with their own connections against PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from console.lib.errors import Conflict
from console.models import Event
from ledger.decisions import lease_acquire
from ledger.proposals import call_propose
from runs.models import Lease, Task
from runs.services import task_create, task_transition

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="needs PostgreSQL row locks"),
    pytest.mark.timeout(120),
]


def at_once(*jobs):
    """Run every job at the same moment, each in its own thread and database connection."""
    start = threading.Barrier(len(jobs))
    results: list = [None] * len(jobs)

    def run(index, job):
        try:
            start.wait(timeout=30)
            results[index] = ("ok", job())
        except Conflict as exc:
            results[index] = ("conflict", exc)
        except Exception as exc:  # noqa: BLE001 - any other outcome fails the test below
            results[index] = ("error", exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert not [r for r in results if r[0] == "error"], results
    return results


def test_workers_racing_for_a_free_task_get_exactly_one_lease(agent):
    task = task_create(principal=agent, task_type="refund", goal="g")
    results = at_once(*[lambda owner=f"w{i}": lease_acquire(task_id=task.task_id, owner=owner, ttl_seconds=60)
                        for i in range(8)])
    winners = [r[1] for r in results if r[0] == "ok"]
    assert len(winners) == 1
    assert Lease.objects.get(pk=task.pk).owner == winners[0].owner


def test_workers_racing_to_take_over_an_expired_lease_raise_the_token_once(agent):
    task = task_create(principal=agent, task_type="refund", goal="g")
    lease_acquire(task_id=task.task_id, owner="old", ttl_seconds=1)
    later = timezone.now() + timedelta(seconds=5)
    results = at_once(*[lambda owner=f"w{i}": lease_acquire(task_id=task.task_id, owner=owner, ttl_seconds=60,
                                                            now=later) for i in range(8)])
    assert [r[0] for r in results].count("ok") == 1
    lease = Lease.objects.get(pk=task.pk)
    assert (lease.fencing_token, lease.generation) == (2, 2)


def test_the_stale_token_can_neither_commit_a_transition_nor_propose_a_call(agent):
    task = task_create(principal=agent, task_type="refund", goal="g")
    old = lease_acquire(task_id=task.task_id, owner="old", ttl_seconds=1)
    task = task_transition(task_id=task.task_id, to="planning", expected_version=1,
                           fencing_token=old.fencing_token, actor="old")
    new = lease_acquire(task_id=task.task_id, owner="new", ttl_seconds=60,
                        now=timezone.now() + timedelta(seconds=5))
    with pytest.raises(Conflict):
        task_transition(task_id=task.task_id, to="running", expected_version=task.version,
                        fencing_token=old.fencing_token, actor="old")
    with pytest.raises(Conflict):
        call_propose(principal=agent, task_id=task.task_id, call_id="c1", step_id="s1", tool_name="orders.lookup",
                     arguments={"order_id": "o1"}, expected_version=task.version, fencing_token=old.fencing_token)
    assert task_transition(task_id=task.task_id, to="running", expected_version=task.version,
                           fencing_token=new.fencing_token, actor="new").status == "running"


def test_a_commit_racing_a_takeover_lands_before_it_or_not_at_all(agent):
    for attempt in range(5):
        task = task_create(principal=agent, task_type="refund", goal=f"g{attempt}")
        old = lease_acquire(task_id=task.task_id, owner="old", ttl_seconds=1)
        later = timezone.now() + timedelta(seconds=5)
        at_once(
            lambda task_id=task.task_id, token=old.fencing_token: task_transition(
                task_id=task_id, to="planning", expected_version=1, fencing_token=token, actor="old"),
            lambda task_id=task.task_id, now=later: lease_acquire(task_id=task_id, owner="new", ttl_seconds=60,
                                                                  now=now),
        )
        events = list(Event.objects.filter(entity__in=["task", "lease"], entity_id=task.task_id)
                      .exclude(to_status="queued").order_by("id").values_list("entity", "actor"))
        takeover = events.index(("lease", "worker:new"))
        # The old holder's transition, if it committed at all, committed before the takeover.
        assert all(not (entity == "task" and actor == "old") for entity, actor in events[takeover:])
        assert Task.objects.get(pk=task.pk).status in ("queued", "planning")
