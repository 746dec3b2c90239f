"""The tool page: a tool's configuration (secrets left out), its tier rules, its use in the
viewer's tenants; and where calls go, named on the run, approval and operation pages."""

from __future__ import annotations

import pytest
from django.urls import reverse

from approvals.models import Tool
from approvals.tools import tool_save, upstream_of
from console.models import Role
from tests.conftest import make_user
from tests.factories import make_operation, make_pending_approval
from tests.fixtures.tools import ticket_tool_fields

pytestmark = pytest.mark.django_db

SECRET = "s3cr3t-value-never-shown"


def tool_url(name: str) -> str:
    return reverse("tools:detail", args=[name])


@pytest.fixture
def ticket_tool(policy, agent, outsider_agent, monkeypatch):
    monkeypatch.setenv("TICKETS_API_TOKEN", SECRET)
    tool = tool_save(tool=Tool(**ticket_tool_fields(
        "https://tickets.example.com:8443", http_headers={"X-Api-Version": "2024-06-01", "X-Team-Key": SECRET})))
    agent.allowed_tools.add(tool)
    outsider_agent.allowed_tools.add(tool)
    return tool


@pytest.fixture
def mcp_tool(policy):
    return tool_save(tool=Tool(
        name="notes.create_note", adapter="mcp", json_schema={"type": "object", "properties": {}},
        mcp_server="https://user:pw@notes.example.com/mcp?token=abc", mcp_tool="create_note",
        credential_ref="NOTES_TOKEN"))


def test_it_shows_an_http_tools_configuration_without_any_secret_value(client, reviewer, ticket_tool):
    client.force_login(reviewer)

    response = client.get(tool_url("tickets.create"))

    body = response.content.decode()
    assert response.status_code == 200
    assert SECRET not in body
    for shown in ("https://tickets.example.com:8443/queues/{queue}/tickets?priority={priority}",
                  "header Idempotency-Key", "$TICKETS_API_TOKEN", "tickets/by-key/{key}", "ticket.id",
                  "rate_limited, unavailable, connect", "5 s", "2024-06-01", "X-Team-Key",
                  "tickets.example.com:8443", "maxLength&quot;: 200"):
        assert shown in body, shown


def test_it_shows_an_mcp_tools_server_and_tool_name_without_the_urls_credentials(client, reviewer, mcp_tool):
    client.force_login(reviewer)

    body = client.get(tool_url("notes.create_note")).content.decode()

    assert "https://notes.example.com/mcp" in body
    assert "create_note" in body and "NOTES_TOKEN" in body
    assert "pw@" not in body and "token=abc" not in body


def test_it_shows_the_tier_rules_and_which_of_my_tenants_allow_the_tool(client, reviewer, agent, outsider_agent):
    client.force_login(reviewer)

    response = client.get(tool_url("payments.refund"))

    body = response.content.decode()
    assert "amount &gt; 200" in body or "amount > 200" in body
    assert "Two approvals" in body
    tenants = [use.tenant.slug for use in response.context["tenant_uses"]]
    assert tenants == ["acme"]  # globex also allows it, but the reviewer is not in globex
    assert response.context["tenant_uses"][0].agents == ["agent"]


def test_recent_operations_are_those_of_my_tenants_and_link_to_their_pages(client, reviewer, agent, outsider_agent):
    mine = make_operation(agent)
    theirs = make_operation(outsider_agent)
    client.force_login(reviewer)

    body = client.get(tool_url("payments.refund")).content.decode()

    assert reverse("operations:detail", args=[mine.operation_id]) in body
    assert theirs.operation_id not in body


def test_agents_anonymous_visitors_and_people_without_a_tenant_are_refused(client, policy, agent):
    from tests.conftest import AGENT_TOKEN

    assert client.get(tool_url("payments.refund")).status_code == 302
    assert client.get(tool_url("payments.refund"), HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}").status_code == 302
    client.force_login(make_user("nobody", None))
    assert client.get(tool_url("payments.refund")).status_code == 404


def test_an_unknown_tool_is_a_404(client, reviewer, policy):
    client.force_login(reviewer)

    assert client.get(tool_url("no.such.tool")).status_code == 404


# -------------------------------------------------------------------- where a call goes


def test_upstream_names_the_host_the_mcp_server_or_built_in(ticket_tool, mcp_tool, policy):
    stdio = Tool(name="x", adapter="mcp", mcp_server="uvx notes-server --db /tmp/n.db", mcp_tool="n")

    assert upstream_of(ticket_tool) == "tickets.example.com:8443"
    assert upstream_of(mcp_tool) == "https://notes.example.com/mcp"
    assert upstream_of(stdio) == "uvx notes-server --db /tmp/n.db"
    assert upstream_of(policy["payments.refund"]) == "built-in"


def test_the_approval_page_says_where_the_call_goes_and_links_the_tool(client, agent, ticket_tool):
    approval = make_pending_approval(agent, tool_name="tickets.create",
                                     arguments={"queue": "billing", "title": "Refund"}, risk_tier=2)
    client.force_login(make_user("rev", agent.tenant, Role.REVIEWER, max_tier=3))

    response = client.get(reverse("approvals:detail", args=[approval.approval_id]))

    assert response.status_code == 200
    body = response.content.decode()
    assert 'id="upstream"><span class="mono">tickets.example.com:8443</span>' in body
    assert tool_url("tickets.create") in body


def test_the_run_page_says_where_each_call_goes_and_links_the_tool(client, reviewer, agent, mcp_tool):
    refund = make_operation(agent)
    note = make_operation(agent, "notes.create_note", arguments={}, task=refund.task)
    client.force_login(reviewer)

    response = client.get(reverse("runs:detail", args=[refund.task_id]))

    body = response.content.decode()
    row_of = {op: body.split(f'id="run-op-{op.operation_id}"')[1].split("</tr>")[0] for op in (refund, note)}
    assert "<td class=\"mono small\" data-upstream>built-in</td>" in row_of[refund]
    assert "https://notes.example.com/mcp" in row_of[note]
    assert tool_url("notes.create_note") in row_of[note]


def test_the_operation_page_links_the_tool_and_says_where_it_went(client, reviewer, agent):
    operation = make_operation(agent)
    client.force_login(reviewer)

    body = client.get(reverse("operations:detail", args=[operation.operation_id])).content.decode()

    assert tool_url("payments.refund") in body
    assert "Goes to <span class=\"mono\">built-in</span>" in body
