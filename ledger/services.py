"""Every write to operations and attempts: one function per transition.

The dispatcher's protocol (docs/architecture.md, "Dispatch, in this order"): `operation_dispatch` commits
`dispatched` with a new fencing token and attempt *before* the provider is called;
`operation_record_outcome` commits the result only while (status = dispatched, token = mine).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals.notifications import notifications_plan_operation
from console.doorbell import ring_doorbell_on_commit
from console.lib import sql
from console.lib.errors import Conflict, IllegalTransition, InvalidInput, NotFound
from console.lib.transitions import event_row, record_events, transition
from console.models import Event
from ledger import tasks, webhooks
from ledger.models import Attempt, Fact, Operation, OperationStatus
from ledger.retry import circuit_note_failure, is_transient_failure


def _get(operation_id: str, *, lock: bool = False) -> Operation:
    qs = Operation.objects.select_for_update() if lock else Operation.objects
    operation = qs.filter(operation_id=operation_id).first()
    if operation is None:
        raise NotFound(f"No operation {operation_id}.")
    return operation


def _move(operation: Operation, **kwargs: Any) -> bool:
    """`transition()` of an operation, plus its agent's webhook events for the move, written in
    the same transaction (an outbox: delivered after the commit, lost with a rollback)."""
    from_status = operation.status
    moved = transition(operation, **kwargs)
    if moved:
        webhooks.webhooks_plan(operation, from_status=from_status, to=kwargs["to"])
    return moved


def _enqueue_dispatch_on_commit(operation: Operation) -> None:
    # Read the queue now, inside the transaction: after commit a lazy load would be a query of its own.
    operation_id, queue = operation.operation_id, operation.tool.queue
    transaction.on_commit(lambda: tasks.enqueue_dispatch(operation_id, queue=queue))


def operation_authorize(*, operation_id: str, actor: str, reason: str = "", evidence: dict | None = None) -> Operation:
    """planned → authorized; the dispatch is enqueued only once this commits."""
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        if _move(operation, to=OperationStatus.AUTHORIZED, actor=actor, reason=reason, evidence=evidence):
            _enqueue_dispatch_on_commit(operation)
    return operation


def operation_reject(*, operation_id: str, actor: str, reason: str) -> Operation:
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        _move(operation, to=OperationStatus.REJECTED, actor=actor, reason=reason)
    return operation


def operation_expire(*, operation_id: str, actor: str, reason: str) -> Operation:
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        _move(operation, to=OperationStatus.EXPIRED, actor=actor, reason=reason)
    return operation


def operation_cancel(*, operation_id: str, actor: str, reason: str) -> Operation:
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        _move(operation, to=OperationStatus.CANCELLED, actor=actor, reason=reason)
    return operation


def operation_hold_for_approval(*, operation_id: str, actor: str, reason: str, risk_tier: int,
                                evidence: dict | None = None) -> Operation:
    """authorized → planned: authorized under a policy that no longer suffices, the operation
    waits for the approvals now required, at its new tier."""
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        _move(operation, to=OperationStatus.PLANNED, actor=actor, reason=reason, evidence=evidence,
                   changes={"risk_tier": risk_tier, "needs_approval": True})
    return operation


def operation_raise_tier(*, operation_id: str, risk_tier: int) -> None:
    """A reviewer's approval found the policy stricter and raised the request: the operation's
    tier follows (never lowered), so what counts it by tier sees the tier it now needs. The
    request's own event says why; the status does not move."""
    Operation.objects.filter(pk=operation_id, risk_tier__lt=risk_tier).update(risk_tier=risk_tier)


def operation_dispatch(*, operation_id: str, worker: str, deadline=None,
                       locked: Operation | None = None) -> tuple[Operation, Attempt]:
    """authorized | retry_safe → dispatched with a new fencing token and attempt number.

    Commits before the provider is called, so a crash after this point is an `unknown`
    outcome the sweeper finds, never a silent second dispatch. `locked` is the row the caller
    already holds `FOR UPDATE` in its open transaction (the dispatcher's claim): it is not read
    again, and it is returned with what the caller loaded on it (its tool).
    """
    # Inside the claim's transaction no savepoint is needed: any failure aborts the claim.
    with transaction.atomic(savepoint=locked is None):
        operation = locked if locked is not None else _get(operation_id, lock=True)
        if operation.status not in (OperationStatus.AUTHORIZED, OperationStatus.RETRY_SAFE):
            # In flight: a conflict (someone else dispatched it); anything else: not a legal move.
            error = Conflict if operation.status == OperationStatus.DISPATCHED else IllegalTransition
            raise error(
                f"Operation {operation_id} is {operation.status}; only authorized or retry_safe dispatch.",
                details={"status": operation.status},
            )
        attempt = _next_attempt(operation, worker=worker)
        _move(
            operation, to=OperationStatus.DISPATCHED, **_dispatched_record(attempt),
            guard={"fencing_token": operation.fencing_token, "attempt_count": operation.attempt_count},
            changes={"fencing_token": attempt.fencing_token, "attempt_count": attempt.number,
                     "dispatch_deadline": deadline},
            also_insert=[attempt],
        )
    return operation, attempt


def _next_attempt(operation: Operation, *, worker: str) -> Attempt:
    return sql.unsaved(Attempt, {"number": operation.attempt_count + 1, "fencing_token": operation.fencing_token + 1,
                                 "worker": worker, "started_at": timezone.now()}, operation=operation)


def _dispatched_record(attempt: Attempt) -> dict[str, Any]:
    """The actor, reason and evidence of a move to `dispatched` (one per attempt)."""
    return {"actor": f"worker:{attempt.worker}", "reason": f"attempt {attempt.number}",
            "evidence": {"attempt": attempt.number, "fencing_token": attempt.fencing_token}}


_OUTCOME_STATUS = {
    Fact.KNOWN_SUCCESS: OperationStatus.CONFIRMED,
    Fact.KNOWN_FAILURE: OperationStatus.FAILED,
    Fact.UNKNOWN: OperationStatus.UNKNOWN,
    Fact.NOT_SENT: OperationStatus.RETRY_SAFE,
}


def operation_record_outcome(
    *,
    operation_id: str,
    attempt_number: int,
    fencing_token: int,
    fact: str,
    receipt: dict[str, Any] | None = None,
    result: dict[str, Any] | None = None,
    error_class: str = "",
    error_code: str = "",
    raw_response: Any = None,
    latency_ms: int | None = None,
    terminal_failure: bool = False,
    retry_at=None,
    operation: Operation | None = None,
    worker: str = "",
) -> tuple[Operation, bool]:
    """Record one attempt's outcome, guarded by (status = dispatched, fencing token = mine).

    Returns (operation, applied). A stale worker's late result is kept on its attempt as
    evidence and changes no status (applied = False). `not_sent` with `terminal_failure`
    (the retry budget is spent) ends in `failed`, otherwise in `retry_safe`. The dispatcher
    passes the `operation` it claimed and its `worker` name, which saves reading them again.
    """
    if fact not in _OUTCOME_STATUS:  # every fact has its status (Fact.values builds a list per call)
        raise InvalidInput(f"Unknown fact {fact!r}.")
    if fact == Fact.KNOWN_SUCCESS and not receipt:
        raise InvalidInput("A known success needs a receipt.")
    now = timezone.now()
    to = _OUTCOME_STATUS[fact]
    if fact == Fact.NOT_SENT and terminal_failure:
        to = OperationStatus.FAILED
    changes: dict[str, Any] = {"last_error": f"{error_class} {error_code}".strip()[:255]}
    if receipt is not None:
        changes["receipt"] = receipt
    if result is not None:
        changes["result"] = result
    if to == OperationStatus.UNKNOWN:
        changes["next_reconcile_at"] = now
    if to == OperationStatus.RETRY_SAFE:
        changes["not_before"] = retry_at
    attempt_fields = {"finished_at": now, "fact": fact, "error_class": error_class[:64],
                      "error_code": str(error_code)[:64], "raw_response": raw_response, "latency_ms": latency_ms}
    recorded = _record_outcome(operation_id, operation, attempt_number=attempt_number, fencing_token=fencing_token,
                               fact=fact, to=to, changes=changes, attempt_fields=attempt_fields,
                               error_class=error_class, error_code=error_code, worker=worker)
    if is_transient_failure(fact, error_class):
        # After the commit, so the count sees this attempt; a stale result counts as well.
        circuit_note_failure(recorded[0].tool)
    return recorded


def _record_outcome(operation_id: str, operation: Operation | None, *, attempt_number: int, fencing_token: int,
                    fact: str, to: str, changes: dict[str, Any], attempt_fields: dict[str, Any], error_class: str,
                    error_code: str, worker: str) -> tuple[Operation, bool]:
    def the_move() -> dict[str, Any]:
        # Guarded by the compare-and-set on (status = dispatched, token = mine), without row locks.
        return dict(
            to=to, actor=f"worker:{worker or _attempt_worker(operation_id, attempt_number)}",
            reason=f"attempt {attempt_number}: {fact}",
            evidence={"attempt": attempt_number, "fencing_token": fencing_token, "error_class": error_class,
                      "error_code": str(error_code)},
            guard={"fencing_token": fencing_token}, changes=changes,
            also_update=[(Attempt, {"operation_id": operation_id, "number": attempt_number},
                          {"stale": False, **attempt_fields})],
        )

    if (operation is not None and operation.status == OperationStatus.DISPATCHED
            and operation.fencing_token == fencing_token
            and not (to == OperationStatus.CONFIRMED and operation.compensates_id is not None)):
        # The dispatcher's receipt, as it mostly is: the move, its event and its attempt, one
        # statement on PostgreSQL, which needs no transaction block. If the agent takes webhooks
        # (their events are written with the move, in a transaction) or the compare-and-set
        # loses, nothing was written and the way below takes over.
        unless = webhooks.receives_webhooks(operation) if webhooks.makes_events(operation.status, to) else None
        try:
            if transition(operation, unless=unless, **the_move()):
                return operation, True
        except (sql.Declined, Conflict):
            pass
    with transaction.atomic():
        if operation is None:
            operation = _get(operation_id)
        if operation.status == OperationStatus.DISPATCHED and operation.fencing_token == fencing_token:
            # If the compare-and-set loses, nothing was written and the stale path below looks
            # at the rows under lock.
            try:
                _move(operation, **the_move())
            except Conflict:
                pass
            else:
                _settle_compensated_original(operation, to=to)
                return operation, True
        attempt = Attempt.objects.select_for_update().get(operation_id=operation_id, number=attempt_number)
        operation = _get(operation_id, lock=True)
        if operation.status == OperationStatus.DISPATCHED and operation.fencing_token == fencing_token:
            # Read stale in memory, current in the database: apply it under the lock.
            _move(
                operation, to=to, actor=f"worker:{attempt.worker}", reason=f"attempt {attempt_number}: {fact}",
                evidence={"attempt": attempt_number, "fencing_token": fencing_token, "error_class": error_class,
                          "error_code": str(error_code)},
                guard={"fencing_token": fencing_token}, changes=changes,
            )
            Attempt.objects.filter(pk=attempt.pk).update(stale=False, **attempt_fields)
            _settle_compensated_original(operation, to=to)
            return operation, True
        if attempt.finished_at is None:
            # A stale worker's late result: kept on its attempt as evidence, no status change.
            Attempt.objects.filter(pk=attempt.pk).update(stale=True, **attempt_fields)
        # Otherwise a repeated report of an outcome already recorded: keep the first.
    return operation, False


def _attempt_worker(operation_id: str, number: int) -> str:
    return Attempt.objects.filter(operation_id=operation_id, number=number).values_list("worker", flat=True).first() or ""


def operation_mark_unknown(*, operation_id: str, actor: str, reason: str, evidence: dict | None = None) -> Operation:
    """dispatched → unknown: the worker died or the deadline passed with no recorded outcome."""
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        _move(
            operation, to=OperationStatus.UNKNOWN, actor=actor, reason=reason, evidence=evidence,
            guard={"fencing_token": operation.fencing_token},
            changes={"next_reconcile_at": timezone.now()},
        )
    return operation


def _refuse_in_flight(operation: Operation, to: str) -> None:
    """Only the worker's own recorded outcome moves a dispatched operation; a person or the
    reconciler acting on an in-flight call would start a second dispatch or call a timeout a
    failure."""
    if operation.status == OperationStatus.DISPATCHED:
        raise IllegalTransition(
            f"Operation {operation.operation_id} is in flight; wait for its outcome or for it to become unknown.",
            details={"status": operation.status, "to": to},
        )


def _token_guard(fencing_token: int | None) -> dict[str, Any] | None:
    # A decision based on what one attempt left behind must not land on a later attempt.
    return None if fencing_token is None else {"fencing_token": fencing_token}


def operation_confirm(*, operation_id: str, receipt: dict[str, Any], actor: str, reason: str,
                      evidence: dict | None = None, fencing_token: int | None = None) -> Operation:
    """unknown | manual → confirmed: a provider query or a person found the effect."""
    if not receipt:
        raise InvalidInput("Confirming needs a receipt.")
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        _refuse_in_flight(operation, OperationStatus.CONFIRMED)
        if _move(operation, to=OperationStatus.CONFIRMED, actor=actor, reason=reason, evidence=evidence,
                      guard=_token_guard(fencing_token), changes={"receipt": receipt, "next_reconcile_at": None}):
            _settle_compensated_original(operation, to=OperationStatus.CONFIRMED)
    return operation


def operation_mark_retry_safe(*, operation_id: str, actor: str, reason: str, evidence: dict[str, Any],
                              fencing_token: int | None = None) -> Operation:
    """unknown | manual → retry_safe: only with evidence of no effect and a stopped request."""
    if not evidence:
        raise InvalidInput("Declaring an operation safe to retry needs evidence.")
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        _refuse_in_flight(operation, OperationStatus.RETRY_SAFE)
        if _move(operation, to=OperationStatus.RETRY_SAFE, actor=actor, reason=reason, evidence=evidence,
                      guard=_token_guard(fencing_token), changes={"next_reconcile_at": None}):
            _enqueue_dispatch_on_commit(operation)
    return operation


def operation_escalate_manual(*, operation_id: str, actor: str, reason: str, evidence: dict | None = None,
                              fencing_token: int | None = None) -> Operation:
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        if _move(operation, to=OperationStatus.MANUAL, actor=actor, reason=reason, evidence=evidence,
                      guard=_token_guard(fencing_token), changes={"next_reconcile_at": None}):
            notifications_plan_operation(operation)  # support is told, on commit
    return operation


def operation_require_compensation(*, operation_id: str, actor: str, reason: str,
                                   evidence: dict | None = None, fencing_token: int | None = None) -> Operation:
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        if _move(operation, to=OperationStatus.COMPENSATION_REQUIRED, actor=actor, reason=reason,
                      evidence=evidence, guard=_token_guard(fencing_token), changes={"next_reconcile_at": None}):
            notifications_plan_operation(operation)  # support is told, on commit
    return operation


def operation_mark_compensated(*, operation_id: str, actor: str, reason: str, evidence: dict[str, Any]) -> Operation:
    """compensation_required → compensated: a compensating operation was confirmed, or a person
    settled the case with evidence."""
    if not evidence:
        raise InvalidInput("Marking an operation compensated needs evidence.")
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        _move(operation, to=OperationStatus.COMPENSATED, actor=actor, reason=reason, evidence=evidence)
    return operation


def _settle_compensated_original(operation: Operation, *, to: str) -> None:
    """Inside the transaction that confirmed `operation`: if it compensates an operation that
    waits for compensation, that one is compensated now (an original that was not waiting —
    confirmed, or already settled — stays as it is)."""
    if to != OperationStatus.CONFIRMED or operation.compensates_id is None:
        return
    waiting = Operation.objects.filter(pk=operation.compensates_id,
                                       status=OperationStatus.COMPENSATION_REQUIRED).exists()
    if waiting:
        operation_mark_compensated(
            operation_id=operation.compensates_id, actor="system:compensation",
            reason=f"compensated by {operation.operation_id}",
            evidence={"compensation": operation.operation_id, "receipt": operation.receipt})


def operation_fail(*, operation_id: str, actor: str, reason: str, evidence: dict[str, Any]) -> Operation:
    """unknown | manual | retry_safe → failed: no effect, with evidence."""
    if not evidence:
        raise InvalidInput("Marking an operation failed needs evidence that it had no effect.")
    with transaction.atomic():
        operation = _get(operation_id, lock=True)
        _refuse_in_flight(operation, OperationStatus.FAILED)
        _move(operation, to=OperationStatus.FAILED, actor=actor, reason=reason, evidence=evidence,
                   changes={"next_reconcile_at": None})
    return operation


def operation_schedule_reconcile(*, operation_id: str, at, tries: int) -> None:
    """Bookkeeping of the reconciler (no status change, so no event)."""
    Operation.objects.filter(operation_id=operation_id, status=OperationStatus.UNKNOWN).update(
        next_reconcile_at=at, reconcile_attempts=tries
    )


def _created_row(operation: Operation, *, actor: str, to_status: str):
    return event_row(
        entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id, tenant_id=operation.tenant_id,
        kind=Event.Kind.CREATED, to_status=to_status, actor=actor, reason=f"{operation.tool.name} call {operation.call_id}",
        evidence={"intent_hash": operation.intent_hash, "risk_tier": operation.risk_tier},
    )


def operation_created_event(operation: Operation, *, actor: str) -> None:
    """A new operation enters the ledger (inside the transaction that inserts it)."""
    record_events([_created_row(operation, actor=actor, to_status=operation.status)])


def operation_created_authorized(operation: Operation, *, actor: str, authorized_by: str, reason: str,
                                 evidence: dict[str, Any], publish: bool = True) -> list[Event]:
    """A call the gate runs at once is inserted directly as `authorized`: its two transitions
    (∅ → planned, planned → authorized), as unsaved event rows the caller inserts in the
    statement that inserts the operation (the proposal, one statement on PostgreSQL). The
    dispatch is enqueued (unless `publish` is false: the caller settles the call itself once it
    committed, ledger/request_dispatch.py), and the live pages rung, once the transaction
    commits; a rollback (the caller's insert lost a race) takes both with it."""
    if operation.status != OperationStatus.AUTHORIZED or OperationStatus.AUTHORIZED not in Operation.TRANSITIONS[OperationStatus.PLANNED]:
        raise IllegalTransition(f"Operation {operation.operation_id} is {operation.status}, not a new authorized one.")
    events = _created_authorized_rows(operation, actor=actor, authorized_by=authorized_by, reason=reason,
                                      evidence=evidence)
    ring_doorbell_on_commit(events)
    if publish:
        _enqueue_dispatch_on_commit(operation)
    return events


def operation_created_dispatched(operation: Operation, *, worker: str, deadline, actor: str, authorized_by: str,
                                 reason: str, evidence: dict[str, Any]) -> tuple[Attempt, list[Event]]:
    """A call the gate runs at once, claimed by its proposal's request before it is written
    (`ledger.dispatcher.claim_new`), is inserted directly as `dispatched`: `operation` (unsaved,
    `authorized`) takes the values `operation_dispatch` would write, and its first attempt and
    its three transitions (∅ → planned → authorized → dispatched) are returned as unsaved rows
    the caller inserts with it, in one statement on PostgreSQL. Nothing is enqueued: the caller
    calls the provider once the transaction commits; the live pages are rung then."""
    if (operation.status != OperationStatus.AUTHORIZED or not operation._state.adding
            or OperationStatus.DISPATCHED not in Operation.TRANSITIONS[OperationStatus.AUTHORIZED]):
        raise IllegalTransition(f"Operation {operation.operation_id} is {operation.status}, not a new authorized one.")
    attempt = _next_attempt(operation, worker=worker)
    events = [
        *_created_authorized_rows(operation, actor=actor, authorized_by=authorized_by, reason=reason,
                                  evidence=evidence),
        event_row(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id, tenant_id=operation.tenant_id,
                  kind=Event.Kind.TRANSITION, from_status=OperationStatus.AUTHORIZED,
                  to_status=OperationStatus.DISPATCHED, **_dispatched_record(attempt)),
    ]
    operation.status = OperationStatus.DISPATCHED
    operation.fencing_token, operation.attempt_count = attempt.fencing_token, attempt.number
    operation.dispatch_deadline = deadline
    ring_doorbell_on_commit(events)
    return attempt, events


def _created_authorized_rows(operation: Operation, *, actor: str, authorized_by: str, reason: str,
                             evidence: dict[str, Any]) -> list[Event]:
    return [
        _created_row(operation, actor=actor, to_status=OperationStatus.PLANNED),
        event_row(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id, tenant_id=operation.tenant_id,
                  kind=Event.Kind.TRANSITION, from_status=OperationStatus.PLANNED,
                  to_status=OperationStatus.AUTHORIZED, actor=authorized_by, reason=reason, evidence=evidence),
    ]
