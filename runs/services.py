"""Every write to tasks, steps and leases."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone

from console.lib import sql
from console.lib.canonical import sha256_hex
from console.lib.errors import (
    Conflict,
    IntentMismatch,
    InvalidInput,
    NotFound,
    NotPermitted,
    StaleFencingToken,
)
from console.lib.ids import new_id
from console.lib.transitions import record_event, transition
from console.models import AgentPrincipal, Event, Membership, Role
from runs import tasks
from runs.models import TASK_TERMINAL, BudgetCounter, Lease, Step, Task, TaskStatus

CONTRACT_FIELDS = ("task_type", "goal", "inputs", "success_criteria", "constraints", "versions")


def contract_hash(contract: dict[str, Any]) -> str:
    """What an Idempotency-Key binds to: the canonical hash of the contract's fields (absent
    optional fields count as their empty defaults)."""
    defaults = {"inputs": {}, "success_criteria": [], "constraints": {}, "versions": {}}
    return sha256_hex({name: contract.get(name) or defaults.get(name) for name in CONTRACT_FIELDS})


def task_create(
    *,
    principal: AgentPrincipal,
    task_type: str,
    goal: str,
    inputs: dict[str, Any] | None = None,
    success_criteria: list[Any] | None = None,
    constraints: dict[str, Any] | None = None,
    versions: dict[str, Any] | None = None,
    idempotency_key: str = "",
    created_by: Any = None,
) -> Task:
    """Register a contract. `created_by`: the person who registered it, when a person did; they
    may not confirm its success (`task_review_decide`)."""
    with transaction.atomic():
        task = Task.objects.create(
            task_id=new_id("tsk"),
            tenant_id=principal.tenant_id,
            actor=principal,
            task_type=task_type,
            goal=goal,
            inputs=inputs or {},
            success_criteria=success_criteria or [],
            constraints=constraints or {},
            versions=versions or {},
            idempotency_key=idempotency_key,
            created_by=created_by,
            contract_hash=contract_hash({"task_type": task_type, "goal": goal, "inputs": inputs,
                                         "success_criteria": success_criteria, "constraints": constraints,
                                         "versions": versions}),
        )
        record_event(
            entity=Task.EVENT_ENTITY, entity_id=task.task_id, tenant_id=task.tenant_id,
            kind=Event.Kind.CREATED, to_status=task.status, actor=principal.ref, reason="task contract registered",
        )
    return task


def task_create_or_get(*, principal: AgentPrincipal, idempotency_key: str, **contract: Any) -> tuple[Task, bool]:
    """The agent's task for this key, created if new: (task, created). The same key with
    another contract is IntentMismatch (422). Two requests with one key at once make one task:
    the unique constraint decides, and the loser reads the winner's row."""
    wanted = contract_hash(contract)

    def existing() -> Task | None:
        task = Task.objects.filter(actor=principal, idempotency_key=idempotency_key).first()
        if task is not None and task.contract_hash != wanted:
            raise IntentMismatch(
                "This Idempotency-Key was used before with another task contract.",
                details={"idempotency_key": idempotency_key, "task_id": task.task_id},
            )
        return task

    task = existing()
    if task is not None:
        return task, False
    try:
        with transaction.atomic():
            return task_create(principal=principal, idempotency_key=idempotency_key, **contract), True
    except IntegrityError:
        task = existing()
        if task is None:
            raise
        return task, False


def _locked_lease(task: Task) -> Lease | None:
    # Locks the lease row so a takeover and a commit under the old token serialize (PostgreSQL);
    # on SQLite the IMMEDIATE transaction already serializes writers.
    return Lease.objects.select_for_update().filter(task_id=task.task_id).first()


_READ = object()


def check_fencing_token(task: Task, fencing_token: int | None, *, locked_lease: Lease | None | object = _READ) -> None:
    """Only the current lease holder may change a task. Call inside a transaction. A caller
    that already locked the task's lease row in this transaction passes it (None: no lease)."""
    lease = _locked_lease(task) if locked_lease is _READ else locked_lease
    if lease is None:
        raise Conflict("The task has no lease; acquire one first.", details={"task_id": task.task_id})
    if fencing_token != lease.fencing_token:
        raise StaleFencingToken(
            "Stale fencing token: another worker holds the task now.",
            details={"task_id": task.task_id, "fencing_token": fencing_token, "current": lease.fencing_token},
        )


def task_transition(
    *,
    task_id: str,
    to: str,
    expected_version: int,
    fencing_token: int | None,
    actor: str,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    superseded_by: str = "",
) -> Task:
    """An agent moves its task. `succeeded` is never the agent's word: it needs a verifier.
    Cancelling with `superseded_by` names the task (same tenant) that replaces this one."""
    if to not in TaskStatus.values:
        raise InvalidInput(f"Unknown task status {to!r}.", details={"to": to})
    if superseded_by and to != TaskStatus.CANCELLED:
        raise InvalidInput("superseded_by goes with to=cancelled.", details={"to": to})
    if to == TaskStatus.SUCCEEDED:
        raise NotPermitted(
            "A task succeeds only through its verifier; move it to 'verifying' with evidence.",
            details={"to": to},
        )
    if to == TaskStatus.WAITING_REVIEW:
        raise NotPermitted(
            "A task waits for a success review when its verifiers say so; move it to 'verifying'.",
            details={"to": to},
        )
    if to == TaskStatus.WAITING_APPROVAL:
        raise NotPermitted(
            "A task waits for approval exactly while one of its calls does; Countersign moves it.",
            details={"to": to},
        )
    with transaction.atomic():
        task = Task.objects.filter(task_id=task_id).first()
        if task is None:
            raise NotFound(f"No task {task_id}.")
        check_fencing_token(task, fencing_token)
        if task.version != expected_version:
            raise Conflict(
                "Stale expected_version.",
                details={"task_id": task_id, "expected_version": expected_version, "version": task.version},
            )
        if to == TaskStatus.RUNNING and task.status == TaskStatus.WAITING_APPROVAL:
            # Waiting for a person is Countersign's to end (when the last held call is decided);
            # the agent may go on proposing meanwhile. An agent saying "running" is already so.
            return task
        changes: dict[str, Any] = {"version": F("version") + 1}
        if superseded_by:
            if superseded_by == task_id or not Task.objects.filter(task_id=superseded_by,
                                                                   tenant_id=task.tenant_id).exists():
                raise InvalidInput("superseded_by must name another task of this tenant.",
                                   details={"superseded_by": superseded_by})
            changes["superseded_by_id"] = superseded_by
            evidence = {**(evidence or {}), "superseded_by": superseded_by}
        transition(
            task, to=to, actor=actor, reason=reason, evidence=evidence,
            guard={"version": expected_version}, changes=changes,
        )
        if to == TaskStatus.VERIFYING:
            transaction.on_commit(lambda: tasks.enqueue_verification(task_id))
    return task


def step_get_or_create(*, task: Task, step_id: str) -> Step:
    step, _ = Step.objects.get_or_create(task=task, step_id=step_id)
    return step


def lease_acquire(*, task_id: str, owner: str, ttl_seconds: int, now=None, retake: bool = False) -> Lease:
    """Take or renew the task's lease. The same owner renews and keeps its token; a new owner
    may take over only an expired lease, with generation and fencing token + 1 (and
    `taken_over` set on the lease returned). Callers go through `ledger.decisions.lease_acquire`,
    which deals with what the previous holder left in flight.

    `retake`: the same owner starting again (a restarted agent process) gets its own live lease
    with generation and fencing token + 1, so the process it replaces can no longer commit.
    Operations already dispatched stay the dispatcher's: the agent's restart says nothing about
    them, so this is not a takeover."""
    if not 1 <= ttl_seconds <= 3600:
        raise InvalidInput("ttl_seconds must be between 1 and 3600.", details={"ttl_seconds": ttl_seconds})
    now = now or timezone.now()
    expires_at = now + timedelta(seconds=ttl_seconds)
    with transaction.atomic():
        task = Task.objects.filter(task_id=task_id).first()
        if task is None:
            raise NotFound(f"No task {task_id}.")
        if task.status in TASK_TERMINAL:
            raise Conflict(f"Task {task_id} is {task.status}; it takes no lease.")
        lease = _locked_lease(task)
        if lease is None:
            try:
                with transaction.atomic():
                    lease = Lease.objects.create(task=task, owner=owner, expires_at=expires_at, acquired_at=now)
            except IntegrityError as exc:
                raise Conflict("Another worker took the lease at the same moment.") from exc
            kind = Event.Kind.LEASE_ACQUIRED
        elif lease.owner == owner and lease.is_live(now) and retake:
            updated = Lease.objects.filter(task_id=task_id, fencing_token=lease.fencing_token).update(
                expires_at=expires_at, acquired_at=now,
                generation=F("generation") + 1, fencing_token=F("fencing_token") + 1,
            )
            if updated != 1:
                raise Conflict("Another worker took the lease at the same moment.")
            lease.refresh_from_db()
            kind = Event.Kind.LEASE_ACQUIRED
        elif lease.owner == owner and lease.is_live(now):
            updated = Lease.objects.filter(
                task_id=task_id, owner=owner, fencing_token=lease.fencing_token
            ).update(expires_at=expires_at)
            if updated != 1:
                raise Conflict("The lease changed while renewing it.")
            lease.expires_at = expires_at
            return lease  # a renewal is not a state change: no event
        elif lease.is_live(now):
            raise Conflict(
                f"Task {task_id} is leased to another worker until {lease.expires_at.isoformat()}.",
                details={"owner": lease.owner, "expires_at": lease.expires_at.isoformat()},
            )
        else:
            updated = Lease.objects.filter(
                task_id=task_id, fencing_token=lease.fencing_token
            ).update(
                owner=owner, expires_at=expires_at, acquired_at=now,
                generation=F("generation") + 1, fencing_token=F("fencing_token") + 1,
            )
            if updated != 1:
                raise Conflict("Another worker took the lease at the same moment.")
            lease.refresh_from_db()
            kind = Event.Kind.LEASE_TAKEN_OVER
            lease.taken_over = True
        record_event(
            entity=Event.Entity.LEASE, entity_id=task_id, tenant_id=task.tenant_id, kind=kind,
            actor=f"worker:{owner}", reason=f"{Event.Kind(kind).label} by {owner}",
            evidence={"fencing_token": lease.fencing_token, "generation": lease.generation,
                      "expires_at": expires_at.isoformat()},
        )
    return lease


def task_lock(*, task_id: str) -> Task:
    """The task row, locked until the end of the caller's transaction (PostgreSQL; on SQLite
    the IMMEDIATE transaction already serializes writers)."""
    return Task.objects.select_for_update().get(pk=task_id)


# Countersign's own moves between `running` and `waiting_approval` keep the version: the version
# is the agent's (its transitions and its state), so a call held for a person neither makes the
# agent's `expected_version` stale nor, when it is decided, invalidates another held call.


def task_wait_for_approval(*, task: Task, actor: str, reason: str, evidence: dict[str, Any] | None = None) -> Task:
    """running → waiting_approval, the version unchanged. Already waiting: a no-op. Called by
    the proposal pipeline with the task row locked."""
    if task.status == TaskStatus.WAITING_APPROVAL:
        return task
    transition(task, to=TaskStatus.WAITING_APPROVAL, actor=actor, reason=reason, evidence=evidence,
               guard={"version": task.version})
    return task


def task_stop_waiting(*, task: Task, actor: str, reason: str, evidence: dict[str, Any] | None = None) -> Task:
    """waiting_approval → running, the version unchanged, once no call of the task waits for a
    person (the caller holds the task row and has checked)."""
    transition(task, to=TaskStatus.RUNNING, actor=actor, reason=reason, evidence=evidence,
               guard={"version": task.version})
    return task


def task_release_budget(*, task_id: str, calls: int, writes: int, amount) -> None:
    """Give back budget a call reserved (a reviewer's edit replaced it before it ran); never
    below zero."""
    Task.objects.filter(pk=task_id).update(
        calls_used=Greatest(F("calls_used") - calls, 0),
        writes_used=Greatest(F("writes_used") - writes, 0),
        amount_used=Greatest(F("amount_used") - amount, 0),
    )


def budget_counters_lock(*, tenant_id: int, keys: list[tuple[str, str]]) -> list[BudgetCounter]:
    """The counters named by (scope key, period), created at zero if new, locked in key order
    (every proposal locks in the same order, so two never wait on each other). Call inside the
    proposal's transaction; it writes them back with its call (`budget_counters_spend`)."""
    keys = sorted(keys)
    if not keys:
        return []
    sql.insert(BudgetCounter, [{"scope_key": key, "period": period, "tenant_id": tenant_id, "calls": 0,
                                "writes": 0, "amount": 0} for key, period in keys], ignore_conflicts=True)
    wanted = set(keys)
    rows = (BudgetCounter.objects.select_for_update()
            .filter(scope_key__in={key for key, _ in keys}, period__in={period for _, period in keys})
            .order_by("scope_key", "period"))
    return [row for row in rows if (row.scope_key, row.period) in wanted]


def budget_counters_read(keys: list[tuple[str, str]]) -> list[BudgetCounter]:
    """The same counters without a lock or a write (a dry run's view)."""
    if not keys:
        return []
    wanted = set(keys)
    rows = BudgetCounter.objects.filter(scope_key__in={key for key, _ in keys},
                                        period__in={period for _, period in keys})
    return [row for row in rows if (row.scope_key, row.period) in wanted]


def budget_counters_spend(counters: list[BudgetCounter], *, writes: int, amount) -> list[sql.Update]:
    """The counters' writes once one more call is counted, for the proposal's statement (the
    rows are locked, so the new values are the ones read plus this call's)."""
    return [(BudgetCounter, {"pk": row.pk}, {"calls": row.calls + 1, "writes": row.writes + writes,
                                             "amount": row.amount + amount}) for row in counters]


def task_pause(*, task: Task, actor: str, reason: str, evidence: dict[str, Any] | None = None) -> Task:
    """→ paused (a budget ran out), compare-and-set on version, version + 1. Already paused: no-op."""
    transition(
        task, to=TaskStatus.PAUSED, actor=actor, reason=reason, evidence=evidence,
        guard={"version": task.version}, changes={"version": F("version") + 1},
    )
    return task


def task_record_verification(*, task_id: str, expected_version: int, result: str,
                             evidence: dict[str, Any]) -> Task:
    """The verifiers' verdict on a `verifying` task: met → succeeded; contradicted → failed;
    not yet → back to running (the agent may continue); met but for human criteria →
    waiting_review (a reviewer decides, `task_review_decide`). Each criterion's verdict is kept
    on the task (`verdicts`) for the run page. Compare-and-set on the version the verifier read,
    so a task that moved meanwhile is not judged on stale evidence."""
    to = VERIFICATION_MOVES[result]
    with transaction.atomic():
        task = Task.objects.filter(task_id=task_id).first()
        if task is None:
            raise NotFound(f"No task {task_id}.")
        if task.status != TaskStatus.VERIFYING or task.version != expected_version:
            raise Conflict("The task moved while it was being verified.",
                           details={"status": task.status, "version": task.version})
        transition(task, to=to, actor="system:verifier", reason=VERIFICATION_REASONS[result], evidence=evidence,
                   guard={"version": expected_version},
                   changes={"version": F("version") + 1, "verdicts": evidence.get("criteria", [])})
    return task


VERIFICATION_MOVES = {"met": TaskStatus.SUCCEEDED, "failed": TaskStatus.FAILED, "pending": TaskStatus.RUNNING,
                      "review": TaskStatus.WAITING_REVIEW}
VERIFICATION_REASONS = {"met": "every success criterion met", "failed": "a success criterion failed",
                        "pending": "a success criterion is not settled yet: back to the agent",
                        "review": "the ledger's checks met; waiting for a success review"}
REVIEW_MOVES = {"confirm": TaskStatus.SUCCEEDED, "reject": TaskStatus.FAILED}
MAX_REVIEW_EVIDENCE = 4000


def may_review_success(user: Any, task: Task) -> bool:
    """A reviewer of the task's tenant who did not register the task. An agent is no person:
    it never decides its own task's success."""
    if isinstance(user, AgentPrincipal) or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    if task.created_by_id is not None and task.created_by_id == user.pk:
        return False
    return user.pk in reviewer_ids(task.tenant_id)


def reviewer_ids(tenant_id: int) -> set[int]:
    return set(Membership.objects.filter(tenant_id=tenant_id, role=Role.REVIEWER).values_list("user_id", flat=True))


def task_review_decide(*, task_id: str, user: Any, decision: str, evidence: str) -> Task:
    """A reviewer decides a task's human success criteria: confirm → succeeded, reject →
    failed, with their evidence (required) in the event and in each human criterion's verdict.
    Separation of duties: never the agent, never the person who registered the task. A
    compare-and-set on the version; already decided: a Conflict naming the status."""
    if decision not in REVIEW_MOVES:
        raise InvalidInput("Confirm or reject.", details={"decision": decision})
    evidence = (evidence or "").strip()
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(task_id=task_id).first()
        if task is None:
            raise NotFound(f"No task {task_id}.")
        if isinstance(user, AgentPrincipal):
            raise NotPermitted("An agent never decides its own task's success.", details={"task_id": task_id})
        if task.created_by_id is not None and task.created_by_id == getattr(user, "pk", None):
            raise NotPermitted("You registered this task: another reviewer decides its success.",
                               details={"task_id": task_id})
        if not may_review_success(user, task):
            raise NotPermitted("Only a reviewer of the task's tenant decides its success.",
                               details={"task_id": task_id})
        if task.status != TaskStatus.WAITING_REVIEW:
            raise Conflict(f"The task is {task.status}: it waits for no success review.",
                           details={"status": task.status})
        if not evidence:
            raise InvalidInput("Give your evidence: what you checked, and where.", details={"field": "evidence"})
        if len(evidence) > MAX_REVIEW_EVIDENCE:
            raise InvalidInput(f"Evidence has at most {MAX_REVIEW_EVIDENCE} characters.",
                               details={"field": "evidence"})
        by = f"user:{user.get_username()}"
        at = timezone.now()
        review = {"decision": decision, "by": by, "at": at.isoformat(), "evidence": evidence}
        verdicts = [_reviewed(v, review) for v in (task.verdicts or [])]
        transition(task, to=REVIEW_MOVES[decision], actor=by,
                   reason=f"success {'confirmed' if decision == 'confirm' else 'rejected'} by a reviewer: {evidence}",
                   evidence={"review": review, "criteria": verdicts}, guard={"version": task.version},
                   changes={"version": F("version") + 1, "verdicts": verdicts})
    return task


def _reviewed(verdict: dict[str, Any], review: dict[str, Any]) -> dict[str, Any]:
    if verdict.get("result") != "review":
        return verdict
    result = "met" if review["decision"] == "confirm" else "failed"
    return {**verdict, "result": result, "evidence": {"review": review}}


def task_cancel_by_person(*, task_id: str, actor: str, reason: str) -> Task:
    """A person cancels the task from the run page (no lease needed: a person overrides the
    agent). Callers go through `ledger.control.task_cancel`, which closes what it left waiting."""
    return _task_set_by_person(task_id=task_id, to=TaskStatus.CANCELLED, actor=actor, reason=reason)


def task_pause_by_person(*, task_id: str, actor: str, reason: str) -> Task:
    """A person pauses the task from the run page; the dispatcher holds its operations."""
    return _task_set_by_person(task_id=task_id, to=TaskStatus.PAUSED, actor=actor, reason=reason)


def task_resume(*, task_id: str, actor: str, reason: str) -> Task:
    """paused → running (a person's pause, or a budget's after the budget was raised)."""
    return _task_set_by_person(task_id=task_id, to=TaskStatus.RUNNING, actor=actor, reason=reason)


def _task_set_by_person(*, task_id: str, to: str, actor: str, reason: str) -> Task:
    """A compare-and-set on the version like every task move, version + 1, so the agent's next
    commit under its old version is refused and it reads the task again. Already there: a no-op."""
    if not (reason or "").strip():
        raise InvalidInput("Say why: the agent and everyone on the run page are told.", details={"field": "reason"})
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(task_id=task_id).first()
        if task is None:
            raise NotFound(f"No task {task_id}.")
        if to == TaskStatus.RUNNING and task.status not in (TaskStatus.PAUSED, TaskStatus.RUNNING):
            raise Conflict(f"Only a paused task resumes; this one is {task.status}.", details={"status": task.status})
        transition(task, to=to, actor=actor, reason=reason.strip(),
                   guard={"version": task.version}, changes={"version": F("version") + 1})
    return task
