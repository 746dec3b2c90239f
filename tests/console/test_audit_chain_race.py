"""Concurrent writers to one hash chain, with real threads (one connection each) against
PostgreSQL, where the chain head's row lock is real: they still form one unbroken chain."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from console.lib import audit
from console.lib.transitions import record_event, transition
from console.models import Event, EventChainHead
from ledger.models import Operation, OperationStatus
from tests.factories import make_operation

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="needs PostgreSQL row locks"),
    pytest.mark.timeout(120),
]

THREADS, EACH = 8, 25


def run_all(work) -> list[BaseException]:
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            start.wait(timeout=30)
            work(index)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not any(thread.is_alive() for thread in threads)
    return errors


def test_concurrent_writers_to_one_tenant_form_one_unbroken_chain(agent, tenant):
    before = Event.objects.filter(tenant=tenant).count()

    def work(index: int) -> None:
        for n in range(EACH):
            with transaction.atomic():
                record_event(entity="task", entity_id=f"t{index}-{n}", tenant_id=tenant.pk,
                             kind=Event.Kind.CREATED, to_status="running", actor=f"agent:{index}")

    assert run_all(work) == []
    seqs = list(Event.objects.filter(tenant=tenant).order_by("chain_seq").values_list("chain_seq", flat=True))
    assert seqs == list(range(1, before + THREADS * EACH + 1))
    assert audit.verify_chain(tenant.pk) is None


def test_concurrent_transitions_and_rolled_back_writers_leave_the_chain_whole(agent, tenant):
    operations = [make_operation(agent) for _ in range(THREADS)]

    def work(index: int) -> None:
        operation = Operation.objects.get(pk=operations[index].pk)
        transition(operation, to=OperationStatus.AUTHORIZED, actor="user:r")
        for n in range(EACH):
            try:
                with transaction.atomic():
                    record_event(entity="task", entity_id=f"t{index}-{n}", tenant_id=tenant.pk,
                                 kind=Event.Kind.CREATED, to_status="running", actor=f"agent:{index}")
                    if n % 3 == 0:
                        raise RuntimeError("rolled back")  # its chain place goes back to the next writer
            except RuntimeError:
                pass

    assert run_all(work) == []
    assert audit.verify_chain(tenant.pk) is None
    written = sum(1 for n in range(EACH) if n % 3)
    assert Event.objects.filter(tenant=tenant, entity_id__regex=r"^t[0-9]+-[0-9]+$").count() == THREADS * written


def _waiting_for_locks() -> int:
    """Backends waiting for a lock now (pg_locks is read afresh on every query, unlike the
    statistics views, whose snapshot is kept for the rest of a transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted")
        return cursor.fetchone()[0]


def test_two_writers_to_two_chains_in_opposite_orders_both_commit(agent, tenant, other_tenant):
    """Each writer's events of two tenants are sealed at its commit, one chain head lock each. In
    the order they were written, writer 1 would hold A's head and wait for B's while writer 2
    holds B's and waits for A's: a deadlock, one commit refused. The main thread holds both heads
    until both writers wait at commit, so they start sealing together."""
    for tenant_id in (tenant.pk, other_tenant.pk):  # both heads exist
        record_event(entity="task", entity_id="genesis", tenant_id=tenant_id, kind=Event.Kind.CREATED,
                     to_status="running", actor="agent:0")
    orders = [(tenant.pk, other_tenant.pk), (other_tenant.pk, tenant.pk)]
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        try:
            with transaction.atomic():
                for tenant_id in orders[index]:
                    record_event(entity="task", entity_id=f"w{index}-{tenant_id}", tenant_id=tenant_id,
                                 kind=Event.Kind.CREATED, to_status="running", actor=f"agent:{index}")
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    with transaction.atomic():
        list(EventChainHead.objects.select_for_update().order_by("chain"))
        for thread in threads:
            thread.start()
        while _waiting_for_locks() < 2:
            assert all(thread.is_alive() for thread in threads), errors
            threading.Event().wait(0.05)
    for thread in threads:
        thread.join(timeout=60)

    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    for tenant_id in (tenant.pk, other_tenant.pk):
        assert Event.objects.filter(tenant_id=tenant_id, entity_id__startswith="w").count() == 2
        assert audit.verify_chain(tenant_id) is None
