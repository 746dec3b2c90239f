"""`POST /tasks/{id}/calls` with `"dry_run": true`: the gate's verdict for these arguments now —
what a framework's approval predicate asks before a tool runs — and nothing is written."""

from __future__ import annotations

import pytest
from django.apps import apps

from approvals.models import EscalationRule
from tests.fixtures.api import MAIL, assert_error, refund, start_task


def url(task_id: str) -> str:
    return f"/api/v1/tasks/{task_id}/calls"


def every_row() -> dict[str, tuple]:
    """Every row of every model, so that a dry run provably wrote nothing (the task's counters and
    version included)."""
    return {model._meta.label: tuple(model.objects.order_by("pk").values_list())
            for model in apps.get_models() if model._meta.app_label in {"runs", "ledger", "approvals", "console"}}


def dry(api, run, tool="payments.refund", arguments=None, **extra):
    return api.post(url(run.task_id), {"dry_run": True, "tool": tool,
                                       "arguments": refund() if arguments is None else arguments, **extra},
                    format="json")


def test_a_call_that_would_run_at_once(api, running_task):
    before = every_row()
    response = dry(api, running_task)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is True
    assert (body["outcome"], body["risk_tier"], body["approvals_needed"]) == ("dispatched", 1, 0)
    assert body["reasons"] == ["payments.refund: base tier L1"]
    assert body["rules"] == []
    assert (body["task_id"], body["task_version"]) == (running_task.task_id, running_task.version)
    assert every_row() == before


def test_a_call_that_would_wait_names_the_rule_that_raised_it(api, running_task):
    before = every_row()
    body = dry(api, running_task, arguments=refund(120)).json()
    assert (body["outcome"], body["risk_tier"], body["approvals_needed"]) == ("awaiting_approval", 3, 1)
    assert "amount 120 > 50 → L3" in body["reasons"]
    rule = EscalationRule.objects.get(tool__name="payments.refund", tier=3)
    assert body["rules"] == [{"id": rule.pk, "argument_path": "amount", "comparison": "gt", "value": rule.value,
                              "tier": 3, "description": rule.description}]
    assert every_row() == before


def test_two_approvers_at_l4(api, running_task):
    body = dry(api, running_task, arguments=refund(250)).json()
    assert (body["outcome"], body["risk_tier"], body["approvals_needed"]) == ("awaiting_approval", 4, 2)
    assert [rule["tier"] for rule in body["rules"]] == [3, 4]


def test_a_call_over_budget_would_be_refused_and_nothing_is_paused(api, agent):
    run = start_task(agent, constraints={"max_amount": 10})
    before = every_row()
    body = dry(api, run).json()
    assert body["outcome"] == "refused"
    assert body["reasons"] == ["amount 30 exceeds what is left of the budget: 10 of 10"]
    assert every_row() == before


def test_call_id_step_version_and_token_are_not_needed_but_accepted(api, running_task):
    before = every_row()
    response = dry(api, running_task, tool="mail.send", arguments=MAIL, call_id="c1", step_id="s1",
                   expected_version=99, fencing_token=99)
    assert response.status_code == 200, response.content
    assert response.json()["outcome"] == "awaiting_approval"
    assert every_row() == before


def test_bad_arguments_are_400_as_for_a_proposal(api, running_task):
    assert_error(dry(api, running_task, arguments={"order_id": ""}), 400, "invalid")


def test_a_tool_the_agent_may_not_use_is_403(api, agent, policy, running_task):
    agent.allowed_tools.remove(policy["payments.refund"])
    assert_error(dry(api, running_task), 403, "forbidden")


def test_another_tenants_task_is_404(outsider_api, running_task):
    assert_error(dry(outsider_api, running_task), 404, "not_found")


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_dry_run_must_be_a_boolean(api, running_task, value):
    assert_error(dry(api, running_task, dry_run=value), 400, "invalid")


def test_without_dry_run_the_proposal_still_needs_its_fields(api, running_task):
    error = assert_error(api.post(url(running_task.task_id), {"tool": "payments.refund", "arguments": refund()},
                                  format="json"), 400, "invalid")
    assert set(error["details"]["fields"]) == {"call_id", "step_id", "expected_version", "fencing_token"}
