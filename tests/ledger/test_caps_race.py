"""Daily budget caps under concurrency, with real threads against PostgreSQL: proposals of many
tasks at once at the cap's boundary never spend past it (the counters are locked rows)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection  # noqa: F401 - read by the skipif condition below

from approvals import caps as budget_caps
from approvals.models import BudgetCap
from ledger.models import Call, Operation
from runs.models import BudgetCounter
from tests.fixtures.api import call_body, post_all_at_once, refund, start_task

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="needs PostgreSQL row locks"),
    pytest.mark.timeout(180),
]

N = 16


def race(requests: list[tuple[str, dict]]) -> list[tuple[int, dict]]:
    """POST every (task, body) at once, each from its own thread and connection."""
    return post_all_at_once([(f"/api/v1/tasks/{task_id}/calls", body) for task_id, body in requests])


@pytest.mark.parametrize("cap", [1, 5, N - 1])
def test_concurrent_proposals_of_many_tasks_never_pass_an_agents_daily_call_cap(agent, tenant, cap):
    BudgetCap.objects.create(tenant=tenant, agent=agent, calls_per_day=cap)
    runs = [start_task(agent, owner=f"worker-{n}") for n in range(N)]
    results = race([(run.task_id, call_body(run, arguments=refund(10, order_id=f"ord-{n}")))
                    for n, run in enumerate(runs)])

    assert [status for status, _ in results if status not in (200, 201)] == []
    outcomes = [answer["decision"]["outcome"] for _, answer in results]
    assert outcomes.count("dispatched") == cap
    assert outcomes.count("refused") == N - cap
    assert Operation.objects.count() == cap
    assert Call.objects.filter(operation__isnull=True).count() == N - cap
    counter = BudgetCounter.objects.get(scope_key=f"agent:{agent.pk}", period=budget_caps.tenant_day(tenant))
    assert counter.calls == cap


def test_concurrent_refunds_never_pass_a_tools_daily_amount_cap(agent, tenant, policy):
    BudgetCap.objects.create(tenant=tenant, tool=policy["payments.refund"], amount_per_day=Decimal("45"))
    runs = [start_task(agent, owner=f"worker-{n}") for n in range(N)]
    results = race([(run.task_id, call_body(run, arguments=refund(10, order_id=f"ord-{n}")))
                    for n, run in enumerate(runs)])

    assert [status for status, _ in results if status not in (200, 201)] == []
    assert [answer["decision"]["outcome"] for _, answer in results].count("dispatched") == 4
    counter = BudgetCounter.objects.get(scope_key=f"tool:{tenant.pk}:{policy['payments.refund'].pk}")
    assert (counter.calls, counter.amount) == (4, Decimal("40"))
