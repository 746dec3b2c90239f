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


# --- the roles the layout shows, read once per page --------------------------------------------

ROLE_SETS = {
    "reviewer": ("reviewer",),
    "admin": ("admin",),
    "support": ("support",),
    "reviewer and support": ("reviewer", "support"),
    "no role": (),
}


def membership_reads(captured) -> int:
    return sum(1 for q in captured.captured_queries if "console_membership" in q["sql"])


@pytest.mark.parametrize("kind", [*ROLE_SETS, "superuser without a membership", "staff reviewer"])
@pytest.mark.parametrize("page", ["/approvals/", "/runs/", "/dashboard/"])
def test_the_layout_shows_the_roles_and_links_read_afresh(client, tenant, kind, page):
    """Whether a page's scope already read the memberships (the inbox) or not (the runs, the
    dashboard), the navigation and the roles are what a fresh read of the user's memberships
    gives."""
    from django.contrib.auth import get_user_model

    from console.context_processors import navigation
    from tests.conftest import make_user

    extra = {"superuser without a membership": {"is_superuser": True, "is_staff": True},
             "staff reviewer": {"is_staff": True}}.get(kind, {})
    roles = ROLE_SETS.get(kind, ("reviewer",) if kind == "staff reviewer" else ())
    user = make_user(f"user-{len(kind)}-{len(page)}", tenant, *roles, max_tier=3, **extra)
    client.force_login(user)

    response = client.get(page)

    fresh = type("Request", (), {"user": get_user_model().objects.get(pk=user.pk)})()
    expected = navigation(fresh)
    if response.status_code == 200:
        assert response.context["nav_items"] == expected["nav_items"]
        assert response.context["user_roles"] == expected["user_roles"]
    else:
        assert response.status_code in (302, 403, 404)


def test_the_inbox_reads_the_users_memberships_once(client, tenant):
    """The reviewer's scope and the layout's roles come from the same query."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.conftest import make_user

    user = make_user("one-read", tenant, "reviewer", "support", max_tier=3)
    client.force_login(user)
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/approvals/")
    assert response.status_code == 200
    assert membership_reads(captured) == 1
    assert response.context["user_roles"] == ["reviewer", "support"]
