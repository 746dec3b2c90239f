"""An MCP tool's configuration: typed into the admin's add form, checked as a whole, and a
change of its server or tool name is a new schema version."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from approvals.models import Tool
from approvals.tools import tool_save
from tests.fixtures.tools import admin_form_data, ticket_tool_fields

SERVER = "https://tools.example.com/mcp"


def mcp_fields(**overrides) -> dict:
    """The ticket tool's policy fields, sent to an MCP server's tool instead of a URL."""
    fields = ticket_tool_fields("https://unused.example.com", name="notes.create_note", adapter="mcp",
                                mcp_server=SERVER, mcp_tool="create_note", idempotency=Tool.Idempotency.NONE,
                                credential_ref="NOTES_TOKEN")
    for name in ("http_method", "http_url", "http_headers", "key_header", "status_query"):
        fields.pop(name)
    fields.update(overrides)
    return fields


@pytest.fixture
def admin_client(client, db):
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


def test_the_admin_form_saves_an_mcp_tool(admin_client):
    response = admin_client.post("/admin/approvals/tool/add/", admin_form_data(mcp_fields()))
    assert response.status_code == 302, response.context["adminform"].form.errors
    tool = Tool.objects.get(name="notes.create_note")
    assert (tool.adapter, tool.mcp_server, tool.mcp_tool, tool.credential_ref) == (
        "mcp", SERVER, "create_note", "NOTES_TOKEN")


def test_the_admin_form_refuses_an_mcp_tool_without_its_tool_name(admin_client):
    response = admin_client.post("/admin/approvals/tool/add/", admin_form_data(mcp_fields(mcp_tool="")))
    assert response.status_code == 200
    assert "mcp_tool" in response.context["adminform"].form.errors
    assert not Tool.objects.filter(name="notes.create_note").exists()


def test_the_admin_form_refuses_a_url_template_on_an_mcp_tool(admin_client):
    fields = mcp_fields(http_method="POST", http_url="https://api.example.com/notes")
    response = admin_client.post("/admin/approvals/tool/add/", admin_form_data(fields))
    assert response.status_code == 200
    assert not Tool.objects.filter(name="notes.create_note").exists()


@pytest.mark.parametrize("change", [{"mcp_server": "https://other.example.com/mcp"}, {"mcp_tool": "create_draft"}])
def test_another_server_or_tool_name_is_a_new_schema_version(db, change):
    tool = tool_save(tool=Tool(**mcp_fields()))
    assert tool.schema_version == 1
    for name, value in change.items():
        setattr(tool, name, value)
    assert tool_save(tool=tool).schema_version == 2
