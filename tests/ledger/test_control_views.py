"""The stop buttons (/stops/), the admin stops API, the Django admin's stops, and a task's
cancel / pause / resume on its run page: who may press what, the error shape, the redirects."""

from __future__ import annotations

import base64

import pytest
from django.urls import reverse

from approvals import stops
from approvals.models import ApprovalStatus, Stop, StopStatus, Tool
from console.models import Event, Membership, Role
from ledger.models import OperationStatus
from runs.models import Task, TaskStatus
from tests.conftest import AGENT_TOKEN, make_user
from tests.factories import make_operation, make_pending_approval
from tests.fixtures.api import start_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(tenant):
    return make_user("boss", tenant, Role.ADMIN)


def refund_tool() -> Tool:
    return Tool.objects.get(name="payments.refund")


# -- the stops page --------------------------------------------------------------------------

def test_an_admin_stops_a_tool_from_the_page_and_resumes_it_with_one_click(client, admin, tenant, policy):
    client.force_login(admin)
    page = client.get(reverse("stops:page"))
    assert page.status_code == 200 and b"Stop now" in page.content

    response = client.post(reverse("stops:create"), {"tenant": tenant.pk, "scope": "tool",
                                                     "tool": refund_tool().pk, "reason": "bad refunds"})

    assert response.status_code == 302
    stop = Stop.objects.get()
    assert (stop.scope, stop.tool, stop.stopped_by, stop.status) == ("tool", refund_tool(), admin, "stopped")
    page = client.get(reverse("stops:page")).content.decode()
    assert "Tool payments.refund in acme is stopped" in page and "bad refunds" in page

    response = client.post(reverse("stops:resume", args=[stop.stop_id]), {"reason": "fixed"})

    assert response.status_code == 302
    stop.refresh_from_db()
    assert (stop.status, stop.resumed_by) == (StopStatus.RESUMED, admin)


def test_a_stop_without_a_reason_is_refused_with_the_message(client, admin, tenant, policy):
    client.force_login(admin)
    response = client.post(reverse("stops:create"), {"tenant": tenant.pk, "scope": "tenant", "reason": ""})

    assert response.status_code == 400
    assert b"A stop needs a reason" in response.content
    assert not Stop.objects.exists()


def test_an_l3_reviewer_sees_the_stops_but_no_button_and_cannot_post_one(client, reviewer, tenant, policy):
    client.force_login(reviewer)
    page = client.get(reverse("stops:page"))
    assert page.status_code == 200 and b"Stop now" not in page.content

    response = client.post(reverse("stops:create"), {"tenant": tenant.pk, "scope": "tool",
                                                     "tool": refund_tool().pk, "reason": "x"})

    assert response.status_code == 403
    assert not Stop.objects.exists()


def test_an_l4_reviewer_stops_a_tool_but_not_the_tenant(client, senior, tenant, policy):
    client.force_login(senior)
    assert client.post(reverse("stops:create"), {"tenant": tenant.pk, "scope": "tenant",
                                                 "reason": "x"}).status_code == 403
    assert client.post(reverse("stops:create"), {"tenant": tenant.pk, "scope": "tool", "tool": refund_tool().pk,
                                                 "reason": "x"}).status_code == 302


def test_an_outsider_cannot_stop_or_resume_in_another_tenant(client, admin, tenant, other_tenant, policy):
    stop = stops.stop_create(tenant_id=tenant.pk, scope="tenant", user=admin, reason="x")
    client.force_login(make_user("stranger", other_tenant, Role.ADMIN))

    assert client.post(reverse("stops:create"), {"tenant": tenant.pk, "scope": "tenant",
                                                 "reason": "x"}).status_code == 404
    assert client.post(reverse("stops:resume", args=[stop.stop_id])).status_code == 404
    stop.refresh_from_db()
    assert stop.status == StopStatus.STOPPED


def test_the_stops_page_needs_a_login(client):
    assert client.get(reverse("stops:page")).status_code == 302


# -- the API ---------------------------------------------------------------------------------

def basic(user: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"{user}:pw".encode()).decode()}


def test_an_admin_stops_and_resumes_an_agent_through_the_api(client, admin, agent):
    response = client.post("/api/v1/stops", {"tenant": "acme", "scope": "agent", "agent": "agent",
                                             "reason": "runaway loop"}, content_type="application/json",
                           **basic("boss"))

    assert response.status_code == 201
    body = response.json()
    assert (body["scope"], body["agent"], body["status"], body["stopped_by"]) == ("agent", "agent", "stopped", "boss")
    listed = client.get("/api/v1/stops", **basic("boss")).json()
    assert [row["stop_id"] for row in listed] == [body["stop_id"]]

    resumed = client.post(f"/api/v1/stops/{body['stop_id']}/resume", {"reason": "fixed"},
                          content_type="application/json", **basic("boss"))

    assert resumed.status_code == 200
    assert (resumed.json()["status"], resumed.json()["resume_reason"]) == ("resumed", "fixed")


def test_the_api_answers_with_the_one_error_shape(client, admin, reviewer, agent):
    conflict = [client.post("/api/v1/stops", {"tenant": "acme", "scope": "tenant", "reason": "x"},
                            content_type="application/json", **basic("boss")) for _ in range(2)][1]
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "conflict"

    forbidden = client.post("/api/v1/stops", {"tenant": "acme", "scope": "tool", "tool": "payments.refund",
                                              "reason": "x"}, content_type="application/json", **basic("reviewer"))
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"

    invalid = client.post("/api/v1/stops", {"tenant": "acme", "scope": "galaxy", "reason": "x"},
                          content_type="application/json", **basic("boss"))
    assert invalid.status_code == 400 and "scope" in invalid.json()["error"]["details"]["fields"]

    unknown = client.post("/api/v1/stops", {"tenant": "globex", "scope": "tenant", "reason": "x"},
                          content_type="application/json", **basic("boss"))
    assert unknown.status_code == 404


def test_an_agent_token_is_not_accepted_by_the_stops_api(client, agent):
    response = client.get("/api/v1/stops", HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"


# -- the Django admin ------------------------------------------------------------------------

def test_a_stop_added_in_the_admin_goes_through_the_service_and_is_resumed_by_the_action(client, tenant, policy):
    superuser = make_user("root", tenant, Role.ADMIN, is_staff=True, is_superuser=True)
    client.force_login(superuser)

    client.post(reverse("admin:approvals_stop_add"), {"tenant": tenant.pk, "scope": "tenant", "reason": "drill"})

    stop = Stop.objects.get()
    assert (stop.stopped_by, stop.scope_key) == (superuser, "tenant")
    assert Event.objects.filter(entity="stop", entity_id=stop.stop_id, to_status="stopped").exists()

    client.post(reverse("admin:approvals_stop_changelist"),
                {"action": "resume_selected", "_selected_action": [stop.stop_id]})

    stop.refresh_from_db()
    assert stop.status == StopStatus.RESUMED


# -- the run page ----------------------------------------------------------------------------

def test_support_cancels_a_task_from_the_run_page_with_a_reason(client, agent, support_user):
    request = make_pending_approval(agent, risk_tier=3, task=start_task(agent).task)
    authorized = make_operation(agent, "payments.refund", status=OperationStatus.AUTHORIZED, task=request.task)
    client.force_login(support_user)
    page = client.get(reverse("runs:detail", args=[request.task_id])).content.decode()
    assert 'id="run-cancel"' in page and 'id="run-pause"' in page

    response = client.post(reverse("runs:control", args=[request.task_id, "cancel"]), {"reason": "duplicate"})

    assert response.status_code == 302
    assert Task.objects.get(pk=request.task_id).status == TaskStatus.CANCELLED
    request.refresh_from_db()
    assert request.status == ApprovalStatus.INVALIDATED
    authorized.refresh_from_db()
    assert authorized.status == OperationStatus.CANCELLED


def test_pause_then_resume_from_the_run_page(client, agent, admin):
    task = start_task(agent).task
    client.force_login(admin)

    client.post(reverse("runs:control", args=[task.task_id, "pause"]), {"reason": "look first"})
    assert Task.objects.get(pk=task.pk).status == TaskStatus.PAUSED
    assert 'id="run-resume"' in client.get(reverse("runs:detail", args=[task.task_id])).content.decode()

    client.post(reverse("runs:control", args=[task.task_id, "resume"]), {"reason": "fine"})
    assert Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING


def test_a_reviewer_sees_no_controls_and_cannot_post_them(client, agent, reviewer):
    task = start_task(agent).task
    client.force_login(reviewer)
    assert 'id="run-cancel"' not in client.get(reverse("runs:detail", args=[task.task_id])).content.decode()

    response = client.post(reverse("runs:control", args=[task.task_id, "cancel"]), {"reason": "x"})

    assert response.status_code == 403
    assert Task.objects.get(pk=task.pk).status == TaskStatus.RUNNING


def test_a_control_without_a_reason_shows_the_error_on_the_run_page(client, agent, admin):
    task = make_pending_approval(agent, risk_tier=3).task
    client.force_login(admin)

    response = client.post(reverse("runs:control", args=[task.task_id, "cancel"]), {"reason": " "})

    assert response.status_code == 400
    assert b'id="control-error"' in response.content
    assert Task.objects.get(pk=task.pk).status != TaskStatus.CANCELLED


def test_another_tenants_run_cannot_be_controlled(client, outsider_agent, admin):
    task = make_pending_approval(outsider_agent, risk_tier=3).task
    client.force_login(admin)

    assert client.post(reverse("runs:control", args=[task.task_id, "cancel"]), {"reason": "x"}).status_code == 404


# -- the operation page ----------------------------------------------------------------------

def test_the_operation_page_says_a_claimed_attempt_finishes_after_a_stop(client, agent, admin, support_user):
    operation = make_operation(agent, "payments.refund", status=OperationStatus.DISPATCHED)
    stops.stop_create(tenant_id=agent.tenant_id, scope="agent", agent=agent, user=admin, reason="incident")
    client.force_login(support_user)

    page = client.get(reverse("operations:detail", args=[operation.operation_id])).content.decode()

    assert 'id="authority-notice"' in page
    assert "Attempt 1 was claimed before agent acme/agent was stopped by boss (incident)" in page


def test_an_admin_of_two_tenants_stops_an_agent_of_the_tenant_chosen(client, tenant, other_tenant, agent,
                                                                     outsider_agent):
    admin = make_user("boss", tenant, Role.ADMIN)
    Membership.objects.create(user=admin, tenant=other_tenant, role=Role.ADMIN)
    client.force_login(admin)
    page = client.get(reverse("stops:page")).content.decode()
    assert '<optgroup label="acme">' in page and '<optgroup label="globex">' in page

    mismatched = client.post(reverse("stops:create"), {"tenant": tenant.pk, "scope": "agent",
                                                       "agent": outsider_agent.pk, "reason": "x"})
    assert mismatched.status_code == 404

    client.post(reverse("stops:create"), {"tenant": other_tenant.pk, "scope": "agent", "agent": outsider_agent.pk,
                                          "reason": "x"})
    assert Stop.objects.get().describe() == "agent globex/outsider"


def test_a_resume_refused_from_the_live_list_is_shown_after_the_reload(client, tenant, senior, policy):
    admin = make_user("boss", tenant, Role.ADMIN)
    stop = stops.stop_create(tenant_id=tenant.pk, scope="tenant", user=admin, reason="x")
    client.force_login(senior)  # an L4 reviewer may resume a tool stop, not a tenant's

    response = client.post(reverse("stops:resume", args=[stop.stop_id]), HTTP_HX_REQUEST="true")

    assert response.status_code == 200 and response["HX-Redirect"] == reverse("stops:page")
    assert "Only the tenant" in client.get(reverse("stops:page")).content.decode()
    stop.refresh_from_db()
    assert stop.status == StopStatus.STOPPED


def test_a_second_stop_added_in_the_admin_is_refused_with_the_message(client, tenant, policy):
    superuser = make_user("root", tenant, Role.ADMIN, is_staff=True, is_superuser=True)
    client.force_login(superuser)
    add = reverse("admin:approvals_stop_add")
    client.post(add, {"tenant": tenant.pk, "scope": "tenant", "reason": "drill"})

    response = client.post(add, {"tenant": tenant.pk, "scope": "tenant", "reason": "again"}, follow=True)

    assert Stop.objects.count() == 1
    assert "Tenant acme is already stopped." in response.content.decode()
