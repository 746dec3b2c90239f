"""bench/sealing.py's prototype sealer: the comparison is only worth its figures if the batched
sealer leaves chains that `audit_verify`'s check finds whole, as the trigger does, also when the
two take turns on one database (the bench alternates them)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from bench import sealing
from console.lib import audit
from console.lib.transitions import record_event
from console.models import Event, Tenant
from tests.bench.test_floor import url as database_url

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the sealing trigger under test is PostgreSQL's"),
]


@pytest.fixture
def url():
    link = database_url()
    yield link
    sealing.set_mode(link, batched=False)  # the trigger back on for the tests that follow


def write(tenants, count: int) -> None:
    for n in range(count):
        for tenant in tenants:
            record_event(entity="operation", entity_id=f"op_{n}", tenant_id=tenant.id if tenant else None,
                         kind=Event.Kind.PROVIDER_ANSWER, to_status="found", actor="bench")


def whole() -> bool:
    return all(audit.verify_chain(chain) is None for chain in audit.chains()) and sealing.verify() == "whole"


def test_the_prototype_sealer_leaves_every_chain_whole(url):
    tenants = [Tenant.objects.create(slug=f"seal-{n}", name=f"Seal {n}") for n in "ab"] + [None]
    write(tenants, 2)  # sealed at commit
    sealing.set_mode(url, batched=True)
    write(tenants, 3)
    assert Event.objects.filter(chain_seq__isnull=True).count() == 9
    assert sealing.verify() == "rows left unsealed"
    with psycopg.connect(url, autocommit=True) as conn:
        assert sealing.seal_pending(conn) == 9
        assert sealing.seal_pending(conn) == 0
    assert whole()
    sealing.set_mode(url, batched=False)
    write(tenants, 1)  # the trigger again, on the heads the sealer moved
    assert not Event.objects.filter(chain_seq__isnull=True).exists()
    assert whole()
