"""The dashboard page: indicators of the user's tenants, filters, cost per success, gates."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from console.models import Role
from runs.defaults import ensure_release_gates
from runs.models import ModelPrice, Span, Task, TaskStatus
from tests.conftest import make_user
from tests.factories import make_task

pytestmark = pytest.mark.django_db


def test_the_dashboard_shows_cost_per_success_and_the_gates(client, agent, tenant):
    client.force_login(make_user("viewer", tenant, Role.REVIEWER, max_tier=3))
    ensure_release_gates()
    ModelPrice.objects.create(model="gpt-x", input_per_million=Decimal("3"), output_per_million=Decimal("15"),
                              currency="EUR", valid_from=timezone.now() - timedelta(days=1))
    task = make_task(agent)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.SUCCEEDED)
    now = timezone.now()
    Span.objects.create(tenant_id=task.tenant_id, trace_id="c" * 32, span_id="00000000000000c1", name="chat",
                        start_time=now, end_time=now, duration_ms=1, task=task, gen_ai_model="gpt-x",
                        input_tokens=10_000, output_tokens=1_000)
    body = client.get("/dashboard/", {"window": "1h"}).content.decode()
    assert '<span id="cost-per-success">EUR 0.0450</span>' in body  # 0.03 + 0.015
    assert "Zero duplicate side effects" in body
    assert 'id="ops-chart-data"' in body and 'id="rates-chart"' in body
    body = client.get("/dashboard/", {"type": "no-such-type"}).content.decode()
    assert '<span id="cost-per-success">—</span>' in body


def test_anonymous_visitors_are_sent_to_log_in(client):
    response = client.get("/dashboard/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def seed_ledger(agent, n: int) -> None:
    """n finished tasks of two releases and two types, each with an L1 refund and an L3 one
    that ran without an approval (a misexecution), and a takeover."""
    from ledger import services as ledger_services
    from ledger.models import OperationStatus as S
    from tests.factories import make_operation

    for i in range(n):
        task = make_task(agent, task_type=("refund", "email")[i % 2], versions={"release": ("r1", "r2")[i % 2]})
        make_operation(agent, status=S.CONFIRMED, task=task)
        manual = make_operation(agent, "mail.send", status=S.MANUAL, task=task, risk_tier=3)
        ledger_services.operation_fail(operation_id=manual.operation_id, actor="user:support", reason="no effect",
                                       evidence={"query": "absent"})
        Task.objects.filter(pk=task.pk).update(status=TaskStatus.SUCCEEDED, updated_at=timezone.now())


@pytest.mark.parametrize("tasks", [2, 8])
def test_the_gates_take_the_same_number_of_queries_however_many_tasks_and_splits(client, agent, tenant, tasks,
                                                                                  django_assert_max_num_queries):
    from runs.models import ReleaseGate

    client.force_login(make_user("viewer", tenant, Role.REVIEWER, max_tier=3))
    ensure_release_gates()
    ReleaseGate.objects.update(split_by_task_type=True, split_by_risk_tier=True)
    ReleaseGate.objects.filter(indicator__in=ReleaseGate.SPLITTABLE).update(split_by_tool=True)
    seed_ledger(agent, tasks)
    with django_assert_max_num_queries(52):  # the whole page, the audit panel's counts included
        body = client.get("/dashboard/", {"window": "1h"}).content.decode()
    assert body.count('class="gate"') == ReleaseGate.objects.count()
    assert 'class="gate-bar"' in body and "per task type, risk tier, tool" in body


def test_the_gates_show_each_split_its_value_threshold_bar_and_verdict(client, agent, tenant):
    from runs.models import ReleaseGate

    client.force_login(make_user("viewer", tenant, Role.REVIEWER, max_tier=3))
    ensure_release_gates()
    seed_ledger(agent, 2)
    body = client.get("/dashboard/", {"window": "1h"}).content.decode()
    misexecutions = ReleaseGate.objects.get(indicator="high_risk_misexecutions", task_type="")
    section = body[body.index(f'id="gate-{misexecutions.pk}"'):]
    section = section[:section.index("</tbody>")]
    assert "No L3/L4 operation ran without authority" in section and "per risk tier" in section
    assert '<td class="num">2</td><td class="num">= 0</td>' in section  # two L3 operations ran unapproved
    assert 'data-passed="fail"' in section and "no consumed approval" in section and "/operations/op_" in section
    assert 'id="release-current">r2<' in body and 'id="release-previous">r1<' in body
    continuation = ReleaseGate.objects.get(indicator="continuation_rate")
    section = body[body.index(f'id="gate-{continuation.pk}"'):]
    assert '<td class="num">100.00%</td><td class="num">≥ 99.00%</td>' in section[:section.index("</tbody>")]
