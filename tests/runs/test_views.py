"""Runs pages: the list (tenant-scoped, filters, search) and one run with its trace."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from console.models import Role
from runs.models import ModelPrice, Span, Task
from runs.services import task_create
from tests.conftest import make_user
from tests.factories import cancel_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client, tenant):
    user = make_user("viewer", tenant, Role.REVIEWER, max_tier=3)
    client.force_login(user)
    return user


def add_spans(task, n: int, *, trace: str = "a" * 32, first: int = 0, model: str = "") -> None:
    t0 = timezone.now()
    Span.objects.bulk_create([
        Span(tenant_id=task.tenant_id, trace_id=trace, span_id=f"{first + i + 1:016x}",
             parent_span_id="" if i == 0 else f"{first + 1:016x}", name=f"span {i}",
             start_time=t0 + timedelta(milliseconds=i), end_time=t0 + timedelta(milliseconds=i + 5),
             duration_ms=5.0, task=task, step_id=f"step-{i % 3}",
             status_code="error" if i == 2 else "unset", input_tokens=10, output_tokens=2, gen_ai_model=model)
        for i in range(n)
    ])


def test_the_list_shows_only_the_users_tenants(client, viewer, agent, outsider_agent):
    mine = task_create(principal=agent, task_type="refund", goal="Refund my order")
    theirs = task_create(principal=outsider_agent, task_type="refund", goal="Refund their order")
    body = client.get("/runs/").content.decode()
    assert mine.task_id in body and theirs.task_id not in body


def test_the_list_filters_by_status_and_finds_a_task_by_id(client, viewer, agent):
    first = task_create(principal=agent, task_type="refund", goal="one")
    second = task_create(principal=agent, task_type="contract_email", goal="two")
    body = client.get("/runs/", {"type": "contract_email"}).content.decode()
    assert second.task_id in body and first.task_id not in body
    body = client.get("/runs/", {"q": first.task_id}).content.decode()
    assert first.task_id in body and second.task_id not in body
    assert client.get("/runs/", {"status": "succeeded"}).content.decode().count("/runs/tsk_") == 0


def test_the_list_filters_by_tenant_and_by_recent_activity(client, viewer, agent, outsider_agent, other_tenant):
    from console.models import Membership

    Membership.objects.create(user=viewer, tenant=other_tenant, role=Role.REVIEWER, max_tier=3)
    mine = task_create(principal=agent, task_type="refund", goal="one")
    theirs = task_create(principal=outsider_agent, task_type="refund", goal="two")
    old = task_create(principal=agent, task_type="refund", goal="three")
    Task.objects.filter(pk=old.pk).update(updated_at=timezone.now() - timedelta(days=3))
    body = client.get("/runs/", {"tenant": other_tenant.id}).content.decode()
    assert theirs.task_id in body and mine.task_id not in body and 'id="id_tenant"' in body
    body = client.get("/runs/", {"since": "24h"}).content.decode()
    assert mine.task_id in body and theirs.task_id in body and old.task_id not in body
    assert old.task_id in client.get("/runs/", {"since": "7d"}).content.decode()


def test_the_list_finds_a_run_by_one_of_its_call_or_operation_ids(client, viewer, agent):
    from tests.factories import make_operation

    operation = make_operation(agent, call_id="call-findme")
    other = task_create(principal=agent, task_type="refund", goal="other")
    for query in ("call-findme", operation.operation_id):
        body = client.get("/runs/", {"q": query}).content.decode()
        assert operation.task_id in body and other.task_id not in body, query


def test_an_htmx_request_gets_only_the_results_fragment(client, viewer, agent):
    task_create(principal=agent, task_type="refund", goal="one")
    body = client.get("/runs/", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="run-results"' in body and "<html" not in body


def test_another_tenants_run_is_not_found(client, viewer, outsider_agent):
    theirs = task_create(principal=outsider_agent, task_type="refund", goal="g")
    assert client.get(f"/runs/{theirs.task_id}/").status_code == 404


def test_anonymous_visitors_are_sent_to_log_in(client):
    response = client.get("/runs/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_detail_page_shows_contract_steps_cost_and_the_spans(client, viewer, agent):
    ModelPrice.objects.create(model="gpt-x", input_per_million=Decimal("3"), output_per_million=Decimal("15"),
                              valid_from=timezone.now() - timedelta(days=1))
    task = task_create(principal=agent, task_type="refund", goal="Refund 30 EUR",
                       success_criteria=[{"kind": "refund_confirmed"}])
    add_spans(task, 5, model="gpt-x")
    response = client.get(f"/runs/{task.task_id}/")
    body = response.content.decode()
    assert "Refund 30 EUR" in body and "refund_confirmed" in body
    assert len(response.context["spans"]) == 5 and 'id="run-spans"' in body
    assert "1 error" in body and "step-2" in body
    # Per step: step-0 has spans 0 and 3, 20 input and 4 output tokens: 20 × 3/1M + 4 × 15/1M.
    step0 = body.split('data-step="step-0"')[1].split("</tr>")[0]
    assert "USD 0.0001" in step0 and ">20<" in step0 and ">4<" in step0
    total = body.split("<tfoot>")[1].split("</tfoot>")[0]
    assert "USD 0.0003" in total and ">50<" in total and ">10<" in total  # 50 × 3/1M + 10 × 15/1M
    assert f'ws-connect="/ws/live/run/{task.task_id}/"' in body


def test_the_detail_page_lists_the_runs_operations_and_approvals_with_their_states(client, viewer, agent):
    from tests.factories import make_approval_request, make_operation

    task = task_create(principal=agent, task_type="refund", goal="g")
    operation = make_operation(agent, task=task)
    approval = make_approval_request(operation)
    body = client.get(f"/runs/{task.task_id}/").content.decode()
    row = body.split(f'id="run-approval-{approval.approval_id}"')[1].split("</tr>")[0]
    assert "pending" in row and "payments.refund" in row and f"/approvals/{approval.approval_id}/" in row
    assert f'id="run-op-{operation.operation_id}"' in body
    timeline = body.split('id="run-timeline"')[1].split("</ol>")[0]  # as the live stream appends them
    assert "operation planned" in timeline and "approval pending" in timeline


def test_tokens_of_a_model_without_a_price_are_shown_as_unpriced(client, viewer, agent):
    task = task_create(principal=agent, task_type="refund", goal="g")
    add_spans(task, 2, model="no-price-model")
    body = client.get(f"/runs/{task.task_id}/").content.decode()
    assert "+24 tokens of models without a price" in body


@pytest.mark.parametrize("rows", [3, 30])
def test_the_list_query_count_does_not_grow_with_rows(client, viewer, agent, rows, django_assert_max_num_queries):
    for i in range(rows):
        task_create(principal=agent, task_type="refund", goal=f"g{i}")
    with django_assert_max_num_queries(10):
        assert client.get("/runs/").status_code == 200


@pytest.mark.parametrize("spans", [3, 300])
def test_the_detail_query_count_does_not_grow_with_spans(client, viewer, agent, spans, django_assert_max_num_queries):
    task = task_create(principal=agent, task_type="refund", goal="g")
    add_spans(task, spans)
    with django_assert_max_num_queries(14):
        assert client.get(f"/runs/{task.task_id}/").status_code == 200
    with django_assert_max_num_queries(10):
        assert client.get(f"/runs/{task.task_id}/trace/").status_code == 200


def trace(client, task, after: int, known: int):
    return client.get(f"/runs/{task.task_id}/trace/", {"after": after, "known": known})


def test_the_live_trace_sends_only_spans_the_page_has_not_seen(client, viewer, agent):
    task = task_create(principal=agent, task_type="refund", goal="g")
    add_spans(task, 3)
    page = client.get(f"/runs/{task.task_id}/")
    cursor = page.context["cursor"]
    assert trace(client, task, cursor, 3).status_code == 204  # nothing new: nothing read, nothing sent
    add_spans(task, 2, trace="b" * 32, first=100)
    answer = trace(client, task, cursor, 3)
    data = answer.json()
    assert answer.status_code == 200 and data["total"] == 5 and data["active"] is True
    assert sorted(row[1] for row in data["spans"]) == [f"{101:016x}", f"{102:016x}"]
    assert data["cursor"] > cursor and 'id="run-trace-summary"' in data["summary"]
    assert trace(client, task, data["cursor"], 5).status_code == 204


def test_a_page_that_missed_a_span_gets_all_of_them_again(client, viewer, agent):
    task = task_create(principal=agent, task_type="refund", goal="g")
    add_spans(task, 4)
    cursor = client.get(f"/runs/{task.task_id}/").context["cursor"]
    # The page holds 3 of 4 (one committed below its cursor): the counts differ, so it asks from 0.
    data = trace(client, task, cursor, 3).json()
    assert data["spans"] == [] and data["total"] == 4
    assert len(trace(client, task, 0, 3).json()["spans"]) == 4


def test_a_finished_run_says_so_a_minute_later_and_the_page_stops_asking(client, viewer, agent):
    task = task_create(principal=agent, task_type="refund", goal="g")
    add_spans(task, 1)
    cursor = client.get(f"/runs/{task.task_id}/").context["cursor"]
    cancel_task(task.task_id, reason="done")
    # Exporters send a run's last spans a few seconds after it ended: the page keeps asking a minute.
    assert trace(client, task, cursor, 1).status_code == 204
    Task.objects.filter(pk=task.pk).update(updated_at=timezone.now() - timedelta(seconds=61))
    assert trace(client, task, cursor, 1).json()["active"] is False
    assert 'data-active="false"' in client.get(f"/runs/{task.task_id}/").content.decode()


def test_another_tenants_trace_is_not_found(client, viewer, outsider_agent):
    theirs = task_create(principal=outsider_agent, task_type="refund", goal="g")
    assert client.get(f"/runs/{theirs.task_id}/trace/").status_code == 404
