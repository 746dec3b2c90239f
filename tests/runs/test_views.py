"""Runs pages: the list (tenant-scoped, filters, search) and one run with its trace."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.models import Role
from runs.models import Span
from runs.services import task_create
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client, tenant):
    user = make_user("viewer", tenant, Role.REVIEWER, max_tier=3)
    client.force_login(user)
    return user


def add_spans(task, n: int, *, trace: str = "a" * 32, first: int = 0) -> None:
    t0 = timezone.now()
    Span.objects.bulk_create([
        Span(tenant_id=task.tenant_id, trace_id=trace, span_id=f"{first + i + 1:016x}",
             parent_span_id="" if i == 0 else f"{first + 1:016x}", name=f"span {i}",
             start_time=t0 + timedelta(milliseconds=i), end_time=t0 + timedelta(milliseconds=i + 5),
             duration_ms=5.0, task=task, step_id=f"step-{i % 3}",
             status_code="error" if i == 2 else "unset", input_tokens=10, output_tokens=2)
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


def test_the_detail_page_shows_contract_steps_and_waterfall(client, viewer, agent):
    task = task_create(principal=agent, task_type="refund", goal="Refund 30 EUR",
                       success_criteria=[{"kind": "refund_confirmed"}])
    add_spans(task, 5)
    body = client.get(f"/runs/{task.task_id}/").content.decode()
    assert "Refund 30 EUR" in body and "refund_confirmed" in body
    assert body.count('class="waterfall__row') == 5
    assert "1 error" in body and "step-2" in body
    assert f'ws-connect="/ws/live/run/{task.task_id}/"' in body


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


def test_an_unchanged_trace_is_not_rendered_again(client, viewer, agent):
    task = task_create(principal=agent, task_type="refund", goal="g")
    add_spans(task, 3)
    page = client.get(f"/runs/{task.task_id}/").content.decode()
    version = page.split("trace_version=")[1].split('"')[0]
    poll = client.get(f"/runs/{task.task_id}/", {"trace_version": version}, HTTP_HX_REQUEST="true")
    assert poll.status_code == 204
    add_spans(task, 2, trace="b" * 32, first=100)
    poll = client.get(f"/runs/{task.task_id}/", {"trace_version": version}, HTTP_HX_REQUEST="true")
    assert poll.status_code == 200 and poll.content.decode().count('class="waterfall__row') == 5
