"""The dashboard page: indicators of the user's tenants, filters, cost per success, gates."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from console.models import Role
from runs.defaults import ensure_release_gates
from runs.models import ModelPrice, Span, Task, TaskStatus
from tests.conftest import make_user
from tests.factories import make_task

pytestmark = pytest.mark.django_db


def test_the_dashboard_shows_cost_per_success_and_the_gates(client, agent, tenant):
    client.force_login(make_user("viewer", tenant, Role.REVIEWER, max_tier=3))
    ensure_release_gates()
    ModelPrice.objects.create(model="gpt-x", input_per_million=Decimal("3"), output_per_million=Decimal("15"),
                              currency="EUR", valid_from=timezone.now() - timedelta(days=1))
    task = make_task(agent)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.SUCCEEDED)
    now = timezone.now()
    Span.objects.create(tenant_id=task.tenant_id, trace_id="c" * 32, span_id="00000000000000c1", name="chat",
                        start_time=now, end_time=now, duration_ms=1, task=task, gen_ai_model="gpt-x",
                        input_tokens=10_000, output_tokens=1_000)
    body = client.get("/dashboard/", {"window": "1h"}).content.decode()
    assert '<span id="cost-per-success">EUR 0.0450</span>' in body  # 0.03 + 0.015
    assert "Zero duplicate side effects" in body
    assert 'id="ops-chart-data"' in body and 'id="rates-chart"' in body
    body = client.get("/dashboard/", {"type": "no-such-type"}).content.decode()
    assert '<span id="cost-per-success">—</span>' in body


def test_anonymous_visitors_are_sent_to_log_in(client):
    response = client.get("/dashboard/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
