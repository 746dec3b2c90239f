"""The support console's pages: the queue, one operation, and the actions' HTTP answers."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledger import decisions
from ledger.models import Operation, OperationStatus
from tests.fixtures.support import age_last_attempt, make_operation, make_unknown, record_answer

S = OperationStatus
pytestmark = pytest.mark.django_db

QUEUE = "/operations/unknown/"


def detail_url(operation: Operation) -> str:
    return reverse("operations:detail", args=[operation.operation_id])


def test_the_queue_lists_only_operations_waiting_in_the_users_tenants(client, agent, outsider_agent, support_user):
    mine = make_operation(agent, call_id="call-mine")
    manual = make_operation(agent, status=S.MANUAL, call_id="call-manual")
    theirs = make_operation(outsider_agent, call_id="call-theirs")
    settled = make_operation(agent, status=S.AUTHORIZED, call_id="call-settled")
    client.force_login(support_user)
    response = client.get(QUEUE)
    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="op-{mine.operation_id}"' in html
    assert f'id="op-{manual.operation_id}"' in html
    assert f'id="op-{theirs.operation_id}"' not in html
    assert f'id="op-{settled.operation_id}"' not in html
    assert response.context["counts"] == {S.UNKNOWN: 1, S.MANUAL: 1, S.COMPENSATION_REQUIRED: 0}
    assert response.context["active_nav"] == "unknown"
    assert 'ws-connect="/ws/live/unknown/all/"' in html


def test_the_queue_is_oldest_first(client, agent, support_user):
    first = make_operation(agent)
    second = make_operation(agent)
    client.force_login(support_user)
    rows = client.get(QUEUE).context["rows"]
    assert [r.operation_id for r in rows] == [first.operation_id, second.operation_id]


def test_filters_and_search_narrow_the_queue_and_htmx_gets_only_the_table(client, agent, support_user):
    refund = make_operation(agent, call_id="call-refund-77")
    mail = make_operation(agent, tool_name="mail.send", status=S.MANUAL, call_id="call-mail-88")
    client.force_login(support_user)

    def listed(**params) -> set[str]:
        return {r.operation_id for r in client.get(QUEUE, params).context["rows"]}

    assert listed(status="manual") == {mail.operation_id}
    assert listed(tool="payments.refund") == {refund.operation_id}
    assert listed(q="refund-77") == {refund.operation_id}
    assert listed(q=mail.operation_id[:12]) == {mail.operation_id}
    assert listed(q=refund.task_id) == {refund.operation_id}
    fragment = client.get(QUEUE, {"q": "mail-88"}, HTTP_HX_REQUEST="true")
    body = fragment.content.decode()
    assert body.lstrip().startswith('<div id="queue-results"')
    assert "<html" not in body
    assert f'id="op-{mail.operation_id}"' in body


def test_the_queue_paginates(client, agent, support_user, monkeypatch):
    monkeypatch.setattr("ledger.views.PAGE_SIZE", 2)
    ops = [make_operation(agent) for _ in range(3)]
    client.force_login(support_user)
    page2 = client.get(QUEUE, {"page": 2})
    assert [r.operation_id for r in page2.context["rows"]] == [ops[2].operation_id]
    assert page2.context["live_arg"] == "all"  # the last page receives new arrivals
    assert client.get(QUEUE).context["live_arg"] != "all"


def test_the_queue_query_count_does_not_grow_with_rows(client, agent, support_user, monkeypatch):
    monkeypatch.setattr("ledger.views.PAGE_SIZE", 50)

    def queries_for_queue(expected_rows: int) -> int:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(QUEUE)
        assert len(response.context["rows"]) == expected_rows
        return len(queries)

    for _ in range(3):
        make_operation(agent, status=S.MANUAL)
    client.force_login(support_user)
    client.get(QUEUE)  # warm the session and the content types
    with_3 = queries_for_queue(3)
    for _ in range(27):
        make_operation(agent)
    assert queries_for_queue(30) == with_3


def test_the_detail_page_shows_the_timeline_attempts_and_task(client, agent, support_user):
    operation = make_operation(agent, status=S.MANUAL)
    record_answer(operation, "absent", raw={"status": 404, "body": {"found": False}})
    client.force_login(support_user)
    response = client.get(detail_url(operation))
    assert response.status_code == 200
    html = response.content.decode()
    assert "ReadTimeout" in html  # the attempt's error
    assert "timed out after 5.0s" in html  # its raw response, as JSON
    assert "Provider answered" in html
    assert operation.task.goal in html
    assert f'ws-connect="/ws/live/operation/{operation.operation_id}/"' in html
    assert 'id="query-button"' in html
    assert [e.to_status for e in response.context["timeline"]] == [
        "planned", "authorized", "dispatched", "unknown", "manual", "absent"]


def test_the_detail_page_is_404_for_another_tenant(client, agent, outsider):
    operation = make_operation(agent)
    client.force_login(outsider)
    assert client.get(detail_url(operation)).status_code == 404
    assert client.post(reverse("operations:query", args=[operation.operation_id])).status_code == 404
    assert client.get(QUEUE).status_code == 200  # their own (empty) queue


def test_anonymous_visitors_are_sent_to_log_in(client, agent):
    operation = make_operation(agent)
    response = client.get(detail_url(operation))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_a_reviewer_may_look_but_an_action_is_403(client, agent, reviewer):
    operation = make_operation(agent)
    client.force_login(reviewer)
    page = client.get(detail_url(operation))
    assert page.status_code == 200
    assert 'id="look-only"' in page.content.decode()
    assert 'id="confirm-form"' not in page.content.decode()
    response = client.post(reverse("operations:fail", args=[operation.operation_id]), {"fail-reason": "x"})
    assert response.status_code == 403
    assert client.post(reverse("operations:query", args=[operation.operation_id])).status_code == 403
    assert Operation.objects.get(pk=operation.pk).status == S.UNKNOWN


def test_an_action_without_a_reason_is_400_with_the_message(client, agent, support_user):
    operation = make_operation(agent)
    client.force_login(support_user)
    response = client.post(reverse("operations:compensate", args=[operation.operation_id]), {"compensate-reason": ""})
    assert response.status_code == 400
    assert "Every support action needs a reason." in response.content.decode()
    assert Operation.objects.get(pk=operation.pk).status == S.UNKNOWN


def test_retry_without_evidence_is_400_and_the_buttons_are_disabled(client, agent, support_user):
    operation = make_operation(agent)
    client.force_login(support_user)
    page = client.get(detail_url(operation)).content.decode()
    assert 'id="retry-button" disabled' in page
    response = client.post(reverse("operations:retry", args=[operation.operation_id]), {"retry-reason": "go"})
    assert response.status_code == 400
    assert "query it first" in response.content.decode()


def test_an_action_succeeds_and_redirects_then_a_second_one_is_409(client, agent, support_user, support2):
    operation = make_operation(agent)
    age_last_attempt(operation)
    record_answer(operation, "absent")
    client.force_login(support_user)
    response = client.post(reverse("operations:fail", args=[operation.operation_id]), {"fail-reason": "no effect"})
    assert response.status_code == 302
    assert response["Location"] == detail_url(operation)
    assert Operation.objects.get(pk=operation.pk).status == S.FAILED

    client.force_login(support2)
    response = client.post(reverse("operations:retry", args=[operation.operation_id]), {"retry-reason": "again"})
    assert response.status_code == 409
    assert "Already resolved by user:support" in response.content.decode()


def test_querying_the_provider_from_htmx_answers_with_a_note(client, agent, support_user, monkeypatch,
                                                             django_capture_on_commit_callbacks):
    from ledger.tasks import query_provider

    sent = []
    monkeypatch.setattr(query_provider, "delay", lambda *args: sent.append(args))
    operation = make_operation(agent)
    client.force_login(support_user)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("operations:query", args=[operation.operation_id]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "Asked the provider" in response.content.decode()
    assert sent == [(operation.operation_id, "user:support")]


def test_the_detail_page_shows_the_approval_and_its_decision(client, agent, support_user, reviewer):
    from approvals import services as approval_services

    operation = make_operation(agent, status=S.PLANNED)
    approval = approval_services.approval_request_create(
        operation=operation, task_type=operation.task.task_type, call_id=operation.call_id, state_version=operation.task.version, risk_tier=3,
        approvals_needed=1, ttl_seconds=600, reasons=["amount > 50"], actor=agent.ref)
    decisions.approval_approve(approval_id=approval.approval_id, reviewer=reviewer,
                                       reason="matches the ticket")
    make_unknown(operation)
    client.force_login(support_user)
    html = client.get(detail_url(operation)).content.decode()
    assert approval.approval_id in html
    assert "<strong>reviewer</strong> approved" in html
    assert "matches the ticket" in html
