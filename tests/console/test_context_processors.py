"""console.context_processors.navigation: links by role for people, nothing for anyone else."""

from __future__ import annotations

import pytest

from tests.conftest import AGENT_TOKEN

pytestmark = pytest.mark.django_db


def test_the_api_docs_render_for_an_agent_token(client, agent):
    # The docs page authenticates with the API's schemes, so request.user is the agent
    # principal: the navigation must not treat it as a person (a probe got a 500 here).
    response = client.get("/api/docs/", HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")

    assert response.status_code == 200
    assert response.context["nav_items"] == []
