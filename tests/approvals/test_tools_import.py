"""`manage.py tools_import openapi`: tools from the payments sandbox's own /openapi.json, served
by a real sandbox process — named <prefix>.<operationId>, disabled until enabled, kinds, tiers,
idempotency and the status query as the document says."""

from __future__ import annotations

import json
from io import StringIO

import httpx
import pytest
from django.core.management import CommandError, call_command

from approvals.models import Tool
from tests.conftest import make_agent

NAMES = {"pay.createRefund", "pay.getRefundByKey", "pay.getRefund", "pay.getOrder"}


def run(*args: str) -> str:
    out = StringIO()
    call_command("tools_import", *args, stdout=out, stderr=out)
    return out.getvalue()


@pytest.fixture
def openapi_url(payments_url) -> str:
    return payments_url + "/openapi.json"


def imported() -> dict[str, Tool]:
    return {tool.name: tool for tool in Tool.objects.filter(name__startswith="pay.")}


def test_it_creates_one_disabled_tool_per_operation_as_the_document_says(db, openapi_url, payments_url):
    output = run("openapi", openapi_url, "--prefix", "pay")
    tools = imported()
    assert set(tools) == NAMES
    assert not any(tool.enabled for tool in tools.values())
    assert "disabled until an administrator enables them" in output

    refund = tools["pay.createRefund"]
    assert (refund.adapter, refund.kind, refund.base_tier, refund.idempotency, refund.key_header) == (
        "http", "write", 2, "native", "Idempotency-Key")
    assert (refund.http_method, refund.http_url) == ("POST", payments_url + "/refunds")
    assert refund.json_schema["required"] == ["order_id", "amount", "currency", "reason"]
    assert set(refund.json_schema["properties"]) == {"order_id", "amount", "currency", "reason"}
    assert refund.json_schema["additionalProperties"] is False
    assert refund.status_query == {
        "url": payments_url + "/refunds/by-key/{key}",
        "found": {"status": 200, "field": "state", "equals": ["succeeded"]},
        "processing": {"status": 200, "field": "state", "equals": ["processing"]},
        "absent": {"status": [404]},
        "object": "refund",
    }
    assert refund.receipt_fields["remote_id"] == "id"

    order = tools["pay.getOrder"]
    assert (order.kind, order.base_tier, order.idempotency, order.status_query) == ("read", 1, "none", {})
    assert order.http_url == payments_url + "/orders/{order_id}" and order.json_schema["required"] == ["order_id"]


def test_tier_sets_every_imported_tools_base_tier(db, openapi_url):
    run("openapi", openapi_url, "--prefix", "pay", "--tier", "3")
    assert {tool.base_tier for tool in imported().values()} == {3}


def test_enable_allows_them_for_the_only_tenants_agents(policy, tenant, openapi_url):
    agent = make_agent(tenant, "a1", "token-a1")
    run("openapi", openapi_url, "--prefix", "pay", "--enable")
    tools = imported()
    assert all(tool.enabled for tool in tools.values())
    assert set(agent.allowed_tools.filter(name__startswith="pay.").values_list("name", flat=True)) == NAMES


def test_enable_with_several_tenants_needs_tenant(policy, tenant, other_tenant, openapi_url):
    mine, theirs = make_agent(tenant, "a1", "t-a1"), make_agent(other_tenant, "b1", "t-b1")
    with pytest.raises(CommandError, match="--tenant"):
        run("openapi", openapi_url, "--prefix", "pay", "--enable")
    assert not imported()  # refused before anything was written
    run("openapi", openapi_url, "--prefix", "pay", "--enable", "--tenant", other_tenant.slug)
    assert theirs.allowed_tools.filter(name="pay.createRefund").exists()
    assert not mine.allowed_tools.filter(name="pay.createRefund").exists()


def test_importing_again_keeps_versions_and_enabled_and_a_changed_shape_bumps_the_version(db, openapi_url,
                                                                                         payments_url):
    run("openapi", openapi_url, "--prefix", "pay")
    Tool.objects.filter(name="pay.getOrder").update(enabled=True)
    Tool.objects.filter(name="pay.createRefund").update(http_url=payments_url + "/v0/refunds")
    run("openapi", openapi_url, "--prefix", "pay")
    tools = imported()
    assert tools["pay.getOrder"].enabled is True and tools["pay.getOrder"].schema_version == 1
    assert tools["pay.createRefund"].schema_version == 2  # the document's URL came back: another request


def test_a_file_whose_servers_are_relative_needs_base_url(db, tmp_path, openapi_url, payments_url):
    path = tmp_path / "payments.json"
    path.write_text(json.dumps(httpx.get(openapi_url).json()))
    with pytest.raises(CommandError, match="--base-url"):
        run("openapi", str(path), "--prefix", "pay")
    run("openapi", str(path), "--prefix", "pay", "--base-url", payments_url)
    assert imported()["pay.getOrder"].http_url == payments_url + "/orders/{order_id}"


def test_an_unreadable_source_is_a_command_error(db, free_port):
    with pytest.raises(CommandError, match="Cannot fetch"):
        run("openapi", f"http://127.0.0.1:{free_port}/openapi.json", "--prefix", "pay")
    with pytest.raises(CommandError, match="Cannot read"):
        run("openapi", "/nonexistent/openapi.json", "--prefix", "pay")
    assert not imported()
