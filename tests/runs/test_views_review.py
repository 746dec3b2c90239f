"""The success review on the console: the list of tasks waiting for one, the run page's
criteria and verdicts, and the confirm / reject form (reviewers of the tenant only, evidence
required, never the person who registered the task, never an agent's token)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.models import Event
from ledger.models import Fact
from ledger.models import OperationStatus as S
from runs.models import Task, TaskStatus
from runs.verification import run_verification
from tests.conftest import AGENT_TOKEN
from tests.factories import make_operation, make_task, record_outcome

pytestmark = pytest.mark.django_db

HUMAN = "The customer confirmed the new address by phone"


@pytest.fixture
def waiting(agent) -> Task:
    task = make_task(agent, task_type="support", goal="Update the customer's address",
                     success_criteria=[{"kind": "human", "description": HUMAN},
                                       {"kind": "operation_confirmed", "tool": "orders.lookup"}])
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.VERIFYING)
    operation = make_operation(agent, "orders.lookup", task=task, status=S.DISPATCHED)
    record_outcome(operation, fact=Fact.KNOWN_SUCCESS, result={"status": "ok"})
    assert run_verification(task.task_id) == "review"
    task.refresh_from_db()
    return task


def review_url(task, decision):
    return reverse("runs:review", args=[task.task_id, decision])


def decide(client, person, task, decision, evidence):
    client.force_login(person)
    return client.post(review_url(task, decision), {"evidence": evidence})


def status_of(task) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=task.pk)


def test_a_reviewer_sees_the_task_in_the_success_review_list(client, reviewer, waiting, outsider_agent):
    make_task(outsider_agent, task_type="support")  # another tenant's, never listed
    client.force_login(reviewer)
    response = client.get(reverse("runs:reviews"))
    assert response.status_code == 200
    html = response.content.decode()
    assert waiting.task_id in html and HUMAN in html
    assert ("reviews", "Success reviews", reverse("runs:reviews")) in response.context["nav_items"]


@pytest.mark.parametrize("who", ["support_user", "outsider"])
def test_people_who_review_nothing_there_see_no_task_in_the_list(client, request, waiting, who):
    client.force_login(request.getfixturevalue(who))
    html = client.get(reverse("runs:reviews")).content.decode()
    assert waiting.task_id not in html


def test_the_run_page_shows_each_criterions_verdict_and_the_form_to_a_reviewer(client, reviewer, waiting):
    client.force_login(reviewer)
    html = client.get(reverse("runs:detail", args=[waiting.task_id])).content.decode()
    assert 'id="run-criteria"' in html and HUMAN in html
    assert "waiting for a reviewer" in html and "badge--met" in html
    assert 'id="run-review-form"' in html


def test_support_staff_see_the_verdicts_but_no_form(client, support_user, waiting):
    client.force_login(support_user)
    html = client.get(reverse("runs:detail", args=[waiting.task_id])).content.decode()
    assert HUMAN in html and 'id="run-review-form"' not in html


def test_a_reviewer_confirms_with_evidence_and_the_run_page_shows_it(client, reviewer, waiting):
    client.force_login(reviewer)
    response = client.post(review_url(waiting, "confirm"), {"evidence": "Called the customer at 14:05."})
    assert response.status_code == 302
    waiting.refresh_from_db()
    assert waiting.status == TaskStatus.SUCCEEDED
    assert Event.objects.filter(entity="task", entity_id=waiting.task_id, to_status="succeeded",
                                actor="user:reviewer").exists()
    html = client.get(reverse("runs:detail", args=[waiting.task_id])).content.decode()
    assert "Confirmed by user:reviewer" in html and "Called the customer at 14:05." in html
    assert 'id="run-review-form"' not in html


def test_a_reviewer_rejects_and_the_task_fails(client, reviewer, waiting):
    decide(client, reviewer, waiting, "reject", "The customer says nobody called.")
    assert status_of(waiting) == TaskStatus.FAILED


def test_a_decision_without_evidence_is_refused_on_the_page(client, reviewer, waiting):
    response = decide(client, reviewer, waiting, "confirm", "  ")
    assert response.status_code == 400
    assert 'id="review-error"' in response.content.decode()
    assert status_of(waiting) == TaskStatus.WAITING_REVIEW


def test_support_staff_cannot_decide(client, support_user, waiting):
    assert decide(client, support_user, waiting, "confirm", "ok").status_code == 403
    assert status_of(waiting) == TaskStatus.WAITING_REVIEW


def test_another_tenants_reviewer_learns_nothing(client, outsider, waiting):
    assert decide(client, outsider, waiting, "confirm", "ok").status_code == 404


def test_the_person_who_registered_the_task_cannot_confirm_it(client, reviewer, waiting):
    Task.objects.filter(pk=waiting.pk).update(created_by=reviewer)
    client.force_login(reviewer)
    html = client.get(reverse("runs:detail", args=[waiting.task_id])).content.decode()
    assert 'id="run-review-form"' not in html and "You registered this task" in html
    assert client.post(review_url(waiting, "confirm"), {"evidence": "Mine, and fine."}).status_code == 403
    waiting.refresh_from_db()
    assert waiting.status == TaskStatus.WAITING_REVIEW


def test_an_agents_token_cannot_decide(client, waiting):
    response = client.post(review_url(waiting, "confirm"), {"evidence": "I did it."},
                           HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    waiting.refresh_from_db()
    assert waiting.status == TaskStatus.WAITING_REVIEW


def test_a_decision_is_a_post(client, reviewer, waiting):
    client.force_login(reviewer)
    assert client.get(review_url(waiting, "confirm")).status_code == 405
    assert client.post(review_url(waiting, "maybe"), {"evidence": "x"}).status_code == 404
