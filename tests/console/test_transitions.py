"""console.lib.transitions: the one shape of every state change."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.db.models import F

from console.lib.errors import Conflict, IllegalTransition
from console.lib.transitions import record_event, transition
from console.models import Event
from ledger.models import Attempt, Operation, OperationStatus
from runs.models import Task, TaskStatus
from tests.factories import event_count, events_of, make_operation, make_task

S = OperationStatus


class Boom(Exception):
    pass


def test_it_moves_the_row_and_appends_one_event_in_the_same_transaction(agent):
    operation = make_operation(agent)
    before = event_count("operation", operation.operation_id)

    moved = transition(operation, to=S.AUTHORIZED, actor="user:r", reason="ok", evidence={"a": 1})

    assert moved is True
    assert operation.status == S.AUTHORIZED  # refreshed in memory
    assert Operation.objects.get(pk=operation.pk).status == S.AUTHORIZED
    events = events_of("operation", operation.operation_id)
    assert len(events) == before + 1
    event = events[-1]
    assert (event.entity, event.from_status, event.to_status) == ("operation", S.PLANNED, S.AUTHORIZED)
    assert (event.actor, event.reason, event.evidence) == ("user:r", "ok", {"a": 1})
    assert event.tenant_id == operation.tenant_id


def test_it_writes_changes_with_the_status_and_refreshes_them(agent):
    task = make_task(agent)

    transition(task, to=TaskStatus.PLANNING, actor="a", changes={"version": F("version") + 1},
               guard={"version": 1})

    assert task.version == 2
    assert Task.objects.get(pk=task.pk).version == 2


@pytest.mark.parametrize("computed", [False, True], ids=["plain values", "F() expressions"])
def test_rows_that_go_with_a_move_are_written_with_it_and_only_with_it(agent, computed):
    operation = make_operation(agent, status=S.AUTHORIZED)
    first = Attempt.objects.create(operation=operation, number=1, fencing_token=1)
    changes = {"attempt_count": F("attempt_count") + 1} if computed else {"attempt_count": 1}
    second = Attempt(operation=operation, number=2, fencing_token=2)

    transition(operation, to=S.DISPATCHED, actor="a", changes=changes, also_insert=[second],
               also_update=[(Attempt, {"pk": first.pk}, {"stale": True})])

    assert second.pk is not None and second._state.adding is False
    assert Attempt.objects.get(pk=second.pk).number == 2
    assert Attempt.objects.get(pk=first.pk).stale is True
    third = Attempt(operation=operation, number=3, fencing_token=3)
    operation.status = S.AUTHORIZED  # stale in memory: the compare-and-set loses
    with pytest.raises(Conflict):
        transition(operation, to=S.DISPATCHED, actor="a", changes=changes, also_insert=[third],
                   also_update=[(Attempt, {"pk": first.pk}, {"stale": False})])
    assert third.pk is None
    assert list(Attempt.objects.filter(operation=operation).values_list("number", "stale")) == [(1, True), (2, False)]


def test_it_bumps_updated_at(agent):
    operation = make_operation(agent)
    stamp = operation.updated_at

    transition(operation, to=S.AUTHORIZED, actor="a")

    assert Operation.objects.get(pk=operation.pk).updated_at > stamp


def test_the_target_state_is_a_no_op_without_an_event(agent):
    operation = make_operation(agent, status=S.AUTHORIZED)
    before = event_count("operation", operation.operation_id)

    assert transition(operation, to=S.AUTHORIZED, actor="a") is False

    assert event_count("operation", operation.operation_id) == before


def test_an_illegal_move_raises_before_touching_the_database(agent):
    operation = make_operation(agent)
    before = Event.objects.count()

    with pytest.raises(IllegalTransition) as excinfo:
        transition(operation, to=S.CONFIRMED, actor="a")

    assert excinfo.value.details == {
        "entity": "operation", "id": operation.operation_id, "from": S.PLANNED, "to": S.CONFIRMED}
    assert Operation.objects.get(pk=operation.pk).status == S.PLANNED
    assert Event.objects.count() == before


def test_a_stale_in_memory_status_raises_conflict_and_keeps_the_other_writers_change(agent):
    operation = make_operation(agent)
    stale = Operation.objects.get(pk=operation.pk)
    # Another writer moves the row after we read it.
    transition(Operation.objects.get(pk=operation.pk), to=S.CANCELLED, actor="other")
    before = event_count("operation", operation.operation_id)

    with pytest.raises(Conflict) as excinfo:
        transition(stale, to=S.AUTHORIZED, actor="me")

    assert not isinstance(excinfo.value, IllegalTransition)
    assert Operation.objects.get(pk=operation.pk).status == S.CANCELLED
    assert event_count("operation", operation.operation_id) == before


def test_a_failed_guard_raises_conflict(agent):
    task = make_task(agent)
    Task.objects.filter(pk=task.pk).update(version=F("version") + 1)

    with pytest.raises(Conflict):
        transition(task, to=TaskStatus.PLANNING, actor="a", guard={"version": 1})

    assert Task.objects.get(pk=task.pk).status == TaskStatus.QUEUED
    assert event_count("task", task.task_id) == 1


def test_a_rollback_after_the_move_takes_the_event_with_it(agent):
    operation = make_operation(agent)
    before = event_count("operation", operation.operation_id)

    with pytest.raises(Boom), transaction.atomic():
        transition(operation, to=S.AUTHORIZED, actor="a")
        raise Boom

    assert Operation.objects.get(pk=operation.pk).status == S.PLANNED
    assert event_count("operation", operation.operation_id) == before


def test_record_event_stores_the_entity_id_as_text(tenant):
    event = record_event(entity="lease", entity_id=42, tenant_id=tenant.pk, kind=Event.Kind.LEASE_ACQUIRED, actor="w")

    assert Event.objects.get(pk=event.pk).entity_id == "42"
    assert Event.objects.get(pk=event.pk).evidence == {}


def test_only_a_transition_names_the_status_it_leaves(tenant):
    with pytest.raises(ValueError):
        record_event(entity="task", entity_id="t", tenant_id=tenant.pk, kind=Event.Kind.CREATED,
                     from_status="queued", to_status="running", actor="a")
    with pytest.raises(ValueError):
        record_event(entity="task", entity_id="t", tenant_id=tenant.pk, kind=Event.Kind.TRANSITION,
                     to_status="running", actor="a")


def test_an_event_row_is_the_models_own_unsaved_instance_built_without_model_init(agent, model_inits):
    """Every move builds its event row; Model.__init__ would set each of its fields through its
    descriptor. The row is what `Event(...)` builds, with its content hash, and saves as one."""
    from console.lib import audit
    from console.lib.transitions import event_row, record_events

    model_inits.clear()
    fields = dict(entity="operation", entity_id="op_1", tenant_id=agent.tenant_id, kind=Event.Kind.TRANSITION,
                  from_status="planned", to_status="authorized", actor="gate", reason="L0", evidence={"n": [1.5]})
    row = event_row(**fields)
    assert model_inits == []

    expected = Event(**fields, created_at=row.created_at)
    assert {k: v for k, v in vars(row).items() if k != "_state"} == {
        k: v for k, v in vars(expected).items() if k not in ("_state", "content_hash")} | {
        "content_hash": audit.content_hash(expected)}
    assert (row._state.adding, row._state.db) == (True, None)
    [saved] = record_events([row])
    assert Event.objects.get(pk=saved.pk).content_hash == audit.content_hash(expected)
