"""approvals.openapi: what an operation becomes — and which operations are skipped, and why."""

from __future__ import annotations

import pytest

from approvals.models import Tool
from approvals.openapi import OpenApiError, base_url, load, tools_from_document
from approvals.tools import tool_config_errors

BASE = "https://api.example.com/v1"


def document(paths: dict, schemas: dict | None = None, **extra) -> dict:
    return {"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": paths,
            "components": {"schemas": schemas or {}}, **extra}


def one(doc: dict, **kwargs) -> dict:
    result = tools_from_document(doc, prefix="x", base=BASE, **kwargs)
    assert not result.skipped, result.skipped
    [tool] = result.tools
    return tool


def test_path_query_and_body_arguments_sit_side_by_side_in_one_flat_object():
    doc = document({"/items/{item_id}": {
        "parameters": [{"name": "item_id", "in": "path", "required": True, "schema": {"type": "string"}}],
        "put": {"operationId": "putItem",
                "parameters": [{"name": "dry_run", "in": "query", "schema": {"type": "boolean"}}],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Item"}}}},
                "responses": {"200": {"description": "ok"}}}}},
        {"Item": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "nullable": True, "example": "x"}, "tags": {"type": "array",
                                                                                "items": {"$ref": "#/components/schemas/Tag"}}}},
         "Tag": {"type": "string", "maxLength": 20}})
    tool = one(doc)
    assert tool["json_schema"]["properties"] == {
        "item_id": {"type": "string"}, "dry_run": {"type": "boolean"},
        "name": {"type": ["string", "null"]}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}}}
    assert tool["json_schema"]["required"] == ["item_id", "name"]
    # A body method names its query parameters in the URL; the rest is the body.
    assert tool["http_url"] == BASE + "/items/{item_id}?dry_run={dry_run}"
    assert (tool["kind"], tool["base_tier"], tool["idempotency"]) == ("write", 2, "none")
    assert tool_config_errors(Tool(**tool)) == {}


@pytest.mark.parametrize(("operation", "why"), [
    ({"parameters": [{"name": "X-Tenant", "in": "header", "required": True, "schema": {"type": "string"}}]},
     "agents do not send headers"),
    ({"requestBody": {"required": True, "content": {"text/plain": {"schema": {"type": "string"}}}}}, "not JSON"),
    ({"parameters": [{"name": "name", "in": "query", "schema": {"type": "string"}}],
      "requestBody": {"content": {"application/json": {"schema": {"type": "object", "properties": {
          "name": {"type": "string"}}}}}}}, "given twice"),
    ({"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}}},
     "refers to itself"),
    ({"parameters": [{"name": "page[size]", "in": "query", "schema": {"type": "integer"}}]}, "cannot be an argument"),
])
def test_an_operation_it_cannot_express_is_skipped_with_the_reason(operation, why):
    doc = document({"/things": {"post": {"operationId": "makeThing", "responses": {}, **operation}}},
                   {"Node": {"type": "object", "properties": {"child": {"$ref": "#/components/schemas/Node"}}}})
    result = tools_from_document(doc, prefix="x", base=BASE)
    assert result.tools == []
    [(operation_name, reason)] = result.skipped
    assert operation_name.startswith("makeThing") and why in reason


def test_an_operation_without_an_operation_id_is_skipped():
    result = tools_from_document(document({"/a": {"get": {"responses": {}}}}), prefix="x", base=BASE)
    assert result.tools == [] and result.skipped == [("GET /a", "no usable operationId")]


def test_the_base_url_is_the_first_server_relative_to_the_document():
    doc = document({}, servers=[{"url": "/api"}])
    assert base_url(doc, document_url="http://h:8001/openapi.json", override=None) == "http://h:8001/api"
    assert base_url(doc, document_url=None, override="https://other/") == "https://other"
    with pytest.raises(OpenApiError, match="--base-url"):
        base_url(doc, document_url=None, override=None)


def test_only_openapi_3_documents_are_read():
    with pytest.raises(OpenApiError, match="OpenAPI 3"):
        load('{"swagger": "2.0"}')
    assert load("openapi: 3.1.0\npaths: {}\n")["openapi"] == "3.1.0"  # YAML too
