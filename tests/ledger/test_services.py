"""ledger.services: one function per operation transition, the dispatch/outcome protocol."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from console.lib.errors import Conflict, IllegalTransition, InvalidInput, NotFound
from console.models import Event
from ledger import services
from ledger.models import OPERATION_TRANSITIONS, Attempt, Fact, Operation, OperationStatus
from tests.factories import (
    concurrent_writer,
    current_attempt,
    event_count,
    events_of,
    make_operation,
    record_outcome,
)

S = OperationStatus
ALL = list(S.values)
EVIDENCE = {"provider_query": "no effect found", "request_stopped": True}
RECEIPT = {"provider_id": "re_123", "amount": 25}


class Boom(Exception):
    pass


def status_of(operation: Operation) -> str:
    return Operation.objects.values_list("status", flat=True).get(pk=operation.pk)


# One call per verb, so the generic tests below run for every transition service.
VERBS: dict[str, tuple[str, Callable[[str], object]]] = {
    "operation_authorize": (S.AUTHORIZED, lambda op_id: services.operation_authorize(
        operation_id=op_id, actor="user:reviewer", reason="approved")),
    "operation_reject": (S.REJECTED, lambda op_id: services.operation_reject(
        operation_id=op_id, actor="user:reviewer", reason="no")),
    "operation_expire": (S.EXPIRED, lambda op_id: services.operation_expire(
        operation_id=op_id, actor="system:sweeper", reason="approval expired")),
    "operation_cancel": (S.CANCELLED, lambda op_id: services.operation_cancel(
        operation_id=op_id, actor="system:dispatcher", reason="task moved on")),
    "operation_mark_unknown": (S.UNKNOWN, lambda op_id: services.operation_mark_unknown(
        operation_id=op_id, actor="system:sweeper", reason="deadline passed")),
    "operation_confirm": (S.CONFIRMED, lambda op_id: services.operation_confirm(
        operation_id=op_id, receipt=RECEIPT, actor="user:support", reason="provider has it")),
    "operation_mark_retry_safe": (S.RETRY_SAFE, lambda op_id: services.operation_mark_retry_safe(
        operation_id=op_id, actor="user:support", reason="no effect", evidence=EVIDENCE)),
    "operation_escalate_manual": (S.MANUAL, lambda op_id: services.operation_escalate_manual(
        operation_id=op_id, actor="system:reconciler", reason="cannot tell")),
    "operation_require_compensation": (S.COMPENSATION_REQUIRED,
                                       lambda op_id: services.operation_require_compensation(
        operation_id=op_id, actor="user:support", reason="wrong refund")),
    "operation_fail": (S.FAILED, lambda op_id: services.operation_fail(
        operation_id=op_id, actor="user:support", reason="no effect", evidence=EVIDENCE)),
}

# `dispatched → confirmed | failed | retry_safe` belong to the worker holding the fencing token
# (operation_record_outcome); a person's verb must not bypass the token while a call is in
# flight. Failing or declaring retry-safe an in-flight call is tested on its own below;
# confirming one with a receipt is left out of the generic sets.
IN_FLIGHT_ONLY_BY_WORKER = {
    ("operation_mark_retry_safe", S.DISPATCHED),
    ("operation_fail", S.DISPATCHED),
    ("operation_confirm", S.DISPATCHED),
}

LEGAL = [
    (verb, source)
    for verb, (target, _) in VERBS.items()
    for source in ALL
    if target in OPERATION_TRANSITIONS[source] and (verb, source) not in IN_FLIGHT_ONLY_BY_WORKER
]
ILLEGAL = [
    (verb, source)
    for verb, (target, _) in VERBS.items()
    for source in ALL
    if target not in OPERATION_TRANSITIONS[source] and source != target
    and (verb, source) not in IN_FLIGHT_ONLY_BY_WORKER
]
LEGAL_SOURCES = {verb: [source for v, source in LEGAL if v == verb] for verb in VERBS}
NO_OPS = [(verb, target) for verb, (target, _) in VERBS.items()]


def _ids(params):
    return [f"{verb}-from-{source}" for verb, source in params]


# --- generic: every transition service ---------------------------------------------------------


@pytest.mark.parametrize(("verb", "source"), LEGAL, ids=_ids(LEGAL))
def test_a_legal_move_changes_the_status_and_writes_exactly_one_event(agent, verb, source):
    target, call = VERBS[verb]
    operation = make_operation(agent, status=source)
    before = events_of("operation", operation.operation_id)

    returned = call(operation.operation_id)

    assert status_of(operation) == target
    assert returned.status == target
    after = events_of("operation", operation.operation_id)
    assert len(after) == len(before) + 1
    new = after[-1]
    assert (new.from_status, new.to_status) == (source, target)
    assert new.tenant_id == operation.tenant_id


@pytest.mark.parametrize(("verb", "source"), ILLEGAL, ids=_ids(ILLEGAL))
def test_an_illegal_move_raises_and_changes_nothing(agent, verb, source):
    _, call = VERBS[verb]
    operation = make_operation(agent, status=source)
    before = event_count("operation", operation.operation_id)

    with pytest.raises(IllegalTransition):
        call(operation.operation_id)

    assert status_of(operation) == source
    assert event_count("operation", operation.operation_id) == before


@pytest.mark.parametrize(("verb", "source"), NO_OPS, ids=_ids(NO_OPS))
def test_a_move_to_the_current_status_is_a_no_op_without_an_event(agent, verb, source):
    _, call = VERBS[verb]
    operation = make_operation(agent, status=source)
    before = event_count("operation", operation.operation_id)
    updated_at = Operation.objects.get(pk=operation.pk).updated_at

    returned = call(operation.operation_id)

    assert returned.status == source
    assert status_of(operation) == source
    assert event_count("operation", operation.operation_id) == before
    assert Operation.objects.get(pk=operation.pk).updated_at == updated_at


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_concurrent_writer_makes_the_move_raise_conflict(agent, verb, monkeypatch):
    target, call = VERBS[verb]
    source = LEGAL_SOURCES[verb][0]
    operation = make_operation(agent, status=source)
    # Someone else moved it first (to a status that is neither ours nor where we start).
    other = next(s for s in ALL if s not in (source, target))
    concurrent_writer(monkeypatch, services, status=other)
    before = event_count("operation", operation.operation_id)

    with pytest.raises(Conflict) as excinfo:
        call(operation.operation_id)

    assert not isinstance(excinfo.value, IllegalTransition)
    assert status_of(operation) == source
    assert event_count("operation", operation.operation_id) == before


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_rolled_back_move_leaves_neither_status_nor_event(agent, verb):
    target, call = VERBS[verb]
    source = LEGAL_SOURCES[verb][0]
    operation = make_operation(agent, status=source)
    before = event_count("operation", operation.operation_id)

    with pytest.raises(Boom), transaction.atomic():
        call(operation.operation_id)
        assert status_of(operation) == target
        raise Boom

    assert status_of(operation) == source
    assert event_count("operation", operation.operation_id) == before


@pytest.mark.parametrize("verb", list(VERBS))
def test_an_unknown_operation_raises_not_found(db, verb):
    _, call = VERBS[verb]
    with pytest.raises(NotFound):
        call("op_does_not_exist")


# --- operation_authorize ---------------------------------------------------------------------


def test_authorize_enqueues_the_dispatch_only_on_commit(agent, django_capture_on_commit_callbacks):
    operation = make_operation(agent)

    with django_capture_on_commit_callbacks() as callbacks:
        services.operation_authorize(operation_id=operation.operation_id, actor="user:reviewer")

    assert len(callbacks) == 1
    assert status_of(operation) == S.AUTHORIZED


def test_authorize_of_an_authorized_operation_enqueues_nothing(agent, django_capture_on_commit_callbacks):
    operation = make_operation(agent, status=S.AUTHORIZED)

    with django_capture_on_commit_callbacks() as callbacks:
        services.operation_authorize(operation_id=operation.operation_id, actor="user:reviewer")

    assert callbacks == []


def test_a_rolled_back_authorize_enqueues_nothing(agent, django_capture_on_commit_callbacks):
    operation = make_operation(agent)

    with django_capture_on_commit_callbacks() as callbacks:
        with pytest.raises(Boom), transaction.atomic():
            services.operation_authorize(operation_id=operation.operation_id, actor="user:reviewer")
            raise Boom

    assert callbacks == []
    assert status_of(operation) == S.PLANNED


def test_authorize_keeps_the_evidence_on_its_event(agent):
    operation = make_operation(agent)

    services.operation_authorize(
        operation_id=operation.operation_id, actor="user:reviewer", reason="approved (apr_1)",
        evidence={"approval_id": "apr_1"},
    )

    event = events_of("operation", operation.operation_id)[-1]
    assert (event.actor, event.reason, event.evidence) == ("user:reviewer", "approved (apr_1)", {"approval_id": "apr_1"})


# --- operation_dispatch ------------------------------------------------------------------------


def test_dispatch_commits_a_new_fencing_token_and_attempt_before_any_call(agent):
    operation = make_operation(agent, status=S.AUTHORIZED)
    before = event_count("operation", operation.operation_id)

    returned, attempt = services.operation_dispatch(operation_id=operation.operation_id, worker="w9")

    stored = Operation.objects.get(pk=operation.pk)
    assert stored.status == S.DISPATCHED
    assert (stored.attempt_count, stored.fencing_token) == (1, 1)
    assert (attempt.number, attempt.fencing_token, attempt.worker) == (1, 1, "w9")
    assert Attempt.objects.filter(operation=operation).count() == 1
    assert returned.fencing_token == 1
    events = events_of("operation", operation.operation_id)
    assert len(events) == before + 1
    assert (events[-1].from_status, events[-1].to_status) == (S.AUTHORIZED, S.DISPATCHED)
    assert events[-1].evidence == {"attempt": 1, "fencing_token": 1}
    assert events[-1].actor == "worker:w9"


def test_a_retry_dispatches_the_same_operation_with_attempt_and_token_plus_one(agent):
    operation = make_operation(agent, status=S.RETRY_SAFE)
    key = operation.idempotency_key

    _, attempt = services.operation_dispatch(operation_id=operation.operation_id, worker="w2")

    stored = Operation.objects.get(pk=operation.pk)
    assert stored.status == S.DISPATCHED
    assert (stored.attempt_count, stored.fencing_token) == (2, 2)
    assert stored.idempotency_key == key
    assert (attempt.number, attempt.fencing_token) == (2, 2)
    assert list(Attempt.objects.filter(operation=operation).values_list("number", flat=True)) == [1, 2]


def test_dispatch_never_dispatches_a_dispatched_operation_twice(agent):
    operation = make_operation(agent, status=S.DISPATCHED)
    before = event_count("operation", operation.operation_id)

    with pytest.raises(Conflict):
        services.operation_dispatch(operation_id=operation.operation_id, worker="w2")

    stored = Operation.objects.get(pk=operation.pk)
    assert (stored.status, stored.attempt_count, stored.fencing_token) == (S.DISPATCHED, 1, 1)
    assert Attempt.objects.filter(operation=operation).count() == 1
    assert event_count("operation", operation.operation_id) == before


@pytest.mark.parametrize("source", [s for s in ALL if s not in (S.AUTHORIZED, S.RETRY_SAFE, S.DISPATCHED)])
def test_dispatch_from_any_other_status_raises_illegal_transition(agent, source):
    operation = make_operation(agent, status=source)
    before = event_count("operation", operation.operation_id)
    attempts = Attempt.objects.filter(operation=operation).count()

    with pytest.raises(IllegalTransition):
        services.operation_dispatch(operation_id=operation.operation_id, worker="w2")

    assert status_of(operation) == source
    assert Attempt.objects.filter(operation=operation).count() == attempts
    assert event_count("operation", operation.operation_id) == before


def test_dispatch_raises_conflict_when_another_worker_dispatched_first(agent, monkeypatch):
    operation = make_operation(agent, status=S.AUTHORIZED)
    # Another worker took the same message (the broker is at-least-once) and won the race.
    concurrent_writer(monkeypatch, services, status=S.DISPATCHED, fencing_token=1, attempt_count=1)
    before = event_count("operation", operation.operation_id)

    with pytest.raises(Conflict):
        services.operation_dispatch(operation_id=operation.operation_id, worker="w2")

    assert not Attempt.objects.filter(operation=operation).exists()
    assert event_count("operation", operation.operation_id) == before


def test_dispatch_raises_conflict_when_the_fencing_token_moved_behind_its_back(agent, monkeypatch):
    operation = make_operation(agent, status=S.RETRY_SAFE)
    concurrent_writer(monkeypatch, services, fencing_token=7)

    with pytest.raises(Conflict):
        services.operation_dispatch(operation_id=operation.operation_id, worker="w2")

    assert Attempt.objects.filter(operation=operation).count() == 1


def test_a_rolled_back_dispatch_leaves_no_attempt_token_or_event(agent):
    operation = make_operation(agent, status=S.AUTHORIZED)
    before = event_count("operation", operation.operation_id)

    with pytest.raises(Boom), transaction.atomic():
        services.operation_dispatch(operation_id=operation.operation_id, worker="w1")
        raise Boom

    stored = Operation.objects.get(pk=operation.pk)
    assert (stored.status, stored.attempt_count, stored.fencing_token) == (S.AUTHORIZED, 0, 0)
    assert not Attempt.objects.filter(operation=operation).exists()
    assert event_count("operation", operation.operation_id) == before


def test_dispatch_of_an_unknown_operation_raises_not_found(db):
    with pytest.raises(NotFound):
        services.operation_dispatch(operation_id="op_nope", worker="w1")


# --- operation_record_outcome ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fact", "target"),
    [
        (Fact.KNOWN_SUCCESS, S.CONFIRMED),
        (Fact.KNOWN_FAILURE, S.FAILED),
        (Fact.UNKNOWN, S.UNKNOWN),
        (Fact.NOT_SENT, S.RETRY_SAFE),
    ],
)
def test_record_outcome_classifies_the_four_facts(agent, fact, target):
    operation = make_operation(agent, status=S.DISPATCHED)
    before = event_count("operation", operation.operation_id)

    returned, applied = record_outcome(
        operation, fact=fact, error_class="timeout" if fact == Fact.UNKNOWN else "",
        raw_response={"status": 200}, latency_ms=42,
    )

    assert applied is True
    stored = Operation.objects.get(pk=operation.pk)
    assert stored.status == returned.status == target
    attempt = current_attempt(stored)
    assert (attempt.fact, attempt.stale, attempt.latency_ms) == (fact, False, 42)
    assert attempt.raw_response == {"status": 200}
    assert attempt.finished_at is not None
    events = events_of("operation", operation.operation_id)
    assert len(events) == before + 1
    assert (events[-1].from_status, events[-1].to_status) == (S.DISPATCHED, target)
    assert events[-1].evidence["fencing_token"] == stored.fencing_token


def test_a_known_success_stores_its_receipt_and_result(agent):
    operation = make_operation(agent, status=S.DISPATCHED)

    record_outcome(operation, fact=Fact.KNOWN_SUCCESS, receipt={"refund_id": "re_1"}, result={"ok": True})

    stored = Operation.objects.get(pk=operation.pk)
    assert stored.receipt == {"refund_id": "re_1"}
    assert stored.result == {"ok": True}


def test_a_known_success_without_a_receipt_is_refused(agent):
    operation = make_operation(agent, status=S.DISPATCHED)

    with pytest.raises(InvalidInput):
        record_outcome(operation, fact=Fact.KNOWN_SUCCESS, receipt={})

    assert status_of(operation) == S.DISPATCHED
    assert current_attempt(operation).fact == ""


def test_an_unknown_fact_is_refused(agent):
    operation = make_operation(agent, status=S.DISPATCHED)

    with pytest.raises(InvalidInput):
        record_outcome(operation, fact="maybe")
    assert status_of(operation) == S.DISPATCHED


def test_a_timeout_is_recorded_as_unknown_never_as_failed_and_is_queued_for_reconciliation(agent):
    operation = make_operation(agent, status=S.DISPATCHED)

    record_outcome(operation, fact=Fact.UNKNOWN, error_class="timeout", error_code="read")

    stored = Operation.objects.get(pk=operation.pk)
    assert stored.status == S.UNKNOWN
    assert stored.next_reconcile_at is not None
    assert stored.last_error == "timeout read"


def test_not_sent_with_the_retry_budget_spent_ends_in_failed(agent):
    operation = make_operation(agent, status=S.DISPATCHED)

    _, applied = record_outcome(operation, fact=Fact.NOT_SENT, error_class="rate_limited", terminal_failure=True)

    assert applied is True
    assert status_of(operation) == S.FAILED


def test_it_keeps_a_stale_workers_late_result_on_its_attempt_and_changes_no_status(agent):
    operation = make_operation(agent, status=S.DISPATCHED)
    old = current_attempt(operation)
    # The first worker hangs; the sweeper marks the operation unknown, the provider proves no
    # effect, and a second attempt under a new token now holds the operation.
    services.operation_mark_unknown(operation_id=operation.operation_id, actor="system:sweeper", reason="deadline")
    services.operation_mark_retry_safe(operation_id=operation.operation_id, actor="system:reconciler",
                                       reason="absent", evidence=EVIDENCE)
    services.operation_dispatch(operation_id=operation.operation_id, worker="w2")
    operation.refresh_from_db()
    assert operation.fencing_token == old.fencing_token + 1
    before = event_count("operation", operation.operation_id)

    returned, applied = record_outcome(
        operation, fact=Fact.KNOWN_SUCCESS, attempt_number=old.number, fencing_token=old.fencing_token,
        receipt={"refund_id": "re_late"}, raw_response={"late": True}, latency_ms=9000,
    )

    assert applied is False
    stored = Operation.objects.get(pk=operation.pk)
    assert stored.status == returned.status == S.DISPATCHED
    assert stored.receipt is None
    assert stored.fencing_token == old.fencing_token + 1
    late = Attempt.objects.get(pk=old.pk)
    assert late.stale is True
    assert (late.fact, late.raw_response, late.latency_ms) == (Fact.KNOWN_SUCCESS, {"late": True}, 9000)
    assert current_attempt(stored).stale is False
    assert event_count("operation", operation.operation_id) == before


def test_it_rejects_a_stale_fencing_token_even_for_the_current_attempt(agent):
    operation = make_operation(agent, status=S.DISPATCHED)
    before = event_count("operation", operation.operation_id)

    _, applied = record_outcome(operation, fact=Fact.KNOWN_FAILURE, fencing_token=operation.fencing_token + 5)

    assert applied is False
    assert status_of(operation) == S.DISPATCHED
    assert current_attempt(operation).stale is True
    assert event_count("operation", operation.operation_id) == before


def test_a_late_result_after_the_sweeper_marked_the_operation_unknown_changes_no_status(agent):
    operation = make_operation(agent, status=S.DISPATCHED)
    services.operation_mark_unknown(operation_id=operation.operation_id, actor="system:sweeper", reason="deadline")
    before = event_count("operation", operation.operation_id)

    _, applied = record_outcome(operation, fact=Fact.KNOWN_SUCCESS)

    assert applied is False
    assert status_of(operation) == S.UNKNOWN
    assert current_attempt(operation).stale is True
    assert event_count("operation", operation.operation_id) == before


def test_a_repeated_report_of_an_applied_outcome_does_not_mark_its_attempt_stale(agent):
    # The broker is at-least-once: the same worker may report the same attempt twice.
    operation = make_operation(agent, status=S.DISPATCHED)
    record_outcome(operation, fact=Fact.KNOWN_SUCCESS, raw_response={"first": True})
    operation.refresh_from_db()

    _, applied = record_outcome(operation, fact=Fact.KNOWN_SUCCESS, raw_response={"second": True})

    assert applied is False
    attempt = current_attempt(operation)
    assert attempt.stale is False
    assert attempt.raw_response == {"first": True}


def test_an_outcome_that_loses_the_compare_and_set_is_kept_as_stale_evidence(agent, monkeypatch):
    # The outcome is recorded without row locks: the compare-and-set on (dispatched, token) is
    # the guard. A token moved between the read and the write makes this worker a stale one.
    operation = make_operation(agent, status=S.DISPATCHED)
    concurrent_writer(monkeypatch, services, fencing_token=99)
    before = event_count("operation", operation.operation_id)

    _, applied = record_outcome(operation, fact=Fact.KNOWN_FAILURE)

    assert applied is False
    assert status_of(operation) == S.DISPATCHED
    assert event_count("operation", operation.operation_id) == before
    assert current_attempt(operation).stale is True


def test_a_rolled_back_outcome_leaves_neither_status_attempt_result_nor_event(agent):
    operation = make_operation(agent, status=S.DISPATCHED)
    before = event_count("operation", operation.operation_id)

    with pytest.raises(Boom), transaction.atomic():
        record_outcome(operation, fact=Fact.KNOWN_SUCCESS)
        raise Boom

    assert status_of(operation) == S.DISPATCHED
    assert current_attempt(operation).fact == ""
    assert event_count("operation", operation.operation_id) == before


# --- verb-specific rules ---------------------------------------------------------------------


GUARDED = {
    "operation_confirm": (S.CONFIRMED, lambda op_id, token: services.operation_confirm(
        operation_id=op_id, receipt=RECEIPT, actor="system:reconciler", reason="found", fencing_token=token)),
    "operation_mark_retry_safe": (S.RETRY_SAFE, lambda op_id, token: services.operation_mark_retry_safe(
        operation_id=op_id, actor="system:reconciler", reason="absent", evidence=EVIDENCE, fencing_token=token)),
    "operation_escalate_manual": (S.MANUAL, lambda op_id, token: services.operation_escalate_manual(
        operation_id=op_id, actor="system:reconciler", reason="cannot tell", fencing_token=token)),
}


@pytest.mark.parametrize("verb", list(GUARDED))
def test_a_reconcilers_decision_about_an_older_attempt_does_not_land_on_a_newer_one(agent, verb):
    _, call = GUARDED[verb]
    operation = make_operation(agent, status=S.UNKNOWN)
    seen_token = Operation.objects.get(pk=operation.pk).fencing_token
    # Meanwhile the operation was retried and is in doubt again, under a new token.
    services.operation_mark_retry_safe(operation_id=operation.operation_id, actor="user:support",
                                       reason="absent", evidence=EVIDENCE)
    services.operation_dispatch(operation_id=operation.operation_id, worker="w2")
    record_outcome(operation, fact=Fact.UNKNOWN, error_class="timeout")
    before = event_count("operation", operation.operation_id)

    with pytest.raises(Conflict) as excinfo:
        call(operation.operation_id, seen_token)

    assert not isinstance(excinfo.value, IllegalTransition)
    stored = Operation.objects.get(pk=operation.pk)
    assert (stored.status, stored.fencing_token) == (S.UNKNOWN, seen_token + 1)
    assert event_count("operation", operation.operation_id) == before


@pytest.mark.parametrize("verb", list(GUARDED))
def test_a_reconcilers_decision_with_the_current_token_applies(agent, verb):
    target, call = GUARDED[verb]
    operation = make_operation(agent, status=S.UNKNOWN)

    call(operation.operation_id, Operation.objects.get(pk=operation.pk).fencing_token)

    assert status_of(operation) == target


def test_not_sent_keeps_the_providers_retry_after_as_the_backoff(agent):
    operation = make_operation(agent, status=S.DISPATCHED)
    retry_at = timezone.now() + timedelta(seconds=30)

    record_outcome(operation, fact=Fact.NOT_SENT, error_class="rate_limited", error_code=429, retry_at=retry_at)

    stored = Operation.objects.get(pk=operation.pk)
    assert stored.status == S.RETRY_SAFE
    assert stored.not_before == retry_at
    assert stored.last_error == "rate_limited 429"


def test_mark_unknown_queues_the_operation_for_reconciliation(agent):
    operation = make_operation(agent, status=S.DISPATCHED)

    services.operation_mark_unknown(operation_id=operation.operation_id, actor="system:sweeper", reason="deadline")

    assert Operation.objects.get(pk=operation.pk).next_reconcile_at is not None


def test_confirm_needs_a_receipt(agent):
    operation = make_operation(agent, status=S.UNKNOWN)

    with pytest.raises(InvalidInput):
        services.operation_confirm(operation_id=operation.operation_id, receipt={}, actor="user:support", reason="x")
    assert status_of(operation) == S.UNKNOWN


def test_confirm_stores_the_receipt_and_takes_the_operation_off_the_reconcile_queue(agent):
    operation = make_operation(agent, status=S.UNKNOWN)

    services.operation_confirm(
        operation_id=operation.operation_id, receipt=RECEIPT, actor="user:support", reason="found it",
        evidence={"query": "found"},
    )

    stored = Operation.objects.get(pk=operation.pk)
    assert stored.receipt == RECEIPT
    assert stored.next_reconcile_at is None
    assert events_of("operation", operation.operation_id)[-1].evidence == {"query": "found"}


def test_mark_retry_safe_needs_evidence(agent):
    operation = make_operation(agent, status=S.UNKNOWN)

    with pytest.raises(InvalidInput):
        services.operation_mark_retry_safe(operation_id=operation.operation_id, actor="user:support",
                                           reason="x", evidence={})
    assert status_of(operation) == S.UNKNOWN


def test_mark_retry_safe_enqueues_the_retry_on_commit(agent, django_capture_on_commit_callbacks):
    operation = make_operation(agent, status=S.MANUAL)

    with django_capture_on_commit_callbacks() as callbacks:
        services.operation_mark_retry_safe(operation_id=operation.operation_id, actor="user:support",
                                           reason="no effect", evidence=EVIDENCE)

    assert len(callbacks) == 1
    assert status_of(operation) == S.RETRY_SAFE


def test_mark_retry_safe_refuses_an_operation_still_in_flight(agent, django_capture_on_commit_callbacks):
    # dispatched → retry_safe is the worker's own `not sent` outcome, guarded by its token; a
    # person declaring an in-flight call safe to retry would start a second dispatch.
    operation = make_operation(agent, status=S.DISPATCHED)

    with django_capture_on_commit_callbacks() as callbacks:
        with pytest.raises(IllegalTransition):
            services.operation_mark_retry_safe(operation_id=operation.operation_id, actor="user:support",
                                               reason="no effect", evidence=EVIDENCE)

    assert status_of(operation) == S.DISPATCHED
    assert callbacks == []


def test_fail_needs_evidence(agent):
    operation = make_operation(agent, status=S.UNKNOWN)

    with pytest.raises(InvalidInput):
        services.operation_fail(operation_id=operation.operation_id, actor="user:support", reason="x", evidence={})
    assert status_of(operation) == S.UNKNOWN


def test_fail_refuses_an_operation_still_in_flight(agent):
    # Only the worker holding the fencing token may record a dispatched call's failure:
    # the provider may still commit it.
    operation = make_operation(agent, status=S.DISPATCHED)

    with pytest.raises(IllegalTransition):
        services.operation_fail(operation_id=operation.operation_id, actor="user:support",
                                reason="looks dead", evidence=EVIDENCE)

    assert status_of(operation) == S.DISPATCHED


@pytest.mark.parametrize("source", [S.MANUAL, S.COMPENSATION_REQUIRED])
def test_escalations_take_the_operation_off_the_reconcile_queue(agent, source):
    operation = make_operation(agent, status=source)

    assert Operation.objects.get(pk=operation.pk).next_reconcile_at is None


def test_dispatched_never_goes_back_to_planned_or_authorized():
    assert S.PLANNED not in OPERATION_TRANSITIONS[S.DISPATCHED]
    assert S.AUTHORIZED not in OPERATION_TRANSITIONS[S.DISPATCHED]
    # The one way back to planned: the dispatcher's re-check finds the policy stricter than the
    # approval an operation was authorized under, before any attempt.
    assert {source for source, moves in OPERATION_TRANSITIONS.items() if S.PLANNED in moves} == {S.AUTHORIZED}


def test_the_full_unknown_to_retry_to_confirmed_story_replays_from_events(agent):
    operation = make_operation(agent, status=S.UNKNOWN)
    services.operation_mark_retry_safe(operation_id=operation.operation_id, actor="user:support",
                                       reason="no effect", evidence=EVIDENCE)
    services.operation_dispatch(operation_id=operation.operation_id, worker="w2")
    record_outcome(operation, fact=Fact.KNOWN_SUCCESS)

    statuses = [e.to_status for e in events_of("operation", operation.operation_id)]
    assert statuses == [
        S.PLANNED, S.AUTHORIZED, S.DISPATCHED, S.UNKNOWN, S.RETRY_SAFE, S.DISPATCHED, S.CONFIRMED,
    ]
    assert statuses[-1] == status_of(operation)
    assert Event.objects.filter(entity="operation", entity_id=operation.operation_id).count() == 7
