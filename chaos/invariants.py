"""What must hold for every operation after a chaos trial, checked against the ledger *and* the
provider's own effect log (not against what the ledger says it did).

- at most one effect per operation key at the provider, exactly one once `confirmed`;
- every consecutive pair of statuses in the operation's events is in OPERATION_TRANSITIONS;
- no `confirmed` without a receipt; no `failed`/`expired`/`cancelled`/`rejected` with an effect;
- attempt numbers 1..n and fencing tokens strictly increasing, matching the operation row;
- after the quiet period nothing is left outside a terminal state or `manual`.

Findings are sorted into the summary's four counts: duplicates (effects > 1), lost (confirmed
with no effect, or authorized and never attempted), stuck (not terminal, not manual, after the
quiet period), violations (everything else, including a scenario's own expectations).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from console.models import Event
from ledger.models import (
    OPERATION_TERMINAL,
    OPERATION_TRANSITIONS,
    Attempt,
    Operation,
    OperationStatus,
)

# Terminal, or waiting for a person (who may take any time): nothing the harness must still see move.
SETTLED = OPERATION_TERMINAL | {OperationStatus.MANUAL, OperationStatus.COMPENSATION_REQUIRED}
NO_EFFECT_STATUSES = frozenset({OperationStatus.FAILED, OperationStatus.EXPIRED, OperationStatus.CANCELLED, OperationStatus.REJECTED})
DUPLICATE, LOST, STUCK, VIOLATION = "duplicate", "lost", "stuck", "violation"


@dataclass(frozen=True)
class Finding:
    kind: str  # duplicate | lost | stuck | violation
    operation_id: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.operation_id}: {self.message}"


@dataclass
class Tally:
    trials: int = 0
    findings: list[Finding] = field(default_factory=list)

    def add(self, findings: Iterable[Finding]) -> None:
        self.findings.extend(findings)

    def count(self, kind: str) -> int:
        return sum(1 for finding in self.findings if finding.kind == kind)

    @property
    def ok(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        return (f"chaos: trials={self.trials} duplicates={self.count(DUPLICATE)} lost={self.count(LOST)} "
                f"stuck={self.count(STUCK)} violations={self.count(VIOLATION)}")


def is_settled(operation_id: str) -> bool:
    return Operation.objects.filter(pk=operation_id, status__in=SETTLED).exists()


def check_operation(operation_id: str, *, effects: int) -> list[Finding]:
    """The protocol's invariants for one operation, given how many effects its provider holds
    for its key. Call after the quiet period."""
    found: list[Finding] = []

    def bad(kind: str, message: str) -> None:
        found.append(Finding(kind, operation_id, message))

    operation = Operation.objects.filter(pk=operation_id).first()
    if operation is None:
        return [Finding(VIOLATION, operation_id, "no such operation")]
    attempts = list(Attempt.objects.filter(operation_id=operation_id).order_by("number", "id"))
    events = list(Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation_id).order_by("id"))

    # The provider's log against the ledger.
    if effects > 1:
        bad(DUPLICATE, f"{effects} effects at the provider for one key")
    if operation.status == OperationStatus.CONFIRMED:
        if effects == 0:
            bad(LOST, "confirmed, but the provider has no effect")
        if not operation.receipt:
            bad(VIOLATION, "confirmed without a receipt")
    if operation.status in NO_EFFECT_STATUSES and effects:
        bad(VIOLATION, f"{operation.status}, but the provider has {effects} effect(s)")

    # The event log: created planned, then legal moves only, contiguous, ending where the row is.
    # Events of other kinds (a reassignment) leave the status where it was.
    previous = None
    for event in events:
        if previous is None:
            if event.kind != Event.Kind.CREATED or event.to_status != OperationStatus.PLANNED:
                bad(VIOLATION, f"first event is {event.kind} {event.to_status}, not created planned")
        elif event.kind != Event.Kind.TRANSITION:
            if event.to_status != previous:
                bad(VIOLATION, f"event #{event.id} ({event.kind}) says {event.to_status}, the status was {previous}")
        else:
            if event.from_status != previous:
                bad(VIOLATION, f"event #{event.id} starts from {event.from_status}, the previous ended in {previous}")
            if event.to_status not in OPERATION_TRANSITIONS.get(previous, frozenset()):
                bad(VIOLATION, f"illegal move {previous}→{event.to_status} (event #{event.id})")
        previous = event.to_status
    if previous != operation.status:
        bad(VIOLATION, f"the last event says {previous}, the row says {operation.status}")

    # Attempts and fencing tokens.
    numbers = [attempt.number for attempt in attempts]
    if numbers != list(range(1, len(attempts) + 1)):
        bad(VIOLATION, f"attempt numbers {numbers} are not 1..n")
    tokens = [attempt.fencing_token for attempt in attempts]
    if any(b <= a for a, b in zip(tokens, tokens[1:], strict=False)):
        bad(VIOLATION, f"fencing tokens {tokens} do not strictly increase")
    if operation.attempt_count != len(attempts):
        bad(VIOLATION, f"attempt_count {operation.attempt_count} but {len(attempts)} attempt rows")
    if attempts and operation.fencing_token != tokens[-1]:
        bad(VIOLATION, f"fencing token {operation.fencing_token} is not the last attempt's {tokens[-1]}")
    dispatches = sum(1 for event in events if event.to_status == OperationStatus.DISPATCHED)
    if dispatches != len(attempts):
        bad(VIOLATION, f"{dispatches} dispatched events but {len(attempts)} attempts")

    # Liveness after the quiet period.
    was_authorized = any(event.to_status == OperationStatus.AUTHORIZED for event in events)
    if operation.status not in SETTLED:
        if operation.status == OperationStatus.AUTHORIZED and not attempts:
            bad(LOST, "authorized but never attempted")
        else:
            bad(STUCK, f"still {operation.status} after the quiet period")
    elif was_authorized and not attempts and operation.status not in (OperationStatus.EXPIRED, OperationStatus.CANCELLED):
        # authorized → planned: the dispatcher's re-check asked for approvals again, and a
        # person then decided; that is a decision, not a lost authorization.
        asked_again = any(event.from_status == OperationStatus.AUTHORIZED and event.to_status == OperationStatus.PLANNED
                          for event in events)
        if not (asked_again and operation.status == OperationStatus.REJECTED):
            bad(LOST, f"authorized, never attempted, ended {operation.status}")
    return found


@dataclass(frozen=True)
class Expect:
    """A scenario's own expectations for one operation, on top of the invariants."""

    statuses: frozenset[str]
    effects: int | None = None  # exact number, None: whatever the invariants allow
    attempts: int | None = None  # exact
    max_attempts: int | None = None
    extra: Callable[[Operation, list[Attempt]], list[str]] | None = None


def check_expectations(operation_id: str, expect: Expect, *, effects: int) -> list[Finding]:
    operation = Operation.objects.get(pk=operation_id)
    attempts = list(Attempt.objects.filter(operation_id=operation_id).order_by("number"))
    problems: list[str] = []
    if operation.status not in expect.statuses:
        problems.append(f"ended {operation.status}, expected one of {sorted(expect.statuses)}")
    # A confirmed operation's effects are the invariants' business (duplicate or lost), once.
    if expect.effects is not None and effects != expect.effects and operation.status != OperationStatus.CONFIRMED:
        problems.append(f"{effects} effects, expected {expect.effects}")
    if expect.attempts is not None and len(attempts) != expect.attempts:
        problems.append(f"{len(attempts)} attempts, expected {expect.attempts}")
    if expect.max_attempts is not None and len(attempts) > expect.max_attempts:
        problems.append(f"{len(attempts)} attempts, more than the {expect.max_attempts} allowed")
    if expect.extra is not None:
        problems.extend(expect.extra(operation, attempts))
    return [Finding(VIOLATION, operation_id, problem) for problem in problems]
