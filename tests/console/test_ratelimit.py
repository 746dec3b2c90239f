"""Per-token and per-tenant request limits on the agent API and OTLP: over the limit is a 429
in the error shape with Retry-After (header and details), counted in a cache every server
process shares (Redis in distributed mode, files under var/ in embedded mode)."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.core.cache import caches
from rest_framework.test import APIClient

from console.lib.errors import RateLimited
from console.ratelimit import rate_limit_hit, rate_limit_reset
from tests.conftest import AGENT_TOKEN, OUTSIDER_TOKEN, make_agent
from tests.runs.test_otlp import otlp_json, post, span_json

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def limits(settings, agent, outsider_agent):
    # Other tests of this run may have counted for the same ids this minute.
    for principal in (agent, outsider_agent):
        rate_limit_reset(principal)
    settings.API_RATE_PER_TOKEN = 3
    settings.API_RATE_PER_TENANT = 5


def api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_a_token_over_its_limit_gets_429_with_retry_after_in_the_error_shape(agent):
    client = api(AGENT_TOKEN)
    for _ in range(3):
        assert client.get("/api/v1/tasks/tsk_missing").status_code == 404
    response = client.get("/api/v1/tasks/tsk_missing")
    assert response.status_code == 429
    body = response.json()["error"]
    assert body["code"] == "rate_limited"
    retry_after = int(response["Retry-After"])
    assert 1 <= retry_after <= 60 and body["details"]["retry_after"] == retry_after
    assert body["details"]["scope"] == "token"


def test_the_tenants_limit_covers_all_its_tokens_and_not_other_tenants(agent, outsider_agent, policy):
    second = make_agent(agent.tenant, "second", "second-token")
    rate_limit_reset(second)
    assert second.tenant_id == agent.tenant_id
    for token in (AGENT_TOKEN, AGENT_TOKEN, AGENT_TOKEN, "second-token", "second-token"):
        assert api(token).get("/api/v1/tasks/tsk_missing").status_code == 404
    response = api("second-token").get("/api/v1/tasks/tsk_missing")
    assert (response.status_code, response.json()["error"]["details"]["scope"]) == (429, "tenant")
    assert api(OUTSIDER_TOKEN).get("/api/v1/tasks/tsk_missing").status_code == 404


def test_otlp_counts_against_the_same_limits(client, agent):
    for n in range(3):
        assert post(client, otlp_json(span_json(f"{0x1000 + n:016x}"))).status_code == 200
    response = post(client, otlp_json(span_json("0000000000002000")))
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited" and int(response["Retry-After"]) >= 1


def test_a_limit_of_zero_is_no_limit(agent, settings):
    settings.API_RATE_PER_TOKEN = settings.API_RATE_PER_TENANT = 0
    client = api(AGENT_TOKEN)
    assert all(client.get("/api/v1/tasks/tsk_missing").status_code == 404 for _ in range(10))


def test_the_counters_live_in_a_cache_that_server_processes_share(settings):
    """Redis when there is one; embedded mode has one server process, whose memory is exact and
    costs nothing (a file cache wrote and renamed two files on every agent request)."""
    backend = settings.CACHES["ratelimit"]["BACKEND"]
    if settings.RATE_LIMIT_CACHE_URL:
        assert backend == "django.core.cache.backends.redis.RedisCache"
    else:
        assert settings.EMBEDDED and backend == "django.core.cache.backends.locmem.LocMemCache"


def test_an_administrator_sets_a_tenants_and_a_tokens_own_limit(agent, outsider_agent, settings):
    settings.API_RATE_PER_TOKEN = settings.API_RATE_PER_TENANT = 1000
    agent.tenant.api_rate_per_minute = 2
    agent.tenant.save()
    client = api(AGENT_TOKEN)
    assert [client.get("/api/v1/tasks/tsk_missing").status_code for _ in range(3)] == [404, 404, 429]
    outsider_agent.api_rate_per_minute = 1
    outsider_agent.save()
    client = api(OUTSIDER_TOKEN)
    response = [client.get("/api/v1/tasks/tsk_missing") for _ in range(2)][-1]
    assert (response.status_code, response.json()["error"]["details"]["scope"]) == (429, "token")


def test_the_limits_are_fields_of_the_admins_tenant_and_agent_forms(client, agent, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@acme.test", "pw")
    client.force_login(admin)
    for url in (f"/admin/console/tenant/{agent.tenant_id}/change/", f"/admin/console/agentprincipal/{agent.pk}/change/"):
        assert 'name="api_rate_per_minute"' in client.get(url).content.decode()


@pytest.mark.skipif(not settings.RATE_LIMIT_CACHE_URL, reason="the counters are in Redis only with a Redis URL")
def test_a_request_counts_its_token_and_tenant_in_one_round_trip_to_redis(agent, monkeypatch):
    from redis.connection import Connection

    sent = []
    send = Connection.send_packed_command

    def counted(self, command, check_health=True):
        sent.append(command)
        return send(self, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", counted)
    rate_limit_hit(agent)
    rate_limit_hit(agent)
    assert len(sent) == 2
    # The window's keys expire: a count never outlives two windows.
    window = int(time.time() // 60)
    cache = caches["ratelimit"]
    assert cache.get(f"token:{agent.pk}:{window}") in (2, None)  # None: the minute turned
    import redis

    client = redis.Redis.from_url(settings.CACHES["ratelimit"]["LOCATION"])
    ttls = [client.ttl(cache.make_and_validate_key(f"{scope}:{ident}:{window}"))
            for scope, ident in (("token", agent.pk), ("tenant", agent.tenant_id))]
    client.close()
    assert all(0 < ttl <= 120 or ttl == -2 for ttl in ttls), ttls  # -2: gone, the minute turned


def test_a_request_over_its_tokens_limit_does_not_count_against_its_tenant(agent, settings):
    settings.API_RATE_PER_TENANT = 100
    for _ in range(3):
        rate_limit_hit(agent)
    with pytest.raises(RateLimited):
        rate_limit_hit(agent)
    window = int(time.time() // 60)
    assert caches["ratelimit"].get(f"tenant:{agent.tenant_id}:{window}") in (3, None)  # None: the minute turned
