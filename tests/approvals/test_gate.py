"""The policy gate: schema, authorization, budgets, risk tier and escalation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import gate
from approvals.models import EscalationRule, PolicyTier, Tool
from console.lib.errors import InvalidInput, NotPermitted
from runs.models import Task
from tests.fixtures.api import MAIL, refund, start_task


@pytest.fixture
def task(agent) -> Task:
    return start_task(agent).task


def evaluate(agent, task, tool_name="payments.refund", arguments=None):
    return gate.evaluate(principal=agent, task=task, tool=Tool.objects.get(name=tool_name),
                         arguments=refund() if arguments is None else arguments)


def test_it_rejects_arguments_that_do_not_match_the_tools_schema(agent, task):
    with pytest.raises(InvalidInput) as exc:
        evaluate(agent, task, arguments={"order_id": "ord-42", "amount": "30", "currency": "XXX"})
    errors = exc.value.details["errors"]
    assert {e["path"] for e in errors} >= {"amount", "currency", ""}  # "" is the missing `reason`
    assert any("reason" in e["message"] for e in errors)


def test_it_checks_formats(agent, task):
    with pytest.raises(InvalidInput) as exc:
        evaluate(agent, task, "mail.send", {**MAIL, "to": ["not-an-address"]})
    assert exc.value.details["errors"][0]["validator"] == "format"


def test_a_schema_changed_in_the_admin_is_the_one_checked(agent, task):
    # Validators are kept per schema: the row read after the change must not meet the old one.
    tool = Tool.objects.create(name="anything.do", adapter="noop", json_schema={"type": "object"})
    agent.allowed_tools.add(tool)
    assert gate.validate_arguments(tool=tool, arguments={"n": "one"}) == gate.canonical_arguments_hash({"n": "one"})
    Tool.objects.filter(pk=tool.pk).update(json_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    with pytest.raises(InvalidInput, match="do not match"):
        gate.validate_arguments(tool=Tool.objects.get(pk=tool.pk), arguments={"n": "one"})
    assert gate.validate_arguments(tool=tool, arguments={"n": "one"})  # the row read before keeps its schema


def test_a_tools_validator_is_built_once_per_schema(agent, task, monkeypatch):
    tool = Tool.objects.get(name="payments.refund")
    built = []
    real = gate.Draft202012Validator

    class Counting:
        FORMAT_CHECKER = real.FORMAT_CHECKER
        check_schema = staticmethod(real.check_schema)

        def __new__(cls, *args, **kwargs):
            built.append(1)
            return real(*args, **kwargs)

    monkeypatch.setattr(gate, "Draft202012Validator", Counting)
    for _ in range(3):
        gate.check_arguments(tool=tool, arguments=refund())
    assert len(built) == 1


def test_a_broken_schema_refuses_every_call_with_a_clear_error(agent, task):
    # Saved around the tool form's check (a raw update, an older version): an unknown type
    # made jsonschema raise while validating, a 500 for the agent.
    tool = Tool.objects.create(name="anything.do", adapter="noop", json_schema={"type": "no-such-type"})
    for _ in range(2):
        with pytest.raises(InvalidInput, match="is invalid") as exc:
            gate.validate_arguments(tool=tool, arguments={})
        assert "no-such-type" in exc.value.details["schema_error"]


@pytest.mark.parametrize("value", [2**53 + 1, float("nan"), float("inf")])
def test_it_rejects_arguments_rfc8785_cannot_canonicalize(agent, task, value):
    tool = Tool.objects.create(name="anything.do", adapter="noop", json_schema={"type": "object"})
    agent.allowed_tools.add(tool)
    with pytest.raises(InvalidInput, match="canonicalized"):
        gate.evaluate(principal=agent, task=task, tool=tool, arguments={"n": value})


def test_it_refuses_a_disabled_tool(agent, task, policy):
    Tool.objects.filter(name="payments.refund").update(enabled=False)
    with pytest.raises(NotPermitted, match="disabled"):
        evaluate(agent, task)


def test_it_refuses_a_tool_the_principal_may_not_use(agent, task, policy):
    agent.allowed_tools.remove(policy["payments.refund"])
    with pytest.raises(NotPermitted, match="may not use"):
        evaluate(agent, task)


def test_it_refuses_a_principal_of_another_tenant(agent, outsider_agent, task):
    with pytest.raises(NotPermitted):
        evaluate(outsider_agent, task)


def test_a_small_refund_runs_at_once_audited(agent, task):
    result = evaluate(agent, task, arguments=refund(30))
    assert (result.decision, result.risk_tier, result.requirement) == (gate.Decision.DISPATCHED, 1, "run_audit")
    assert result.approvals_needed == 0
    assert result.reasons == ("payments.refund: base tier L1",)


def test_a_refund_over_50_needs_one_approval(agent, task):
    result = evaluate(agent, task, arguments=refund(120))
    assert (result.decision, result.risk_tier, result.approvals_needed) == (gate.Decision.AWAITING_APPROVAL, 3, 1)
    assert "amount 120 > 50 → L3" in result.reasons


def test_a_refund_over_200_needs_two_approvals(agent, task):
    result = evaluate(agent, task, arguments=refund(250))
    assert (result.decision, result.risk_tier, result.approvals_needed) == (gate.Decision.AWAITING_APPROVAL, 4, 2)
    assert result.reasons[-1] == "amount 250 > 200 → L4"
    assert result.approval_ttl_seconds == PolicyTier.objects.get(level=4).approval_ttl_seconds


def test_mail_needs_one_approval_with_a_preview(agent, task):
    result = evaluate(agent, task, "mail.send", MAIL)
    assert (result.decision, result.risk_tier, result.approvals_needed) == (gate.Decision.AWAITING_APPROVAL, 2, 1)
    assert result.shows_preview


def test_a_rule_never_lowers_the_tier(agent, task, policy):
    EscalationRule.objects.create(tool=policy["mail.send"], argument_path="subject", comparison="eq",
                                  value="Your refund", tier=0)
    result = evaluate(agent, task, "mail.send", MAIL)
    assert result.risk_tier == 2
    assert "subject Your refund = Your refund → L0 (tier stays L2)" in result.reasons


def test_a_rule_whose_path_is_missing_does_not_match(agent, task, policy):
    EscalationRule.objects.create(tool=policy["mail.send"], argument_path="to.5", comparison="ne",
                                  value="x@example.com", tier=4)
    EscalationRule.objects.create(tool=policy["mail.send"], argument_path="headers.priority", comparison="ne",
                                  value="high", tier=4)
    assert evaluate(agent, task, "mail.send", MAIL).risk_tier == 2


@pytest.mark.parametrize(
    ("path", "comparison", "value", "matches"),
    [
        ("amount", "gte", 30, True),
        ("amount", "lt", 30, False),
        ("amount", "lte", 30, True),
        ("amount", "gt", "29", False),  # a number never compares with a string
        ("currency", "in", ["EUR", "GBP"], True),
        ("currency", "ne", "EUR", False),
        ("reason", "contains", "transit", True),
        ("order_id", "eq", "ord-42", True),
    ],
)
def test_rules_compare_as_declared(agent, task, policy, path, comparison, value, matches):
    rule = EscalationRule(tool=policy["payments.refund"], argument_path=path, comparison=comparison,
                          value=value, tier=4)
    assert gate.rule_matches(rule, refund(30))[0] is matches


def test_a_list_element_can_be_escalated(agent, task, policy):
    EscalationRule.objects.create(tool=policy["mail.send"], argument_path="to.0", comparison="contains",
                                  value="@example.com", tier=3)
    result = evaluate(agent, task, "mail.send", MAIL)
    assert result.risk_tier == 3
    assert "to.0 customer@example.com contains @example.com → L3" in result.reasons


def test_a_forbidden_tier_is_refused(agent, task):
    PolicyTier.objects.filter(level=4).update(requirement=PolicyTier.Requirement.FORBIDDEN)
    result = evaluate(agent, task, arguments=refund(500))
    assert result.refused
    assert result.reasons[-1] == "L4 is forbidden by policy"
    assert not result.exhausted_budgets


def test_a_tier_without_policy_is_refused(agent, task):
    PolicyTier.objects.filter(level=3).delete()
    result = evaluate(agent, task, arguments=refund(120))
    assert result.refused and "no policy is configured for L3" in result.reasons


def test_the_tasks_approval_threshold_raises_the_tier(agent):
    task = start_task(agent, constraints={"approval_threshold": 10}).task
    result = evaluate(agent, task, arguments=refund(30))
    assert (result.decision, result.risk_tier) == (gate.Decision.AWAITING_APPROVAL, 2)
    assert "amount 30 > task approval_threshold 10 → L2" in result.reasons


def test_a_spent_call_budget_refuses_and_asks_for_a_pause(agent):
    task = start_task(agent, constraints={"max_tool_calls": 2}).task
    Task.objects.filter(pk=task.pk).update(calls_used=2)
    task.refresh_from_db()
    result = evaluate(agent, task, "orders.lookup", {"order_id": "ord-42"})
    assert result.refused
    assert result.reasons == ("tool call budget spent: 2 of 2",)
    assert result.exhausted_budgets == ("max_tool_calls",)


def test_the_write_budget_counts_only_writes(agent):
    task = start_task(agent, constraints={"max_writes": 1}).task
    Task.objects.filter(pk=task.pk).update(writes_used=1)
    task.refresh_from_db()
    assert evaluate(agent, task, "orders.lookup", {"order_id": "ord-42"}).decision == gate.Decision.DISPATCHED
    result = evaluate(agent, task)
    assert result.refused and result.exhausted_budgets == ("max_writes",)


def test_an_amount_over_what_is_left_is_refused_without_a_pause(agent):
    task = start_task(agent, constraints={"max_amount": 100}).task
    Task.objects.filter(pk=task.pk).update(amount_used=80)
    task.refresh_from_db()
    result = evaluate(agent, task, arguments=refund(30))
    assert result.refused
    assert result.reasons == ("amount 30 exceeds what is left of the budget: 20 of 100",)
    assert result.exhausted_budgets == ()
    assert evaluate(agent, task, arguments=refund(20)).decision == gate.Decision.DISPATCHED


def test_a_passed_deadline_refuses(agent):
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    task = start_task(agent, constraints={"deadline": past}).task
    result = evaluate(agent, task)
    assert result.refused and result.exhausted_budgets == ("deadline",)
    assert "has passed" in result.reasons[0]
