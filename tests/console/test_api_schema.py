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
