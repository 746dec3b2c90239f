"""console.lib.audit and `manage.py audit_verify`: the event log's hash chains, and the first
broken link named when a row is changed, removed, inserted or re-ordered behind the
application's back (raw SQL, with the append-only trigger off on PostgreSQL)."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from django.core.management import call_command
from django.db import connection

from console.lib import audit
from console.lib.transitions import record_event, transition
from console.models import Event, EventChainHead
from ledger.models import OperationStatus
from tests.factories import make_operation

pytestmark = pytest.mark.django_db


def sealed() -> None:
    """On PostgreSQL the sealer links rows after their commit: seal the ones written so far (and
    run the deferred foreign-key checks, which these tests never commit: ALTER TABLE refuses a
    table with pending trigger events)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    audit.seal_pending()


def verify(*args: str) -> tuple[int, str]:
    sealed()
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("audit_verify", *args, stdout=out)
    return exited.value.code, out.getvalue()


def raw(statement: str, params=()) -> None:
    """A write the application would never make, past the append-only and sealing triggers
    (the test's transaction is rolled back afterwards, the triggers' absence with it)."""
    sealed()  # the rows written so far
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE ledger_event DISABLE TRIGGER USER")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS ledger_event_seal")
        cursor.execute(statement, params)


def some_events(tenant, n: int = 4) -> list[Event]:
    return [record_event(entity="task", entity_id=f"t{i}", tenant_id=tenant.pk, kind=Event.Kind.CREATED,
                         to_status="running", actor="agent:a", evidence={"i": i, "b": [1.5, "x"], "a": None})
            for i in range(n)]


def test_each_event_names_the_hash_of_the_one_before_in_its_tenants_chain(agent, tenant, other_tenant):
    first, second = some_events(tenant, 2)
    elsewhere = record_event(entity="task", entity_id="o", tenant_id=other_tenant.pk, kind=Event.Kind.CREATED,
                             to_status="running", actor="agent:b")
    untenanted = record_event(entity="stop", entity_id="s", tenant_id=None, kind=Event.Kind.CREATED,
                              to_status="active", actor="user:root")
    sealed()
    rows = {e.pk: e for e in Event.objects.filter(pk__in=[first.pk, second.pk, elsewhere.pk, untenanted.pk])}

    assert rows[second.pk].prev_hash == rows[first.pk].hash != ""
    assert rows[second.pk].chain_seq == rows[first.pk].chain_seq + 1
    assert rows[elsewhere.pk].chain_seq == 1 and rows[elsewhere.pk].prev_hash == ""
    assert rows[untenanted.pk].chain_seq == 1
    for row in rows.values():
        assert row.content_hash == audit.content_hash(row)  # read back, it hashes as it was written
        assert row.hash == audit.link_hash(row)  # the trigger built the bytes audit.link_bytes does
    assert EventChainHead.objects.get(chain=f"tenant:{tenant.pk}").hash == rows[second.pk].hash


def test_transitions_and_proposals_are_chained_and_the_log_verifies(agent, tenant):
    operation = make_operation(agent)
    transition(operation, to=OperationStatus.AUTHORIZED, actor="user:r", reason="ok", evidence={"n": 1})
    some_events(tenant, 2)

    code, out = verify()

    assert code == 0, out
    assert "0 broken" in out
    assert Event.objects.filter(chain_seq__isnull=True).count() == 0


def test_a_lost_compare_and_set_leaves_the_chain_whole(agent, tenant):
    from console.lib.errors import Conflict

    operation = make_operation(agent)
    stale = type(operation).objects.get(pk=operation.pk)
    transition(operation, to=OperationStatus.AUTHORIZED, actor="user:r")
    with pytest.raises(Conflict):
        transition(stale, to=OperationStatus.CANCELLED, actor="user:r")
    some_events(tenant, 1)

    assert verify()[0] == 0


def test_a_changed_field_is_named(agent, tenant):
    events = some_events(tenant)
    raw("UPDATE ledger_event SET reason = 'nothing to see' WHERE id = %s", [events[2].pk])

    code, out = verify("--tenant", tenant.slug)

    assert code == 1
    assert f"changed at event #{events[2].pk}" in out


def test_a_changed_evidence_is_named(agent, tenant):
    events = some_events(tenant)
    raw("UPDATE ledger_event SET evidence = %s WHERE id = %s", ['{"i": 99}', events[1].pk])

    code, out = verify()

    assert code == 1
    assert f"changed at event #{events[1].pk}" in out


def test_a_deleted_row_is_named(agent, tenant):
    events = some_events(tenant)
    raw("DELETE FROM ledger_event WHERE id = %s", [events[1].pk])

    code, out = verify("--tenant", tenant.slug)

    assert code == 1
    assert f"removed at event #{events[2].pk}" in out


def test_a_deleted_last_row_is_caught_by_the_head(agent, tenant):
    events = some_events(tenant)
    raw("DELETE FROM ledger_event WHERE id = %s", [events[-1].pk])

    code, out = verify("--tenant", tenant.slug)

    assert code == 1
    assert "removed at chain end" in out


def test_a_reordered_pair_is_named(agent, tenant):
    events = some_events(tenant)
    a, b = events[1].pk, events[2].pk
    # Swap the two rows' ids: the log read in id order shows them the other way round.
    raw("UPDATE ledger_event SET id = -1 WHERE id = %s", [a])
    raw("UPDATE ledger_event SET id = %s WHERE id = %s", [a, b])
    raw("UPDATE ledger_event SET id = %s WHERE id = -1", [b])

    code, out = verify("--tenant", tenant.slug)

    assert code == 1
    assert f"moved at event #{b}" in out


def test_a_row_swapped_into_anothers_place_is_named(agent, tenant):
    events = some_events(tenant)
    # Swap the two rows' contents, leaving the chain columns where they were.
    for row, other in ((events[1], events[2]), (events[2], events[1])):
        raw("UPDATE ledger_event SET entity_id = %s, evidence = %s WHERE id = %s",
            [other.entity_id, json.dumps(other.evidence), row.pk])

    code, out = verify()

    assert code == 1
    assert f"changed at event #{events[1].pk}" in out


def test_a_row_inserted_behind_the_applications_back_is_named(agent, tenant):
    """Sealed like any other row (the chains use no secret: docs/security.md), it is named by its
    content hash, which is not its fields'."""
    some_events(tenant)
    raw("INSERT INTO ledger_event (tenant_id, entity, entity_id, kind, from_status, to_status, actor, reason, "
        "evidence, created_at, content_hash, prev_hash, hash) VALUES (%s, 'task', 'x', 'created', '', 'running', 'agent:a', '', "
        "'{}', '2026-01-01 00:00:00+00', '', '', '')", [tenant.pk])
    inserted = Event.objects.get(entity_id="x")

    code, out = verify("--tenant", tenant.slug)

    assert code == 1
    assert f"changed at event #{inserted.pk}" in out


def test_an_unknown_tenant_is_an_error(db):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        call_command("audit_verify", "--tenant", "nobody")


def test_a_chain_is_read_in_pages_of_bounded_size_and_a_break_across_pages_is_found(tenant):
    """Memory stays flat however long the chain: pages by (chain_seq, id), never the whole chain
    (a server-side cursor outside a transaction is materialized whole by PostgreSQL)."""
    from django.test.utils import CaptureQueriesContext

    events = some_events(tenant, n=10)
    sealed()
    with CaptureQueriesContext(connection) as queries:
        assert audit.verify_chain(tenant.pk, chunk_size=3) is None
    reads = [q["sql"] for q in queries.captured_queries
             if 'FROM "ledger_event"' in q["sql"] and "chain_seq" in q["sql"] and "IS NULL" not in q["sql"]]

    assert len(reads) >= 4 and all("LIMIT 3" in sql for sql in reads), reads

    raw("DELETE FROM ledger_event WHERE id = %s", [events[4].pk])  # the second page's second row

    assert audit.verify_chain(tenant.pk, chunk_size=3) == audit.Break(
        f"tenant:{tenant.pk}", events[5].pk, "removed", "rows 5..5 are missing before this one")


def test_the_content_hash_covers_the_bytes_docs_security_md_gives_an_auditor():
    """The format is a promise to whoever checks a dump without this code: it must never
    change with the code that writes it (docs/security.md)."""
    from datetime import UTC, datetime, timedelta, timezone

    row = Event(tenant_id=7, entity="operation", entity_id="op_1", kind="transition", from_status="authorized",
                to_status="dispatched", actor="agent:a", reason="r", evidence={"b": [1, 2.5], "a": "é"},
                created_at=datetime(2026, 12, 4, 17, 5, 6, 7, tzinfo=timezone(timedelta(hours=2))))
    expected = ('["countersign-event-v1",7,"operation","op_1","transition","authorized","dispatched","agent:a","r",'
                '{"a":"é","b":[1,2.5]},"2026-12-04T15:05:06.000007Z"]').encode()
    assert audit.content_bytes(row) == expected
    assert audit.content_hash(row) == hashlib.sha256(expected).hexdigest()
    row.tenant_id, row.created_at = None, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert audit.content_bytes(row).endswith(b',"2026-01-02T03:04:05.000000Z"]')
    assert audit.content_bytes(row).startswith(b'["countersign-event-v1",null,')
