"""The benchmark's floor (bench/floor.py) replays a lifecycle's statements: each replay must
write every row a real lifecycle writes, or the floor would be cheaper than the writes it
stands for and the conclusions drawn from it would be wrong."""

from __future__ import annotations

import pytest
from django.db import connection
from psycopg.conninfo import make_conninfo

from bench import floor
from bench import ledger as bench
from console.models import Event
from ledger.models import Attempt, Call, Operation, OperationStatus
from runs.models import Step

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the floor replays PostgreSQL statements"),
]

MODELS = (Operation, Call, Step, Attempt, Event)


def rows() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in MODELS}


def url() -> str:
    s = connection.settings_dict
    return make_conninfo(dbname=s["NAME"], host=s["HOST"] or None, port=s["PORT"] or None,
                         user=s["USER"] or None, password=s["PASSWORD"] or None)


@pytest.fixture
def recorded():
    bench.ensure_fixtures(1)
    one, _ = bench.lifecycle_runner(0)
    one("warm", "warm")
    before = rows()
    recording = floor.record(one)
    written = {name: count - before[name] for name, count in rows().items()}
    return recording, written


@pytest.mark.parametrize("shape", floor.SHAPES)
def test_each_replay_writes_the_rows_of_one_lifecycle_and_confirms_a_new_operation(recorded, shape):
    recording, written = recorded
    before = rows()
    replayer = floor.Replayer(url(), recording, shape=shape)
    try:
        replayer.replay()
        replayer.replay()
    finally:
        replayer.close()

    assert recording.write_commits == 2  # the proposal, its call inserted claimed, and the receipt
    assert written["Operation"] == 1 and written["Event"] >= 3
    assert {name: count - before[name] for name, count in rows().items()} == {
        name: 2 * count for name, count in written.items()}
    replayed = Operation.objects.exclude(operation_id=recording.ids[0]).filter(call_id__startswith="floor-call-")
    assert [op.status for op in replayed] == [OperationStatus.CONFIRMED] * 2
    assert all(op.receipt for op in replayed)


@pytest.mark.parametrize("shape", floor.SHAPES)
def test_a_replay_that_writes_less_than_the_lifecycle_is_an_error(recorded, monkeypatch, shape):
    recording, _ = recorded
    replayer = floor.Replayer(url(), recording, shape=shape)
    same_names = replayer._names()
    monkeypatch.setattr(replayer, "_names", lambda: same_names)
    try:
        replayer.replay()
        # The same IDs again: the call and step inserts meet their unique constraints and
        # write nothing (ON CONFLICT DO NOTHING), which the replay must not pass off as a lifecycle.
        with pytest.raises(RuntimeError, match="rows where the lifecycle touched"):
            replayer.replay()
    finally:
        replayer.close()


def test_a_statement_in_autocommit_that_writes_is_a_write_commit_and_a_read_is_not():
    read = floor.Transaction(autocommit=True, statements=[
        ("SELECT 1 FROM ledger_operation WHERE operation_id = %s FOR UPDATE", ["op"])])
    write = floor.Transaction(autocommit=True, statements=[
        ('WITH moved AS (UPDATE "ledger_operation" SET "status" = %s WHERE "operation_id" = %s RETURNING 1) '
         "SELECT (SELECT 1 FROM moved)", ["confirmed", "op"])])
    block = floor.Transaction(autocommit=False, statements=[("SELECT 1", [])])

    assert floor.Recording(transactions=[read, write, block], ids=()).write_commits == 2
