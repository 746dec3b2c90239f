"""Reliability indicators from the ledger and events; release gates; pass@k and pass^k."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger import services as ledger_services
from ledger.models import OperationStatus as S
from runs import gates, metrics
from runs.defaults import ensure_release_gates
from runs.models import ReleaseGate, Task, TaskStatus
from tests.factories import make_operation, make_task

pytestmark = pytest.mark.django_db


def since():
    return timezone.now() - timedelta(hours=1)


def test_pass_at_k_and_pass_hat_k_follow_the_unbiased_estimators():
    assert metrics.pass_at_k(10, 10, 3) == 1.0
    assert metrics.pass_at_k(10, 0, 3) == 0.0
    assert metrics.pass_at_k(5, 1, 1) == pytest.approx(0.2)
    assert metrics.pass_hat_k(5, 4, 2) == pytest.approx(6 / 10)
    # 95% per trial, 10 in a row: pass^k falls while pass@k rises.
    assert metrics.pass_hat_k(20, 19, 10) < 0.6 < metrics.pass_at_k(20, 19, 10)


def recover_one_by_the_system_and_one_by_a_person(agent) -> None:
    auto = make_operation(agent, status=S.UNKNOWN)
    ledger_services.operation_confirm(operation_id=auto.operation_id, receipt={"remote_id": "r1"},
                                      actor="system:reconciler", reason="found")
    person = make_operation(agent, status=S.MANUAL)
    ledger_services.operation_fail(operation_id=person.operation_id, actor="user:support", reason="no effect",
                                   evidence={"query": "absent"})


def test_recovery_is_automatic_when_the_system_resolves_and_personal_when_a_user_does(agent):
    recover_one_by_the_system_and_one_by_a_person(agent)
    make_operation(agent, status=S.UNKNOWN)  # still open
    result = metrics.compute(tenant_ids={agent.tenant_id}, since=since())
    assert (result.auto_recovered, result.resolved_by_person, result.went_unknown) == (1, 1, 3)
    assert result.automatic_recovery_rate == pytest.approx(1 / 3)
    assert result.recovery_time_median_seconds is not None and result.recovery_time_median_seconds >= 0


def test_success_rate_counts_only_finished_tasks_and_never_another_tenant(agent, outsider_agent):
    done = make_task(agent)
    Task.objects.filter(pk=done.pk).update(status=TaskStatus.SUCCEEDED)
    failed = make_task(agent)
    Task.objects.filter(pk=failed.pk).update(status=TaskStatus.FAILED)
    make_task(agent)  # still queued
    foreign = make_task(outsider_agent)
    Task.objects.filter(pk=foreign.pk).update(status=TaskStatus.FAILED)
    result = metrics.compute(tenant_ids={agent.tenant_id}, since=since())
    assert (result.tasks_succeeded, result.tasks_terminal, result.terminal_success_rate) == (1, 2, 0.5)


def test_repeated_trials_of_the_same_inputs_give_pass_at_k(agent):
    for status in (TaskStatus.SUCCEEDED, TaskStatus.SUCCEEDED, TaskStatus.FAILED):
        task = make_task(agent, inputs={"order_id": "same"})
        Task.objects.filter(pk=task.pk).update(status=status)
    result = metrics.compute(tenant_ids={agent.tenant_id}, since=since())
    assert result.trial_groups == 1
    assert result.pass_at_k[1] == pytest.approx(2 / 3)
    assert result.pass_hat_k[3] == 0.0


def test_retry_amplification_counts_attempts_per_operation(agent):
    make_operation(agent, status=S.CONFIRMED)
    retried = make_operation(agent, status=S.RETRY_SAFE)
    ledger_services.operation_dispatch(operation_id=retried.operation_id, worker="w2")
    result = metrics.compute(tenant_ids={agent.tenant_id}, since=since())
    assert result.retry_amplification == pytest.approx(3 / 2)
    assert result.duplicates == 0


def test_release_gates_pass_fail_or_say_no_data(agent):
    ensure_release_gates()
    task = make_task(agent)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.FAILED)
    result = metrics.compute(tenant_ids={agent.tenant_id}, since=since())
    results, _releases = gates.evaluate(tenant_ids={agent.tenant_id}, since=since(), fallback=result)
    verdicts = {r.gate.indicator: r.passed for r in results}
    assert verdicts[ReleaseGate.Indicator.SUCCESS_RATE] is False
    assert verdicts[ReleaseGate.Indicator.DUPLICATE_RATE] is None  # nothing confirmed yet


def test_the_dashboard_renders_indicators_gates_and_chart_data(client, agent, reviewer):
    ensure_release_gates()
    make_operation(agent, status=S.CONFIRMED)
    client.force_login(reviewer)
    response = client.get("/dashboard/", {"window": "1h"})
    body = response.content.decode()
    assert response.status_code == 200
    assert "Terminal success rate" in body and "Release gates" in body
    assert 'id="ops-chart-data"' in body and "Zero duplicate side effects" in body


def test_cost_per_success_counts_the_tokens_of_failed_tasks_too(agent, outsider_agent):
    from decimal import Decimal

    from runs.models import ModelPrice, Span

    ModelPrice.objects.create(model="gpt-x", input_per_million=Decimal("2"), output_per_million=Decimal("10"),
                              valid_from=timezone.now() - timedelta(days=1))
    now = timezone.now()
    for status, principal in ((TaskStatus.SUCCEEDED, agent), (TaskStatus.FAILED, agent),
                              (TaskStatus.SUCCEEDED, outsider_agent)):
        task = make_task(principal)
        Task.objects.filter(pk=task.pk).update(status=status)
        Span.objects.create(tenant_id=task.tenant_id, trace_id=f"{task.pk:0>32}"[-32:], span_id="00000000000000a1",
                            name="chat", start_time=now, end_time=now, duration_ms=1, task=task,
                            gen_ai_model="gpt-x", input_tokens=100_000, output_tokens=10_000)
    result = metrics.compute(tenant_ids={agent.tenant_id}, since=since())
    # Two tasks' calls (0.2 + 0.1 each) over one success; the other tenant's task is not counted.
    assert result.cost_per_success == {"USD": Decimal("0.6")}
    assert result.cost_per_success_display == "USD 0.6000"


def test_the_series_has_three_indicators_per_bucket_and_follows_the_filters(agent):
    done = make_task(agent)
    Task.objects.filter(pk=done.pk).update(status=TaskStatus.SUCCEEDED)
    failed = make_task(agent, task_type="contract_email")
    Task.objects.filter(pk=failed.pk).update(status=TaskStatus.FAILED)
    recover_one_by_the_system_and_one_by_a_person(agent)
    data = metrics.series(tenant_ids={agent.tenant_id}, since=since(), buckets=4)
    last = -1  # everything happened just now
    assert data["success_rate"][last] == 0.5 and data["success_rate"][0] is None
    assert data["auto_recovery_rate"][last] == 0.5
    assert data["human_rate"][last] == 0.5 and sum(data["created"]) == 2 and sum(data["confirmed"]) == 1
    refunds = metrics.series(tenant_ids={agent.tenant_id}, since=since(), task_type="refund", buckets=4)
    assert refunds["success_rate"][last] == 1.0
    assert metrics.series(tenant_ids={agent.tenant_id}, since=since(), tier=4, buckets=4)["created"] == [0] * 4
