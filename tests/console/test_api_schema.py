"""GET /api/schema/: the OpenAPI document agents and integrations generate clients from."""

from __future__ import annotations

import pytest
from django.test import Client

PATHS = {
    "/api/v1/tasks": {"post"},
    "/api/v1/tasks/{task_id}": {"get"},
    "/api/v1/tasks/{task_id}/lease": {"post"},
    "/api/v1/tasks/{task_id}/transition": {"post"},
    "/api/v1/tasks/{task_id}/calls": {"post"},
    "/api/v1/operations/{operation_id}": {"get"},
    "/api/v1/calls/{call_id}": {"get"},
    "/api/v1/tools": {"get"},
}


@pytest.mark.django_db
def test_the_schema_renders_and_lists_every_agent_endpoint():
    response = Client().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    for path, methods in PATHS.items():
        assert set(schema["paths"][path]) >= methods, path
    assert schema["components"]["securitySchemes"]["agentToken"] == {"type": "http", "scheme": "bearer"}
    propose = schema["paths"]["/api/v1/tasks/{task_id}/calls"]["post"]
    assert {"200", "201", "400", "401", "403", "404", "409", "422"} <= set(propose["responses"])
    wait = [p for p in schema["paths"]["/api/v1/calls/{call_id}"]["get"]["parameters"] if p["name"] == "wait"]
    assert wait and wait[0]["in"] == "query"
    decision = schema["components"]["schemas"]["CallProposeOutput"]["properties"]["decision"]
    assert decision["$ref"].endswith("CallDecision")
    outcome = schema["components"]["schemas"]["CallDecision"]["properties"]["outcome"]["allOf"][0]["$ref"]
    outcome = outcome.rsplit("/", 1)[1]
    assert schema["components"]["schemas"][outcome]["enum"] == [
        "dispatched", "awaiting_approval", "approved", "rejected", "refused", "expired", "cancelled"]


@pytest.mark.django_db
def test_every_operation_lists_the_503_a_database_error_answers_beside_its_other_errors():
    """Any request that reads the database can fail on it (console.api.exception_handler)."""
    schema = _schema()
    error = {"$ref": "#/components/schemas/Error"}
    operations = [(path, method, operation) for path, methods in schema["paths"].items()
                  for method, operation in methods.items()]

    assert {path for path, _, _ in operations} >= set(PATHS)
    for path, method, operation in operations:
        responses = operation["responses"]
        assert responses["503"]["content"]["application/json"]["schema"] == error, (path, method)
        assert "Retry-After" in responses["503"]["description"]
        assert responses["401"]["content"]["application/json"]["schema"] == error, (path, method)
    propose = schema["paths"]["/api/v1/tasks/{task_id}/calls"]["post"]["responses"]
    assert {"400", "401", "403", "404", "409", "422", "503"} <= set(propose)


# What the schema admits, the server takes: requests generated from the schema (tests/
# test_api_schema_fuzz.py) found each of these documented more loosely than the server checks.

def _schema() -> dict:
    return Client().get("/api/schema/", {"format": "json"}).json()


def _admits(schema: dict, part: dict, value) -> bool:
    import jsonschema

    document = {**part, "components": schema["components"]}
    return jsonschema.Draft7Validator(document).is_valid(value)


def _parameter(schema: dict, path: str, method: str, name: str) -> dict:
    return next(p for p in schema["paths"][path][method]["parameters"] if p["name"] == name)


@pytest.mark.django_db
def test_the_schema_names_the_statuses_a_long_poll_takes_as_seen():
    from ledger.selectors import CALL_STATUSES

    schema = _schema()
    seen = _parameter(schema, "/api/v1/calls/{call_id}", "get", "seen")["schema"]

    assert _admits(schema, seen, "confirmed")
    assert not _admits(schema, seen, "ï7")
    assert set(seen["enum"]) == set(CALL_STATUSES)


@pytest.mark.django_db
def test_the_schema_documents_until_final_and_admits_nothing_else():
    schema = _schema()
    until = _parameter(schema, "/api/v1/calls/{call_id}", "get", "until")

    assert until["in"] == "query" and not until.get("required")
    assert _admits(schema, until["schema"], "final")
    assert not _admits(schema, until["schema"], "dispatched")
    assert "final" in until["description"]


@pytest.mark.django_db
def test_the_schema_admits_only_the_idempotency_keys_the_server_takes():
    schema = _schema()
    key = _parameter(schema, "/api/v1/tasks", "post", "Idempotency-Key")["schema"]

    assert _admits(schema, key, "thread-1 step 2")
    for refused in ("", " ", "é", "a\tb", "x" * 256):
        assert not _admits(schema, key, refused), refused


@pytest.mark.django_db
def test_the_schema_requires_a_proposals_ids_unless_it_is_a_dry_run():
    schema = _schema()
    body = schema["paths"]["/api/v1/tasks/{task_id}/calls"]["post"]["requestBody"]["content"]["application/json"][
        "schema"]
    proposal = {"tool": "mail.send", "arguments": {}, "call_id": "c1", "step_id": "s1", "expected_version": 0,
                "fencing_token": 1}

    assert _admits(schema, body, proposal)
    assert _admits(schema, body, {**proposal, "dry_run": False})
    assert _admits(schema, body, {"tool": "mail.send", "arguments": {}, "dry_run": True})
    assert not _admits(schema, body, {"tool": "mail.send", "arguments": {}})
    assert not _admits(schema, body, {"tool": "mail.send", "arguments": {}, "dry_run": False})


@pytest.mark.django_db
def test_the_schema_admits_no_negative_wait():
    schema = _schema()
    wait = _parameter(schema, "/api/v1/calls/{call_id}", "get", "wait")["schema"]

    assert _admits(schema, wait, 0) and _admits(schema, wait, 45.5)  # more than 30 is taken as 30
    assert not _admits(schema, wait, -1.5)


@pytest.mark.django_db
def test_the_schema_admits_no_string_the_server_trims_to_nothing():
    schema = _schema()
    owner = schema["components"]["schemas"]["TaskLeaseInput"]["properties"]["owner"]

    assert _admits(schema, owner, " worker-1 ")
    for blank in ("\n", "  ", "\t\u3000", "\x1c"):
        assert not _admits(schema, owner, blank), repr(blank)
