"""Concurrent writers to one hash chain, with real threads (one connection each) against
PostgreSQL, where the chain head's row lock is real: they still form one unbroken chain."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from console.lib import audit
from console.lib.transitions import record_event, transition
from console.models import Event
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
