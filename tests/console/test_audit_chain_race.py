"""Concurrent writers to one hash chain, and sealers beside them, with real threads (one
connection each) against PostgreSQL, where the chain head's row lock is real: they still form one
unbroken chain, and no writer's commit waits for a chain head."""

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


def run_all(work, *, sealers: int = 2) -> list[BaseException]:
    """`work(index)` on THREADS threads at once, with `sealers` threads sealing all along (as
    beat's runs may overlap), and a last sealing after them."""
    start = threading.Barrier(THREADS + sealers)
    writing = threading.Event()
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            start.wait(timeout=30)
            work(index)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)
        finally:
            connection.close()

    def sealer() -> None:
        try:
            start.wait(timeout=30)
            while writing.is_set():
                audit.seal_pending(batch=7)  # small batches: many sealings interleave with the writers
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    writing.set()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    sealing = [threading.Thread(target=sealer) for _ in range(sealers)]
    for thread in threads + sealing:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    writing.clear()
    for thread in sealing:
        thread.join(timeout=90)
    assert not any(thread.is_alive() for thread in threads + sealing)
    audit.seal_pending()
    return errors


def test_concurrent_writers_to_one_tenant_form_one_unbroken_chain(agent, tenant):
    before = Event.objects.filter(tenant=tenant).count()

    def work(index: int) -> None:
        for n in range(EACH):
            with transaction.atomic():
                record_event(entity="task", entity_id=f"t{index}-{n}", tenant_id=tenant.pk,
                             kind=Event.Kind.CREATED, to_status="running", actor=f"agent:{index}")

    assert run_all(work) == []
    assert not Event.objects.filter(chain_seq__isnull=True).exists()
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
                        raise RuntimeError("rolled back")  # never committed, never sealed
            except RuntimeError:
                pass

    assert run_all(work) == []
    assert audit.verify_chain(tenant.pk) is None
    written = sum(1 for n in range(EACH) if n % 3)
    assert Event.objects.filter(tenant=tenant, entity_id__regex=r"^t[0-9]+-[0-9]+$").count() == THREADS * written


def test_no_writers_commit_waits_for_a_chain_head(agent, tenant, other_tenant):
    """Sealed at each writer's commit, a tenant's writers took turns on its chain head through
    each commit's WAL flush (and two writers of two tenants in opposite orders deadlocked). The
    main thread holds both heads, as a sealer would: the writers, each writing to both chains,
    commit all the same (a writer that waited for a head would fail at its lock timeout)."""
    for tenant_id in (tenant.pk, other_tenant.pk):  # both heads exist
        record_event(entity="task", entity_id="genesis", tenant_id=tenant_id, kind=Event.Kind.CREATED,
                     to_status="running", actor="agent:0")
    audit.seal_pending()
    orders = [(tenant.pk, other_tenant.pk), (other_tenant.pk, tenant.pk)]
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '10s'")
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
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        assert Event.objects.filter(entity_id__startswith="w", chain_seq__isnull=True).count() == 4
    assert audit.seal_pending() == 4
    for tenant_id in (tenant.pk, other_tenant.pk):
        assert audit.verify_chain(tenant_id) is None
