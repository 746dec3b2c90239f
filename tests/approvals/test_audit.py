"""Audited tiers: an entry for every call run at once under "run and audit", reviewed or
flagged by a reviewer of that tier or above in the tenant, never by the call's proposer."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import audit
from approvals.models import AuditReview, AuditStatus, PolicyTier
from console.lib.errors import Conflict, InvalidInput, NotFound, NotPermitted
from console.models import Event, Role
from ledger import decisions
from ledger.proposals import call_propose
from tests.conftest import make_user
from tests.fixtures.api import refund, start_task

pytestmark = pytest.mark.django_db


def propose(agent, run, *, call_id="call-1", step_id="step-1", tool="payments.refund", arguments=None):
    return call_propose(principal=agent, task_id=run.task_id, call_id=call_id, step_id=step_id, tool_name=tool,
                        arguments=arguments or refund(30), expected_version=run.version,
                        fencing_token=run.fencing_token)


@pytest.fixture
def audited(agent) -> AuditReview:
    run = start_task(agent)
    proposal = propose(agent, run)
    return AuditReview.objects.get(pk=proposal.operation_id)


def test_a_call_run_at_once_under_an_audited_tier_gets_an_unreviewed_entry(agent):
    run = start_task(agent)
    proposal = propose(agent, run)
    assert (proposal.decision, proposal.risk_tier) == ("dispatched", 1)
    entry = AuditReview.objects.get(pk=proposal.operation_id)
    assert (entry.status, entry.risk_tier, entry.call_id, entry.tool.name, entry.requested_by_id,
            entry.proposed_by_id) == (AuditStatus.UNREVIEWED, 1, "call-1", "payments.refund", agent.pk, None)


def test_a_call_under_a_tier_that_just_runs_gets_no_entry(agent):
    PolicyTier.objects.filter(level=1).update(requirement=PolicyTier.Requirement.RUN)
    run = start_task(agent)
    proposal = propose(agent, run)
    assert proposal.decision == "dispatched"
    assert not AuditReview.objects.exists()


def test_held_and_refused_calls_get_no_entry(agent):
    run = start_task(agent, constraints={"max_tool_calls": 1})
    assert propose(agent, run, arguments=refund(120)).decision == "awaiting_approval"
    assert propose(agent, run, call_id="call-2", step_id="step-2").decision == "refused"
    assert not AuditReview.objects.exists()


def test_a_regenerated_call_for_the_same_step_adds_no_second_entry(agent):
    run = start_task(agent)
    first = propose(agent, run)
    again = propose(agent, run, call_id="call-1-regenerated")
    assert again.operation_id == first.operation_id
    assert AuditReview.objects.count() == 1


def test_a_reviewer_marks_a_call_reviewed_and_an_event_says_so(audited, reviewer):
    entry = audit.audit_review(operation_id=audited.pk, reviewer=reviewer, verdict="reviewed", note="")
    entry.refresh_from_db()
    assert (entry.status, entry.reviewed_by, entry.reviewed_at is not None) == ("reviewed", reviewer, True)
    event = Event.objects.get(entity=Event.Entity.AUDIT, entity_id=audited.pk)
    assert (event.from_status, event.to_status, event.actor) == ("unreviewed", "reviewed", "user:reviewer")


def test_a_flag_needs_a_note_and_emits_an_event_with_it(audited, reviewer):
    with pytest.raises(InvalidInput):
        audit.audit_review(operation_id=audited.pk, reviewer=reviewer, verdict="flagged", note="  ")
    assert AuditReview.objects.get(pk=audited.pk).status == "unreviewed"
    audit.audit_review(operation_id=audited.pk, reviewer=reviewer, verdict="flagged", note="wrong customer")
    entry = AuditReview.objects.get(pk=audited.pk)
    assert (entry.status, entry.note) == ("flagged", "wrong customer")
    event = Event.objects.get(entity=Event.Entity.AUDIT, entity_id=audited.pk)
    assert (event.to_status, event.reason, event.evidence["note"]) == ("flagged", "wrong customer", "wrong customer")


def test_a_second_verdict_is_a_conflict_that_names_the_first_reviewer(audited, reviewer, senior):
    audit.audit_review(operation_id=audited.pk, reviewer=reviewer, verdict="reviewed", note="")
    with pytest.raises(Conflict, match="Already reviewed by reviewer"):
        audit.audit_review(operation_id=audited.pk, reviewer=senior, verdict="flagged", note="late doubt")
    # The same verdict again is a no-op.
    audit.audit_review(operation_id=audited.pk, reviewer=senior, verdict="reviewed", note="")
    assert AuditReview.objects.get(pk=audited.pk).reviewed_by == reviewer


def test_a_reviewer_below_the_calls_tier_may_not_review_it(audited, tenant):
    low = make_user("low", tenant, Role.REVIEWER, max_tier=0)
    with pytest.raises(NotPermitted):
        audit.audit_review(operation_id=audited.pk, reviewer=low, verdict="reviewed", note="")


def test_admins_support_and_other_tenants_reviewers_may_not_review(audited, tenant, support_user, outsider):
    admin = make_user("tenant-admin", tenant, Role.ADMIN)
    for person in (admin, support_user, outsider):
        with pytest.raises(NotPermitted):
            audit.audit_review(operation_id=audited.pk, reviewer=person, verdict="reviewed", note="")
    assert AuditReview.objects.get(pk=audited.pk).status == "unreviewed"


def test_an_unknown_entry_is_not_found(reviewer, db):
    with pytest.raises(NotFound):
        audit.audit_review(operation_id="op-nothing", reviewer=reviewer, verdict="reviewed", note="")


def test_an_unknown_verdict_is_invalid(audited, reviewer):
    with pytest.raises(InvalidInput):
        audit.audit_review(operation_id=audited.pk, reviewer=reviewer, verdict="approved", note="")


def test_an_edit_that_runs_at_once_is_the_editors_call_and_they_may_not_review_it(agent, reviewer, senior):
    run = start_task(agent)
    held = propose(agent, run, arguments=refund(120))
    result = decisions.approval_edit_and_approve(approval_id=held.approval_id, reviewer=reviewer,
                                                 arguments=refund(20), reason="smaller refund")
    assert result.decision == "dispatched"
    entry = AuditReview.objects.get(pk=result.operation_id)
    assert entry.proposed_by == reviewer
    assert not audit.may_review(reviewer, entry)
    with pytest.raises(NotPermitted, match="You proposed this call"):
        audit.audit_review(operation_id=entry.pk, reviewer=reviewer, verdict="reviewed", note="")
    audit.audit_review(operation_id=entry.pk, reviewer=senior, verdict="reviewed", note="")


def test_the_days_count_audited_calls_reviews_and_flags(agent, reviewer, tenant):
    run = start_task(agent)
    ids = [propose(agent, run, call_id=f"c{n}", step_id=f"s{n}").operation_id for n in range(4)]
    old = timezone.now() - timedelta(days=3)
    AuditReview.objects.filter(pk=ids[3]).update(created_at=old)
    audit.audit_review(operation_id=ids[0], reviewer=reviewer, verdict="reviewed", note="")
    audit.audit_review(operation_id=ids[1], reviewer=reviewer, verdict="flagged", note="odd")
    days = audit.audit_days({tenant.pk})
    assert len(days) == audit.PLOT_DAYS
    assert (days[-1].audited, days[-1].reviewed, days[-1].flagged) == (3, 1, 1)
    assert days[-4].audited == 1
    assert audit.audit_backlog({tenant.pk}) == 2
    assert audit.audit_days({tenant.pk + 1000})[-1].audited == 0
