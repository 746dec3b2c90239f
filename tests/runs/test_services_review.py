"""A success review: a reviewer of the tenant confirms or rejects a task's human criteria with
evidence; never the agent, never the person who registered the task."""

from __future__ import annotations

import pytest

from console.lib.errors import Conflict, InvalidInput, NotPermitted
from console.models import Event
from runs.models import Task, TaskStatus
from runs.services import task_review_decide, task_transition
from runs.verification import run_verification
from tests.factories import make_lease, make_task

pytestmark = pytest.mark.django_db


def waiting_review(agent, **fields) -> Task:
    task = make_task(agent, task_type="support", success_criteria=[
        {"kind": "human", "description": "The customer confirmed the new address by phone"}], **fields)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.VERIFYING)
    assert run_verification(task.task_id) == "review"
    task.refresh_from_db()
    return task


def test_a_reviewer_confirms_with_evidence_and_the_task_succeeds(agent, reviewer):
    task = waiting_review(agent)
    task_review_decide(task_id=task.task_id, user=reviewer, decision="confirm",
                       evidence="Called +1 555 0100 at 14:05; the customer confirmed.")
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    event = Event.objects.filter(entity="task", entity_id=task.task_id).latest("id")
    assert (event.from_status, event.to_status, event.actor) == ("waiting_review", "succeeded", "user:reviewer")
    assert event.evidence["review"]["evidence"] == "Called +1 555 0100 at 14:05; the customer confirmed."
    [verdict] = task.verdicts
    assert verdict["result"] == "met" and verdict["evidence"]["review"]["by"] == "user:reviewer"


def test_a_reviewer_rejects_with_evidence_and_the_task_fails(agent, reviewer):
    task = waiting_review(agent)
    task_review_decide(task_id=task.task_id, user=reviewer, decision="reject", evidence="Nobody answered.")
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
    assert task.verdicts[0]["result"] == "failed"


@pytest.mark.parametrize("evidence", ["", "   "])
def test_evidence_is_required(agent, reviewer, evidence):
    task = waiting_review(agent)
    with pytest.raises(InvalidInput):
        task_review_decide(task_id=task.task_id, user=reviewer, decision="confirm", evidence=evidence)
    task.refresh_from_db()
    assert task.status == TaskStatus.WAITING_REVIEW


def test_the_agent_never_decides_its_own_success(agent):
    task = waiting_review(agent)
    with pytest.raises(NotPermitted):
        task_review_decide(task_id=task.task_id, user=agent, decision="confirm", evidence="I did it.")
    lease = make_lease(task)
    with pytest.raises(NotPermitted):
        task_transition(task_id=task.task_id, to=TaskStatus.SUCCEEDED, expected_version=task.version,
                        fencing_token=lease.fencing_token, actor=agent.ref)
    task.refresh_from_db()
    assert task.status == TaskStatus.WAITING_REVIEW


def test_the_agent_cannot_put_its_task_into_review_itself(agent):
    task = make_task(agent, task_type="support")
    lease = make_lease(task)
    with pytest.raises(NotPermitted):
        task_transition(task_id=task.task_id, to=TaskStatus.WAITING_REVIEW, expected_version=task.version,
                        fencing_token=lease.fencing_token, actor=agent.ref)


def test_the_person_who_registered_the_task_cannot_confirm_it_but_another_reviewer_can(agent, reviewer, senior):
    task = waiting_review(agent, created_by=reviewer)
    with pytest.raises(NotPermitted):
        task_review_decide(task_id=task.task_id, user=reviewer, decision="confirm", evidence="Looks right.")
    task_review_decide(task_id=task.task_id, user=senior, decision="confirm", evidence="Checked the CRM.")
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED


def test_support_staff_and_another_tenants_reviewer_cannot_decide(agent, support_user, outsider):
    task = waiting_review(agent)
    for person in (support_user, outsider):
        with pytest.raises(NotPermitted):
            task_review_decide(task_id=task.task_id, user=person, decision="confirm", evidence="ok")
    task.refresh_from_db()
    assert task.status == TaskStatus.WAITING_REVIEW


def test_a_task_already_decided_takes_no_second_decision(agent, reviewer, senior):
    task = waiting_review(agent)
    task_review_decide(task_id=task.task_id, user=reviewer, decision="reject", evidence="No.")
    with pytest.raises(Conflict):
        task_review_decide(task_id=task.task_id, user=senior, decision="confirm", evidence="Yes.")
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED


def test_the_agent_may_still_give_up_a_task_waiting_for_review(agent):
    task = waiting_review(agent)
    lease = make_lease(task)
    task_transition(task_id=task.task_id, to=TaskStatus.FAILED, expected_version=task.version,
                    fencing_token=lease.fencing_token, actor=agent.ref, reason="customer withdrew")
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
