"""The dispatcher: steps 5–7 of dispatch (docs/architecture.md, "Dispatch, in this order").

    re-read → re-validate → consume the approval, authorized → dispatched with a new fencing
    token and attempt (COMMIT) → call the provider with the operation's key and a timeout
    (no transaction open) → record the outcome guarded by (status = dispatched, token = mine).

Every early return is a no-op the broker may cause (duplicate or late delivery): the ledger,
not the message, decides whether there is anything to do.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals import gate
from approvals import services as approval_services
from approvals.catalog import Catalog, for_token
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, Tool
from approvals.stops import active_stop
from console.access import reviewer_max_tier
from console.lib import sql
from console.lib.locks import lock_name
from console.models import AgentPrincipal, Event, Tenant
from console.tracing import tracer
from ledger import decisions, services, tasks
from ledger.adapters import adapter_for
from ledger.adapters.base import ABSENT, FOUND, Outcome, known_success, not_sent, unknown
from ledger.models import Attempt, Fact, Operation, OperationStatus, ToolCircuit
from ledger.queries import BUSINESS_KEY_BUSY_SQL as _BUSINESS_KEY_BUSY_SQL
from ledger.queries import STILL_MINE_SQL as _STILL_MINE_SQL
from ledger.queries import claim_sql as _claim_sql
from ledger.retry import backoff_delay, circuit_still_open, retry_budget_left
from ledger.seams import seam
from runs.models import TASK_TERMINAL, Task, TaskStatus

logger = logging.getLogger(__name__)
ACTOR = "system:dispatcher"


@dataclass(frozen=True)
class Deferred:
    reason: str
    seconds: float
    queue: str


def run_dispatch(operation_id: str, *, worker: str, let_go: Callable[[], None] | None = None) -> str:
    """Execute one authorized (or retry-safe) operation. Returns what happened, for logs.
    `let_go()` runs once the claim is checked and before the provider is called: a server's
    request thread gives its database connection back to the pool there (a provider may take
    its whole timeout); a worker's thread keeps its own."""
    with tracer.start_as_current_span("dispatch", attributes={"countersign.operation_id": operation_id}) as span:
        return _settle(span, operation_id, _claim(operation_id, worker=worker), let_go)[0]


Claim = tuple[Operation, Attempt] | Deferred | str


def settle(operation_id: str, claimed: Claim, *,
           let_go: Callable[[], None] | None = None) -> tuple[str, Operation | None]:
    """Steps 6 and 7 after a claim committed (`_claim`'s result, or a proposal's that claimed its
    call as it wrote it: `claim_new`): the provider call and the receipt; a deferred claim goes
    back to the broker for later; a claim that found nothing to do ends here. Returns what
    happened, for logs, and the operation as its receipt left it (status, result), for an
    answer that needs no read after it; None when no receipt was recorded (nothing to do,
    deferred, a stale result)."""
    with tracer.start_as_current_span("dispatch", attributes={"countersign.operation_id": operation_id}) as span:
        return _settle(span, operation_id, claimed, let_go)


def _settle(span, operation_id: str, claimed: Claim,
            let_go: Callable[[], None] | None) -> tuple[str, Operation | None]:
    if isinstance(claimed, str):
        span.set_attribute("countersign.dispatch.result", claimed)
        return claimed, None
    if isinstance(claimed, Deferred):
        _enqueue_later(operation_id, claimed)
        span.set_attribute("countersign.dispatch.result", f"deferred:{claimed.reason}")
        return f"deferred:{claimed.reason}", None
    operation, attempt = claimed
    span.set_attributes({"countersign.task_id": operation.task_id, "gen_ai.tool.call.id": operation.call_id,
                         "countersign.attempt": attempt.number})
    seam("before_provider_call", operation_id)
    outcome, latency_ms = _call_provider(operation, attempt, let_go)
    seam("after_provider_call", operation_id)
    return _record(operation, attempt, outcome, latency_ms)


def _enqueue_later(operation_id: str, deferred: Deferred) -> None:
    countdown = max(0.05, deferred.seconds)
    # This message is the next try; the sweeper pushes again only if it is lost.
    Operation.objects.filter(pk=operation_id, status__in=[OperationStatus.AUTHORIZED, OperationStatus.RETRY_SAFE]).update(
        next_redispatch_at=timezone.now() + timedelta(seconds=countdown + settings.REDISPATCH_AFTER_SECONDS)
    )
    tasks.enqueue_dispatch(operation_id, queue=deferred.queue, countdown=countdown)


def _claim(operation_id: str, *, worker: str) -> Claim:
    """Step 5 in a transaction of its own: re-validate and commit `dispatched`. Returns
    (operation, attempt), a Deferred, or a string naming why there is nothing to do; `settle`
    takes it from there."""
    with transaction.atomic():
        now = timezone.now()
        claimed = _lock_for_claim(operation_id)
        if claimed is None:
            return "missing"
        operation, circuit_until, in_flight, catalog = claimed
        if operation.status not in (OperationStatus.AUTHORIZED, OperationStatus.RETRY_SAFE):
            return f"noop:{operation.status}"
        tool = operation.tool
        held = _held(operation, catalog)
        if held:
            return held
        # The approval this dispatch consumes, looked up once (an operation the gate ran at once has none).
        approval = _approved_request(operation) if operation.needs_approval else None
        refusal = _revalidate(operation, approval, now=now, catalog=catalog)
        if refusal:
            return refusal
        if operation.status == OperationStatus.RETRY_SAFE:
            stop = _retry_exhausted(operation, tool, now=now)
            if stop:
                services.operation_fail(operation_id=operation_id, actor=ACTOR, reason=stop,
                                        evidence={"attempts": operation.attempt_count,
                                                  "last_error": operation.last_error})
                return f"failed:{stop}"
            if operation.not_before and operation.not_before > now:
                return Deferred("backoff", (operation.not_before - now).total_seconds(), tool.queue)
        deferred = _load_guards(operation, circuit_until=circuit_until, in_flight=in_flight, now=now)
        if deferred:
            return deferred
        if approval is not None:
            approval_services.approval_consume(approval_id=approval.approval_id, actor=ACTOR)
        seam("before_dispatch_commit", operation_id)
        # The row locked above, with its tool: no second lock, no lazy load before the provider call.
        return services.operation_dispatch(operation_id=operation_id, worker=worker,
                                           deadline=_deadline(tool, now), locked=operation)


def claim_new(operation: Operation, *, worker: str, circuit_until, in_flight: int,
              created: dict) -> Deferred | tuple[Attempt, list[Event]]:
    """Step 5 for a call its proposal has not written yet, in the proposal's transaction (the
    request that proposed it dispatches it: ledger/request_dispatch.py).

    The gate decided on this call moments before, in the same transaction, on the agent's row
    and the configuration that the proposal's write checks are unchanged and share-locks until
    the commit (`ledger.proposals._authority_moved`: moved, nothing is written and the proposal
    reads again). So every re-check of the claim already has its answer: a stop or a paused task
    refused the proposal, the task is running, the tool's schema is the one validated, and the
    policy's verdict is the gate's. Left are the load guards, which are not about authority: an
    open circuit, another operation on the same business object in flight, the tenant at its
    limit. They defer the call (the caller inserts it `authorized` and settles the Deferred once
    it committed).

    Otherwise `operation` (unsaved) goes in `dispatched`: the attempt and the event rows to
    insert with it are returned (`services.operation_created_dispatched`; `created` names the
    gate's authorization), and `settle` calls the provider once they committed. The proposal
    calls the seam before that commit, after its write."""
    now = timezone.now()
    deferred = _load_guards(operation, circuit_until=circuit_until, in_flight=in_flight, now=now)
    if deferred:
        return deferred
    return services.operation_created_dispatched(operation, worker=worker, deadline=_deadline(operation.tool, now),
                                                 **created)


def _load_guards(operation: Operation, *, circuit_until, in_flight: int, now) -> Deferred | None:
    tool = operation.tool
    reopen = circuit_still_open(tool, circuit_until, now=now)
    if reopen:
        return Deferred("circuit_open", (reopen - now).total_seconds(), tool.queue)
    # Mutual exclusion: two operations on one business object (one order's refunds) never
    # run at once. The tenant's in-flight limit is a load guard, not a safety property: it
    # is counted without a lock (concurrent claimers may overshoot it by their number)
    # rather than serializing every dispatch of a tenant.
    if operation.business_key:
        lock_name(f"business:{tool.name}:{operation.business_key}")
        # An operation in doubt (unknown) may still have happened: it blocks its business key too.
        busy = sql.fetchone(sql.connection_for(Operation), _BUSINESS_KEY_BUSY_SQL,
                            [tool.pk, operation.business_key, OperationStatus.DISPATCHED, OperationStatus.UNKNOWN,
                             operation.pk])
        if busy is not None:
            return Deferred("business_key_busy", 0.5, tool.queue)
    if in_flight >= settings.TENANT_MAX_IN_FLIGHT:
        return Deferred("tenant_limit", 0.5, tool.queue)
    return None


def _deadline(tool: Tool, now):
    return now + timedelta(seconds=tool.timeout_seconds + settings.DISPATCH_GRACE_SECONDS)


_CLAIM_LOADS = (Operation, Tool, Task, AgentPrincipal, Tenant, ToolCircuit)


def _lock_for_claim(operation_id: str) -> tuple[Operation, object, int, Catalog] | None:
    """The operation locked, with its tool, its task and its agent (share-locked) with the
    agent's tenant, the circuit breaker's stored verdict, the tenant's operations in flight, and
    the configuration (tiers, rules, allowed tools, stops) held still until the claim commits:
    one statement (the claim runs for every dispatch), two when a configuration change commits
    while it waits.

    So a withdrawal either committed before the claim read its authority (and is seen) or waits
    for the claim to end: never a `dispatched` that commits after a withdrawal it did not see."""
    connection = sql.connection_for(Operation)
    claim, params = _claim_sql(connection.vendor), [OperationStatus.DISPATCHED, operation_id]
    row = sql.fetchone(connection, claim, params)
    if row is not None and row[-2] != row[-1]:
        # The statement waited for a configuration change (its snapshot has the token before
        # it): read again, in a snapshot that has the change. The generation is held now.
        row = sql.fetchone(connection, claim, params)
    if row is None:
        return None
    at = itertools.accumulate((sql.width(m) for m in _CLAIM_LOADS[:-1]), initial=0)
    operation, tool, task, principal, tenant, circuit = (
        sql.load(model, row, start, connection=connection) for model, start in zip(_CLAIM_LOADS, at, strict=True))
    sql.attach(principal, "tenant", tenant)
    sql.attach(operation, "tool", tool)
    sql.attach(operation, "task", task)
    sql.attach(operation, "principal", principal)
    return operation, circuit.open_until if circuit else None, row[-3], for_token(row[-1])


def _approved_request(operation: Operation) -> ApprovalRequest | None:
    return (
        ApprovalRequest.objects.select_for_update()
        .filter(operation=operation, status=ApprovalStatus.APPROVED)
        .order_by("-created_at")
        .first()
    )


def _revalidate(operation: Operation, approval: ApprovalRequest | None, *, now, catalog: Catalog) -> str | None:
    """Step 5's re-checks of the operation and its approved request (if any), then the
    authority behind it as it is now (a retry's too). On failure the approval and the operation
    are closed (with events), or the operation waits for approval again, and a reason is
    returned."""
    task = operation.task
    # Every decision's signed receipt, against what will run: a row forged or altered in the
    # database never dispatches.
    forged = approval and approval_services.approval_forged_decision(approval, arguments_hash=operation.arguments_hash)
    if forged:
        decisions.approval_invalidate(approval_id=approval.approval_id, actor=ACTOR, reason=f"forged approval: {forged}")
        return "cancelled:approval_signature"
    if operation.status == OperationStatus.AUTHORIZED:
        # A compensation undoes an effect of a task that may long be finished: it still runs.
        if task.status in TASK_TERMINAL and operation.compensates_id is None:
            services.operation_cancel(operation_id=operation.operation_id, actor=ACTOR, reason=f"task {task.status}")
            return f"cancelled:task_{task.status}"
        if operation.tool.schema_version != operation.tool_schema_version:
            reason = "tool schema changed since the call was proposed"
            if approval:
                decisions.approval_invalidate(approval_id=approval.approval_id, actor=ACTOR, reason=reason)
            else:
                services.operation_cancel(operation_id=operation.operation_id, actor=ACTOR, reason=reason)
            return "cancelled:schema_changed"
        if approval is not None and approval.expires_at <= now:
            decisions.approval_expire(approval_id=approval.approval_id, actor=ACTOR,
                                      reason="approval expired before dispatch")
            return "expired:approval"
        if approval is not None and task.version != approval.state_version:
            decisions.approval_invalidate(
                approval_id=approval.approval_id, actor=ACTOR,
                reason=f"task moved from version {approval.state_version} to {task.version}")
            return "invalidated:task_version"
    withdrawn = _recheck_authority(operation, approval, catalog)
    if withdrawn or approval is None:
        return withdrawn
    for decision in approval.decisions.filter(verdict=ApprovalDecision.Verdict.APPROVE).select_related("reviewer"):
        max_tier = reviewer_max_tier(decision.reviewer, approval.tenant_id)
        if max_tier is None or max_tier < approval.risk_tier:
            decisions.approval_invalidate(
                approval_id=approval.approval_id, actor=ACTOR,
                reason=f"{decision.reviewer.get_username()} may no longer approve L{approval.risk_tier}")
            return "invalidated:approver"
    return None


def _held(operation: Operation, catalog: Catalog) -> str | None:
    """A stop in force over the operation's tenant, agent or tool, or its task paused by a
    person: nothing moves and no attempt starts. Resuming pushes the operation again
    (`ledger.control`). A task paused because its budget ran out still runs what was approved
    within the budget (its share was reserved when it was proposed)."""
    stop = active_stop(tenant_id=operation.tenant_id, agent_id=operation.principal_id, tool_id=operation.tool_id,
                       catalog=catalog)
    if stop is not None:
        return f"held:stopped:{stop.stop_id}"
    if operation.task.status == TaskStatus.PAUSED and paused_by_person(operation.task_id):
        return "held:task_paused"
    return None


def paused_by_person(task_id: str) -> bool:
    """Was the task's latest pause a person's (the run page), not a budget's?"""
    actor = (Event.objects.filter(entity=Task.EVENT_ENTITY, entity_id=task_id, to_status=TaskStatus.PAUSED)
             .order_by("-id").values_list("actor", flat=True).first())
    return bool(actor) and actor.startswith("user:")


def _recheck_authority(operation: Operation, approval: ApprovalRequest | None, catalog: Catalog) -> str | None:
    """The gate's verdict on the call now, against the latest state: the agent active, the
    tool enabled and allowed to it, the tier and the escalation rules as they are. Refused now:
    the operation is cancelled (a retry that is due fails: its earlier attempt provably had no
    effect) with the reason. Stricter now than what authorized it: back to waiting for the
    approvals now required. Never dispatched on authority that no longer holds."""
    # A compensation is asked for by people to undo an effect: the agent's authority is not
    # what stands behind it (the agent may be the reason for it), the tool and the policy are.
    # The agent as it is now: the claim read it under a share lock (`_lock_for_claim`), so a
    # deactivation committed before is seen and one after waits for the claim.
    principal = None if operation.compensates_id is not None else operation.principal
    verdict = gate.reevaluate(principal=principal, task=operation.task, tool=operation.tool,
                              arguments=operation.arguments, args_hash=operation.arguments_hash, catalog=catalog)
    if verdict.refused:
        reason = "authority withdrawn: " + "; ".join(verdict.reasons)
        if operation.status == OperationStatus.RETRY_SAFE:
            services.operation_fail(operation_id=operation.operation_id, actor=ACTOR, reason=reason,
                                    evidence={"reasons": list(verdict.reasons)})
            return "failed:authority_withdrawn"
        if approval is not None:
            decisions.approval_invalidate(approval_id=approval.approval_id, actor=ACTOR, reason=reason)
        else:
            services.operation_cancel(operation_id=operation.operation_id, actor=ACTOR, reason=reason)
        return "cancelled:authority_withdrawn"
    if verdict.needs_approval and _stricter(operation, approval, verdict):
        if operation.status == OperationStatus.RETRY_SAFE:
            # A retry is a new dispatch, and the policy would now hold it for approvals the call
            # never had; its earlier attempt provably had no effect: it fails with the reason
            # (the agent proposes again, under the policy as it is), as a refused retry does.
            reason = (f"approval required again: the policy now requires L{verdict.risk_tier}, "
                      f"{verdict.approvals_needed} approval(s); a retry does not run on the old authority")
            services.operation_fail(operation_id=operation.operation_id, actor=ACTOR, reason=reason,
                                    evidence={"reasons": list(verdict.reasons)})
            return "failed:approval_required_again"
        decisions.approval_require_again(operation=operation, approval=approval, verdict=verdict, actor=ACTOR)
        return "held:approval_required_again"
    return None


def _stricter(operation: Operation, approval: ApprovalRequest | None, verdict: gate.GateResult) -> bool:
    """Does the verdict ask more than what authorized the operation?"""
    if approval is not None:
        return verdict.risk_tier > approval.risk_tier or verdict.approvals_needed > approval.approvals_needed
    # Authorized without an approval: the gate ran it at once, or (needs_approval) it was
    # authorized at its tier by other means; either way a higher tier than it was given asks more.
    return not operation.needs_approval or verdict.risk_tier > operation.risk_tier


def _retry_exhausted(operation: Operation, tool: Tool, *, now) -> str | None:
    if operation.attempt_count >= tool.max_attempts:
        return f"max attempts ({tool.max_attempts}) reached"
    if now - operation.created_at > timedelta(seconds=tool.total_deadline_seconds):
        return f"total deadline ({tool.total_deadline_seconds}s) passed"
    return None


def _call_provider(operation: Operation, attempt: Attempt,
                   let_go: Callable[[], None] | None = None) -> tuple[Outcome, int]:
    """Step 6, outside any transaction."""
    tool = operation.tool
    adapter = adapter_for(tool)
    started = time.monotonic()
    attributes = {
        "countersign.operation_id": operation.operation_id, "countersign.task_id": operation.task_id,
        "gen_ai.tool.name": tool.name, "gen_ai.tool.call.id": operation.call_id,
        "countersign.attempt": attempt.number, "countersign.fencing_token": attempt.fencing_token,
    }
    with tracer.start_as_current_span("provider.call", attributes=attributes) as span:
        # Client-side fencing: a worker that stalled after its claim (GC pause, SIGSTOP) may
        # have been declared lost and replaced; it must not send once its token is stale.
        if sql.fetchone(sql.connection_for(Operation), _STILL_MINE_SQL,
                        [operation.pk, OperationStatus.DISPATCHED, attempt.fencing_token]) is None:
            span.set_attribute("countersign.fenced", True)
            return not_sent("fenced", transport="none", code="stale_token",
                            raw={"fencing_token": attempt.fencing_token}), 0
        if let_go is not None:
            let_go()
        outcome = None
        if attempt.number > 1 and tool.idempotency == Tool.Idempotency.QUERY and adapter.can_query:
            # The provider does not deduplicate: ask before sending again.
            answer = adapter.query(key=operation.idempotency_key, timeout=tool.timeout_seconds)
            if answer.state == FOUND:
                outcome = known_success(receipt=answer.receipt or {}, code="query",
                                        raw={"pre_send_query": answer.raw})
            elif answer.state != ABSENT:
                outcome = unknown("query_" + answer.state, transport="ok", code=answer.state,
                                  raw={"pre_send_query": answer.raw})
        if outcome is None:
            outcome = adapter.execute(operation.arguments, key=operation.idempotency_key, timeout=tool.timeout_seconds)
        span.set_attribute("countersign.fact", outcome.fact)
    return outcome, int((time.monotonic() - started) * 1000)


def _record(operation: Operation, attempt: Attempt, outcome: Outcome, latency_ms: int) -> tuple[str, Operation | None]:
    """Step 7, then schedule what follows: a retry after backoff, or reconciliation. Returns the
    status the receipt moved the operation to, and the operation (None for a stale result)."""
    tool = operation.tool
    retry_at = None
    terminal = False
    if outcome.fact == Fact.NOT_SENT:
        if outcome.error_class not in tool.retryable_errors:
            terminal = True
        elif attempt.number >= tool.max_attempts or not retry_budget_left(tool):
            terminal = True
        else:
            delay = backoff_delay(tool, attempt.number, outcome.retry_after)
            retry_at = timezone.now() + timedelta(seconds=delay)
    updated, applied = services.operation_record_outcome(
        operation_id=operation.operation_id, attempt_number=attempt.number, fencing_token=attempt.fencing_token,
        fact=outcome.fact, receipt=outcome.receipt, result=outcome.result, error_class=outcome.error_class,
        error_code=outcome.error_code, raw_response=outcome.as_evidence(), latency_ms=latency_ms,
        terminal_failure=terminal, retry_at=retry_at, operation=operation, worker=attempt.worker,
    )
    if not applied:
        logger.warning("stale result for %s attempt %s kept as evidence", operation.operation_id, attempt.number)
        return "stale", None
    if updated.status == OperationStatus.RETRY_SAFE and retry_at is not None:
        tasks.enqueue_dispatch(operation.operation_id, queue=tool.queue,
                         countdown=max(0.0, (retry_at - timezone.now()).total_seconds()))
    elif updated.status == OperationStatus.UNKNOWN:
        tasks.enqueue_reconcile(operation.operation_id)
    return updated.status, updated
