"""approvals.stops: who may stop what, one stop in force per scope, the events, and the holds
the gate and the approval services read (no new proposals, pending approvals frozen)."""

from __future__ import annotations

import re

import pytest

from approvals import stops
from approvals.models import PolicyGeneration, Stop, StopStatus, Tool
from console.lib.errors import Conflict, InvalidInput, NotPermitted
from console.models import Event, Role
from ledger import decisions
from ledger.models import Call, Operation
from ledger.proposals import call_propose
from tests.conftest import make_user
from tests.factories import events_of, make_pending_approval
from tests.fixtures.api import RunningTask, start_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(tenant):
    return make_user("boss", tenant, Role.ADMIN)


def refund_tool() -> Tool:
    return Tool.objects.get(name="payments.refund")


def propose(agent, run: RunningTask, call_id: str = "c1", tool: str = "payments.refund", amount: float = 20):
    arguments = ({"order_id": "ord-1", "amount": amount, "currency": "EUR", "reason": "damaged"}
                 if tool == "payments.refund" else {"order_id": "ord-1"})
    return call_propose(principal=agent, task_id=run.task_id, call_id=call_id, step_id=call_id, tool_name=tool,
                        arguments=arguments, expected_version=run.version, fencing_token=run.fencing_token)


# -- who and what ----------------------------------------------------------------------------

def test_an_admin_stops_a_tenant_with_a_reason_and_it_is_an_event(tenant, admin):
    stop = stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TENANT, user=admin, reason="incident 42")

    assert stop.status == StopStatus.STOPPED
    [event] = events_of(Event.Entity.STOP, stop.stop_id)
    assert (event.kind, event.to_status, event.actor) == (Event.Kind.CREATED, "stopped", "user:boss")
    assert event.reason == "stopped tenant acme: incident 42"
    assert event.tenant_id == tenant.pk


def test_resuming_is_a_transition_with_who_and_why(tenant, admin):
    stop = stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TENANT, user=admin, reason="incident")

    stops.stop_resume(stop_id=stop.stop_id, user=admin, reason="fixed")

    stop.refresh_from_db()
    assert (stop.status, stop.resumed_by, stop.resume_reason) == (StopStatus.RESUMED, admin, "fixed")
    last = events_of(Event.Entity.STOP, stop.stop_id)[-1]
    assert (last.from_status, last.to_status, last.actor, last.reason) == (
        "stopped", "resumed", "user:boss", "resumed tenant acme: fixed")


def test_an_l4_reviewer_may_stop_a_tool_but_not_an_agent_or_the_tenant(tenant, agent, senior):
    stop = stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TOOL, tool=refund_tool(), user=senior,
                             reason="refunds look wrong")
    assert stop.scope_key == f"tool:{refund_tool().pk}"
    with pytest.raises(NotPermitted):
        stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.AGENT, agent=agent, user=senior, reason="x")
    with pytest.raises(NotPermitted):
        stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TENANT, user=senior, reason="x")


def test_an_l3_reviewer_support_staff_and_an_outsider_may_stop_nothing(policy, tenant, other_tenant, reviewer, support_user):
    outsider_admin = make_user("stranger", other_tenant, Role.ADMIN)
    for user in (reviewer, support_user, outsider_admin):
        with pytest.raises(NotPermitted):
            stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TOOL, tool=refund_tool(), user=user,
                              reason="x")
    assert not Stop.objects.exists()


def test_a_stop_needs_a_reason(tenant, admin):
    with pytest.raises(InvalidInput):
        stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TENANT, user=admin, reason="  ")


def test_a_second_stop_of_the_same_scope_is_a_conflict_until_resumed(tenant, agent, admin):
    first = stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.AGENT, agent=agent, user=admin, reason="a")
    with pytest.raises(Conflict, match="already stopped"):
        stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.AGENT, agent=agent, user=admin, reason="b")
    stops.stop_resume(stop_id=first.stop_id, user=admin)
    again = stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.AGENT, agent=agent, user=admin, reason="c")
    assert again.pk != first.pk


def test_an_agent_of_another_tenant_cannot_be_stopped_from_this_one(tenant, outsider_agent, admin):
    with pytest.raises(Exception, match="No such agent"):
        stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.AGENT, agent=outsider_agent, user=admin,
                          reason="x")


# -- no new proposals ------------------------------------------------------------------------

@pytest.mark.parametrize("scope", ["tenant", "agent", "tool"])
def test_a_stop_refuses_new_proposals_in_its_scope_and_records_the_refused_call(tenant, agent, admin, running_task,
                                                                               scope):
    extra = {"agent": agent} if scope == "agent" else {"tool": refund_tool()} if scope == "tool" else {}
    stops.stop_create(tenant_id=tenant.pk, scope=scope, user=admin, reason="incident", **extra)

    answer = propose(agent, running_task)

    assert (answer.decision, answer.operation_id, answer.outcome.final) == ("refused", None, True)
    assert len(answer.reasons) == 1 and re.match(r"Stopped: .*incident", answer.reasons[0])
    call = Call.objects.get(call_id="c1")
    assert call.operation_id is None and call.refusal["reasons"] == list(answer.reasons)
    assert not Operation.objects.exists()
    [refused] = events_of("call", "c1")
    assert (refused.kind, refused.to_status) == (Event.Kind.CALL_REFUSED, "refused")


def test_a_stop_refused_call_is_answered_the_same_on_repeat_while_the_stop_holds(tenant, agent, admin,
                                                                                running_task):
    stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TENANT, user=admin, reason="incident")
    first = propose(agent, running_task)

    again = propose(agent, running_task)

    assert (again.decision, again.reasons, again.operation_id, again.repeat) == ("refused", first.reasons, None, True)
    assert Call.objects.filter(call_id="c1").count() == 1


def test_after_the_resume_a_stop_refused_call_id_stays_refused_and_a_new_call_id_runs(tenant, agent, admin,
                                                                                    running_task):
    """As every refusal: the refusal stands for that call ID; the agent proposes again under a
    new call ID (the step had no operation, so the same step ID is free)."""
    stop = stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TENANT, user=admin, reason="incident")
    refused = propose(agent, running_task, call_id="c1")
    stops.stop_resume(stop_id=stop.stop_id, user=admin)

    assert propose(agent, running_task, call_id="c1").reasons == refused.reasons
    assert propose(agent, running_task, call_id="c1").decision == "refused"
    fresh = call_propose(principal=agent, task_id=running_task.task_id, call_id="c2", step_id="c1",
                         tool_name="payments.refund",
                         arguments={"order_id": "ord-1", "amount": 20, "currency": "EUR", "reason": "damaged"},
                         expected_version=running_task.version, fencing_token=running_task.fencing_token)
    assert fresh.decision == "dispatched" and fresh.operation_id is not None


def test_a_tool_stop_leaves_the_other_tools_and_tenants_alone(tenant, agent, outsider_agent, admin, running_task):
    stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TOOL, tool=refund_tool(), user=admin, reason="x")

    assert propose(agent, running_task, tool="orders.lookup").decision == "dispatched"
    assert propose(outsider_agent, start_task(outsider_agent)).decision == "dispatched"


def test_proposals_are_accepted_again_once_resumed(tenant, agent, admin, running_task):
    stop = stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TENANT, user=admin, reason="x")
    stops.stop_resume(stop_id=stop.stop_id, user=admin)

    assert propose(agent, running_task).decision == "dispatched"


# -- pending approvals frozen ----------------------------------------------------------------

def test_a_pending_approval_cannot_be_approved_while_stopped(tenant, agent, admin, reviewer):
    request = make_pending_approval(agent, risk_tier=3)
    stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TOOL, tool=refund_tool(), user=admin, reason="x")

    with pytest.raises(Conflict, match="Frozen"):
        decisions.approval_approve(approval_id=request.approval_id, reviewer=reviewer, reason="ok")

    request.refresh_from_db()
    assert request.status == "pending"
    assert not request.decisions.exists()


def test_a_frozen_approval_can_still_be_rejected(tenant, agent, admin, reviewer):
    request = make_pending_approval(agent, risk_tier=3)
    stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.AGENT, agent=agent, user=admin, reason="x")

    decisions.approval_reject(approval_id=request.approval_id, reviewer=reviewer, reason="not now")

    request.refresh_from_db()
    assert request.status == "rejected"


def test_an_approval_thaws_when_the_stop_is_resumed(tenant, agent, admin, reviewer):
    request = make_pending_approval(agent, risk_tier=3)
    stop = stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TENANT, user=admin, reason="x")
    stops.stop_resume(stop_id=stop.stop_id, user=admin)

    decisions.approval_approve(approval_id=request.approval_id, reviewer=reviewer, reason="ok")

    request.refresh_from_db()
    assert request.status == "approved"


def test_a_stop_after_the_gate_cached_its_configuration_holds_the_next_call_at_once(tenant, agent, admin,
                                                                                   running_task):
    assert propose(agent, running_task, call_id="c1").decision == "dispatched"  # the cache is warm
    stop = stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.AGENT, agent=agent, user=admin, reason="now")

    assert propose(agent, running_task, call_id="c2").decision == "refused"

    stops.stop_resume(stop_id=stop.stop_id, user=admin)
    assert propose(agent, running_task, call_id="c3").decision == "dispatched"


def token() -> str | None:
    return PolicyGeneration.objects.filter(pk=1).values_list("token", flat=True).first()


def test_stopping_and_resuming_give_the_configuration_a_new_generation(policy, tenant, admin):
    before = token()
    stop = stops.stop_create(tenant_id=tenant.pk, scope=Stop.Scope.TENANT, user=admin, reason="x")
    during = token()
    stops.stop_resume(stop_id=stop.stop_id, user=admin)

    assert before is not None and len({before, during, token()}) == 3
