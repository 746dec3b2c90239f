"""The proposal pipeline: an agent proposes a tool call; the ledger answers once and for all.

Steps 1–3 of dispatch (docs/architecture.md), in one transaction with the task row locked:

1. A repeat (same task, same call ID) is answered from the ledger before any version or token
   check — an agent retrying with a stale version still gets its operation. Same call ID with
   other arguments: IntentMismatch (422), nothing written.
2. Fencing token and expected version (409); the task must be running or waiting for approval.
3. The gate (schema 400, authorization 403, budgets, risk tier). A refusal is an event, no
   operation; a spent budget pauses the task.
4. create_or_get on the operation ID derived from (tenant, task, step, tool): the same step
   proposed again under a new call ID maps to the same operation — one step, one effect.
5. run → authorized (the dispatch is enqueued on commit), or dispatched with its first attempt
   when the proposal's request dispatches it (ledger/request_dispatch.py); approval → an
   approval request bound to call ID, operation, argument hash and the task's state version,
   and the task waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import rfc8785
from django.db import transaction
from django.utils import timezone

from approvals import audit, catalog, gate
from approvals import caps as budget_caps
from approvals import services as approval_services
from approvals.gate import Decision
from approvals.models import (
    ApprovalRequest,
    ApprovalStatus,
    AuditReview,
    EscalationRule,
    PolicyTier,
    Tool,
)
from console.lib import sql
from console.lib.canonical import digest, intent_hash_of
from console.lib.errors import Conflict, IntentMismatch, InvalidInput, NotFound
from console.lib.ids import derive_operation_id
from console.lib.transitions import record_event
from console.models import AgentPrincipal, Event, Tenant
from console.tracing import tracer
from ledger import request_dispatch
from ledger import services as ledger_services
from ledger.models import Attempt, Call, Operation, OperationStatus, ToolCircuit
from ledger.queries import AUTHORITY_MOVED_SQL, PROPOSAL_TASK_FIELDS
from ledger.queries import lease_sql as _lease_sql
from ledger.queries import task_for_claim_sql as _task_for_claim_sql
from ledger.queries import task_sql as _task_sql
from ledger.seams import seam
from ledger.selectors import (
    GATE_ACTOR,
    CallOutcome,
    Outcome,
    operation_approval,
    operation_decision,
    operation_outcome,
    refusal_outcome,
)
from runs import services as run_services
from runs.models import Lease, Step, Task, TaskStatus

MAX_CALL_ID = 64
MAX_STEP_ID = 128
CALL_ENTITY = Event.Entity.CALL

# A task proposes calls only while it runs; waiting for one approval does not stop it from
# proposing the next (independent) step.
PROPOSING_STATUSES = frozenset({TaskStatus.RUNNING, TaskStatus.WAITING_APPROVAL})


@dataclass(frozen=True)
class Proposal:
    call_id: str
    operation_id: str | None
    decision: Decision
    status: str  # the operation's status; "refused" when no operation was created
    task_id: str
    task_version: int
    outcome: CallOutcome
    approval_id: str | None = None
    reasons: tuple[str, ...] = ()
    risk_tier: int | None = None
    approvals_needed: int = 0
    result: Any = None  # the operation's result, once it has one (a repeat of a call that ran)
    created: bool = False  # this proposal created the operation (HTTP 201)
    repeat: bool = False  # answered from the ledger for a call ID seen before
    call_pk: int | None = None  # the call's row: what a proposal that waits for the outcome watches
    # Nothing was published: the caller dispatches it now that the proposal committed with its
    # claim, `claim` (`call_propose(dispatch_here=True)`, ledger/request_dispatch.py).
    dispatch_here: bool = False
    claim: Any = None


def call_propose(
    *,
    principal: AgentPrincipal,
    task_id: str,
    call_id: str,
    step_id: str,
    tool_name: str,
    arguments: dict[str, Any],
    expected_version: int,
    fencing_token: int | None,
    dispatch_here: bool = False,
) -> Proposal:
    """`dispatch_here`: the caller waits for the outcome and will dispatch a call the gate runs
    at once itself (`ledger.request_dispatch`): its claim commits with the proposal, and the
    answer's `dispatch_here` and `claim` say whether the caller must settle it (nothing was
    published for it)."""
    if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_CALL_ID or not call_id.isprintable():
        # Event rows name their entity in 64 characters, and every call leaves events. Any
        # printable character (frameworks invent their own IDs); no control characters.
        raise InvalidInput(f"call_id must be 1 to {MAX_CALL_ID} printable characters.", details={"call_id": call_id})
    if not isinstance(step_id, str) or not 0 < len(step_id) <= MAX_STEP_ID:
        raise InvalidInput(f"step_id must be 1 to {MAX_STEP_ID} characters.", details={"step_id": step_id})
    # Made once: the arguments' hash and the intent's are both hashes of it.
    args_json = gate.canonical_arguments(arguments)
    proposal = dict(principal=principal, task_id=task_id, call_id=call_id, step_id=step_id, tool_name=tool_name,
                    arguments=arguments, expected_version=expected_version, fencing_token=fencing_token,
                    args_json=args_json, args_hash=digest(args_json), dispatch_here=dispatch_here)
    try:
        for _ in range(PROPOSAL_PASSES):
            try:
                return _propose(**proposal)
            except (_LostRace, _AuthorityMoved):
                # Everything was rolled back. Lost race: another writer inserted this call or
                # operation after our reads (the task lock keeps agents out, not a compensation);
                # the next pass finds the ledger's row and answers from it. Authority moved: the
                # agent's row or the configuration changed between the reads and the write of a
                # dispatching proposal; the next pass reads them again.
                continue
    except _InvalidArguments as invalid:
        _record_invalid_arguments(invalid, principal=principal, call_id=call_id, step_id=step_id)
        raise invalid.error from None
    raise Conflict("The agent or the configuration changed while the call was proposed, at every try; "
                   "nothing was written. Propose it again.", details={"call_id": call_id})


# Passes of a proposal that lost a race or found its authority moved (both rare: the second
# pass almost always answers).
PROPOSAL_PASSES = 3


class _LostRace(Exception):
    pass


class _AuthorityMoved(Exception):
    pass


class _InvalidArguments(Exception):
    """The arguments failed the tool's schema (400): the proposal's transaction is rolled back,
    and `call_propose` then records the refusal on its own."""

    def __init__(self, error: InvalidInput, *, task: Task, tool: Tool) -> None:
        super().__init__(error.message)
        self.error, self.task_id, self.tenant_id, self.tool_name = error, task.task_id, task.tenant_id, tool.name


def _record_invalid_arguments(invalid: _InvalidArguments, *, principal: AgentPrincipal, call_id: str,
                              step_id: str) -> None:
    """A `call_refused` event for a proposal whose arguments failed the tool's schema: no call
    row (a repeat is checked again, and a corrected call may reuse the call ID), but a record
    that it happened, which the tool-argument validity gate (runs.gates) counts."""
    with transaction.atomic():
        record_event(
            entity=CALL_ENTITY, entity_id=call_id, tenant_id=invalid.tenant_id, kind=Event.Kind.CALL_REFUSED,
            to_status=Decision.REFUSED, actor=principal.ref, reason=invalid.error.message,
            evidence={"task_id": invalid.task_id, "step_id": step_id, "tool": invalid.tool_name,
                      "invalid_arguments": invalid.error.details.get("errors", []),
                      "schema_error": invalid.error.details.get("schema_error", "")},
        )


def _check_proposing(task: Task) -> None:
    if task.status not in PROPOSING_STATUSES:
        raise Conflict(
            f"Task {task.task_id} is {task.status}; calls are proposed only while it is running.",
            details={"task_id": task.task_id, "status": task.status},
        )


def _propose(*, principal: AgentPrincipal, task_id: str, call_id: str, step_id: str, tool_name: str,
             arguments: dict[str, Any], expected_version: int, fencing_token: int | None, args_json: bytes,
             args_hash: str, dispatch_here: bool) -> Proposal:
    # The ID a new operation would have: the tool is named by the request, and the task is
    # looked up in the principal's tenant only.
    operation_id = derive_operation_id(tenant=principal.tenant.slug, task_id=task_id, step_id=step_id,
                                       tool=tool_name)
    with transaction.atomic():
        task, lease, known_call, known_operation, policy, claim_reads = _lock_task(
            principal=principal, task_id=task_id, call_id=call_id, operation_id=operation_id, tool_name=tool_name,
            for_claim=dispatch_here)
        if claim_reads is not None:
            # The agent as it is now, not as the request's authentication found it: the gate
            # below and the claim check the same row, which the write finds unchanged and
            # share-locks until the commit (`_authority_moved`).
            principal = claim_reads.principal

        if known_call:
            return _repeat(_call(task, call_id), task=task, step_id=step_id, tool_name=tool_name,
                           args_hash=args_hash, policy=policy)

        run_services.check_fencing_token(task, fencing_token, locked_lease=lease)
        if task.version != expected_version:
            raise Conflict(
                "Stale expected_version.",
                details={"task_id": task.task_id, "expected_version": expected_version, "version": task.version},
            )
        _check_proposing(task)
        tool = policy.tool(tool_name)
        if tool is None:
            raise InvalidInput(f"Unknown tool {tool_name!r}.", details={"tool": tool_name})
        # Validated and authorized once, here: `gate.decide` below does the rest of the gate.
        try:
            gate.check_arguments(tool=tool, arguments=arguments)
        except InvalidInput as exc:
            raise _InvalidArguments(exc, task=task, tool=tool) from exc
        gate.authorize_principal(principal=principal, task=task, tool=tool, catalog=policy)
        # A stop refuses the call as the gate's other refusals do: recorded, and a repeat of the
        # call ID is answered the same from the ledger (after the resume too: a new call ID runs).
        stopped = gate.stop_refusal(task=task, principal=principal, tool=tool, args_hash=args_hash, catalog=policy)
        if stopped is not None:
            return _refuse(stopped, principal=principal, task=task, call_id=call_id, step_id=step_id, tool=tool,
                           args_hash=args_hash)

        intent = intent_hash_of(tool=tool.name, arguments_json=args_json, principal=principal.ref)
        if known_operation:
            # Checked before the budgets: a regenerated call for a step already in the ledger
            # spends nothing, so a spent budget must not refuse it.
            existing = Operation.objects.select_related("tool", "step").get(pk=operation_id)
            return _regenerated(existing, principal=principal, task=task, call_id=call_id,
                                intent=intent, args_hash=args_hash, policy=policy)

        with tracer.start_as_current_span("gate", attributes={
                "countersign.task_id": task.task_id, "countersign.step_id": step_id,
                "countersign.operation_id": operation_id, "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.name": tool.name}) as span:
            counters, caps = _lock_cap_counters(task=task, principal=principal, tool=tool, catalog=policy)
            result = gate.decide(task=task, tool=tool, arguments=arguments, args_hash=args_hash, catalog=policy,
                                 caps=caps)
            span.set_attributes({"countersign.decision": result.decision, "countersign.risk_tier": result.risk_tier})
        if result.refused:
            return _refuse(result, principal=principal, task=task, call_id=call_id, step_id=step_id, tool=tool,
                           args_hash=args_hash)

        runs_at_once = not result.needs_approval
        dispatch_here = dispatch_here and runs_at_once and request_dispatch.applies(tool)
        now = timezone.now()
        operation = sql.unsaved(Operation, {
            "operation_id": operation_id,
            "tenant_id": task.tenant_id,
            "tool_schema_version": tool.schema_version,
            "call_id": call_id,
            "arguments": arguments,
            "arguments_hash": args_hash,
            "intent_hash": intent,
            "idempotency_key": _idempotency_key(tool, task, arguments, operation_id),
            "business_key": _business_key(tool, arguments),
            "risk_tier": result.risk_tier,
            # A call the gate runs at once is inserted authorized (its two events below).
            "status": OperationStatus.AUTHORIZED if runs_at_once else OperationStatus.PLANNED,
            "needs_approval": not runs_at_once,
            "created_at": now,
            "updated_at": now,
        }, task=task, tool=tool, principal=principal)
        created = dict(actor=principal.ref, authorized_by=GATE_ACTOR,
                       reason=f"L{result.risk_tier} {result.requirement}: runs at once",
                       evidence={"risk_tier": result.risk_tier, "reasons": list(result.reasons), "call_id": call_id})
        # The request dispatches the call: claimed before the write, it goes in `dispatched` with
        # its attempt, unless a load guard defers it (then it goes in authorized, as below).
        claim = request_dispatch.claim(operation, circuit_until=claim_reads.circuit_until,
                                       in_flight=claim_reads.in_flight, created=created) if dispatch_here else None
        attempt, events = claim if isinstance(claim, tuple) else (None, [])
        if runs_at_once and attempt is None:
            events = ledger_services.operation_created_authorized(operation, **created, publish=not dispatch_here)
        # The budget spent, the step (or the one the task has: compensations add steps without
        # holding the task's row), the call, the operation on that step and (run at once) its
        # events, with its attempt when it goes in dispatched: one statement on PostgreSQL. The
        # call before the operation: its foreign key to it is checked at commit. ON CONFLICT DO
        # NOTHING instead of a savepoint: a row another writer got in first means that writer's
        # row is the answer (`_LostRace` rolls all of it back). The task row is locked, so the
        # new counts are the ones read plus this call's.
        spent = _budget_after(task, tool, arguments)
        # Run at once under an audited tier: reviewers look at it afterwards (approvals.audit).
        audited = runs_at_once and result.requirement == PolicyTier.Requirement.RUN_AUDIT
        audit_entry = [(AuditReview, audit.audit_entry_values(
            operation_id=operation_id, tenant_id=task.tenant_id, tool_id=tool.pk, call_id=call_id,
            risk_tier=result.risk_tier, requested_by_id=principal.pk, created_at=now))] if audited else []
        try:
            written = sql.update_then_write(
                Task, where={"pk": task.pk}, values=spent, ignore_conflicts=True,
                inserts=[sql.Existing(Step, {"task": task, "step_id": step_id, "created_at": now},
                                      on=("task", "step_id")),
                         (Call, {"task": task, "call_id": call_id, "operation_id": operation_id,
                                 "arguments_hash": args_hash, "created_at": now}),
                         (Operation, {**sql.values_of(operation), "step_id": sql.Key(0)}),
                         *([(Attempt, sql.values_of(attempt))] if attempt is not None else []),
                         *audit_entry,
                         *[(Event, sql.values_of(event)) for event in events]],
                updates=run_services.budget_counters_spend(
                    counters, writes=spent["writes_used"] - task.writes_used, amount=gate.call_amount(tool, arguments)),
                # Dispatched: the agent's row and the configuration as the gate judged them, held
                # to the commit (the claim's authority at the moment of effect).
                unless=_authority_moved(claim_reads) if attempt is not None else None)
        except sql.Declined:
            raise _AuthorityMoved from None
        if written is None:
            raise _LostRace
        step_pk, call_pk, operation_pk, *rest = written
        if call_pk is None or operation_pk is None:
            raise _LostRace
        if attempt is not None:
            seam("before_dispatch_commit", operation_id)
        operation.step_id = step_pk
        operation._state.adding = False
        if attempt is not None:
            attempt.pk, attempt._state.adding = rest[0], False
        for name, value in spent.items():
            setattr(task, name, value)
        if runs_at_once:
            return Proposal(
                call_id=call_id, operation_id=operation_id, decision=Decision.DISPATCHED, status=operation.status,
                task_id=task.task_id, task_version=task.version, reasons=result.reasons,
                risk_tier=result.risk_tier, created=True, call_pk=call_pk, dispatch_here=dispatch_here,
                claim=(operation, attempt) if attempt is not None else claim,
                outcome=CallOutcome(outcome=Outcome.DISPATCHED, final=False, by=GATE_ACTOR, at=now),
            )

        ledger_services.operation_created_event(operation, actor=principal.ref)
        run_services.task_wait_for_approval(
            task=task, actor=principal.ref, reason=f"call {call_id} needs approval",
            evidence={"operation_id": operation_id, "risk_tier": result.risk_tier},
        )
        approval = approval_services.approval_request_create(
            operation=operation, task_type=task.task_type, call_id=call_id,
            # The agent's version (waiting does not move it): the dispatcher refuses if the agent
            # committed anything since.
            state_version=task.version,
            risk_tier=result.risk_tier, approvals_needed=result.approvals_needed,
            ttl_seconds=result.approval_ttl_seconds, reasons=list(result.reasons), actor=principal.ref,
        )
        return Proposal(
            call_id=call_id, operation_id=operation_id, decision=Decision.AWAITING_APPROVAL, status=operation.status,
            task_id=task.task_id, task_version=task.version, approval_id=approval.approval_id,
            reasons=result.reasons, risk_tier=result.risk_tier, approvals_needed=result.approvals_needed,
            created=True,
            outcome=CallOutcome(outcome=Outcome.AWAITING_APPROVAL, final=False,
                                approvals_needed=approval.approvals_needed, expires_at=approval.expires_at,
                                approval_id=approval.approval_id),
        )


def _lock_cap_counters(*, task: Task, principal: AgentPrincipal, tool: Tool,
                       catalog: catalog.Catalog) -> tuple[list, gate.CapState]:
    """The counters of the budget caps covering this call, locked (none while no cap covers
    it: nothing is counted, nothing locked), and the caps' state the gate decides on."""
    covering = budget_caps.caps_covering(catalog=catalog, tenant_id=task.tenant_id, agent_id=principal.pk,
                                         tool_id=tool.pk)
    if not covering:
        return [], gate.CapState()
    keys = budget_caps.counter_keys(covering, task_id=task.task_id, day=budget_caps.tenant_day(task.tenant))
    counters = run_services.budget_counters_lock(tenant_id=task.tenant_id, keys=keys)
    return counters, gate.cap_state(task=task, agent_id=principal.pk, tool=tool, catalog=catalog, counters=counters)


@dataclass(frozen=True)
class DryRun:
    task_id: str
    task_version: int
    tool: str
    outcome: str  # dispatched, awaiting_approval or refused
    risk_tier: int | None
    approvals_needed: int
    reasons: tuple[str, ...]
    rules: tuple[EscalationRule, ...]  # the escalation rules that matched these arguments
    dry_run: bool = True


def call_dry_run(*, principal: AgentPrincipal, task_id: str, tool_name: str, arguments: dict[str, Any]) -> DryRun:
    """What the gate would answer a proposal of these arguments now, writing nothing: the same
    schema (400), authorization (403), task status (409), budgets and tier as `call_propose`,
    without the ledger (a call ID, a version or a token are not asked for)."""
    task = Task.objects.filter(task_id=task_id, tenant_id=principal.tenant_id).first()
    if task is None:
        raise NotFound(f"No task {task_id}.", details={"task_id": task_id})
    _check_proposing(task)
    policy = catalog.current()
    tool = policy.tool(tool_name)
    if tool is None:
        raise InvalidInput(f"Unknown tool {tool_name!r}.", details={"tool": tool_name})
    args_hash = gate.validate_arguments(tool=tool, arguments=arguments)
    gate.authorize(principal=principal, task=task, tool=tool, catalog=policy)
    result = gate.decide(task=task, tool=tool, arguments=arguments, args_hash=args_hash, catalog=policy,
                         caps=gate.cap_state(task=task, agent_id=principal.pk, tool=tool, catalog=policy))
    rules = tuple(rule for rule in policy.rules(tool) if gate.rule_matches(rule, arguments)[0])
    return DryRun(task_id=task.task_id, task_version=task.version, tool=tool.name, outcome=result.decision,
                  risk_tier=result.risk_tier, approvals_needed=result.approvals_needed, reasons=result.reasons,
                  rules=rules if result.risk_tier is not None else ())


def task_settle_waiting(*, task_id: str, actor: str, reason: str) -> None:
    """The task leaves `waiting_approval` (for `running`, the version unchanged) once none of
    its calls waits for a person. Called in the transaction that decided a held call.

    The task row is locked before the pending requests are counted: a proposal holding it may
    be adding one, and the count must see it (PostgreSQL reads each statement at its start, so
    after the lock). The read before the lock only skips tasks that are not waiting."""
    if not Task.objects.filter(pk=task_id, status=TaskStatus.WAITING_APPROVAL).exists():
        return
    task = run_services.task_lock(task_id=task_id)
    if task.status != TaskStatus.WAITING_APPROVAL:
        return
    if ApprovalRequest.objects.filter(task_id=task_id, status=ApprovalStatus.PENDING).exists():
        return
    run_services.task_stop_waiting(task=task, actor=actor, reason=reason)


@dataclass(frozen=True)
class _ClaimReads:
    """What a dispatching proposal's first statements read for its claim (`task_for_claim_sql`)."""

    principal: AgentPrincipal  # as it is now (its row is share-locked by the write, if unchanged)
    circuit_until: Any
    in_flight: int
    agent_version: str | None  # the agent's row version as read (PostgreSQL; None on SQLite)
    token: str  # the configuration generation's token as read


def _authority_moved(reads: _ClaimReads) -> sql.Unless | None:
    """The write's check that the agent's row and the configuration are as the gate judged them
    (`AUTHORITY_MOVED_SQL`), which share-locks both until the commit. None on SQLite, whose
    writers take turns: nothing changes between the proposal's reads and its commit."""
    if reads.agent_version is None:
        return None
    return AUTHORITY_MOVED_SQL, [reads.principal.pk, reads.agent_version, reads.token]


def _lock_task(*, principal: AgentPrincipal, task_id: str, call_id: str, operation_id: str, tool_name: str,
               for_claim: bool) -> tuple[Task, Lease | None, bool, bool, catalog.Catalog, _ClaimReads | None]:
    """The task (of the principal's tenant) and its lease, both locked, whether the call and
    the operation are already in the ledger, and the gate's configuration as of this
    transaction (by its generation token): two statements. `for_claim`: the request will
    dispatch the call, so the task's statement also reads what the claim needs
    (`task_for_claim_sql`), with the agent's row version and the token that the write checks
    and share-locks to the commit (`_authority_moved`).

    Lock order lease → task, the order task_transition takes them in (it locks the lease, then
    updates the task row): the other order could deadlock against it on PostgreSQL. Holding the
    task row serializes every proposal of the task, so a repeat and its original never both
    miss each other. On SQLite the IMMEDIATE transaction already serializes.
    """
    connection = sql.connection_for(Task)
    lease_row = sql.fetchone(connection, _lease_sql(connection.vendor), [task_id, principal.tenant_id])
    if for_claim:
        statement = _task_for_claim_sql(connection.vendor)
        params = [call_id, operation_id, OperationStatus.DISPATCHED, principal.pk, tool_name, task_id,
                  principal.tenant_id]
    else:
        statement, params = _task_sql(connection.vendor), [call_id, operation_id, task_id, principal.tenant_id]
    row = sql.fetchone(connection, statement, params)
    if row is None:
        raise NotFound(f"No task {task_id}.", details={"task_id": task_id})
    task = sql.load(Task, row, connection=connection, only=PROPOSAL_TASK_FIELDS)
    task_width = sql.width(Task, only=PROPOSAL_TASK_FIELDS)
    tenant = sql.load(Tenant, row, task_width, connection=connection)
    sql.attach(task, "tenant", tenant)
    lease = sql.load(Lease, lease_row, connection=connection) if lease_row is not None else None
    if not for_claim:
        return task, lease, row[-3] is not None, row[-2] is not None, catalog.for_token(row[-1]), None
    start = task_width + sql.width(Tenant)
    agent = sql.load(AgentPrincipal, row, start, connection=connection)
    sql.attach(agent, "tenant", tenant)
    circuit = sql.load(ToolCircuit, row, start + sql.width(AgentPrincipal), connection=connection)
    reads = _ClaimReads(principal=agent, circuit_until=circuit.open_until if circuit else None, in_flight=row[-3],
                        agent_version=row[-2], token=row[-1])
    return task, lease, row[-5] is not None, row[-4] is not None, catalog.for_token(row[-1]), reads


def _call(task: Task, call_id: str) -> Call | None:
    return Call.objects.select_related("operation__tool", "operation__step").filter(task=task, call_id=call_id).first()


def _repeat(call: Call, *, task: Task, step_id: str, tool_name: str, args_hash: str,
            policy: catalog.Catalog) -> Proposal:
    operation = call.operation
    known = ((operation.tool.name, operation.step.step_id) if operation is not None
             else (call.tool_name, call.step_id))
    if (call.arguments_hash, *known) != (args_hash, tool_name, step_id):
        raise IntentMismatch(
            f"Call {call.call_id} was proposed before with other arguments; a call ID names one intent.",
            details={"call_id": call.call_id, "operation_id": call.operation_id,
                     "arguments_hash": call.arguments_hash, "tool": known[0], "step_id": known[1]},
        )
    if operation is None:
        refusal = call.refusal or {}
        reasons = tuple(refusal.get("reasons", ()))
        return Proposal(
            call_id=call.call_id, operation_id=None, decision=Decision.REFUSED, status=Decision.REFUSED,
            task_id=task.task_id, task_version=task.version, reasons=reasons, risk_tier=refusal.get("risk_tier"),
            outcome=refusal_outcome(reasons=reasons, at=call.created_at), repeat=True,
        )
    return _answer(operation, task=task, call_id=call.call_id, repeat=True, policy=policy, call_pk=call.pk)


def _regenerated(operation: Operation, *, principal: AgentPrincipal, task: Task, call_id: str,
                 intent: str, args_hash: str, policy: catalog.Catalog) -> Proposal:
    """The step is already in the ledger under another call ID (the model regenerated it)."""
    if operation.intent_hash != intent:
        raise IntentMismatch(
            f"Step {operation.step.step_id} already has an operation with another intent; "
            "give a different side effect its own step ID.",
            details={"operation_id": operation.operation_id, "step_id": operation.step.step_id,
                     "call_id": operation.call_id},
        )
    # ON CONFLICT DO NOTHING, no savepoint: the task row is locked, so a writer of this call ID
    # that got in first does not hold it (a compensation); its row is the answer.
    written = sql.insert(Call, [{"task": task, "call_id": call_id, "operation_id": operation.operation_id,
                                 "arguments_hash": args_hash, "created_at": timezone.now()}],
                         returning=("id",), ignore_conflicts=True)
    if not written:
        call = _call(task, call_id)
        if call is None:
            raise _LostRace
        return _repeat(call, task=task, step_id=operation.step.step_id, tool_name=operation.tool.name,
                       args_hash=args_hash, policy=policy)
    answer = _answer(operation, task=task, call_id=call_id, policy=policy, call_pk=written[0][0])
    record_event(
        entity=CALL_ENTITY, entity_id=call_id, tenant_id=task.tenant_id, kind=Event.Kind.CALL_MAPPED,
        to_status=answer.decision,
        actor=principal.ref,
        reason=f"same step as call {operation.call_id}: answered from operation {operation.operation_id}",
        evidence={"operation_id": operation.operation_id, "status": operation.status, "task_id": task.task_id},
    )
    return answer


def _answer(operation: Operation, *, task: Task, call_id: str, policy: catalog.Catalog,
            repeat: bool = False, call_pk: int | None = None) -> Proposal:
    approval = operation_approval(operation, call_id=call_id)
    decision, reasons = operation_decision(operation, approval)
    if decision == Decision.DISPATCHED:
        # The generation read with the task: the token is not read again.
        reasons = gate.risk_tier(tool=operation.tool, task=task, arguments=operation.arguments, catalog=policy)[1]
    return Proposal(
        call_id=call_id, operation_id=operation.operation_id, decision=decision, status=operation.status,
        task_id=task.task_id, task_version=task.version,
        approval_id=approval.approval_id if approval is not None else None,
        reasons=tuple(reasons), risk_tier=operation.risk_tier,
        approvals_needed=approval.approvals_needed if approval is not None else 0,
        repeat=repeat, outcome=operation_outcome(operation, approval), result=operation.result, call_pk=call_pk,
    )


def _refuse(result: gate.GateResult, *, principal: AgentPrincipal, task: Task, call_id: str, step_id: str,
            tool: Tool, args_hash: str) -> Proposal:
    """The refusal is recorded as the call (with no operation), so a repeat of the call ID is
    answered the same refusal from the ledger, and the call can be read back."""
    if result.exhausted_budgets and task.status != TaskStatus.PAUSED:
        run_services.task_pause(
            task=task, actor=GATE_ACTOR, reason=f"budget ran out: {', '.join(result.exhausted_budgets)}",
            evidence={"budgets": list(result.exhausted_budgets), "call_id": call_id, "reasons": list(result.reasons)},
        )
    record_event(
        entity=CALL_ENTITY, entity_id=call_id, tenant_id=task.tenant_id, kind=Event.Kind.CALL_REFUSED,
        to_status=Decision.REFUSED, actor=principal.ref,
        reason="; ".join(result.reasons),
        evidence={"task_id": task.task_id, "step_id": step_id, "tool": tool.name,
                  "arguments_hash": result.arguments_hash, "risk_tier": result.risk_tier,
                  "reasons": list(result.reasons), "exhausted_budgets": list(result.exhausted_budgets)},
    )
    now = timezone.now()
    # ON CONFLICT DO NOTHING, no savepoint: the task row is locked, so another writer of this
    # call ID can only be one that does not hold it; its row is the answer (`_LostRace`).
    written = sql.insert(Call, [{
        "task": task, "call_id": call_id, "operation_id": None, "arguments_hash": args_hash, "created_at": now,
        "step_id": step_id, "tool_name": tool.name,
        "refusal": {"reasons": list(result.reasons), "risk_tier": result.risk_tier,
                    "exhausted_budgets": list(result.exhausted_budgets)},
    }], returning=("id",), ignore_conflicts=True)
    if not written:
        raise _LostRace
    return Proposal(
        call_id=call_id, operation_id=None, decision=Decision.REFUSED, status=Decision.REFUSED, task_id=task.task_id,
        task_version=task.version, reasons=result.reasons, risk_tier=result.risk_tier,
        outcome=refusal_outcome(reasons=result.reasons, at=now),
    )


def _budget_after(task: Task, tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
    """The task's budget counters once this call is counted. Budgets are spent when the
    operation is created (reserved), whatever a reviewer decides."""
    writes = 1 if tool.kind == Tool.Kind.WRITE else 0
    return {"calls_used": task.calls_used + 1, "writes_used": task.writes_used + writes,
            "amount_used": task.amount_used + gate.call_amount(tool, arguments)}


def _key_part(value: Any) -> str:
    # Numbers in their canonical JSON form, so 30 and 30.0 make one key, as they make one intent.
    if isinstance(value, str):
        return value
    if isinstance(value, Decimal):
        value = float(value)
    return rfc8785.dumps(value).decode()


def _idempotency_key(tool: Tool, task: Task, arguments: dict[str, Any], operation_id: str) -> str:
    """The operation ID, unless the tool defines a business key template (e.g.
    `{tenant}:{order_id}:refund:{amount}`); placeholders are the tenant's slug and arguments."""
    if not tool.idempotency_key_template:
        return operation_id
    values = {name: _key_part(value) for name, value in arguments.items()}
    values["tenant"] = task.tenant.slug
    try:
        key = tool.idempotency_key_template.format_map(values)
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise InvalidInput(
            f"The idempotency key template of {tool.name} cannot be filled from these arguments.",
            details={"template": tool.idempotency_key_template, "error": f"{type(exc).__name__}: {exc}"},
        ) from exc
    if not key or len(key) > 255:
        raise InvalidInput(f"The idempotency key of {tool.name} must be 1 to 255 characters.",
                           details={"length": len(key)})
    return key


def _business_key(tool: Tool, arguments: dict[str, Any]) -> str:
    if not tool.business_key:
        return ""
    value = gate.resolve_path(arguments, tool.business_key)
    if value is gate.MISSING or value is None:
        return ""
    return _key_part(value)[:255]
