"""The hash-chain migration on PostgreSQL: events written before it (the schema of
console 0005) are chained by it, per tenant in id order, and `audit_verify` finds every chain
whole; events written after it are sealed onto the same chains (by the sealer, since 0011).
And 0011 reversed: the rows left for the sealer are sealed before sealing at commit comes back."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from console.lib import audit
from console.lib.transitions import record_event
from console.models import Event, EventChainHead

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the PostgreSQL triggers and migration"),
    pytest.mark.timeout(300),
]

BEFORE_CHAINS = ("console", "0005_event_entity_stop")


def migrate(targets) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


def verify() -> tuple[int, str]:
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("audit_verify", stdout=out)
    return exited.value.code, out.getvalue()


def test_events_written_before_the_chains_are_chained_by_the_migration_and_verify(tenant, other_tenant):
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        executor = migrate([BEFORE_CHAINS])
        old_event = executor.loader.project_state([BEFORE_CHAINS]).apps.get_model("console", "Event")
        at = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
        # Interleaved tenants, one untenanted, evidence of every JSON kind, non-ASCII text.
        for i, tenant_id in enumerate([tenant.pk, other_tenant.pk, tenant.pk, None, other_tenant.pk, tenant.pk]):
            old_event.objects.create(tenant_id=tenant_id, entity="task", entity_id=f"old-{i}", kind="created",
                                     from_status="", to_status="running", actor="agent:öld", reason="café ✓",
                                     evidence={"i": i, "f": 1.5, "n": None, "l": [True, "x"]},
                                     created_at=at + timedelta(seconds=i))
    finally:
        migrate(latest)

    code, out = verify()

    assert code == 0, out
    assert "3 chain(s) checked, 0 broken." in out
    old = list(Event.objects.filter(tenant=tenant).order_by("id"))
    assert [e.chain_seq for e in old] == [1, 2, 3] and old[0].prev_hash == ""
    assert old[1].prev_hash == old[0].hash and old[2].prev_hash == old[1].hash
    assert EventChainHead.objects.get(chain=f"tenant:{tenant.pk}").hash == old[2].hash

    record_event(entity="task", entity_id="new", tenant_id=tenant.pk, kind=Event.Kind.CREATED,
                 to_status="running", actor="agent:new")
    assert audit.seal_pending() == 1
    new = Event.objects.get(entity_id="new")

    assert (new.chain_seq, new.prev_hash) == (4, old[2].hash)
    assert audit.verify_chain(tenant.pk) is None
    assert verify()[0] == 0


SEALED_AT_COMMIT = ("console", "0010_tenant_time_zone")


def test_migrating_back_to_sealing_at_commit_seals_what_the_sealer_had_left(tenant):
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    record_event(entity="task", entity_id="left", tenant_id=tenant.pk, kind=Event.Kind.CREATED,
                 to_status="running", actor="agent:a")
    assert Event.objects.get(entity_id="left").chain_seq is None
    try:
        migrate([SEALED_AT_COMMIT])
        assert Event.objects.get(entity_id="left").chain_seq == 1
        record_event(entity="task", entity_id="at-commit", tenant_id=tenant.pk, kind=Event.Kind.CREATED,
                     to_status="running", actor="agent:a")
        assert Event.objects.get(entity_id="at-commit").chain_seq == 2  # the trigger is back
    finally:
        migrate(latest)
    record_event(entity="task", entity_id="after", tenant_id=tenant.pk, kind=Event.Kind.CREATED,
                 to_status="running", actor="agent:a")
    assert Event.objects.get(entity_id="after").chain_seq is None  # and gone again
    assert audit.seal_pending() == 1
    assert audit.verify_chain(tenant.pk) is None
