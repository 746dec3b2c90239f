"""ledger.dispatcher.run_dispatch against the real sandbox providers (steps 5–7 of dispatch in docs/architecture.md)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus, Tool
from console.models import Membership
from ledger import decisions, dispatcher
from ledger.adapters import get_adapter
from ledger.adapters.base import PROCESSING, QueryAnswer
from ledger.dispatcher import run_dispatch
from ledger.models import Attempt, Fact, Operation, OperationStatus
from ledger.reconcile import run_reconcile
from ledger.retry import backoff_bounds
from ledger.sweeper import run_sweep
from runs import services as run_services
from runs.models import Task
from tests.factories import cancel_task, make_approval_request, make_lease, make_operation
from tests.fixtures.dispatch import (
    GRACE_SECONDS,
    PAYMENTS_TIMEOUT,
    attempts_of,
    authorized_mail,
    authorized_refund,
    effects_of,
    refund_arguments,
    release_backoff,
    reload,
    status_story,
)

S = OperationStatus
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sandbox_settings", "enqueued")]


@pytest.fixture
def approved_refund(agent, tools, reviewer, unique):
    """An L3 refund a reviewer approved: planned → authorized through the approval."""

    def make(order_id: str | None = None) -> tuple[Operation, ApprovalRequest]:
        operation = make_operation(agent, "payments.refund", status=S.PLANNED, risk_tier=3,
                                   arguments=refund_arguments(order_id or unique("ord"), amount=80))
        approval = make_approval_request(operation, risk_tier=3)
        decisions.approval_approve(approval_id=approval.approval_id, reviewer=reviewer, reason="ok")
        assert reload(operation).status == S.AUTHORIZED
        return operation, approval

    return make


def dispatch_until_settled(operation: Operation, *, limit: int = 10) -> list[str]:
    """Run the dispatcher the way the broker would after each backoff, without waiting it out."""
    results = []
    for _ in range(limit):
        results.append(run_dispatch(operation.operation_id, worker="test"))
        if reload(operation).status != S.RETRY_SAFE:
            return results
        release_backoff(operation)
    raise AssertionError(f"still retrying after {limit} dispatches: {results}")


# -- the happy path and duplicates -----------------------------------------------------------

def test_it_confirms_a_refund_with_the_providers_receipt_and_exactly_one_effect(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("ord"))

    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED

    operation = reload(operation)
    effects = effects_of(payments_url, operation)
    assert len(effects) == 1
    assert operation.status == S.CONFIRMED
    assert operation.receipt["remote_id"] == effects[0]["payload"]["id"]
    assert operation.receipt["provider"] == "payments"
    [attempt] = attempts_of(operation)
    assert (attempt.number, attempt.fencing_token, attempt.fact, attempt.stale) == (1, 1, Fact.KNOWN_SUCCESS, False)
    assert attempt.worker == "test" and attempt.finished_at is not None
    assert (operation.attempt_count, operation.fencing_token) == (1, 1)
    assert status_story(operation) == [S.PLANNED, S.AUTHORIZED, S.DISPATCHED, S.CONFIRMED]


def test_it_sends_the_operations_idempotency_key_and_exact_arguments(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("ord"), amount=12.5, currency="USD")

    run_dispatch(operation.operation_id, worker="test")

    [effect] = effects_of(payments_url, operation)
    assert effect["key"] == operation.idempotency_key
    assert effect["payload"]["amount"] == 12.5
    assert effect["payload"]["currency"] == "USD"
    assert effect["payload"]["order_id"] == operation.arguments["order_id"]


def test_it_treats_a_duplicate_delivery_as_a_no_op(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("ord"))

    first = run_dispatch(operation.operation_id, worker="test")
    second = run_dispatch(operation.operation_id, worker="test-2")

    assert (first, second) == (S.CONFIRMED, "noop:confirmed")
    assert len(attempts_of(operation)) == 1
    assert len(effects_of(payments_url, operation)) == 1
    assert status_story(operation).count(S.DISPATCHED) == 1


def test_it_does_not_dispatch_again_while_the_first_delivery_is_still_at_the_provider(
    agent, tools, payments_url, unique, monkeypatch
):
    operation = authorized_refund(agent, unique("ord"))
    real_call = dispatcher._call_provider
    during_call = []

    def call_while_a_duplicate_arrives(op, attempt, let_go=None):
        during_call.append(run_dispatch(op.operation_id, worker="duplicate"))
        return real_call(op, attempt, let_go)

    monkeypatch.setattr(dispatcher, "_call_provider", call_while_a_duplicate_arrives)

    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    assert during_call == ["noop:dispatched"]
    assert len(attempts_of(operation)) == 1
    assert len(effects_of(payments_url, operation)) == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_deliveries_of_one_operation_claim_it_exactly_once(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("ord"))
    results: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def deliver(worker: str) -> None:
        try:
            barrier.wait(timeout=10)
            results.append(run_dispatch(operation.operation_id, worker=worker))
        except BaseException as exc:  # surfaced below, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not errors
    assert sorted(results).count(S.CONFIRMED) == 1
    assert all(r == S.CONFIRMED or r.startswith("noop:") for r in results), results
    assert len(attempts_of(operation)) == 1
    assert len(effects_of(payments_url, operation)) == 1
    assert reload(operation).status == S.CONFIRMED


def test_it_reports_a_missing_operation_without_touching_anything(db):
    assert run_dispatch("op_does_not_exist", worker="test") == "missing"


@pytest.mark.parametrize("status", [S.PLANNED, S.UNKNOWN, S.MANUAL, S.FAILED, S.CANCELLED])
def test_it_never_dispatches_an_operation_that_is_not_authorized_or_retry_safe(agent, tools, payments_url, status):
    operation = make_operation(agent, "payments.refund", status=status)
    attempts_before = len(attempts_of(operation))

    assert run_dispatch(operation.operation_id, worker="test") == f"noop:{status}"

    assert reload(operation).status == status
    assert len(attempts_of(operation)) == attempts_before
    assert effects_of(payments_url, operation) == []


# -- outcomes that are unknown, never failed -------------------------------------------------

@pytest.mark.parametrize(
    ("fault", "error_class"),
    [
        ("fault-timeout-after-commit", "timeout"),
        ("fault-5xx-after-commit", "server_error"),
        ("fault-lost-reply", "reset"),
    ],
)
def test_a_reply_lost_after_the_provider_committed_is_unknown_not_failed(
    agent, tools, payments_url, unique, enqueued, fault, error_class
):
    operation = authorized_refund(agent, unique(fault))

    assert run_dispatch(operation.operation_id, worker="test") == S.UNKNOWN

    operation = reload(operation)
    assert operation.status == S.UNKNOWN
    assert operation.next_reconcile_at is not None
    [attempt] = attempts_of(operation)
    assert (attempt.fact, attempt.error_class, attempt.stale) == (Fact.UNKNOWN, error_class, False)
    assert attempt.raw_response["side_effect"] == "unknown"
    # The provider did commit: calling this "failed" would invite a second refund.
    assert len(effects_of(payments_url, operation)) == 1
    assert enqueued.reconciles == [operation.operation_id]
    assert enqueued.dispatches == []
    assert S.FAILED not in status_story(operation)


def test_an_unknown_operation_is_never_dispatched_again(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("fault-lost-reply"))
    run_dispatch(operation.operation_id, worker="test")

    assert run_dispatch(operation.operation_id, worker="test") == "noop:unknown"
    assert len(attempts_of(operation)) == 1


# -- not sent: retried within policy ---------------------------------------------------------

def test_a_429_is_retried_after_the_retry_after_the_provider_asked_for(agent, tools, payments_url, unique, enqueued):
    operation = authorized_refund(agent, unique("fault-429"))

    assert run_dispatch(operation.operation_id, worker="test") == S.RETRY_SAFE

    operation = reload(operation)
    [first] = attempts_of(operation)
    assert (first.fact, first.error_class, first.error_code) == (Fact.NOT_SENT, "rate_limited", "429")
    assert first.raw_response["retry_after"] == 1.0
    # Retry-After: 1 → not before one second after the attempt started (and not much later).
    assert operation.not_before >= first.started_at + timedelta(seconds=1)
    assert operation.not_before <= first.finished_at + timedelta(seconds=1.5)
    [(operation_id, options)] = enqueued.dispatches
    assert operation_id == operation.operation_id
    assert 0.5 <= options["countdown"] <= 1.0
    assert effects_of(payments_url, operation) == []

    # The broker delivers early (or twice): the ledger's not_before still holds.
    assert run_dispatch(operation.operation_id, worker="test") == "deferred:backoff"
    assert len(attempts_of(operation)) == 1

    release_backoff(operation)
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED

    operation = reload(operation)
    assert (operation.attempt_count, operation.fencing_token) == (2, 2)
    assert [a.fact for a in attempts_of(operation)] == [Fact.NOT_SENT, Fact.KNOWN_SUCCESS]
    assert len(effects_of(payments_url, operation)) == 1
    assert status_story(operation) == [S.PLANNED, S.AUTHORIZED, S.DISPATCHED, S.RETRY_SAFE, S.DISPATCHED,
                                       S.CONFIRMED]


def test_a_503_before_commit_is_retried_with_the_same_key_and_confirmed(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("fault-5xx-before-commit"))

    assert run_dispatch(operation.operation_id, worker="test") == S.RETRY_SAFE
    operation = reload(operation)
    [first] = attempts_of(operation)
    assert (first.fact, first.error_class, first.error_code) == (Fact.NOT_SENT, "unavailable", "503")
    low, high = backoff_bounds(operation.tool, 1)
    assert first.started_at + timedelta(seconds=low) <= operation.not_before
    assert operation.not_before <= first.finished_at + timedelta(seconds=high)

    release_backoff(operation)
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    operation = reload(operation)
    assert operation.attempt_count == 2
    [effect] = effects_of(payments_url, operation)
    assert effect["key"] == operation.idempotency_key


def test_a_refused_connection_is_not_sent_and_retried(agent, tools, payments_url, unique, settings, free_port):
    operation = authorized_refund(agent, unique("ord"))
    settings.SANDBOX_PAYMENTS_URL = f"http://127.0.0.1:{free_port}"

    assert run_dispatch(operation.operation_id, worker="test") == S.RETRY_SAFE
    [attempt] = attempts_of(operation)
    assert (attempt.fact, attempt.error_class) == (Fact.NOT_SENT, "connect")

    settings.SANDBOX_PAYMENTS_URL = payments_url
    release_backoff(operation)
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, operation)) == 1


def test_a_validation_error_is_a_known_failure_and_is_not_retried(agent, tools, payments_url, unique, enqueued):
    # The tool's schema would refuse this at the gate; the provider's own check is what is
    # exercised here, so the arguments are written straight onto the operation.
    operation = authorized_refund(agent, unique("ord"), currency="XYZ")

    assert run_dispatch(operation.operation_id, worker="test") == S.FAILED

    operation = reload(operation)
    [attempt] = attempts_of(operation)
    assert (attempt.fact, attempt.error_class, attempt.error_code) == (Fact.KNOWN_FAILURE, "validation", "400")
    assert attempt.raw_response["raw"]["body"]["error"]["details"]["currency"].startswith("unknown currency")
    assert operation.last_error == "validation 400"
    assert effects_of(payments_url, operation) == []
    assert enqueued.dispatches == [] and enqueued.reconciles == []
    assert run_dispatch(operation.operation_id, worker="test") == "noop:failed"
    assert len(attempts_of(operation)) == 1


@pytest.mark.parametrize("fault", ["fault-429-always", "fault-5xx-before-commit-always"])
def test_a_fault_on_every_attempt_stops_at_max_attempts_and_fails(
    agent, tools, payments_url, unique, enqueued, fault
):
    Tool.objects.filter(name="payments.refund").update(max_attempts=3)
    operation = authorized_refund(agent, unique(fault))

    results = dispatch_until_settled(operation)

    operation = reload(operation)
    assert results == [S.RETRY_SAFE, S.RETRY_SAFE, S.FAILED]
    assert operation.status == S.FAILED
    attempts = attempts_of(operation)
    assert [a.number for a in attempts] == [1, 2, 3]
    assert {a.fact for a in attempts} == {Fact.NOT_SENT}
    assert effects_of(payments_url, operation) == []
    # Two retries were scheduled, each within full jitter (or at the Retry-After, capped).
    assert len(enqueued.dispatches) == 2
    tool = operation.tool
    for attempt, (_, options) in zip(attempts, enqueued.dispatches, strict=False):
        low, high = backoff_bounds(tool, attempt.number)
        retry_after = attempt.raw_response["retry_after"]
        floor = min(retry_after, tool.backoff_cap_seconds) if retry_after is not None else low
        assert floor - 0.25 <= options["countdown"] <= max(high, floor)
    assert run_dispatch(operation.operation_id, worker="test") == "noop:failed"


def test_a_retry_safe_operation_past_max_attempts_is_failed_not_sent_again(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("fault-429"))
    run_dispatch(operation.operation_id, worker="test")
    # The policy tightened since the first attempt.
    Tool.objects.filter(name="payments.refund").update(max_attempts=1)
    release_backoff(operation)

    assert run_dispatch(operation.operation_id, worker="test") == "failed:max attempts (1) reached"

    assert reload(operation).status == S.FAILED
    assert len(attempts_of(operation)) == 1
    assert effects_of(payments_url, operation) == []


# -- fencing ---------------------------------------------------------------------------------

def test_a_stale_workers_late_result_is_kept_on_its_attempt_and_changes_no_status(
    agent, tools, payments_url, unique, monkeypatch
):
    """Worker A claims, then stalls before its request leaves. The sweeper declares it lost,
    the reconciler finds no effect, worker B retries and confirms. When A wakes, its token is
    fenced: it does not send, and its late result is kept as evidence without committing."""
    operation = authorized_refund(agent, unique("ord"))
    real_call = dispatcher._call_provider
    takeover = {}

    def stalled_worker_a(op, attempt, let_go=None):
        if attempt.worker == "A":
            later = timezone.now() + timedelta(seconds=PAYMENTS_TIMEOUT + GRACE_SECONDS + 0.1)
            takeover["sweep"] = run_sweep(now=later)
            takeover["reconcile"] = run_reconcile(op.operation_id, worker="test", now=later)
            takeover["b"] = run_dispatch(op.operation_id, worker="B")
        return real_call(op, attempt, let_go)

    monkeypatch.setattr(dispatcher, "_call_provider", stalled_worker_a)

    assert run_dispatch(operation.operation_id, worker="A") == "stale"

    assert takeover["sweep"]["unknown"] == 1
    assert takeover["reconcile"] == S.RETRY_SAFE
    assert takeover["b"] == S.CONFIRMED
    operation = reload(operation)
    assert (operation.status, operation.fencing_token, operation.attempt_count) == (S.CONFIRMED, 2, 2)
    a, b = attempts_of(operation)
    assert (a.worker, a.fencing_token, a.stale, a.fact, a.error_class) == ("A", 1, True, Fact.NOT_SENT, "fenced")
    assert (b.worker, b.fencing_token, b.stale) == ("B", 2, False)
    assert operation.receipt["remote_id"] == b.raw_response["receipt"]["remote_id"]
    assert status_story(operation) == [S.PLANNED, S.AUTHORIZED, S.DISPATCHED, S.UNKNOWN, S.RETRY_SAFE,
                                       S.DISPATCHED, S.CONFIRMED]
    assert len(effects_of(payments_url, operation)) == 1


def test_a_late_result_after_the_sweeper_gave_up_is_evidence_only(agent, tools, payments_url, unique, monkeypatch):
    operation = authorized_refund(agent, unique("ord"))
    real_call = dispatcher._call_provider

    def slow_worker(op, attempt, let_go=None):
        outcome = real_call(op, attempt, let_go)
        run_sweep(now=op.dispatch_deadline + timedelta(milliseconds=1))
        return outcome

    monkeypatch.setattr(dispatcher, "_call_provider", slow_worker)

    assert run_dispatch(operation.operation_id, worker="test") == "stale"

    operation = reload(operation)
    assert operation.status == S.UNKNOWN
    assert operation.receipt is None
    [attempt] = attempts_of(operation)
    assert attempt.stale and attempt.fact == Fact.KNOWN_SUCCESS
    assert status_story(operation)[-1] == S.UNKNOWN
    # The reconciler then finds the effect the late worker reported.
    assert run_reconcile(operation.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, operation)) == 1



def test_a_worker_that_stalls_past_its_deadline_does_not_send_a_second_email(
    agent, tools, mail_url, unique, monkeypatch
):
    operation = authorized_mail(agent, f"{unique('customer')}@example.com")
    real_call = dispatcher._call_provider

    def stalled_worker_a(op, attempt, let_go=None):
        if attempt.worker == "A":
            later = op.dispatch_deadline + timedelta(milliseconds=1)
            run_sweep(now=later)
            run_reconcile(op.operation_id, worker="test", now=later)
            run_dispatch(op.operation_id, worker="B")
        return real_call(op, attempt, let_go)

    monkeypatch.setattr(dispatcher, "_call_provider", stalled_worker_a)

    run_dispatch(operation.operation_id, worker="A")

    assert reload(operation).status == S.CONFIRMED
    assert len(effects_of(mail_url, operation)) == 1

# -- re-validation before the claim ----------------------------------------------------------

def test_it_consumes_the_approval_when_it_dispatches(approved_refund, payments_url):
    operation, approval = approved_refund()

    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.CONSUMED
    assert len(effects_of(payments_url, operation)) == 1


def test_an_approval_that_expired_before_dispatch_expires_the_operation(approved_refund, payments_url):
    operation, approval = approved_refund()
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert run_dispatch(operation.operation_id, worker="test") == "expired:approval"

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.EXPIRED
    assert reload(operation).status == S.EXPIRED
    assert attempts_of(operation) == []
    assert effects_of(payments_url, operation) == []


def test_a_task_that_moved_on_invalidates_the_approval_and_cancels_the_operation(approved_refund, payments_url):
    operation, approval = approved_refund()
    task = Task.objects.get(pk=operation.task_id)
    lease = make_lease(task)
    run_services.task_transition(task_id=task.task_id, to="planning", expected_version=task.version,
                                 fencing_token=lease.fencing_token, actor="agent")

    assert run_dispatch(operation.operation_id, worker="test") == "invalidated:task_version"

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.INVALIDATED
    assert reload(operation).status == S.CANCELLED
    assert attempts_of(operation) == []
    assert effects_of(payments_url, operation) == []


def test_an_approver_who_lost_the_right_does_not_authorize_the_dispatch(approved_refund, reviewer, payments_url):
    operation, approval = approved_refund()
    Membership.objects.filter(user=reviewer).delete()

    assert run_dispatch(operation.operation_id, worker="test") == "invalidated:approver"

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.INVALIDATED
    assert reload(operation).status == S.CANCELLED
    assert effects_of(payments_url, operation) == []


def test_an_approver_whose_tier_was_lowered_does_not_authorize_the_dispatch(approved_refund, reviewer, payments_url):
    operation, _ = approved_refund()
    Membership.objects.filter(user=reviewer).update(max_tier=2)

    assert run_dispatch(operation.operation_id, worker="test") == "invalidated:approver"
    assert effects_of(payments_url, operation) == []


def test_a_tool_schema_change_since_the_proposal_stops_the_dispatch(approved_refund, payments_url):
    operation, approval = approved_refund()
    Tool.objects.filter(name="payments.refund").update(schema_version=F("schema_version") + 1)

    assert run_dispatch(operation.operation_id, worker="test") == "cancelled:schema_changed"

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.INVALIDATED
    assert reload(operation).status == S.CANCELLED
    assert effects_of(payments_url, operation) == []


def test_a_tool_schema_change_stops_an_operation_that_needed_no_approval(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("ord"))
    Tool.objects.filter(name="payments.refund").update(schema_version=F("schema_version") + 1)

    assert run_dispatch(operation.operation_id, worker="test") == "cancelled:schema_changed"
    assert reload(operation).status == S.CANCELLED
    assert effects_of(payments_url, operation) == []


def test_a_cancelled_task_cancels_its_authorized_operation(agent, tools, payments_url, unique):
    operation = authorized_refund(agent, unique("ord"))
    cancel_task(operation.task_id, reason="customer withdrew")

    assert run_dispatch(operation.operation_id, worker="test") == "cancelled:task_cancelled"
    assert reload(operation).status == S.CANCELLED
    assert effects_of(payments_url, operation) == []


# -- mutual exclusion and limits -------------------------------------------------------------

def test_a_second_refund_for_an_order_waits_while_the_first_is_dispatched(
    agent, tools, payments_url, unique, monkeypatch, enqueued
):
    order_id = unique("ord")
    first = authorized_refund(agent, order_id, amount=10)
    second = authorized_refund(agent, order_id, amount=15)
    real_call = dispatcher._call_provider
    during_first = []

    def first_is_at_the_provider(op, attempt, let_go=None):
        if op.operation_id == first.operation_id:
            during_first.append(run_dispatch(second.operation_id, worker="other"))
        return real_call(op, attempt, let_go)

    monkeypatch.setattr(dispatcher, "_call_provider", first_is_at_the_provider)

    assert run_dispatch(first.operation_id, worker="test") == S.CONFIRMED

    assert during_first == ["deferred:business_key_busy"]
    assert reload(second).status == S.AUTHORIZED
    assert attempts_of(second) == []
    assert effects_of(payments_url, second) == []
    assert [(op_id, opts["countdown"]) for op_id, opts in enqueued.dispatches] == [(second.operation_id, 0.5)]
    # Once the first is settled the second goes through.
    assert run_dispatch(second.operation_id, worker="test") == S.CONFIRMED
    assert len(effects_of(payments_url, second)) == 1


def test_a_tenant_at_its_in_flight_limit_defers_new_dispatches(
    agent, tools, payments_url, unique, monkeypatch, settings
):
    settings.TENANT_MAX_IN_FLIGHT = 1
    first = authorized_refund(agent, unique("ord"))
    second = authorized_refund(agent, unique("ord"))
    real_call = dispatcher._call_provider
    during_first = []

    def first_is_at_the_provider(op, attempt, let_go=None):
        if op.operation_id == first.operation_id:
            during_first.append(run_dispatch(second.operation_id, worker="other"))
        return real_call(op, attempt, let_go)

    monkeypatch.setattr(dispatcher, "_call_provider", first_is_at_the_provider)
    run_dispatch(first.operation_id, worker="test")

    assert during_first == ["deferred:tenant_limit"]
    assert effects_of(payments_url, second) == []


# -- mail: SMTP does not deduplicate ---------------------------------------------------------

@pytest.fixture
def mail_calls(monkeypatch):
    """Spy on the mail adapter (calls go through to the real provider) to see the order of
    queries and sends."""
    adapter = get_adapter("mail.send")
    calls: list[str] = []
    real_query, real_execute = adapter.query, adapter.execute

    def query(**kwargs):
        calls.append("query")
        return real_query(**kwargs)

    def execute(arguments, **kwargs):
        calls.append("execute")
        return real_execute(arguments, **kwargs)

    monkeypatch.setattr(adapter, "query", query)
    monkeypatch.setattr(adapter, "execute", execute)
    return calls


def test_it_sends_one_email_and_confirms_it_with_the_message_id(agent, tools, mail_url, unique, mail_calls):
    recipient = f"{unique('customer')}@example.com"
    operation = authorized_mail(agent, recipient)

    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED

    operation = reload(operation)
    [effect] = effects_of(mail_url, operation)
    assert effect["payload"]["to"] == [recipient]
    assert effect["payload"]["message_id"] == operation.receipt["message_id"] == f"<{operation.idempotency_key}@countersign.local>"
    assert mail_calls == ["execute"]  # a first attempt needs no query


def test_a_mail_retry_after_a_451_queries_before_it_sends_again(agent, tools, mail_url, unique, mail_calls):
    operation = authorized_mail(agent, f"{unique('fault-429')}@example.com")

    assert run_dispatch(operation.operation_id, worker="test") == S.RETRY_SAFE
    [first] = attempts_of(operation)
    assert (first.fact, first.error_code) == (Fact.NOT_SENT, "451")
    assert effects_of(mail_url, operation) == []

    release_backoff(operation)
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED

    assert mail_calls == ["execute", "query", "execute"]
    assert len(effects_of(mail_url, operation)) == 1
    second = attempts_of(operation)[1]
    assert (second.fact, second.raw_response["provider_status"]) == (Fact.KNOWN_SUCCESS, "250")


def test_a_mail_the_provider_stored_before_answering_451_is_found_not_sent_twice(
    agent, tools, mail_url, unique, mail_calls
):
    operation = authorized_mail(agent, f"{unique('fault-5xx-after-commit')}@example.com")

    assert run_dispatch(operation.operation_id, worker="test") == S.RETRY_SAFE
    # The provider claimed "not kept" but kept it: the ledger cannot know yet.
    assert len(effects_of(mail_url, operation)) == 1

    release_backoff(operation)
    assert run_dispatch(operation.operation_id, worker="test") == S.CONFIRMED

    assert mail_calls == ["execute", "query"]  # found by the pre-send query: no second send
    operation = reload(operation)
    assert len(effects_of(mail_url, operation)) == 1
    assert operation.receipt["via"] == "query"
    second = attempts_of(operation)[1]
    assert second.fact == Fact.KNOWN_SUCCESS
    assert "pre_send_query" in second.raw_response["raw"]


def test_a_mail_the_provider_is_still_delivering_is_unknown_not_resent(
    agent, tools, mail_url, unique, mail_calls, enqueued, monkeypatch
):
    operation = authorized_mail(agent, f"{unique('fault-429')}@example.com")
    run_dispatch(operation.operation_id, worker="test")
    release_backoff(operation)

    def still_delivering(**kwargs):
        mail_calls.append("query")
        return QueryAnswer(PROCESSING, raw={"status": 404, "body": {"found": False, "in_flight": True}})

    # The provider says a DATA for this Message-ID is in progress right now.
    monkeypatch.setattr(get_adapter("mail.send"), "query", still_delivering)

    assert run_dispatch(operation.operation_id, worker="test") == S.UNKNOWN

    assert mail_calls == ["execute", "query"]
    assert attempts_of(operation)[1].error_class == "query_processing"
    assert enqueued.reconciles == [operation.operation_id]
    assert effects_of(mail_url, operation) == []


def test_attempt_numbers_and_tokens_only_grow(agent, tools, unique):
    operation = authorized_refund(agent, unique("fault-5xx-before-commit-always"))
    dispatch_until_settled(operation)

    rows = Attempt.objects.filter(operation_id=operation.operation_id).order_by("number")
    assert [(a.number, a.fencing_token) for a in rows] == [(n, n) for n in range(1, operation.tool.max_attempts + 1)]
