"""approvals.tools: a tool's configuration checked where it is saved, and the schema version
bumped by a change of the schema or of the request's shape — whoever saves."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from approvals.models import Tool
from approvals.tools import tool_config_errors, tool_save, tools_enable
from console.lib.errors import InvalidInput
from tests.conftest import make_agent
from tests.fixtures.tools import admin_form_data, ticket_tool_fields

BASE = "https://tickets.example.com"


def ticket_tool(**overrides) -> Tool:
    return Tool(**ticket_tool_fields(BASE, **overrides))


def test_a_complete_http_tool_has_no_errors(db):
    assert tool_config_errors(ticket_tool()) == {}


@pytest.mark.parametrize(("overrides", "field", "words"), [
    ({"http_url": BASE + "/queues/{queue}/tickets?assignee={assignee}"}, "http_url", "'assignee', which the schema lacks"),
    ({"http_url": "https://{queue}.example.com/tickets"}, "http_url", "not in the host"),
    ({"http_url": BASE + "/{priority}/x"}, "http_url", "must require it"),
    ({"http_url": "ftp://tickets.example.com/x"}, "http_url", "http://"),
    ({"http_url": BASE + "/queues/{queue-id}"}, "http_url", "not a placeholder"),
    ({"http_method": ""}, "http_method", "needs a method"),
    ({"http_headers": {"X-Evil": "a\r\nInjected: yes"}}, "http_headers", "one line"),
    ({"http_headers": {"Host": "other.example.com"}}, "http_headers", "set by Countersign"),
    ({"credential_ref": "sk_live_51Habc"}, "credential_ref", "never the secret itself"),
    ({"key_header": ""}, "key_header", "Native idempotency needs"),
    ({"status_query": {"url": BASE + "/tickets/{queue}", "found": {"status": 200}, "absent": {"status": 404}}},
     "status_query", "{key}"),
    ({"status_query": {"url": BASE + "/t/{key}", "found": {"status": 200}}}, "status_query", "absent"),
    ({"status_query": {"url": BASE + "/t/{key}", "found": {"status": "ok"}, "absent": {"status": 404}}},
     "status_query", "status code"),
    ({"receipt_fields": {"remote_id": "ticket id"}}, "receipt_fields", "dotted.path"),
    ({"json_schema": {"type": "objekt"}}, "json_schema", "Not a valid JSON Schema"),
])
def test_a_bad_configuration_is_refused_on_the_field_it_is_about(db, overrides, field, words):
    errors = tool_config_errors(ticket_tool(**overrides))
    assert any(words in message for message in errors.get(field, [])), errors


def test_an_argument_that_is_an_object_cannot_go_into_the_url(db):
    schema = {"type": "object", "properties": {"filter": {"type": "object"}}, "required": ["filter"]}
    errors = tool_config_errors(ticket_tool(json_schema=schema, http_url=BASE + "/search?f={filter}"))
    assert any("cannot go into a URL" in m for m in errors["http_url"])


def test_tool_save_refuses_an_invalid_configuration_and_writes_nothing(db):
    with pytest.raises(InvalidInput) as caught:
        tool_save(tool=ticket_tool(http_url=BASE + "/{nope}"))
    assert "http_url" in caught.value.details
    assert not Tool.objects.filter(name="tickets.create").exists()


SHAPE_CHANGES = {
    "the schema": {"json_schema": {**ticket_tool_fields(BASE)["json_schema"], "maxProperties": 4}},
    "the method": {"http_method": "PUT"},
    "the URL": {"http_url": BASE + "/v2/queues/{queue}/tickets"},
    "a static header": {"http_headers": {"X-Api-Version": "2025-01-01"}},
    "the key's header": {"key_header": "X-Request-Id"},
}


@pytest.mark.parametrize("change", SHAPE_CHANGES.values(), ids=SHAPE_CHANGES.keys())
def test_a_change_of_schema_or_request_shape_bumps_the_schema_version(db, change):
    tool = tool_save(tool=ticket_tool())
    assert tool.schema_version == 1
    for name, value in change.items():
        setattr(tool, name, value)
    tool_save(tool=tool)
    assert Tool.objects.get(pk=tool.pk).schema_version == 2


def test_what_does_not_change_the_call_keeps_the_schema_version(db):
    tool = tool_save(tool=ticket_tool())
    tool.description = "Open a ticket in a queue."
    tool.base_tier = 2
    tool.receipt_fields = {"remote_id": "ticket.id"}
    tool.status_query = {}
    tool.credential_ref = "OTHER_TOKEN"
    tool_save(tool=tool)
    assert Tool.objects.get(pk=tool.pk).schema_version == 1


def test_a_stale_copy_cannot_lower_the_schema_version(db):
    tool = tool_save(tool=ticket_tool())
    Tool.objects.filter(pk=tool.pk).update(schema_version=7)
    tool.description = "stale copy, version 1 in memory"
    tool_save(tool=tool)
    assert Tool.objects.get(pk=tool.pk).schema_version == 7


def test_tools_enable_enables_and_allows_them_for_the_tenants_agents_only(policy, tenant, other_tenant):
    mine = make_agent(tenant, "mine", "token-mine")
    theirs = make_agent(other_tenant, "theirs", "token-theirs")
    tool = tool_save(tool=ticket_tool(enabled=False))
    tools_enable(tools=[tool], tenant=tenant)
    assert Tool.objects.get(pk=tool.pk).enabled is True
    assert mine.allowed_tools.filter(pk=tool.pk).exists()
    assert not theirs.allowed_tools.filter(pk=tool.pk).exists()


# -- the admin form ------------------------------------------------------------------------------

@pytest.fixture
def admin_client(client, db):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


def test_the_admin_form_rejects_a_template_naming_an_argument_the_schema_lacks(admin_client):
    fields = ticket_tool_fields(BASE, http_url=BASE + "/queues/{queue}/tickets?assignee={assignee}")
    response = admin_client.post("/admin/approvals/tool/add/", admin_form_data(fields))
    assert response.status_code == 200  # the form again, with its errors
    errors = response.context["adminform"].form.errors
    assert "'assignee', which the schema lacks" in " ".join(errors["http_url"])
    assert not Tool.objects.filter(name="tickets.create").exists()


def test_the_admin_form_saves_a_valid_tool_and_a_schema_edit_bumps_its_version(admin_client):
    fields = ticket_tool_fields(BASE)
    response = admin_client.post("/admin/approvals/tool/add/", admin_form_data(fields))
    assert response.status_code == 302, response.context["adminform"].form.errors
    tool = Tool.objects.get(name="tickets.create")
    assert (tool.adapter, tool.http_method, tool.key_header, tool.schema_version) == ("http", "POST", "Idempotency-Key", 1)

    schema = {**fields["json_schema"], "properties": {**fields["json_schema"]["properties"],
                                                      "due": {"type": "string", "format": "date"}}}
    # The form also posts a schema_version of its own choosing: it is not a field of the form.
    response = admin_client.post(f"/admin/approvals/tool/{tool.pk}/change/",
                                 {**admin_form_data({**fields, "json_schema": schema}), "schema_version": "1"})
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Tool.objects.get(pk=tool.pk).schema_version == 2


def test_the_admin_shows_the_credentials_name_never_a_value(admin_client, monkeypatch):
    monkeypatch.setenv("TICKETS_API_TOKEN", "s3cret-value-in-the-environment")
    tool = tool_save(tool=ticket_tool())
    page = admin_client.get(f"/admin/approvals/tool/{tool.pk}/change/").content.decode()
    assert "TICKETS_API_TOKEN" in page
    assert "s3cret-value-in-the-environment" not in page


def test_the_admin_form_refuses_an_adapter_nobody_knows(admin_client):
    response = admin_client.post("/admin/approvals/tool/add/",
                                 admin_form_data(ticket_tool_fields(BASE, adapter="htpp")))
    assert "No adapter 'htpp'" in " ".join(response.context["adminform"].form.errors["adapter"])
