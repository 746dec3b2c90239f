"""Chaos tests start real workers, beat and sandbox providers against the pytest test database
(children get a DATABASE_URL naming it), and talk to them through a real broker."""

from __future__ import annotations

import pytest
from django.conf import settings

from chaos.stack import ChaosStack, database_url_for


def chaos_broker_url() -> str | None:
    """Redis when the run is configured for it (the distributed mode), else a file-system broker
    of the stack's own."""
    url = settings.CELERY_BROKER_URL
    return url if url.startswith(("redis://", "amqp://")) else None


def start_stack(**kwargs) -> ChaosStack:
    return ChaosStack(database_url=database_url_for(settings.DATABASES["default"]),
                      broker_url=chaos_broker_url(), **kwargs).start()


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        running = start_stack(workers=2)
    yield running
    running.stop()


def pytest_configure(config):
    config.addinivalue_line("markers", "chaos: fault injection with real worker, beat and sandbox processes")
