"""/metrics is an operator's view of every tenant's counters: only the bearer token opens it."""

from __future__ import annotations

import pytest

from ledger.models import OperationStatus
from tests.conftest import AGENT_TOKEN
from tests.factories import make_operation

pytestmark = pytest.mark.django_db


def test_without_a_token_configured_metrics_are_off_even_on_loopback(client, agent, settings):
    settings.METRICS_TOKEN = ""
    # Behind a reverse proxy on the same machine every request comes from loopback.
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 403
    assert b"METRICS_TOKEN" in response.content and b"countersign_" not in response.content


def test_only_the_right_bearer_token_opens_metrics(client, agent, settings):
    make_operation(agent, status=OperationStatus.CONFIRMED)
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 401
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    response = client.get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer s3cret")
    assert response.status_code == 200
    assert 'countersign_operations{status="confirmed",tool="payments.refund"} 1.0' in response.content.decode()


def test_a_tenants_person_or_agent_cannot_read_every_tenants_counters(client, agent, reviewer, settings):
    settings.METRICS_TOKEN = "s3cret"
    client.force_login(reviewer)
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}").status_code == 401
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
