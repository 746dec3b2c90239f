"""GET /api/v1/tools: the tools this agent may call, with their JSON schemas (what a framework
binds to a model)."""

from __future__ import annotations

import pytest

from approvals.models import Tool
from tests.fixtures.api import assert_error

URL = "/api/v1/tools"


def test_it_lists_the_tools_the_agent_may_call_with_their_schemas(api, agent):
    response = api.get(URL)
    assert response.status_code == 200, response.content
    tools = {tool["name"]: tool for tool in response.json()["tools"]}
    allowed = set(agent.allowed_tools.filter(enabled=True).values_list("name", flat=True))
    assert set(tools) == allowed and "payments.refund" in tools
    refund = tools["payments.refund"]
    model = Tool.objects.get(name="payments.refund")
    assert refund == {
        "name": "payments.refund", "description": model.description, "input_schema": model.json_schema,
        "kind": "write", "base_tier": 1, "idempotency": "native", "schema_version": model.schema_version,
    }
    assert list(tools) == sorted(tools)


def test_a_tool_not_allowed_or_disabled_is_not_listed(api, agent, policy):
    agent.allowed_tools.remove(policy["payments.refund"])
    Tool.objects.filter(name="mail.send").update(enabled=False)
    names = {tool["name"] for tool in api.get(URL).json()["tools"]}
    assert "payments.refund" not in names and "mail.send" not in names
    assert "orders.lookup" in names


def test_another_tenants_agent_sees_its_own_allowances(outsider_api, outsider_agent):
    outsider_agent.allowed_tools.clear()
    assert outsider_api.get(URL).json()["tools"] == []


@pytest.mark.django_db
def test_it_needs_a_token(anonymous_api):
    assert_error(anonymous_api.get(URL), 401, "unauthenticated")
