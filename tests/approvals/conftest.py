"""Fixtures of the reviewer console's tests; the records come from tests/factories.py."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalRequest
from tests.factories import make_pending_approval


@pytest.fixture(autouse=True)
def _fresh_cache():
    """The inbox caches its filter choices for a minute; each test starts without them."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def make_approval(agent):
    def factory(**kwargs: Any) -> ApprovalRequest:
        return make_pending_approval(kwargs.pop("agent", agent), **kwargs)

    return factory


@pytest.fixture
def eager_celery():
    """Deliveries run through the real Celery task, in process (countdowns are not waited)."""
    from console.celery import app

    saved = (app.conf.task_always_eager, app.conf.task_eager_propagates)
    app.conf.task_always_eager, app.conf.task_eager_propagates = True, True
    yield app
    app.conf.task_always_eager, app.conf.task_eager_propagates = saved
