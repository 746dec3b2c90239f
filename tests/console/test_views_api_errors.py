"""The edges of the agent API answer in its one error shape: a body over the size limit is a
413, an unknown path under /api/ a JSON 404 (probes: both answered with HTML pages)."""

from __future__ import annotations

import json

import pytest
from django.conf import settings

from tests.conftest import AGENT_TOKEN
from tests.fixtures.api import assert_error

pytestmark = pytest.mark.django_db
AUTH = {"HTTP_AUTHORIZATION": f"Bearer {AGENT_TOKEN}"}


def too_big() -> str:
    return json.dumps({"task_type": "refund", "goal": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})


def test_a_body_over_the_limit_is_a_413_in_the_error_shape(client, agent):
    response = client.post("/api/v1/tasks", too_big(), content_type="application/json", **AUTH)

    error = assert_error(response, 413, "too_large")
    assert error["details"]["limit_bytes"] == settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def test_an_otlp_body_over_the_limit_is_a_413_in_the_error_shape(client, agent):
    response = client.post("/v1/traces", too_big(), content_type="application/json", **AUTH)

    assert_error(response, 413, "too_large")


def test_an_unknown_api_path_is_a_json_404(client, agent):
    assert_error(client.get("/api/v1/nope", **AUTH), 404, "not_found")


def test_an_unknown_page_is_still_the_html_404(client):
    response = client.get("/nope/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
