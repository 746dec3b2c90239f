"""The API toolkit (console.api): one error shape from every kind of view, bearer tokens,
strict fields and the schema helpers."""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import pytest
from django.core.exceptions import PermissionDenied
from django.test import AsyncClient
from rest_framework import exceptions, serializers
from rest_framework.test import APIClient, APIRequestFactory
from rest_framework.views import APIView

import console.api
from console.api import (
    ErrorSerializer,
    JSONObjectField,
    StrictCharField,
    StrictIntegerField,
    error_body,
    errors,
    exception_handler,
    principal_for_authorization,
)
from console.lib.errors import IntentMismatch, RateLimited
from ledger import api as ledger_api
from runs import otlp
from tests.conftest import AGENT_TOKEN

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}


def agent_client(token: str = AGENT_TOKEN) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def long_poll(method: str, path: str, headers: dict[str, str]):
    async def run():
        return await getattr(AsyncClient(), method)(path, headers=headers)

    return asyncio.run(run())


# --- the one renderer ------------------------------------------------------------------------


def test_error_body_always_carries_code_message_and_an_object_of_details():
    assert error_body("conflict", "Stale version.") == {
        "error": {"code": "conflict", "message": "Stale version.", "details": {}}
    }
    assert error_body("not_found", "No task t1.", {"task_id": "t1"})["error"]["details"] == {"task_id": "t1"}


def test_every_kind_of_view_renders_its_error_body_with_the_one_function(db, monkeypatch):
    rendered = []

    def spy(code, message, details=None):
        rendered.append(code)
        return error_body(code, message, details)

    for module in (console.api, ledger_api, otlp):
        monkeypatch.setattr(module, "error_body", spy)

    assert APIClient().get("/api/v1/tasks/t1").status_code == 401  # DRF
    assert long_poll("post", "/api/v1/calls/c1", AUTH).status_code == 405  # async long-poll
    otlp_response = APIClient().post("/v1/traces", data=b"{}", content_type="application/json")
    assert otlp_response.status_code == 401  # OTLP ingest

    assert rendered == ["unauthenticated", "method_not_allowed", "unauthenticated"]


# --- DRF views -------------------------------------------------------------------------------


def test_a_validation_error_lists_the_fields_under_details(agent):
    response = agent_client().post("/api/v1/tasks", {"task_type": 5, "goal": "g", "inputs": []},
                                   format="json")
    assert response.status_code == 400
    assert response.content == json.dumps(error_body("invalid", "The request is invalid.", {"fields": {
        "task_type": ["Not a valid string."], "inputs": ["Expected a JSON object."],
    }}), separators=(",", ":")).encode()


def test_no_token_is_401_with_a_bearer_challenge(db):
    response = APIClient().get("/api/v1/tasks/t1")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json() == error_body("unauthenticated", "Authentication credentials were not provided.")


def test_an_unknown_token_is_401_with_a_bearer_challenge(db):
    response = agent_client("no-such-token").get("/api/v1/tasks/t1")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json() == error_body("unauthenticated", "Unknown or inactive agent token.")


def test_a_token_under_another_scheme_is_refused(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {AGENT_TOKEN}")
    response = client.get("/api/v1/tasks/t1")
    assert response.status_code == 401
    assert response.json() == error_body("unauthenticated", "Use 'Authorization: Bearer <token>'.")


def test_a_wrong_method_and_a_wrong_media_type_have_their_own_codes(agent):
    wrong_method = agent_client().delete("/api/v1/tasks")  # (GET reads a task by its key)
    assert wrong_method.status_code == 405
    assert wrong_method.json() == error_body("method_not_allowed", 'Method "DELETE" not allowed.')
    wrong_type = agent_client().post("/api/v1/tasks", data=b"x", content_type="text/plain")
    assert wrong_type.status_code == 415
    assert wrong_type.json()["error"]["code"] == "unsupported_media_type"


class RateLimitedView(APIView):
    authentication_classes: list = []
    permission_classes: list = []

    def get(self, request):
        raise RateLimited("Too many proposals.", retry_after=12, details={"limit": 60})


def test_a_domain_error_answers_with_its_code_and_status_and_a_rate_limit_with_retry_after():
    response = RateLimitedView.as_view()(APIRequestFactory().get("/limited"))
    response.render()
    assert response.status_code == 429
    assert response["Retry-After"] == "12"
    assert json.loads(response.content) == error_body("rate_limited", "Too many proposals.", {"limit": 60})


def test_a_domain_error_without_a_rate_limit_has_no_retry_after():
    response = exception_handler(IntentMismatch("Same call ID, other arguments."), {})
    assert response.status_code == 422
    assert "Retry-After" not in response
    assert response.data == error_body("intent_mismatch", "Same call ID, other arguments.")


def test_drf_throttling_answers_with_retry_after_in_whole_seconds():
    response = exception_handler(exceptions.Throttled(wait=3.4), {})
    assert response.status_code == 429
    assert response["Retry-After"] == "4"
    assert response.data["error"]["code"] == "rate_limited"


def test_djangos_permission_denied_is_a_403_in_the_error_shape():
    response = exception_handler(PermissionDenied(), {})
    assert response.status_code == 403
    assert response.data["error"]["code"] == "forbidden"


def test_an_exception_that_is_not_an_api_error_is_left_to_propagate():
    assert exception_handler(ValueError("a bug"), {}) is None


# --- the async long-poll ---------------------------------------------------------------------


def test_the_long_poll_refuses_another_method_with_405_and_allow():
    response = long_poll("post", "/api/v1/calls/c1", AUTH)
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"
    assert response.content == (b'{"error":{"code":"method_not_allowed",'
                                b'"message":"Method \\"POST\\" not allowed.","details":{}}}')


def test_the_long_poll_without_a_token_is_the_same_401_as_drf(db):
    long_poll_response = long_poll("get", "/api/v1/calls/c1", {})
    drf_response = APIClient().get("/api/v1/tasks/t1")
    assert long_poll_response.status_code == drf_response.status_code == 401
    assert long_poll_response["WWW-Authenticate"] == drf_response["WWW-Authenticate"] == "Bearer"
    assert long_poll_response.content == drf_response.content


@pytest.mark.django_db(transaction=True)
def test_the_long_poll_with_an_unknown_token_is_401():
    response = long_poll("get", "/api/v1/calls/c1", {"Authorization": "Bearer no-such-token"})
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json() == error_body(
        "unauthenticated", "Use 'Authorization: Bearer <token>' with a known, active agent token.")


# --- OTLP ingest -----------------------------------------------------------------------------


def test_otlp_without_a_token_is_401_with_a_bearer_challenge(db, client):
    response = client.post("/v1/traces", data=b"{}", content_type="application/json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json() == error_body("unauthenticated", "Use 'Authorization: Bearer <agent token>'.")


def test_otlp_refuses_a_media_type_it_cannot_read_with_415(agent, client):
    response = client.post("/v1/traces", data=b"{}", content_type="text/plain",
                           HTTP_AUTHORIZATION=AUTH["Authorization"])
    assert response.status_code == 415
    assert response.json() == error_body("unsupported_media_type",
                                         "Send application/x-protobuf or application/json.")


def test_otlp_refuses_a_body_that_is_not_otlp_with_400(agent, client):
    response = client.post("/v1/traces", data=b"[]", content_type="application/json",
                           HTTP_AUTHORIZATION=AUTH["Authorization"])
    assert response.status_code == 400
    assert response.json() == error_body("invalid", "Expected an OTLP/JSON object with resourceSpans.")


# --- bearer tokens ---------------------------------------------------------------------------


def test_a_bearer_header_names_the_active_agent_and_nothing_else_does(agent):
    assert principal_for_authorization(f"Bearer {AGENT_TOKEN}") == agent
    assert principal_for_authorization(f"bearer  {AGENT_TOKEN}") == agent
    assert principal_for_authorization(f"Basic {AGENT_TOKEN}") is None
    assert principal_for_authorization("Bearer ") is None
    assert principal_for_authorization("Bearer no-such-token") is None
    agent.is_active = False
    agent.save(update_fields=["is_active"])
    assert principal_for_authorization(f"Bearer {AGENT_TOKEN}") is None


# --- fields and schema pieces ----------------------------------------------------------------


class Strict(serializers.Serializer):
    version = StrictIntegerField(required=False)
    goal = StrictCharField(required=False)
    inputs = JSONObjectField(required=False)


@pytest.mark.parametrize("value", ["3", 3.0, True])
def test_a_strict_integer_field_refuses_what_is_not_a_json_integer(value):
    serializer = Strict(data={"version": value})
    assert not serializer.is_valid()
    assert serializer.errors["version"] == ["A valid integer is required."]


def test_a_strict_integer_field_takes_a_json_integer():
    serializer = Strict(data={"version": 3})
    assert serializer.is_valid(), serializer.errors
    assert serializer.validated_data == {"version": 3}


@pytest.mark.parametrize("value", [5, True, ["goal"]])
def test_a_strict_char_field_refuses_what_is_not_a_json_string(value):
    serializer = Strict(data={"goal": value})
    assert not serializer.is_valid()
    assert serializer.errors["goal"] == ["Not a valid string."]


@pytest.mark.parametrize("value", [[], "{}", 1])
def test_a_json_object_field_refuses_what_is_not_an_object(value):
    serializer = Strict(data={"inputs": value})
    assert not serializer.is_valid()
    assert serializer.errors["inputs"] == ["Expected a JSON object."]


def test_errors_documents_each_status_with_the_error_serializer():
    documented = errors(400, 401, 404)
    assert list(documented) == [400, 401, 404, 503]  # any view may fail on the database
    assert all(response.response is ErrorSerializer for response in documented.values())
    assert documented[401].description == "Missing or unknown bearer token."


def test_the_toolkit_imports_no_app():
    tree = ast.parse(Path(console.api.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] in ("runs", "approvals", "ledger")}


def test_the_bearer_lookup_is_one_statement_written_by_hand_with_the_tenant(agent, django_assert_num_queries):
    """Every agent request looks its token up: one statement built once (console.queries), not
    a query the ORM compiles anew on each request; the tenant comes in the same row."""
    from console import queries

    with django_assert_num_queries(1) as captured:
        principal = principal_for_authorization(f"Bearer {AGENT_TOKEN}")
        assert principal.tenant.slug == agent.tenant.slug
    assert captured.captured_queries[0]["sql"].startswith(queries.PRINCIPAL_SQL.split("%s")[0])
