"""The support actions (ledger.support): each needs a reason and its evidence, acts only within the
actor's tenants and roles, and exactly one action on an operation counts."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from console.lib.errors import Conflict, InvalidInput, NotFound, NotPermitted
from console.models import Event
from ledger import support
from ledger.compensation import compensation_propose
from ledger.models import Operation, OperationStatus
from ledger.support import ProviderDenied
from ledger.tasks import query_provider
from tests.fixtures.support import (
    age_last_attempt,
    leaving_events,
    make_operation,
    record_answer,
    refund_at_provider,
)

S = OperationStatus


def status_of(operation: Operation) -> str:
    return Operation.objects.get(pk=operation.pk).status


# ---------------------------------------------------------------------------- the provider


@pytest.mark.django_db
def test_the_query_task_records_the_providers_answer_as_evidence(agent, support_user, payments):
    operation = make_operation(agent)
    assert query_provider(operation.operation_id, "user:support") == "absent"
    refund = refund_at_provider(payments, operation)
    assert query_provider(operation.operation_id, "user:support") == "found"

    answers = list(Event.objects.filter(entity="provider_query", entity_id=operation.operation_id).order_by("id"))
    assert [a.to_status for a in answers] == ["absent", "found"]
    assert answers[0].tenant_id == operation.tenant_id
    assert answers[1].evidence["raw"]["body"]["refund"]["id"] == refund["id"]
    assert answers[1].evidence["asked_at"]
    assert status_of(operation) == S.UNKNOWN  # evidence, not a transition


@pytest.mark.django_db
def test_asking_for_a_query_enqueues_it_after_commit(agent, support_user, django_capture_on_commit_callbacks,
                                                     monkeypatch):
    operation = make_operation(agent)
    sent = []
    monkeypatch.setattr(query_provider, "delay", lambda *args: sent.append(args))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        support.support_request_provider_query(operation_id=operation.operation_id, user=support_user)
    assert len(callbacks) == 1
    assert sent == [(operation.operation_id, "user:support")]


# ------------------------------------------------------------------------------ confirm


@pytest.mark.django_db
def test_it_refuses_to_confirm_a_receipt_when_the_provider_has_no_effect(agent, support_user, payments):
    operation = make_operation(agent)
    with pytest.raises(ProviderDenied, match="no effect"):
        support.support_confirm(operation_id=operation.operation_id, user=support_user,
                                remote_id="re_made_up", reason="customer says it arrived")
    assert status_of(operation) == S.UNKNOWN
    assert leaving_events(operation) == []


@pytest.mark.django_db
def test_it_refuses_to_confirm_a_remote_id_other_than_the_providers(agent, support_user, payments):
    operation = make_operation(agent)
    refund_at_provider(payments, operation)
    with pytest.raises(ProviderDenied, match="not re_someone_elses"):
        support.support_confirm(operation_id=operation.operation_id, user=support_user,
                                remote_id="re_someone_elses", reason="found in the dashboard")
    assert status_of(operation) == S.UNKNOWN
    assert leaving_events(operation) == []


@pytest.mark.django_db
def test_it_refuses_to_confirm_an_effect_that_differs_from_the_approved_intent(agent, support_user, payments):
    operation = make_operation(agent, status=S.MANUAL)
    refund = refund_at_provider(payments, operation, amount=operation.arguments["amount"] + 100)
    with pytest.raises(ProviderDenied, match="differs from what was approved: amount") as caught:
        support.support_confirm(operation_id=operation.operation_id, user=support_user, remote_id=refund["id"],
                                reason="found in the provider dashboard")
    assert caught.value.details["differences"]["amount"]["found"] == operation.arguments["amount"] + 100
    assert status_of(operation) == S.MANUAL
    assert leaving_events(operation) == []


@pytest.mark.django_db
def test_it_confirms_with_the_receipt_when_the_provider_has_the_effect(agent, support_user, payments):
    operation = make_operation(agent, status=S.MANUAL)
    refund = refund_at_provider(payments, operation)
    support.support_confirm(operation_id=operation.operation_id, user=support_user, remote_id=refund["id"],
                            reason="found in the provider dashboard")
    operation.refresh_from_db()
    assert operation.status == S.CONFIRMED
    assert operation.receipt["remote_id"] == refund["id"]
    assert operation.receipt["entered_by"] == "user:support"
    [event] = leaving_events(operation)
    assert (event.from_status, event.to_status, event.actor) == (S.MANUAL, S.CONFIRMED, "user:support")
    assert event.reason == "found in the provider dashboard"
    assert event.evidence["query"] == "found"
    assert event.evidence["remote_id"] == refund["id"]


@pytest.mark.django_db
def test_a_confirm_needs_a_reason_and_a_remote_id(agent, support_user):
    operation = make_operation(agent)
    with pytest.raises(InvalidInput, match="reason"):
        support.support_confirm(operation_id=operation.operation_id, user=support_user, remote_id="re_1", reason=" ")
    with pytest.raises(InvalidInput, match="remote ID"):
        support.support_confirm(operation_id=operation.operation_id, user=support_user, remote_id="", reason="seen")
    assert status_of(operation) == S.UNKNOWN


# ------------------------------------------------------------------- retry and fail: evidence


@pytest.mark.django_db
def test_it_refuses_to_retry_without_evidence_from_the_provider(agent, support_user):
    operation = make_operation(agent)
    age_last_attempt(operation)
    with pytest.raises(InvalidInput, match="query it first"):
        support.support_mark_retry_safe(operation_id=operation.operation_id, user=support_user, reason="try again")
    assert status_of(operation) == S.UNKNOWN
    assert leaving_events(operation) == []


@pytest.mark.django_db
def test_it_refuses_to_retry_when_the_provider_was_asked_before_the_old_request_could_stop(agent, support_user):
    operation = make_operation(agent)  # its attempt started just now; the tool's timeout is 5 s
    record_answer(operation, "absent")
    with pytest.raises(InvalidInput, match="query it again"):
        support.support_mark_retry_safe(operation_id=operation.operation_id, user=support_user, reason="try again")
    assert status_of(operation) == S.UNKNOWN


@pytest.mark.django_db
def test_it_refuses_to_retry_when_the_latest_answer_is_not_absent(agent, support_user):
    operation = make_operation(agent)
    age_last_attempt(operation)
    record_answer(operation, "absent")
    record_answer(operation, "error", raw={"status": 500})
    with pytest.raises(InvalidInput, match="“error”"):
        support.support_mark_retry_safe(operation_id=operation.operation_id, user=support_user, reason="try again")
    assert status_of(operation) == S.UNKNOWN


@pytest.mark.django_db
def test_it_declares_safe_to_retry_on_a_recent_absent_and_enqueues_the_dispatch(
        agent, support_user, payments, django_capture_on_commit_callbacks, monkeypatch):
    operation = make_operation(agent)
    age_last_attempt(operation)
    query_provider(operation.operation_id, "user:support")  # the real provider: absent
    answer = Event.objects.get(entity="provider_query", entity_id=operation.operation_id)
    dispatched = []
    monkeypatch.setattr("ledger.tasks.enqueue_dispatch", lambda op_id, **kw: dispatched.append(op_id))
    with django_capture_on_commit_callbacks(execute=True):
        support.support_mark_retry_safe(operation_id=operation.operation_id, user=support_user,
                                        reason="provider has nothing; retry with the same key")
    operation.refresh_from_db()
    assert operation.status == S.RETRY_SAFE
    assert operation.idempotency_key == operation.operation_id
    assert dispatched == [operation.operation_id]
    [event] = leaving_events(operation)
    assert event.to_status == S.RETRY_SAFE
    assert event.evidence["provider_query_event"] == answer.id
    assert event.evidence["answer"] == "absent"


@pytest.mark.django_db
def test_it_marks_failed_only_with_the_same_evidence(agent, support_user):
    operation = make_operation(agent, status=S.MANUAL)
    with pytest.raises(InvalidInput):
        support.support_fail(operation_id=operation.operation_id, user=support_user, reason="nothing happened")
    age_last_attempt(operation)
    record_answer(operation, "absent")
    support.support_fail(operation_id=operation.operation_id, user=support_user, reason="nothing happened")
    assert status_of(operation) == S.FAILED
    [event] = leaving_events(operation)
    assert event.evidence["answer"] == "absent"
    assert event.actor == "user:support"


# ------------------------------------------------------------------------ escalate, compensate


@pytest.mark.django_db
def test_it_escalates_to_a_named_support_person_and_emails_them(agent, support_user, support2, mailoutbox,
                                                                 django_capture_on_commit_callbacks):
    operation = make_operation(agent)
    with django_capture_on_commit_callbacks(execute=True):
        support.support_escalate(operation_id=operation.operation_id, user=support_user, assignee="support2",
                                 reason="needs the payments team")
    assert status_of(operation) == S.MANUAL
    event = Event.objects.filter(entity="operation", entity_id=operation.operation_id).latest("id")
    assert (event.from_status, event.to_status) == (S.UNKNOWN, S.MANUAL)
    assert event.evidence == {"assigned_to": "support2", "assigned_by": "user:support"}
    assert len(mailoutbox) == 1
    assert mailoutbox[0].to == ["support2@example.com"]
    assert operation.operation_id in mailoutbox[0].subject

    # Escalating a manual operation again re-assigns it (an event, no transition).
    support.support_escalate(operation_id=operation.operation_id, user=support_user, assignee="support",
                             reason="back to me")
    event = Event.objects.filter(entity="operation", entity_id=operation.operation_id).latest("id")
    assert (event.kind, event.to_status, event.evidence["assigned_to"]) == (Event.Kind.REASSIGNED, S.MANUAL, "support")


@pytest.mark.django_db
def test_it_refuses_to_escalate_to_someone_without_the_support_role(agent, support_user, reviewer):
    operation = make_operation(agent)
    with pytest.raises(InvalidInput, match="support person"):
        support.support_escalate(operation_id=operation.operation_id, user=support_user, assignee="reviewer",
                                 reason="you look at it")
    assert status_of(operation) == S.UNKNOWN


# ------------------------------------------------------------------------------ who may act


@pytest.mark.django_db
def test_nobody_can_act_outside_their_tenant(agent, outsider):
    operation = make_operation(agent)
    age_last_attempt(operation)
    record_answer(operation, "absent")
    with pytest.raises(NotFound):
        support.support_fail(operation_id=operation.operation_id, user=outsider, reason="not mine")
    with pytest.raises(NotFound):
        support.support_request_provider_query(operation_id=operation.operation_id, user=outsider)
    assert status_of(operation) == S.UNKNOWN


@pytest.mark.django_db
def test_reviewers_may_look_but_not_act(agent, reviewer, reviewer_and_support):
    operation = make_operation(agent)
    age_last_attempt(operation)
    record_answer(operation, "absent")
    assert support.operation_for_viewer(operation_id=operation.operation_id, user=reviewer) == operation
    with pytest.raises(NotPermitted):
        support.support_fail(operation_id=operation.operation_id, user=reviewer, reason="looks failed")
    with pytest.raises(NotPermitted):
        support.support_request_provider_query(operation_id=operation.operation_id, user=reviewer)
    assert status_of(operation) == S.UNKNOWN
    # A reviewer who also holds the support role may.
    support.support_fail(operation_id=operation.operation_id, user=reviewer_and_support, reason="no effect")
    assert status_of(operation) == S.FAILED


@pytest.mark.django_db
def test_a_second_action_is_refused_naming_who_resolved_it(agent, support_user, support2):
    operation = make_operation(agent)
    age_last_attempt(operation)
    record_answer(operation, "absent")
    support.support_fail(operation_id=operation.operation_id, user=support_user, reason="no effect")
    with pytest.raises(Conflict, match=r"Already resolved by user:support: failed at \d\d:\d\d:\d\d UTC"):
        support.support_mark_retry_safe(operation_id=operation.operation_id, user=support2, reason="retry")
    with pytest.raises(Conflict, match="Already resolved by user:support"):
        support.support_confirm(operation_id=operation.operation_id, user=support2, remote_id="re_1", reason="x")
    assert len(leaving_events(operation)) == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_people_resolving_at_once_count_exactly_once(agent, support_user, support2):
    if connection.vendor != "postgresql":
        pytest.skip("row locks and concurrent writers need PostgreSQL")
    from approvals.models import Tool
    from ledger.adapters import get_adapter

    # The in-process noop provider has the effect: the confirm's query finds it.
    Tool.objects.filter(name="payments.refund").update(adapter="noop")
    operation = make_operation(agent)
    get_adapter("noop").effects[operation.idempotency_key] = dict(operation.arguments)
    age_last_attempt(operation)
    record_answer(operation, "absent", asked_at=timezone.now() + timedelta(seconds=1))

    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def act(name, call):
        try:
            barrier.wait(timeout=10)
            call()
            outcomes[name] = "ok"
        except Exception as exc:  # recorded and asserted below
            outcomes[name] = exc
        finally:
            connection.close()

    threads = [
        threading.Thread(target=act, args=("confirm", lambda: support.support_confirm(
            operation_id=operation.operation_id, user=support_user, remote_id=f"noop-{operation.idempotency_key}",
            reason="the provider has it"))),
        threading.Thread(target=act, args=("fail", lambda: support.support_fail(
            operation_id=operation.operation_id, user=support2, reason="no effect"))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(type(v).__name__ if isinstance(v, Exception) else v for v in outcomes.values()) == ["Conflict", "ok"]
    [event] = leaving_events(operation)
    assert status_of(operation) == event.to_status
    loser = next(v for v in outcomes.values() if isinstance(v, Exception))
    assert f"by {event.actor}" in str(loser)


# ---------------------------------------------------------------- leaving compensation_required


@pytest.mark.django_db
def test_a_person_resolves_compensation_required_with_evidence(agent, support_user):
    operation = make_operation(agent, status=S.COMPENSATION_REQUIRED)
    support.support_mark_compensated(operation_id=operation.operation_id, user=support_user,
                                     evidence="bank transfer TR-4411 reversed the double refund",
                                     reason="settled with the customer")
    assert status_of(operation) == S.COMPENSATED
    event = Event.objects.filter(entity="operation", entity_id=operation.operation_id).order_by("-id")[0]
    assert (event.from_status, event.to_status, event.actor) == (S.COMPENSATION_REQUIRED, S.COMPENSATED,
                                                                 "user:support")
    assert event.evidence["evidence"] == "bank transfer TR-4411 reversed the double refund"


@pytest.mark.django_db
def test_resolving_compensation_needs_evidence_a_reason_and_support_staff(agent, support_user, reviewer, outsider):
    operation = make_operation(agent, status=S.COMPENSATION_REQUIRED)
    with pytest.raises(InvalidInput, match="evidence"):
        support.support_mark_compensated(operation_id=operation.operation_id, user=support_user, evidence=" ",
                                         reason="r")
    with pytest.raises(InvalidInput):
        support.support_mark_compensated(operation_id=operation.operation_id, user=support_user, evidence="e",
                                         reason="")
    with pytest.raises(NotPermitted):
        support.support_mark_compensated(operation_id=operation.operation_id, user=reviewer, evidence="e",
                                         reason="r")
    with pytest.raises(NotFound):
        support.support_mark_compensated(operation_id=operation.operation_id, user=outsider, evidence="e",
                                         reason="r")
    assert status_of(operation) == S.COMPENSATION_REQUIRED


@pytest.mark.django_db
def test_only_compensation_required_is_resolved_this_way(agent, support_user):
    operation = make_operation(agent, status=S.UNKNOWN)
    with pytest.raises(Conflict):
        support.support_mark_compensated(operation_id=operation.operation_id, user=support_user, evidence="e",
                                         reason="r")
    assert status_of(operation) == S.UNKNOWN


@pytest.mark.django_db
def test_a_compensation_still_under_way_blocks_resolving_by_hand(agent, support_user):
    operation = make_operation(agent, status=S.COMPENSATION_REQUIRED)
    compensation_propose(operation_id=operation.operation_id, user=support_user, tool_name="payments.refund",
                         arguments=operation.arguments, reason="undo")
    with pytest.raises(Conflict, match="still"):
        support.support_mark_compensated(operation_id=operation.operation_id, user=support_user, evidence="e",
                                         reason="r")
    assert status_of(operation) == S.COMPENSATION_REQUIRED


@pytest.mark.django_db
def test_the_detail_page_resolves_compensation_required(client, agent, support_user):
    operation = make_operation(agent, status=S.COMPENSATION_REQUIRED)
    client.force_login(support_user)
    url = reverse("operations:detail", args=[operation.operation_id])
    assert 'id="compensated-form"' in client.get(url).content.decode()
    response = client.post(reverse("operations:compensated", args=[operation.operation_id]),
                           {"compensated-evidence": "TR-1", "compensated-reason": "settled"})
    assert response.status_code == 302
    assert status_of(operation) == S.COMPENSATED
