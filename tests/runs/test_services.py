"""runs.services: task contracts, the task state machine, leases and fencing tokens."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from console.lib.errors import Conflict, IllegalTransition, InvalidInput, NotFound, NotPermitted
from console.models import Event
from ledger import decisions
from runs import services
from runs.models import Lease, Task, TaskStatus
from tests.factories import (
    cancel_task,
    concurrent_writer,
    event_count,
    events_of,
    make_lease,
    make_task,
)

T = TaskStatus


class Boom(Exception):
    pass


def drive(task: Task, *statuses: str, token: int) -> Task:
    """Move a leased task through `statuses` with its current version."""
    for to in statuses:
        task.refresh_from_db()
        services.task_transition(
            task_id=task.task_id, to=to, expected_version=task.version, fencing_token=token, actor="agent"
        )
    task.refresh_from_db()
    return task


@pytest.fixture
def task(agent) -> Task:
    return make_task(agent)


@pytest.fixture
def token(task) -> int:
    return make_lease(task).fencing_token


# --- task_create ------------------------------------------------------------------------------


def test_task_create_registers_a_queued_contract_with_its_first_event(agent):
    task = services.task_create(
        principal=agent, task_type="refund", goal="Refund order 1001",
        inputs={"order_id": "1001"}, success_criteria=["refund confirmed"],
        constraints={"max_amount": 100}, versions={"workflow": "1"},
    )

    stored = Task.objects.get(task_id=task.task_id)
    assert stored.status == T.QUEUED
    assert stored.version == 1
    assert stored.tenant_id == agent.tenant_id
    assert stored.actor_id == agent.pk
    assert stored.constraints == {"max_amount": 100}
    [event] = events_of("task", task.task_id)
    assert (event.from_status, event.to_status) == ("", T.QUEUED)
    assert event.tenant_id == agent.tenant_id
    assert event.actor == agent.ref


def test_task_create_leaves_nothing_behind_when_its_transaction_rolls_back(agent):
    with pytest.raises(Boom), transaction.atomic():
        task = make_task(agent)
        raise Boom

    assert not Task.objects.filter(task_id=task.task_id).exists()
    assert event_count("task", task.task_id) == 0


# --- task_transition --------------------------------------------------------------------------


def test_it_moves_a_task_along_a_legal_path_bumping_the_version_each_time(task, token):
    drive(task, T.PLANNING, T.RUNNING, T.PAUSED, T.RUNNING, T.VERIFYING, token=token)

    assert task.status == T.VERIFYING
    assert task.version == 6
    moves = [(e.from_status, e.to_status) for e in events_of("task", task.task_id)]
    assert moves == [
        ("", T.QUEUED),
        (T.QUEUED, T.PLANNING),
        (T.PLANNING, T.RUNNING),
        (T.RUNNING, T.PAUSED),
        (T.PAUSED, T.RUNNING),
        (T.RUNNING, T.VERIFYING),
    ]


def test_an_agent_cannot_move_its_task_into_waiting_approval(task, token):
    drive(task, T.PLANNING, T.RUNNING, token=token)
    with pytest.raises(NotPermitted):
        drive(task, T.WAITING_APPROVAL, token=token)
    assert (task.status, task.version) == (T.RUNNING, 3)


def test_it_writes_exactly_one_event_per_transition_with_its_reason_and_evidence(task, token):
    before = event_count("task", task.task_id)

    services.task_transition(
        task_id=task.task_id, to=T.PLANNING, expected_version=1, fencing_token=token,
        actor="agent:acme/agent", reason="planning", evidence={"plan": ["look up", "refund"]},
    )

    events = events_of("task", task.task_id)
    assert len(events) == before + 1
    assert events[-1].reason == "planning"
    assert events[-1].evidence == {"plan": ["look up", "refund"]}
    assert events[-1].actor == "agent:acme/agent"


def test_it_rejects_an_illegal_move_and_changes_nothing(task, token):
    before = event_count("task", task.task_id)

    with pytest.raises(IllegalTransition):
        services.task_transition(
            task_id=task.task_id, to=T.RUNNING, expected_version=1, fencing_token=token, actor="agent"
        )

    task.refresh_from_db()
    assert (task.status, task.version) == (T.QUEUED, 1)
    assert event_count("task", task.task_id) == before


@pytest.mark.parametrize("to", [T.RUNNING, T.PLANNING, T.CANCELLED])
def test_it_never_moves_a_task_out_of_a_terminal_state(task, token, to):
    drive(task, T.PLANNING, T.FAILED, token=token)

    with pytest.raises(IllegalTransition):
        services.task_transition(
            task_id=task.task_id, to=to, expected_version=task.version, fencing_token=token, actor="agent"
        )
    task.refresh_from_db()
    assert task.status == T.FAILED


def test_it_refuses_success_on_the_agents_word(task, token):
    drive(task, T.PLANNING, T.RUNNING, T.VERIFYING, token=token)

    with pytest.raises(NotPermitted):
        services.task_transition(
            task_id=task.task_id, to=T.SUCCEEDED, expected_version=task.version, fencing_token=token,
            actor="agent", evidence={"i": "promise"},
        )
    task.refresh_from_db()
    assert task.status == T.VERIFYING


def test_it_rejects_an_unknown_status(task, token):
    with pytest.raises(InvalidInput):
        services.task_transition(
            task_id=task.task_id, to="done", expected_version=1, fencing_token=token, actor="agent"
        )


def test_it_rejects_an_unknown_task(task, token):
    with pytest.raises(NotFound):
        services.task_transition(
            task_id="tsk_nope", to=T.PLANNING, expected_version=1, fencing_token=token, actor="agent"
        )


def test_it_rejects_a_stale_expected_version(task, token):
    drive(task, T.PLANNING, token=token)
    before = event_count("task", task.task_id)

    with pytest.raises(Conflict) as excinfo:
        services.task_transition(
            task_id=task.task_id, to=T.RUNNING, expected_version=1, fencing_token=token, actor="agent"
        )

    assert not isinstance(excinfo.value, IllegalTransition)
    task.refresh_from_db()
    assert (task.status, task.version) == (T.PLANNING, 2)
    assert event_count("task", task.task_id) == before


def test_it_rejects_a_stale_fencing_token(task):
    first = make_lease(task, owner="worker-1", ttl_seconds=1)
    later = timezone.now() + timedelta(seconds=5)
    second = make_lease(task, owner="worker-2", now=later)
    assert second.fencing_token == first.fencing_token + 1

    with pytest.raises(Conflict):
        services.task_transition(
            task_id=task.task_id, to=T.PLANNING, expected_version=1,
            fencing_token=first.fencing_token, actor="worker-1",
        )
    task.refresh_from_db()
    assert task.status == T.QUEUED

    services.task_transition(
        task_id=task.task_id, to=T.PLANNING, expected_version=1,
        fencing_token=second.fencing_token, actor="worker-2",
    )
    task.refresh_from_db()
    assert task.status == T.PLANNING


def test_it_refuses_a_task_without_a_lease(task):
    with pytest.raises(Conflict):
        services.task_transition(
            task_id=task.task_id, to=T.PLANNING, expected_version=1, fencing_token=1, actor="agent"
        )
    assert Task.objects.get(pk=task.pk).status == T.QUEUED


def test_moving_to_the_current_status_is_a_no_op_without_an_event(task, token):
    drive(task, T.PLANNING, token=token)
    before = event_count("task", task.task_id)

    result = services.task_transition(
        task_id=task.task_id, to=T.PLANNING, expected_version=2, fencing_token=token, actor="agent"
    )

    assert (result.status, result.version) == (T.PLANNING, 2)
    task.refresh_from_db()
    assert (task.status, task.version) == (T.PLANNING, 2)
    assert event_count("task", task.task_id) == before


def test_it_raises_conflict_when_another_writer_bumps_the_version_first(task, token, monkeypatch):
    concurrent_writer(monkeypatch, services, version=F("version") + 1)
    before = event_count("task", task.task_id)

    with pytest.raises(Conflict) as excinfo:
        services.task_transition(
            task_id=task.task_id, to=T.PLANNING, expected_version=1, fencing_token=token, actor="agent"
        )

    assert not isinstance(excinfo.value, IllegalTransition)
    assert Task.objects.get(pk=task.pk).status == T.QUEUED
    assert event_count("task", task.task_id) == before


def test_a_rolled_back_transition_leaves_neither_status_nor_event(task, token):
    before = event_count("task", task.task_id)

    with pytest.raises(Boom), transaction.atomic():
        services.task_transition(
            task_id=task.task_id, to=T.PLANNING, expected_version=1, fencing_token=token, actor="agent"
        )
        raise Boom

    task.refresh_from_db()
    assert (task.status, task.version) == (T.QUEUED, 1)
    assert event_count("task", task.task_id) == before


# --- lease_acquire ----------------------------------------------------------------------------


def test_lease_acquire_grants_the_first_lease_with_token_one_and_an_event(task):
    now = timezone.now()

    lease = decisions.lease_acquire(task_id=task.task_id, owner="worker-1", ttl_seconds=30, now=now)

    stored = Lease.objects.get(task=task)
    assert (stored.owner, stored.generation, stored.fencing_token) == ("worker-1", 1, 1)
    assert stored.expires_at == now + timedelta(seconds=30)
    assert lease.fencing_token == 1
    [event] = events_of("lease", task.task_id)
    assert (event.kind, event.evidence["fencing_token"]) == (Event.Kind.LEASE_ACQUIRED, 1)
    assert event.actor == "worker:worker-1"
    assert event.tenant_id == task.tenant_id


def test_lease_acquire_renews_for_the_holder_keeping_its_token_without_an_event(task):
    now = timezone.now()
    decisions.lease_acquire(task_id=task.task_id, owner="worker-1", ttl_seconds=30, now=now)

    renewed = decisions.lease_acquire(
        task_id=task.task_id, owner="worker-1", ttl_seconds=60, now=now + timedelta(seconds=20)
    )

    stored = Lease.objects.get(task=task)
    assert renewed.fencing_token == stored.fencing_token == 1
    assert stored.generation == 1
    assert stored.expires_at == now + timedelta(seconds=80)
    assert event_count("lease", task.task_id) == 1


def test_lease_acquire_refuses_another_owner_while_the_lease_is_live(task):
    now = timezone.now()
    decisions.lease_acquire(task_id=task.task_id, owner="worker-1", ttl_seconds=30, now=now)

    with pytest.raises(Conflict):
        decisions.lease_acquire(
            task_id=task.task_id, owner="worker-2", ttl_seconds=30, now=now + timedelta(seconds=29)
        )

    assert Lease.objects.get(task=task).owner == "worker-1"
    assert event_count("lease", task.task_id) == 1


def test_lease_acquire_lets_a_new_owner_take_over_an_expired_lease_with_token_plus_one(task):
    now = timezone.now()
    decisions.lease_acquire(task_id=task.task_id, owner="worker-1", ttl_seconds=30, now=now)

    lease = decisions.lease_acquire(
        task_id=task.task_id, owner="worker-2", ttl_seconds=30, now=now + timedelta(seconds=31)
    )

    stored = Lease.objects.get(task=task)
    assert (stored.owner, stored.generation, stored.fencing_token) == ("worker-2", 2, 2)
    assert lease.fencing_token == 2
    assert [(e.kind, e.evidence["fencing_token"]) for e in events_of("lease", task.task_id)] == [
        (Event.Kind.LEASE_ACQUIRED, 1), (Event.Kind.LEASE_TAKEN_OVER, 2)]


def test_fencing_tokens_strictly_increase_across_takeovers(task):
    now = timezone.now()
    tokens = []
    for i in range(5):
        lease = decisions.lease_acquire(
            task_id=task.task_id, owner=f"worker-{i}", ttl_seconds=1, now=now + timedelta(seconds=2 * i)
        )
        tokens.append(lease.fencing_token)

    assert tokens == sorted(set(tokens))
    assert tokens == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("ttl", [0, -1, 3601])
def test_lease_acquire_rejects_a_ttl_out_of_range(task, ttl):
    with pytest.raises(InvalidInput):
        decisions.lease_acquire(task_id=task.task_id, owner="worker-1", ttl_seconds=ttl)
    assert not Lease.objects.filter(task=task).exists()


def test_lease_acquire_rejects_an_unknown_task(db):
    with pytest.raises(NotFound):
        decisions.lease_acquire(task_id="tsk_nope", owner="worker-1", ttl_seconds=30)


def test_lease_acquire_refuses_a_terminal_task(task):
    cancel_task(task.task_id)  # by the agent, under a lease of its own

    with pytest.raises(Conflict):
        decisions.lease_acquire(task_id=task.task_id, owner="worker-1", ttl_seconds=30)
    assert list(Lease.objects.filter(task=task).values_list("owner", flat=True)) == ["canceller"]


def test_lease_acquire_raises_conflict_when_another_worker_takes_over_first(task, monkeypatch):
    now = timezone.now()
    decisions.lease_acquire(task_id=task.task_id, owner="worker-1", ttl_seconds=30, now=now)
    real = services._locked_lease

    def racing(t):
        lease = real(t)
        # Another worker takes the expired lease between our read and our compare-and-set.
        Lease.objects.filter(task_id=t.task_id).update(
            owner="worker-3", fencing_token=F("fencing_token") + 1, generation=F("generation") + 1
        )
        return lease

    monkeypatch.setattr(services, "_locked_lease", racing)

    with pytest.raises(Conflict):
        decisions.lease_acquire(
            task_id=task.task_id, owner="worker-2", ttl_seconds=30, now=now + timedelta(seconds=60)
        )
    assert event_count("lease", task.task_id) == 1


def test_lease_acquire_raises_conflict_when_another_worker_creates_the_lease_first(task, monkeypatch):
    Lease.objects.create(task=task, owner="worker-1", expires_at=timezone.now() + timedelta(seconds=30))
    # Our read saw no lease: the other worker's insert had not committed yet.
    monkeypatch.setattr(services, "_locked_lease", lambda t: None)

    with pytest.raises(Conflict):
        decisions.lease_acquire(task_id=task.task_id, owner="worker-2", ttl_seconds=30)

    assert Lease.objects.get(task=task).owner == "worker-1"
    assert event_count("lease", task.task_id) == 0


def test_a_rolled_back_lease_acquire_leaves_neither_lease_nor_event(task):
    with pytest.raises(Boom), transaction.atomic():
        decisions.lease_acquire(task_id=task.task_id, owner="worker-1", ttl_seconds=30)
        raise Boom

    assert not Lease.objects.filter(task=task).exists()
    assert event_count("lease", task.task_id) == 0
    assert not Event.objects.filter(entity="lease").exists()
