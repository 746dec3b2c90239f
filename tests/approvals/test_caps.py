"""Budget caps per tenant, agent and tool: a contract can only lower them; per day they count
across the tenant's tasks in the tenant's day; over a cap the gate refuses with the reason."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from approvals import caps as budget_caps
from approvals.models import BudgetCap, Tool
from ledger.models import Call
from ledger.proposals import call_dry_run, call_propose
from runs.models import BudgetCounter, Task
from tests.fixtures.api import refund, start_task

pytestmark = pytest.mark.django_db


def propose(agent, run, n: int, *, tool="payments.refund", arguments=None):
    return call_propose(principal=agent, task_id=run.task_id, call_id=f"call-{n}", step_id=f"step-{n}",
                        tool_name=tool, arguments=arguments or refund(10, order_id=f"ord-{n}"),
                        expected_version=run.version, fencing_token=run.fencing_token)


def test_without_caps_nothing_is_counted_or_locked(agent):
    run = start_task(agent)
    propose(agent, run, 1)
    assert not BudgetCounter.objects.exists()


def test_a_tenant_cap_per_task_lowers_a_contract_that_asks_for_more_and_says_so(agent, tenant):
    BudgetCap.objects.create(tenant=tenant, calls_per_task=2)
    run = start_task(agent, constraints={"max_tool_calls": 10})
    assert [propose(agent, run, n).decision for n in (1, 2)] == ["dispatched", "dispatched"]
    refused = propose(agent, run, 3)
    assert refused.decision == "refused"
    assert refused.reasons == ("tool call budget spent: 2 of 2 (capped by tenant acme; the contract asked for 10)",)
    # Like the contract's own budget: spent, so the task pauses.
    assert Task.objects.get(pk=run.task_id).status == "paused"
    assert Call.objects.get(call_id="call-3").refusal["reasons"] == list(refused.reasons)


def test_a_contract_below_the_cap_binds_with_its_own_words(agent, tenant):
    BudgetCap.objects.create(tenant=tenant, calls_per_task=5)
    run = start_task(agent, constraints={"max_tool_calls": 1})
    propose(agent, run, 1)
    assert propose(agent, run, 2).reasons == ("tool call budget spent: 1 of 1",)


def test_a_cap_binds_a_contract_that_sets_no_budget(agent, tenant):
    BudgetCap.objects.create(tenant=tenant, agent=agent, amount_per_task=Decimal("25"))
    run = start_task(agent)
    assert propose(agent, run, 1, arguments=refund(20, order_id="o1")).decision == "dispatched"
    refused = propose(agent, run, 2, arguments=refund(10, order_id="o2"))
    assert refused.reasons == ("amount 10 exceeds what is left of the budget: 5 of 25 (capped by agent acme/agent)",)


def test_an_agents_daily_cap_counts_across_its_tasks_and_refuses_without_pausing(agent, tenant):
    BudgetCap.objects.create(tenant=tenant, agent=agent, calls_per_day=2)
    first, second = start_task(agent), start_task(agent)
    assert propose(agent, first, 1).decision == "dispatched"
    assert propose(agent, second, 2).decision == "dispatched"
    refused = propose(agent, second, 3)
    day = budget_caps.tenant_day(tenant)
    assert refused.decision == "refused"
    assert refused.reasons == (f"agent acme/agent's daily cap ({day}): 2 of 2 tool calls used",)
    assert Task.objects.get(pk=second.task_id).status == "running"
    counter = BudgetCounter.objects.get(scope_key=f"agent:{agent.pk}", period=day)
    assert (counter.calls, counter.writes, counter.amount) == (2, 2, Decimal("20"))


def test_another_agents_calls_do_not_count_against_an_agents_cap(agent, tenant, policy):
    from tests.conftest import make_agent

    other = make_agent(tenant, "other-agent", "other-agent-token")
    other.allowed_tools.set(Tool.objects.all())
    BudgetCap.objects.create(tenant=tenant, agent=agent, calls_per_day=1)
    assert propose(other, start_task(other), 1).decision == "dispatched"
    assert propose(agent, start_task(agent), 2).decision == "dispatched"


def test_a_tenants_daily_write_cap_does_not_count_reads(agent, tenant):
    BudgetCap.objects.create(tenant=tenant, writes_per_day=1)
    run = start_task(agent)
    assert propose(agent, run, 1).decision == "dispatched"
    assert propose(agent, run, 2, tool="orders.lookup", arguments={"order_id": "ord-1"}).decision == "dispatched"
    refused = propose(agent, run, 3)
    assert refused.reasons[0].endswith("1 of 1 writes used")


def test_a_tools_cap_per_task_counts_that_tool_only(agent, tenant, policy):
    BudgetCap.objects.create(tenant=tenant, tool=policy["payments.refund"], calls_per_task=1,
                             amount_per_day=Decimal("100"))
    run = start_task(agent)
    assert propose(agent, run, 1).decision == "dispatched"
    refused = propose(agent, run, 2)
    assert refused.reasons == ("tool payments.refund in acme's cap per task: 1 of 1 tool calls used",)
    assert propose(agent, run, 3, tool="orders.lookup", arguments={"order_id": "ord-1"}).decision == "dispatched"
    # Another task starts its own count of the tool.
    assert propose(agent, start_task(agent), 4).decision == "dispatched"


def test_a_daily_amount_cap_refuses_the_call_that_would_pass_it(agent, tenant, policy):
    BudgetCap.objects.create(tenant=tenant, tool=policy["payments.refund"], amount_per_day=Decimal("25"))
    run = start_task(agent)
    assert propose(agent, run, 1, arguments=refund(20, order_id="o1")).decision == "dispatched"
    refused = propose(agent, run, 2, arguments=refund(10, order_id="o2"))
    assert "amount 10 exceeds what is left, 5 of 25" in refused.reasons[0]
    assert propose(agent, run, 3, arguments=refund(5, order_id="o3")).decision == "dispatched"


def test_a_repeated_call_and_a_dry_run_count_nothing(agent, tenant):
    BudgetCap.objects.create(tenant=tenant, calls_per_day=1)
    run = start_task(agent)
    first = propose(agent, run, 1)
    assert propose(agent, run, 1).operation_id == first.operation_id
    dry = call_dry_run(principal=agent, task_id=run.task_id, tool_name="payments.refund", arguments=refund(1))
    assert dry.outcome == "refused" and "daily cap" in dry.reasons[0]
    assert BudgetCounter.objects.get(scope_key=f"tenant:{tenant.pk}").calls == 1


def test_the_day_is_the_tenants_day(tenant):
    late_utc = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)
    assert budget_caps.tenant_day(tenant, late_utc) == "2026-03-01"
    tenant.time_zone = "Asia/Tokyo"
    assert budget_caps.tenant_day(tenant, late_utc) == "2026-03-02"
    tenant.time_zone = "Not/AZone"
    assert budget_caps.tenant_day(tenant, late_utc) == "2026-03-01"


def test_yesterdays_count_does_not_bind_today(agent, tenant):
    BudgetCap.objects.create(tenant=tenant, calls_per_day=1)
    BudgetCounter.objects.create(scope_key=f"tenant:{tenant.pk}", period="2000-01-01", tenant=tenant, calls=99)
    assert propose(agent, start_task(agent), 1).decision == "dispatched"


def test_the_tasks_answer_names_the_limits_that_bind_it(agent, tenant, api):
    BudgetCap.objects.create(tenant=tenant, calls_per_task=3, amount_per_task=Decimal("500"))
    run = start_task(agent, constraints={"max_tool_calls": 10, "max_amount": 100})
    body = api.get(f"/api/v1/tasks/{run.task_id}").json()
    assert body["budget"]["limits"] == {
        "max_tool_calls": {"limit": 3, "source": "tenant acme", "contract_asked": 10},
        "max_amount": {"limit": 100.0, "source": "contract", "contract_asked": None},
    }


def test_a_cap_naming_an_agent_and_a_tool_is_refused_by_the_database(agent, tenant, policy):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        BudgetCap.objects.create(tenant=tenant, agent=agent, tool=policy["mail.send"], calls_per_day=1)


@pytest.fixture
def admin_client(client, db):
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    return client


def test_an_admin_sets_a_cap_and_the_next_proposal_obeys_it(admin_client, agent, tenant):
    run = start_task(agent)
    assert propose(agent, run, 1).decision == "dispatched"  # the gate's cache now holds "no caps"
    response = admin_client.post("/admin/approvals/budgetcap/add/", {
        "tenant": tenant.pk, "agent": agent.pk, "tool": "", "description": "pilot", "calls_per_day": 1})
    assert response.status_code == 302
    # Counted from the moment the cap exists: the call before it is not in the day's count.
    assert propose(agent, run, 2).decision == "dispatched"
    assert BudgetCounter.objects.get(scope_key=f"agent:{agent.pk}").calls == 1
    assert propose(agent, run, 3).decision == "refused"


def test_the_admin_refuses_a_cap_on_an_agent_and_a_tool_or_on_another_tenants_agent(
        admin_client, agent, tenant, other_tenant, outsider_agent, policy):
    both = admin_client.post("/admin/approvals/budgetcap/add/", {
        "tenant": tenant.pk, "agent": agent.pk, "tool": policy["mail.send"].pk, "calls_per_day": 1})
    foreign = admin_client.post("/admin/approvals/budgetcap/add/", {
        "tenant": tenant.pk, "agent": outsider_agent.pk, "tool": "", "calls_per_day": 1})
    assert (both.status_code, foreign.status_code) == (200, 200)
    assert b"not an agent and a tool" in both.content
    assert b"belongs to another tenant" in foreign.content
    assert not BudgetCap.objects.exists()


# --- model cost: known only from the agent's spans, so a cap refuses the calls after it is spent

def spend(run, *, tokens_in: int, when=None) -> None:
    """One model call of the task's agent (a span with GenAI usage), priced by a list price of
    USD 2 per million input tokens."""
    from django.utils import timezone

    from runs.models import ModelPrice, Span

    if not ModelPrice.objects.exists():
        ModelPrice.objects.create(model="gpt-x", input_per_million=Decimal("2"), output_per_million=Decimal("0"),
                                  valid_from=datetime(2020, 1, 1, tzinfo=UTC))
    now = when or timezone.now()
    tenant_id = Task.objects.values_list("tenant_id", flat=True).get(pk=run.task_id)
    Span.objects.create(tenant_id=tenant_id, trace_id=f"{Span.objects.count() + 1:0>32}",
                        span_id="00000000000000a1", name="chat", start_time=now, end_time=now, duration_ms=1,
                        task_id=run.task_id, gen_ai_model="gpt-x", input_tokens=tokens_in, output_tokens=0)


def test_a_tasks_model_cost_cap_refuses_the_calls_after_it_is_spent(agent, tenant):
    BudgetCap.objects.create(tenant=tenant, cost_per_task=Decimal("1"), cost_currency="USD")
    run = start_task(agent)
    spend(run, tokens_in=400_000)  # USD 0.80
    assert propose(agent, run, 1).decision == "dispatched"
    spend(run, tokens_in=100_000)  # USD 1.00 in all: spent
    refused = propose(agent, run, 2)
    assert refused.decision == "refused"
    assert refused.reasons == ("model cost per task spent: USD 1 of 1 (capped by tenant acme)",)
    other = start_task(agent)  # another task has its own
    assert propose(agent, other, 3).decision == "dispatched"


def test_an_agents_daily_model_cost_cap_counts_its_tasks_of_the_day_only(agent, tenant):
    from datetime import timedelta

    from django.utils import timezone

    BudgetCap.objects.create(tenant=tenant, agent=agent, cost_per_day=Decimal("1"), cost_currency="USD")
    yesterday = start_task(agent)
    spend(yesterday, tokens_in=5_000_000, when=timezone.now() - timedelta(days=2))
    first = start_task(agent)
    spend(first, tokens_in=300_000)
    second = start_task(agent)
    assert propose(agent, second, 1).decision == "dispatched"
    spend(second, tokens_in=200_000)  # USD 1.00 today across the agent's tasks
    refused = propose(agent, second, 2)
    assert refused.reasons[0].startswith("agent acme/agent's daily model cost cap")
    assert "USD 1 of 1" in refused.reasons[0]


def test_a_cost_cap_needs_its_currency_and_no_tool(agent, tenant, policy):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="currency"):
        BudgetCap(tenant=tenant, cost_per_task=Decimal("1")).full_clean()
    with pytest.raises(ValidationError, match="model"):
        BudgetCap(tenant=tenant, tool=Tool.objects.get(name="payments.refund"), cost_per_day=Decimal("1"),
                  cost_currency="USD").full_clean()


def test_an_admin_sets_a_cost_cap_and_the_next_proposal_obeys_it(admin_client, agent, tenant):
    run = start_task(agent)
    assert propose(agent, run, 1).decision == "dispatched"  # the gate's cache now holds "no caps"
    spend(run, tokens_in=1_000_000)  # USD 2
    response = admin_client.post("/admin/approvals/budgetcap/add/", {
        "tenant": tenant.pk, "agent": "", "tool": "", "description": "", "cost_currency": "USD",
        "cost_per_task": "1.5"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert propose(agent, run, 2).reasons == ("model cost per task spent: USD 2 of 1.5 (capped by tenant acme)",)
