"""The proposal pipeline (ledger.proposals.call_propose): repeats, create_or_get, decisions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus, Tool
from console.lib.canonical import arguments_hash
from console.lib.errors import Conflict, IntentMismatch, InvalidInput, NotFound, NotPermitted
from console.lib.ids import derive_operation_id
from console.models import Event
from ledger import decisions
from ledger.models import Attempt, Call, Operation
from ledger.proposals import call_propose
from runs import services as run_services
from runs.models import Task
from tests.fixtures.api import MAIL, RunningTask, refund, start_task


def propose(agent, run: RunningTask, *, call_id="call-1", step_id="step-1", tool="payments.refund",
            arguments=None, expected_version=None, fencing_token=None):
    return call_propose(
        principal=agent, task_id=run.task_id, call_id=call_id, step_id=step_id, tool_name=tool,
        arguments=refund() if arguments is None else arguments,
        expected_version=run.version if expected_version is None else expected_version,
        fencing_token=run.fencing_token if fencing_token is None else fencing_token,
    )


def rows() -> tuple[int, int, int, int, int]:
    return (Operation.objects.count(), Call.objects.count(), Attempt.objects.count(),
            ApprovalRequest.objects.count(), Event.objects.count())


def test_a_low_risk_call_is_authorized_and_dispatched_on_commit(agent, running_task,
                                                                 django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        proposal = propose(agent, running_task)
    assert (proposal.decision, proposal.status, proposal.created) == ("dispatched", "authorized", True)
    operation = Operation.objects.get()
    assert operation.operation_id == proposal.operation_id == derive_operation_id(
        tenant="acme", task_id=running_task.task_id, step_id="step-1", tool="payments.refund")
    assert operation.idempotency_key == operation.operation_id
    assert (operation.call_id, operation.risk_tier, operation.business_key) == ("call-1", 1, "ord-42")
    assert Call.objects.get().operation == operation
    moves = list(Event.objects.filter(entity="operation").order_by("id")
                 .values_list("from_status", "to_status", "actor"))
    assert moves == [("", "planned", agent.ref), ("planned", "authorized", "system:gate")]
    assert len(callbacks) == 1  # the dispatch, published only once this commits
    task = running_task.task
    assert (task.calls_used, task.writes_used, task.amount_used, task.status) == (1, 1, 30, "running")
    assert proposal.task_version == task.version == 3  # a dispatch does not move the task


def test_the_answer_carries_the_calls_own_key_the_waits_watch_it_by(agent, running_task):
    from runs.models import Step

    Step.objects.create(task_id=running_task.task_id, step_id="an-earlier-step")  # keys of steps and calls differ

    proposal = propose(agent, running_task)

    assert proposal.call_pk == Call.objects.get(call_id="call-1").pk
    assert Operation.objects.get(pk=proposal.operation_id).step.step_id == "step-1"


def test_a_repeat_with_the_same_call_id_and_arguments_gets_the_same_answer(agent, running_task):
    first = propose(agent, running_task)
    before = rows()
    again = propose(agent, running_task)
    assert again.operation_id == first.operation_id
    assert (again.decision, again.status, again.created, again.repeat) == ("dispatched", "authorized", False, True)
    assert rows() == before


def test_a_repeat_is_answered_before_the_version_and_token_checks(agent, running_task):
    first = propose(agent, running_task, arguments=refund(120))
    assert running_task.version == 3  # waiting for a person does not move the agent's version
    again = propose(agent, running_task, arguments=refund(120.0), expected_version=1, fencing_token=999)
    assert (again.operation_id, again.decision, again.approval_id) == (
        first.operation_id, "awaiting_approval", first.approval_id)
    assert Operation.objects.count() == 1


def test_the_same_call_id_with_other_arguments_is_an_intent_mismatch(agent, running_task):
    propose(agent, running_task)
    before = rows()
    with pytest.raises(IntentMismatch) as exc:
        propose(agent, running_task, arguments=refund(31))
    assert exc.value.status == 422
    assert rows() == before


def test_the_same_call_id_for_another_step_is_an_intent_mismatch(agent, running_task):
    propose(agent, running_task)
    with pytest.raises(IntentMismatch):
        propose(agent, running_task, step_id="step-2")
    assert Operation.objects.count() == 1


def test_a_regenerated_call_for_the_same_step_maps_to_the_same_operation(agent, running_task):
    first = propose(agent, running_task, call_id="call-a")
    second = propose(agent, running_task, call_id="call-b")
    assert second.operation_id == first.operation_id
    assert (second.decision, second.created, second.repeat) == ("dispatched", False, False)
    assert Operation.objects.count() == 1
    assert set(Call.objects.values_list("call_id", "operation_id")) == {
        ("call-a", first.operation_id), ("call-b", first.operation_id)}
    event = Event.objects.get(entity="call", entity_id="call-b")
    assert event.to_status == "dispatched" and first.operation_id in event.reason
    assert running_task.task.calls_used == 1  # one effect, one unit of budget


def test_a_regenerated_call_is_answered_even_when_the_budget_is_spent(agent):
    run = start_task(agent, constraints={"max_tool_calls": 1})
    first = propose(agent, run, call_id="call-a")
    assert propose(agent, run, call_id="call-b").operation_id == first.operation_id
    assert run.task.status == "running"


def test_the_same_step_with_other_arguments_is_an_intent_mismatch(agent, running_task):
    propose(agent, running_task, call_id="call-a")
    before = rows()
    with pytest.raises(IntentMismatch):
        propose(agent, running_task, call_id="call-b", arguments=refund(31))
    assert rows() == before


def test_a_new_call_with_a_stale_version_is_a_conflict(agent, running_task):
    with pytest.raises(Conflict, match="expected_version"):
        propose(agent, running_task, expected_version=running_task.version - 1)
    assert Operation.objects.count() == 0


def test_a_new_call_with_a_stale_fencing_token_is_a_conflict(agent, running_task):
    with pytest.raises(Conflict, match="fencing token"):
        propose(agent, running_task, fencing_token=running_task.fencing_token + 1)
    assert Operation.objects.count() == 0


def test_a_worker_whose_lease_was_taken_over_cannot_propose(agent, running_task):
    later = timezone.now() + timedelta(hours=1)
    lease = decisions.lease_acquire(task_id=running_task.task_id, owner="worker-2", ttl_seconds=60, now=later)
    with pytest.raises(Conflict):
        propose(agent, running_task)
    assert propose(agent, running_task, fencing_token=lease.fencing_token).created


def test_a_task_that_is_not_running_takes_no_calls(agent):
    task = run_services.task_create(principal=agent, task_type="refund", goal="g")
    lease = decisions.lease_acquire(task_id=task.task_id, owner="w", ttl_seconds=60)
    with pytest.raises(Conflict, match="queued"):
        propose(agent, RunningTask(task.task_id, lease.fencing_token))


def test_another_tenants_task_does_not_exist(agent, outsider_agent, running_task):
    with pytest.raises(NotFound):
        propose(outsider_agent, running_task)


def test_an_unknown_tool_is_invalid(agent, running_task):
    with pytest.raises(InvalidInput, match="Unknown tool"):
        propose(agent, running_task, tool="payments.chargeback")


def test_invalid_arguments_write_nothing_but_the_record_of_the_refusal(agent, running_task):
    operations, calls, attempts, approvals, events = rows()
    with pytest.raises(InvalidInput):
        propose(agent, running_task, arguments={"order_id": "ord-42"})
    # No call: a repeat is checked again, and the agent may correct it under the same call ID.
    assert rows() == (operations, calls, attempts, approvals, events + 1)
    event = Event.objects.order_by("-id").first()
    assert (event.entity, event.entity_id, event.kind, event.actor) == ("call", "call-1", "call_refused", agent.ref)
    assert {e["path"] for e in event.evidence["invalid_arguments"]} == {""}  # required properties missing
    assert propose(agent, running_task).decision == "dispatched"


def test_a_tool_the_principal_may_not_use_is_forbidden(agent, running_task, policy):
    agent.allowed_tools.remove(policy["payments.refund"])
    with pytest.raises(NotPermitted):
        propose(agent, running_task)


def test_a_call_that_needs_approval_makes_the_task_wait(agent, running_task, django_capture_on_commit_callbacks):
    version_before = running_task.version
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        proposal = propose(agent, running_task, arguments=refund(120))
    assert (proposal.decision, proposal.status, proposal.created) == ("awaiting_approval", "planned", True)
    assert "amount 120 > 50 → L3" in proposal.reasons
    task = running_task.task
    assert (task.status, task.version) == ("waiting_approval", version_before)
    assert proposal.task_version == task.version
    approval = ApprovalRequest.objects.get()
    assert approval.approval_id == proposal.approval_id
    assert approval.call_id == "call-1"
    assert approval.operation_id == proposal.operation_id
    assert approval.arguments_hash == arguments_hash(refund(120))
    assert approval.state_version == task.version
    assert approval.requested_by == agent
    assert (approval.risk_tier, approval.approvals_needed, approval.status) == (3, 1, ApprovalStatus.PENDING)
    assert abs((approval.expires_at - approval.created_at).total_seconds() - 3600) < 5
    assert Event.objects.filter(entity="task", entity_id=task.task_id, to_status="waiting_approval").count() == 1
    assert Event.objects.filter(entity="approval", entity_id=approval.approval_id, to_status="pending").count() == 1
    assert callbacks == []  # nothing is dispatched before a person approves


def test_a_refund_over_200_asks_for_two_approvers(agent, running_task):
    proposal = propose(agent, running_task, arguments=refund(250))
    assert proposal.approvals_needed == 2
    assert ApprovalRequest.objects.get().approvals_needed == 2


def test_a_second_call_while_waiting_keeps_the_version(agent, running_task):
    propose(agent, running_task, arguments=refund(120))
    waiting_version = running_task.version
    second = propose(agent, running_task, call_id="call-2", step_id="step-2", tool="mail.send", arguments=MAIL)
    assert second.decision == "awaiting_approval"
    assert running_task.version == waiting_version
    assert ApprovalRequest.objects.get(call_id="call-2").state_version == waiting_version


def test_a_repeat_after_a_rejection_is_refused(agent, running_task, reviewer):
    first = propose(agent, running_task, arguments=refund(120))
    decisions.approval_reject(approval_id=first.approval_id, reviewer=reviewer, reason="not our fault")
    again = propose(agent, running_task, arguments=refund(120))
    assert (again.decision, again.status) == ("refused", "rejected")
    assert again.reasons == ("operation rejected: not our fault",)


def test_a_repeat_after_approval_is_dispatched(agent, running_task, reviewer):
    first = propose(agent, running_task, arguments=refund(120))
    decisions.approval_approve(approval_id=first.approval_id, reviewer=reviewer)
    again = propose(agent, running_task, arguments=refund(120))
    assert (again.decision, again.status, again.approval_id) == ("dispatched", "authorized", first.approval_id)


def test_a_spent_budget_refuses_the_call_and_pauses_the_task(agent):
    run = start_task(agent, constraints={"max_writes": 1})
    propose(agent, run, call_id="call-1", step_id="step-1")
    version = run.version
    operations = Operation.objects.count()
    proposal = propose(agent, run, call_id="call-2", step_id="step-2")
    assert (proposal.decision, proposal.status, proposal.operation_id) == ("refused", "refused", None)
    assert proposal.reasons == ("write budget spent: 1 of 1",)
    assert Operation.objects.count() == operations
    refused = Call.objects.get(call_id="call-2")  # recorded with its refusal, no operation
    assert (refused.operation_id, refused.refusal["reasons"]) == (None, ["write budget spent: 1 of 1"])
    task = run.task
    assert (task.status, task.version) == ("paused", version + 1)
    assert proposal.task_version == task.version
    pause = Event.objects.get(entity="task", entity_id=task.task_id, to_status="paused")
    assert pause.evidence["budgets"] == ["max_writes"]
    refusal = Event.objects.get(entity="call", entity_id="call-2")
    assert refusal.to_status == "refused" and refusal.reason == "write budget spent: 1 of 1"
    with pytest.raises(Conflict, match="paused"):
        propose(agent, run, call_id="call-3", step_id="step-3")


def test_a_refusal_that_is_not_a_spent_budget_leaves_the_task_running(agent):
    run = start_task(agent, constraints={"max_amount": 100})
    proposal = propose(agent, run, arguments=refund(150))
    assert proposal.decision == "refused"
    assert run.task.status == "running"
    assert Event.objects.filter(entity="call", entity_id="call-1", to_status="refused").count() == 1


def test_budgets_are_spent_when_the_operation_is_created(agent):
    run = start_task(agent, constraints={"max_amount": 200})
    propose(agent, run, call_id="c1", step_id="s1", arguments=refund(30))
    propose(agent, run, call_id="c2", step_id="s2", arguments=refund(120))  # awaiting approval: reserved
    propose(agent, run, call_id="c3", step_id="s3", tool="orders.lookup", arguments={"order_id": "ord-42"})
    task = run.task
    assert (task.calls_used, task.writes_used, task.amount_used) == (3, 2, 150)


def test_a_business_key_template_names_the_idempotency_key(agent, running_task, policy):
    Tool.objects.filter(name="payments.refund").update(idempotency_key_template="{tenant}:{order_id}:refund:{amount}")
    proposal = propose(agent, running_task, arguments=refund(30.0))
    assert Operation.objects.get(pk=proposal.operation_id).idempotency_key == "acme:ord-42:refund:30"


def test_a_template_the_arguments_cannot_fill_is_invalid(agent, running_task, policy):
    Tool.objects.filter(name="payments.refund").update(idempotency_key_template="{tenant}:{customer_id}")
    with pytest.raises(InvalidInput, match="template"):
        propose(agent, running_task)
    assert Operation.objects.count() == 0


def test_arguments_that_cannot_be_canonicalized_are_invalid(agent, running_task):
    with pytest.raises(InvalidInput, match="canonicalized"):
        propose(agent, running_task, arguments=refund(2**60))


def test_task_counters_move_no_version(agent, running_task):
    version = running_task.version
    propose(agent, running_task, call_id="c1", step_id="s1")
    propose(agent, running_task, call_id="c2", step_id="s2", expected_version=version)
    assert Task.objects.get(pk=running_task.task_id).version == version


def blind_once(monkeypatch):
    """The first proposal after this misses the ledger's call and operation, as a writer that
    got past the task lock would (the lock should prevent it); later ones see them again."""
    from ledger import proposals

    real = proposals._lock_task
    calls = []

    def lock_task(**kwargs):
        task, lease, known_call, known_operation, policy, claim_reads = real(**kwargs)
        calls.append((known_call, known_operation))
        if len(calls) == 1:
            return task, lease, False, False, policy, claim_reads
        return task, lease, known_call, known_operation, policy, claim_reads

    monkeypatch.setattr(proposals, "_lock_task", lock_task)
    return calls


def test_a_lost_race_on_the_call_is_answered_from_the_ledger(agent, running_task, monkeypatch):
    first = propose(agent, running_task)
    before = rows()
    seen = blind_once(monkeypatch)
    again = propose(agent, running_task)
    assert seen == [(True, True), (True, True)]  # blind pass, rolled back; second pass answers
    assert (again.operation_id, again.repeat, again.created) == (first.operation_id, True, False)
    assert rows() == before


def test_a_lost_race_on_the_operation_is_answered_from_the_ledger(agent, running_task, monkeypatch):
    """A new call ID for a step already in the ledger (a regenerated call) that misses the
    operation: the insert meets it, and the second pass maps the call to it."""
    first = propose(agent, running_task)
    seen = blind_once(monkeypatch)
    again = propose(agent, running_task, call_id="call-2")
    assert seen == [(False, True), (False, True)]
    assert (again.operation_id, again.created) == (first.operation_id, False)
    assert (Operation.objects.count(), Call.objects.count()) == (1, 2)
    assert not Event.objects.filter(entity="operation").exclude(entity_id=first.operation_id).exists()
