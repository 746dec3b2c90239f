"""The Django admin: evidence is read-only for everyone (superusers included), configuration is
editable; on PostgreSQL the event log refuses UPDATE and DELETE at the database itself."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, transaction
from django.urls import reverse

from approvals.models import ApprovalDecision, ApprovalRequest, EscalationRule, PolicyTier, Tool
from console.lib.ids import derive_operation_id
from console.models import AgentPrincipal, Event, hash_token
from ledger.decisions import approval_approve
from ledger.models import (
    Attempt,
    Call,
    LivenessAlert,
    Operation,
    OperationStatus,
    WebhookDelivery,
    WebhookEvent,
    WorkerHeartbeat,
)
from runs.models import Lease, Step, Task
from tests.factories import make_approval_request, make_operation, make_task

READ_ONLY = [Operation, Attempt, Call, ApprovalRequest, ApprovalDecision, Event, Task, Step, Lease, WorkerHeartbeat,
             LivenessAlert, WebhookEvent]
EDITABLE = [Tool, PolicyTier, EscalationRule, AgentPrincipal]


@pytest.fixture
def admin_client(client, db):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


@pytest.fixture
def evidence(agent, senior, senior2):
    """One row of every read-only model."""
    operation = make_operation(agent, status=OperationStatus.CONFIRMED,
                               arguments={"order_id": "o-9", "amount": 300, "currency": "EUR", "reason": "x"})
    request = make_approval_request(make_operation(agent, task=operation.task), risk_tier=4, approvals_needed=2)
    approval_approve(approval_id=request.approval_id, reviewer=senior)
    Lease.objects.create(task=operation.task, owner="w1", expires_at=operation.created_at)
    return {
        Operation: operation,
        Attempt: Attempt.objects.filter(operation=operation).first(),
        Call: Call.objects.filter(operation=operation).first(),
        ApprovalRequest: request,
        ApprovalDecision: ApprovalDecision.objects.get(request=request),
        Event: Event.objects.filter(entity="operation", entity_id=operation.operation_id).last(),
        Task: operation.task,
        Step: operation.step,
        Lease: Lease.objects.get(task=operation.task),
        WorkerHeartbeat: WorkerHeartbeat.objects.create(name="w1@host", pool="thread", queues=["fast"]),
        LivenessAlert: LivenessAlert.objects.create(oldest_due_seconds=130.0, due_count=3),
        WebhookEvent: _webhook_event(operation),
    }


def _webhook_event(operation: Operation) -> WebhookEvent:
    event = WebhookEvent.objects.create(
        webhook_id="msg_admin", tenant_id=operation.tenant_id, principal=operation.principal, operation=operation,
        call_id=operation.call_id, kind="call.final", operation_status=operation.status, payload={"type": "call.final"},
        attempts=1, last_error="HTTP 500")
    WebhookDelivery.objects.create(event=event, number=1, url="https://agent.example/hook",
                                   started_at=operation.created_at, status_code=500, error="HTTP 500")
    return event


def url(model, view: str, *args) -> str:
    # The admin quotes primary keys in its URLs ("_24" reads back as "$"), as its own links do;
    # an ID like "op_24..." reversed unquoted names another object and the page redirects away.
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}",
                   args=[quote(arg) for arg in args])


def snapshot(obj) -> dict:
    return type(obj).objects.filter(pk=obj.pk).values().get()


@pytest.mark.parametrize("model", READ_ONLY, ids=lambda m: m.__name__)
def test_the_changelist_of_evidence_answers_200(admin_client, evidence, model):
    response = admin_client.get(url(model, "changelist"))

    assert response.status_code == 200
    assert response.context["cl"].result_count >= 1


@pytest.mark.parametrize("model", READ_ONLY, ids=lambda m: m.__name__)
def test_the_view_page_of_evidence_answers_200_without_a_save_button(admin_client, evidence, model):
    obj = evidence[model]

    response = admin_client.get(url(model, "change", obj.pk))

    assert response.status_code == 200
    assert response.context["has_change_permission"] is False
    assert b'name="_save"' not in response.content


def test_an_operation_whose_id_reads_like_an_admin_escape_opens_from_its_changelist_link(admin_client, agent):
    # "op_24..." unquoted is "op$..." to the admin: CI once met such an ID by chance.
    task = make_task(agent)
    step_id = next(f"step-{n}" for n in itertools.count() if derive_operation_id(
        tenant=agent.tenant.slug, task_id=task.task_id, step_id=f"step-{n}", tool="payments.refund",
    ).startswith("op_24"))
    operation = make_operation(agent, task=task, step_id=step_id)

    changelist = admin_client.get(url(Operation, "changelist")).content.decode()
    link = url(Operation, "change", operation.pk)

    assert link in changelist
    assert admin_client.get(link).status_code == 200


@pytest.mark.parametrize("model", READ_ONLY, ids=lambda m: m.__name__)
def test_changing_evidence_is_refused_even_for_a_superuser(admin_client, evidence, model):
    obj = evidence[model]
    before = snapshot(obj)

    response = admin_client.post(url(model, "change", obj.pk), {"status": "confirmed", "reason": "edited"})

    assert response.status_code == 403
    assert snapshot(obj) == before


@pytest.mark.parametrize("model", READ_ONLY, ids=lambda m: m.__name__)
def test_adding_evidence_is_refused_even_for_a_superuser(admin_client, evidence, model):
    count = model.objects.count()

    assert admin_client.get(url(model, "add")).status_code == 403
    assert admin_client.post(url(model, "add"), {}).status_code == 403
    assert model.objects.count() == count


@pytest.mark.parametrize("model", READ_ONLY, ids=lambda m: m.__name__)
def test_deleting_evidence_is_refused_even_for_a_superuser(admin_client, evidence, model):
    obj = evidence[model]

    assert admin_client.get(url(model, "delete", obj.pk)).status_code == 403
    assert admin_client.post(url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    assert model.objects.filter(pk=obj.pk).exists()


@pytest.mark.parametrize("model", READ_ONLY, ids=lambda m: m.__name__)
def test_the_bulk_delete_action_is_not_offered_for_evidence(admin_client, evidence, model):
    obj = evidence[model]

    response = admin_client.post(
        url(model, "changelist"), {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"}
    )

    assert response.status_code in (200, 302)
    assert model.objects.filter(pk=obj.pk).exists()
    changelist = admin_client.get(url(model, "changelist"))
    assert b"delete_selected" not in changelist.content


@pytest.mark.parametrize("model", EDITABLE, ids=lambda m: m.__name__)
def test_configuration_is_editable(admin_client, policy, agent, model):
    assert admin_client.get(url(model, "add")).status_code == 200
    obj = model.objects.first()
    response = admin_client.get(url(model, "change", obj.pk))
    assert response.status_code == 200
    assert b'name="_save"' in response.content


def test_a_policy_tier_can_be_changed_in_the_admin(admin_client, policy):
    tier = PolicyTier.objects.get(level=2)

    response = admin_client.post(url(PolicyTier, "change", tier.pk), {
        "level": 2, "requirement": PolicyTier.Requirement.TWO_APPROVALS, "approval_ttl_seconds": 600,
        "description": "Stricter",
    })

    assert response.status_code == 302
    tier.refresh_from_db()
    assert (tier.requirement, tier.approval_ttl_seconds, tier.shows_preview) == ("two_approvals", 600, False)


def test_adding_an_agent_principal_shows_its_token_once_and_stores_only_the_hash(admin_client, tenant, policy):
    response = admin_client.post(url(AgentPrincipal, "add"), {
        "tenant": tenant.pk, "name": "bot", "is_active": "on",
        "allowed_tools": [Tool.objects.get(name="orders.lookup").pk],
    }, follow=True)

    assert response.status_code == 200
    principal = AgentPrincipal.objects.get(name="bot")
    [message] = [str(m) for m in response.context["messages"] if "shown once" in str(m)]
    token = message.rsplit(": ", 1)[1]
    assert principal.token_hash == hash_token(token)
    assert token.startswith(principal.token_prefix)
    assert token not in str(AgentPrincipal.objects.filter(pk=principal.pk).values().get())


def test_the_policy_tier_list_shows_l0_to_l4_after_the_defaults_are_installed(admin_client, policy):
    response = admin_client.get(url(PolicyTier, "changelist"))

    assert response.status_code == 200
    levels = [tier.level for tier in response.context["cl"].result_list]
    assert levels == [0, 1, 2, 3, 4]
    for label in ("L0", "L1", "L2", "L3", "L4"):
        assert f">{label}<".encode() in response.content


def test_people_without_staff_status_cannot_open_the_admin(client, reviewer):
    client.force_login(reviewer)

    response = client.get(url(Operation, "changelist"))

    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


# --- the database itself (PostgreSQL) ---------------------------------------------------------



@pytest.mark.parametrize(
    "sql",
    ["UPDATE ledger_event SET reason = 'x'", "DELETE FROM ledger_event"],
    ids=["update", "delete"],
)
@pytest.mark.postgres
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the append-only trigger is PostgreSQL's")
def test_the_database_refuses_to_rewrite_the_event_log(agent, sql):
    make_operation(agent, status=OperationStatus.AUTHORIZED)
    before = list(Event.objects.order_by("id").values_list("id", "reason"))
    assert before

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)

    assert list(Event.objects.order_by("id").values_list("id", "reason")) == before


@pytest.mark.postgres
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the append-only trigger is PostgreSQL's")
def test_the_database_still_accepts_new_events(agent):
    make_operation(agent)
    assert Event.objects.filter(entity="operation").count() == 1


def test_an_agents_webhook_needs_the_name_of_its_secret_not_the_secret(admin_client, agent):
    change = url(AgentPrincipal, "change", agent.pk)
    form = {"tenant": agent.tenant_id, "name": agent.name, "is_active": "on", "webhook_url": "https://agent.example/hook"}

    missing = admin_client.post(change, {**form, "webhook_secret_ref": ""})
    pasted = admin_client.post(change, {**form, "webhook_secret_ref": "whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0+/="})
    named = admin_client.post(change, {**form, "webhook_secret_ref": "AGENT_HOOK_SECRET"})

    assert missing.status_code == pasted.status_code == 200  # the form again, with the error
    assert b"needs the name of the variable" in missing.content
    assert b"not the secret itself" in pasted.content
    assert named.status_code == 302
    agent.refresh_from_db()
    assert (agent.webhook_url, agent.webhook_secret_ref) == ("https://agent.example/hook", "AGENT_HOOK_SECRET")


def test_a_webhook_event_shows_its_delivery_attempts(admin_client, evidence):
    page = admin_client.get(url(WebhookEvent, "change", evidence[WebhookEvent].pk))

    assert page.status_code == 200
    assert b"https://agent.example/hook" in page.content and b"HTTP 500" in page.content
