"""approvals.catalog: the gate's configuration, cached per process by a generation token that
database triggers renew on every write — so a change is seen by the very next proposal."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import catalog
from approvals.models import EscalationRule, PolicyGeneration, PolicyTier, Tool
from console.lib.errors import NotPermitted
from ledger.proposals import call_propose
from tests.fixtures.api import refund, start_task

CONFIG_TABLES = re.compile(r"approvals_tool\b|approvals_escalationrule|approvals_policytier|allowed_tools")


def token() -> str | None:
    return PolicyGeneration.objects.filter(pk=1).values_list("token", flat=True).first()


def propose(agent, run, n: int, **arguments):
    return call_propose(principal=agent, task_id=run.task_id, call_id=f"c{n}", step_id=f"s{n}",
                        tool_name="payments.refund", arguments=refund(**arguments), expected_version=run.version,
                        fencing_token=run.fencing_token)


def config_reads(queries) -> list[str]:
    return [q["sql"] for q in queries if CONFIG_TABLES.search(q["sql"]) and q["sql"].lstrip().startswith("SELECT")
            and "FOR UPDATE" not in q["sql"] and "runs_task" not in q["sql"]]


WRITES = {
    "a tool saved": lambda: Tool.objects.get(name="payments.refund").save(),
    "tools updated in bulk": lambda: Tool.objects.update(description="x"),
    "a rule added": lambda: EscalationRule.objects.create(
        tool=Tool.objects.get(name="mail.send"), argument_path="subject", comparison="eq", value="x", tier=3),
    "a rule deleted": lambda: EscalationRule.objects.filter(tool__name="payments.refund").first().delete(),
    "a tier changed": lambda: PolicyTier.objects.filter(level=2).update(approval_ttl_seconds=60),
    "a tool revoked": lambda: Tool.agents.through.objects.all()[:1].get().delete(),
    "raw SQL": lambda: connection.cursor().execute("UPDATE approvals_tool SET description = 'raw'"),
}


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_every_write_to_the_configuration_gives_a_new_token(agent, write):
    before = token()
    write()
    after = token()
    assert after is not None and after != before


def test_reads_elsewhere_do_not_change_the_token(agent):
    before = token()
    list(Tool.objects.all())
    start_task(agent)
    assert token() == before


def test_the_second_proposal_reads_no_configuration(agent):
    run = start_task(agent)
    with CaptureQueriesContext(connection) as first:
        propose(agent, run, 1)
    with CaptureQueriesContext(connection) as second:
        propose(agent, run, 2)
    assert config_reads(first.captured_queries)  # the first one filled the cache
    assert config_reads(second.captured_queries) == []


def test_a_tool_disabled_after_it_was_cached_is_refused_at_once(agent):
    run = start_task(agent)
    propose(agent, run, 1)
    tool = Tool.objects.get(name="payments.refund")
    tool.enabled = False
    tool.save()
    with pytest.raises(NotPermitted, match="disabled"):
        propose(agent, run, 2)


def test_a_tool_revoked_from_the_agent_is_refused_at_once(agent):
    run = start_task(agent)
    propose(agent, run, 1)
    agent.allowed_tools.remove(Tool.objects.get(name="payments.refund"))
    with pytest.raises(NotPermitted, match="may not use"):
        propose(agent, run, 2)


def test_a_new_escalation_rule_raises_the_next_call_at_once(agent):
    run = start_task(agent)
    assert propose(agent, run, 1, amount=20).risk_tier == 1
    EscalationRule.objects.create(tool=Tool.objects.get(name="payments.refund"), argument_path="amount",
                                  comparison="gt", value=10, tier=3)
    proposal = propose(agent, run, 2, amount=20)
    assert (proposal.risk_tier, proposal.decision) == (3, "awaiting_approval")


def test_a_tier_made_stricter_applies_to_the_next_call_at_once(agent):
    run = start_task(agent)
    assert propose(agent, run, 1).decision == "dispatched"  # L1 runs at once by default
    PolicyTier.objects.filter(level=1).update(requirement=PolicyTier.Requirement.FORBIDDEN)
    assert propose(agent, run, 2).decision == "refused"


def test_without_a_token_nothing_is_cached(agent):
    PolicyGeneration.objects.all().delete()
    first, second = catalog.for_token(None), catalog.for_token(None)
    assert first is not second
    first.tool("payments.refund")
    assert first._tools == {}


def test_one_token_one_catalog():
    assert catalog.for_token("t1") is catalog.for_token("t1")
    assert catalog.for_token("t2") is not catalog.for_token("t1")
