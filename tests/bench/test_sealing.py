"""bench/sealing.py puts the old design back (sealing at each writer's commit, the triggers of
migrations 0006 and 0007) beside the product's sealer. Its figures are only worth something if
each mode is what it says, and if switching between them leaves chains `audit_verify`'s check
finds whole (the bench alternates them on one database)."""

from __future__ import annotations

import pytest
from django.db import connection

from bench import sealing
from console.lib import audit
from console.lib.transitions import record_event
from console.models import Event, Tenant
from tests.bench.test_floor import url as database_url

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the sealing under test is PostgreSQL's"),
]


@pytest.fixture
def url():
    link = database_url()
    yield link
    sealing.set_mode(link, at_commit=False)  # the product's sealing for the tests that follow


def write(tenants, count: int) -> None:
    for n in range(count):
        for tenant in tenants:
            record_event(entity="operation", entity_id=f"op_{n}", tenant_id=tenant.id if tenant else None,
                         kind=Event.Kind.PROVIDER_ANSWER, to_status="found", actor="bench")


def whole() -> bool:
    return all(audit.verify_chain(chain) is None for chain in audit.chains()) and sealing.verify() == "whole"


def unsealed() -> int:
    return Event.objects.filter(chain_seq__isnull=True).count()


def test_the_two_modes_take_turns_and_every_chain_stays_whole(url):
    tenants = [Tenant.objects.create(slug=f"seal-{n}", name=f"Seal {n}") for n in "ab"] + [None]
    write(tenants, 2)  # the product: left for the sealer
    assert unsealed() == 6 and sealing.verify() == "rows left unsealed"
    sealing.set_mode(url, at_commit=True)  # seals them, then the triggers
    assert unsealed() == 0
    write(tenants, 3)
    assert unsealed() == 0  # sealed at each commit
    assert whole()
    sealing.set_mode(url, at_commit=False)
    write(tenants, 1)
    assert unsealed() == 3
    assert audit.seal_pending() == 3
    assert whole()
