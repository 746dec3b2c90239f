"""ledger.control and the holds it relies on: a stop holds every new dispatch and attempt
(retries, reconciliation's redispatches, the sweeper's pushes) while attempts in flight finish
and are recorded; resuming pushes the held work again. A task cancelled, paused or resumed by a
person, against the real sandbox providers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import stops
from approvals.models import ApprovalRequest, ApprovalStatus, Stop, Tool
from console.lib.errors import Conflict, InvalidInput, NotPermitted
from console.models import Event, Role
from ledger import control, decisions, dispatcher
from ledger.adapters import get_adapter
from ledger.adapters.base import ABSENT
from ledger.dispatcher import run_dispatch
from ledger.models import Operation, OperationStatus
from ledger.reconcile import run_reconcile
from ledger.sweeper import run_sweep
from runs import services as run_services
from runs.models import Task, TaskStatus
from sandbox.client import wait_for
from tests.conftest import make_user
from tests.factories import events_of, make_operation, make_pending_approval
from tests.fixtures.dispatch import (
    HANG_SECONDS,
    attempts_of,
    authorized_refund,
    effects_of,
    refund_arguments,
    reload,
)

S = OperationStatus
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sandbox_settings", "enqueued")]


@pytest.fixture
def admin(tenant):
    return make_user("boss", tenant, Role.ADMIN)


def stop(admin, scope: str = "tenant", **target) -> Stop:
    return stops.stop_create(tenant_id=admin.memberships.first().tenant_id, scope=scope, user=admin,
                             reason="incident", **target)


def an_hour_later():
    return timezone.now() + timedelta(hours=1)


# -- no new dispatch or attempt while stopped ----------------------------------------------------

@pytest.mark.parametrize("scope", ["tenant", "agent", "tool"])
def test_a_stop_holds_an_authorized_operation_without_moving_it(agent, tools, admin, payments_url, unique, scope):
    operation = authorized_refund(agent, unique("ord"))
    target = {"agent": agent} if scope == "agent" else {"tool": tools["payments.refund"]} if scope == "tool" else {}
    held_by = stop(admin, scope, **target)

    assert run_dispatch(operation.operation_id, worker="test") == f"held:stopped:{held_by.stop_id}"

    assert reload(operation).status == S.AUTHORIZED
    assert attempts_of(operation) == []
    assert effects_of(payments_url, operation) == []


def test_a_stop_holds_a_retry(agent, tools, admin, unique):
    operation = make_operation(agent, "payments.refund", status=S.RETRY_SAFE,
                               arguments=refund_arguments(unique("ord")))
    stop(admin, "tool", tool=tools["payments.refund"])

    assert run_dispatch(operation.operation_id, worker="test").startswith("held:stopped:")
    assert reload(operation).status == S.RETRY_SAFE
    assert len(attempts_of(operation)) == 1


def test_reconciliation_still_asks_the_provider_under_a_stop_but_its_redispatch_is_held(
        agent, tools, admin, payments_url, unique, django_capture_on_commit_callbacks):
    operation = authorized_refund(agent, unique("fault-timeout-before-commit"))
    assert run_dispatch(operation.operation_id, worker="test") == S.UNKNOWN
    held_by = stop(admin, "tool", tool=tools["payments.refund"])
    adapter = get_adapter("payments.refund")
    wait_for(lambda: adapter.query(key=operation.idempotency_key, timeout=1.0).state == ABSENT,
             timeout=HANG_SECONDS + 5, what="the provider to drop the hung request")

    assert run_reconcile(operation.operation_id, worker="test", now=an_hour_later()) == S.RETRY_SAFE
    assert run_dispatch(operation.operation_id, worker="test") == f"held:stopped:{held_by.stop_id}"
    assert len(attempts_of(operation)) == 1
    assert effects_of(payments_url, operation) == []

    with django_capture_on_commit_callbacks(execute=True):
        control.stop_resume(stop_id=held_by.stop_id, user=admin)
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, operation)) == 1


def test_the_sweeper_does_not_push_stopped_work(agent, tools, admin, unique, enqueued):
    held = authorized_refund(agent, unique("ord"))
    other_tool = authorized_refund(agent, unique("ord"))
    Operation.objects.filter(pk=other_tool.pk).update(tool=tools["orders.lookup"])
    stop(admin, "tool", tool=tools["payments.refund"])

    run_sweep(now=an_hour_later())

    assert enqueued.dispatched_ids() == [other_tool.operation_id]
    assert held.operation_id not in enqueued.dispatched_ids()


def test_a_stop_of_another_tenant_holds_nothing_here(agent, tools, other_tenant, payments_url, unique):
    operation = authorized_refund(agent, unique("ord"))
    stranger = make_user("stranger", other_tenant, Role.ADMIN)
    stops.stop_create(tenant_id=other_tenant.pk, scope="tenant", user=stranger, reason="theirs")

    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED


def test_an_attempt_in_flight_when_the_stop_comes_finishes_and_is_recorded(agent, tools, admin, payments_url,
                                                                          unique, monkeypatch):
    operation = authorized_refund(agent, unique("ord"))
    real_call = dispatcher._call_provider
    notices = []

    def stop_during_the_call(op, attempt, let_go=None):
        stop(admin)
        notices.append(control.authority_notice(Operation.objects.get(pk=op.pk)))
        return real_call(op, attempt, let_go)

    monkeypatch.setattr(dispatcher, "_call_provider", stop_during_the_call)

    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED

    assert len(effects_of(payments_url, operation)) == 1
    [attempt] = attempts_of(operation)
    assert attempt.finished_at is not None
    assert notices[0].startswith("Attempt 1 was claimed before tenant acme was stopped by boss (incident)")
    assert "allowed to finish and is recorded" in notices[0]


def test_resuming_pushes_what_the_stop_held_and_it_runs(agent, tools, admin, payments_url, unique, enqueued,
                                                        django_capture_on_commit_callbacks):
    operation = authorized_refund(agent, unique("ord"))
    held_by = stop(admin, "agent", agent=agent)
    run_dispatch(operation.operation_id, worker="test")
    enqueued.clear()

    with django_capture_on_commit_callbacks(execute=True):
        control.stop_resume(stop_id=held_by.stop_id, user=admin, reason="all clear")

    assert enqueued.dispatched_ids() == [operation.operation_id]
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, operation)) == 1


def test_an_operation_under_two_stops_stays_held_until_both_are_resumed(agent, tools, admin, unique):
    operation = authorized_refund(agent, unique("ord"))
    first = stop(admin, "agent", agent=agent)
    stop(admin, "tool", tool=tools["payments.refund"])

    control.stop_resume(stop_id=first.stop_id, user=admin)

    assert run_dispatch(operation.operation_id, worker="test").startswith("held:stopped:")


def test_the_held_operation_page_says_why(agent, tools, admin, unique):
    operation = authorized_refund(agent, unique("ord"))
    stop(admin)

    assert control.authority_notice(reload(operation)).startswith("Held: tenant acme was stopped by boss")


def test_the_page_says_so_when_authority_was_withdrawn_after_the_claim(agent, tools, unique):
    operation = make_operation(agent, "payments.refund", status=S.DISPATCHED,
                               arguments=refund_arguments(unique("ord")))
    Tool.objects.filter(name="payments.refund").update(enabled=False)

    notice = control.authority_notice(reload(operation))

    assert notice.startswith("Attempt 1 was claimed before its authority was withdrawn")
    assert "payments.refund is disabled" in notice


def test_nothing_is_said_when_authority_holds(agent, tools, unique):
    operation = make_operation(agent, "payments.refund", status=S.DISPATCHED,
                               arguments=refund_arguments(unique("ord")))
    assert control.authority_notice(reload(operation)) == ""


# -- a task cancelled, paused, resumed -----------------------------------------------------------

def test_cancelling_a_task_closes_its_approvals_and_cancels_what_was_not_sent(agent, tools, admin, unique):
    pending = make_pending_approval(agent, risk_tier=3)
    task = pending.task
    authorized = make_operation(agent, "payments.refund", status=S.AUTHORIZED, task=task,
                                arguments=refund_arguments(unique("ord")))
    retry = make_operation(agent, "payments.refund", status=S.RETRY_SAFE, task=task,
                           arguments=refund_arguments(unique("ord")))
    in_flight = make_operation(agent, "payments.refund", status=S.DISPATCHED, task=task,
                               arguments=refund_arguments(unique("ord")))

    control.task_cancel(task_id=task.task_id, user=admin, reason="customer withdrew")

    assert Task.objects.get(pk=task.pk).status == TaskStatus.CANCELLED
    pending.refresh_from_db()
    assert pending.status == ApprovalStatus.INVALIDATED
    assert Operation.objects.get(pk=pending.operation_id).status == S.CANCELLED
    assert reload(authorized).status == S.CANCELLED
    assert reload(retry).status == S.FAILED
    assert reload(in_flight).status == S.DISPATCHED  # it finishes and is recorded
    last = events_of("task", task.task_id)[-1]
    assert (last.to_status, last.actor, last.reason) == ("cancelled", "user:boss", "customer withdrew")
    assert events_of("operation", authorized.operation_id)[-1].reason == "task cancelled by boss: customer withdrew"


def test_a_paused_task_holds_its_operations_and_resuming_pushes_them(agent, tools, admin, payments_url, unique,
                                                                     enqueued, django_capture_on_commit_callbacks):
    operation = authorized_refund(agent, unique("ord"))
    Task.objects.filter(pk=operation.task_id).update(status=TaskStatus.RUNNING)

    control.task_pause(task_id=operation.task_id, user=admin, reason="checking with finance")
    assert run_dispatch(operation.operation_id, worker="test") == "held:task_paused"
    run_sweep(now=an_hour_later())  # a push the sweeper makes is held again
    assert run_dispatch(operation.operation_id, worker="test") == "held:task_paused"
    assert attempts_of(operation) == []

    with django_capture_on_commit_callbacks(execute=True):
        control.task_resume(task_id=operation.task_id, user=admin, reason="finance agrees")

    assert Task.objects.get(pk=operation.task_id).status == TaskStatus.RUNNING
    assert enqueued.dispatched_ids()[-1] == operation.operation_id
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, operation)) == 1


def test_a_person_s_cancel_makes_the_agent_s_next_commit_stale(agent, admin):
    request = make_pending_approval(agent, risk_tier=3)
    version = Task.objects.get(pk=request.task_id).version

    task = control.task_cancel(task_id=request.task_id, user=admin, reason="stop")

    assert task.version == version + 1


def test_task_controls_need_a_reason_and_the_right_role(agent, admin, reviewer, outsider):
    request = make_pending_approval(agent, risk_tier=3)
    with pytest.raises(InvalidInput):
        control.task_cancel(task_id=request.task_id, user=admin, reason=" ")
    for user in (reviewer, outsider):
        with pytest.raises(NotPermitted):
            control.task_pause(task_id=request.task_id, user=user, reason="x")
    assert Task.objects.get(pk=request.task_id).status != TaskStatus.PAUSED


def test_only_a_paused_task_resumes(agent, admin):
    request = make_pending_approval(agent, risk_tier=3)
    control.task_cancel(task_id=request.task_id, user=admin, reason="done")

    with pytest.raises(Conflict, match="Only a paused task resumes"):
        control.task_resume(task_id=request.task_id, user=admin, reason="oops")


def test_stop_and_resume_events_carry_the_tenant_for_the_live_feed(agent, admin):
    held_by = stop(admin, "agent", agent=agent)
    control.stop_resume(stop_id=held_by.stop_id, user=admin, reason="ok")

    assert [e.to_status for e in Event.objects.filter(entity="stop", tenant_id=agent.tenant_id)] == [
        "stopped", "resumed"]
    assert ApprovalRequest.objects.count() == 0


def test_a_task_paused_by_its_budget_still_runs_what_was_approved_within_it(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("ord"))
    task = Task.objects.get(pk=operation.task_id)
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.RUNNING)
    task.refresh_from_db()
    run_services.task_pause(task=task, actor=agent.ref, reason="tool call budget spent")

    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, operation)) == 1


# -- the expiry clock stops while a request is frozen ------------------------------------------

def _back(seconds: float):
    return timezone.now() - timedelta(seconds=seconds)


@pytest.mark.parametrize("scope", ["tenant", "agent", "tool"])
def test_a_frozen_request_does_not_expire_while_the_stop_holds(agent, tools, admin, scope):
    request = make_pending_approval(agent, risk_tier=3, ttl_seconds=60)
    target = {"agent": agent} if scope == "agent" else {"tool": Tool.objects.get(name="payments.refund")} \
        if scope == "tool" else {}
    stop(admin, scope, **target)

    run_sweep(now=an_hour_later())

    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.PENDING
    assert reload(request.operation).status == S.PLANNED


def test_an_unfrozen_request_still_expires(agent, tools, admin, other_tenant):
    request = make_pending_approval(agent, risk_tier=3, ttl_seconds=60)
    stops.stop_create(tenant_id=other_tenant.pk, scope="tenant", user=make_user("theirs", other_tenant, Role.ADMIN),
                      reason="elsewhere")

    run_sweep(now=an_hour_later())

    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.EXPIRED


@pytest.mark.parametrize("approved", [False, True], ids=["pending", "approved"])
def test_resuming_gives_a_frozen_request_back_the_time_it_was_frozen(agent, tools, admin, reviewer, approved):
    """The request was filed 10 minutes ago with an hour to live; the stop held it for the last
    5 minutes: after the resume it expires 5 minutes later than it would have."""
    request = make_pending_approval(agent, risk_tier=3, ttl_seconds=3600)
    ApprovalRequest.objects.filter(pk=request.pk).update(created_at=_back(600))
    if approved:
        decisions.approval_approve(approval_id=request.approval_id, reviewer=reviewer, reason="ok")
    expires_at = ApprovalRequest.objects.get(pk=request.pk).expires_at
    held = stop(admin)
    Stop.objects.filter(pk=held.pk).update(created_at=_back(300))

    resumed = control.stop_resume(stop_id=held.stop_id, user=admin)

    frozen = resumed.resumed_at - Stop.objects.get(pk=held.pk).created_at
    assert ApprovalRequest.objects.get(pk=request.pk).expires_at == expires_at + frozen


def test_a_request_filed_during_the_stop_gets_back_only_its_own_frozen_time(agent, tools, admin):
    held = stop(admin)
    Stop.objects.filter(pk=held.pk).update(created_at=_back(300))
    request = make_pending_approval(agent, risk_tier=3, ttl_seconds=3600)
    ApprovalRequest.objects.filter(pk=request.pk).update(created_at=_back(120))
    stored = ApprovalRequest.objects.get(pk=request.pk)

    resumed = control.stop_resume(stop_id=held.stop_id, user=admin)

    assert ApprovalRequest.objects.get(pk=request.pk).expires_at == stored.expires_at + (
        resumed.resumed_at - stored.created_at)


def test_a_request_already_past_its_expiry_when_stopped_is_not_revived(agent, tools, admin):
    request = make_pending_approval(agent, risk_tier=3, ttl_seconds=3600)
    ApprovalRequest.objects.filter(pk=request.pk).update(expires_at=_back(400))
    held = stop(admin)
    Stop.objects.filter(pk=held.pk).update(created_at=_back(300))

    control.stop_resume(stop_id=held.stop_id, user=admin)

    assert ApprovalRequest.objects.get(pk=request.pk).expires_at < timezone.now()
    run_sweep()
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.EXPIRED


def test_a_request_outside_the_resumed_scope_keeps_its_expiry(agent, tools, admin):
    request = make_pending_approval(agent, risk_tier=3, tool_name="mail.send")
    expires_at = request.expires_at
    held = stop(admin, "tool", tool=Tool.objects.get(name="payments.refund"))
    Stop.objects.filter(pk=held.pk).update(created_at=_back(300))

    control.stop_resume(stop_id=held.stop_id, user=admin)

    assert ApprovalRequest.objects.get(pk=request.pk).expires_at == expires_at
