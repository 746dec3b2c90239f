"""Scenarios 4, 5 and 12: races on the way *into* the ledger, while the stack's real workers
dispatch whatever commits. Each contender is a thread of the harness with its own database
connection, released together by a barrier (after a seeded jitter of up to 5 ms), so on
PostgreSQL the row locks are what decide; on SQLite the IMMEDIATE transactions serialize them.

4. 50 identical proposals (one call ID, one step, one body) → one operation, one call, one
   budget charge, one approval request if the tier needs one; exactly one answer says created.
5. One call ID, other arguments → 422 (intent mismatch), nothing written, no attempt: the
   contenders come one after the other, or all at once (then whichever commits first is the
   call, and the provider's effect carries its amount).
12. Two workers claim one task: a lease holder whose lease expired commits at the moment other
   workers take over. Its commit lands before the takeover or not at all; the token goes up by
   exactly one; after the takeover the old token commits nothing; the new holder finishes the
   step, whose refund happens once.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from approvals.models import ApprovalRequest
from chaos import invariants
from chaos.invariants import Expect, Finding
from chaos.stack import ChaosStack
from chaos.world import (
    NEEDS_APPROVAL,
    REFUND,
    Trial,
    World,
    order,
    refund_arguments,
    start_task,
)
from console.lib.errors import Conflict, DomainError, IntentMismatch
from console.models import Event
from ledger import decisions
from ledger.models import Attempt, Call, Operation, OperationStatus
from ledger.proposals import call_propose
from runs import services as run_services
from runs.models import Lease, Task, TaskStatus
from sandbox.client import effects as provider_effects

CONTENDERS = 50
JITTER_SECONDS = 0.005


def at_once(jobs: list[Callable[[], object]], rng: random.Random) -> list[tuple[str, object]]:
    """Run every job at the same moment, each in its own thread and connection: ("ok", value),
    ("conflict" | "mismatch" | "domain" | "error", exception)."""
    delays = [rng.uniform(0, JITTER_SECONDS) for _ in jobs]
    start = threading.Barrier(len(jobs))
    results: list[tuple[str, object]] = [("error", RuntimeError("never ran"))] * len(jobs)

    def run(index: int) -> None:
        try:
            start.wait(timeout=30)
            time.sleep(delays[index])
            results[index] = ("ok", jobs[index]())
        except IntentMismatch as exc:
            results[index] = ("mismatch", exc)
        except Conflict as exc:
            results[index] = ("conflict", exc)
        except DomainError as exc:
            results[index] = ("domain", exc)
        except Exception as exc:  # noqa: BLE001 - any other outcome is a finding
            results[index] = ("error", exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,), name=f"chaos-race-{i}", daemon=True)  # Ctrl-C must end the run
               for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def _unexpected(results, allowed: set[str]) -> list[str]:
    return sorted({f"{kind}: {type(value).__name__}: {value}" for kind, value in results if kind not in allowed})


def _ledger_counts(task_id: str) -> tuple[int, int, int]:
    """(operations, calls, calls charged to the task's budget)."""
    return (Operation.objects.filter(task_id=task_id).count(), Call.objects.filter(task_id=task_id).count(),
            Task.objects.values_list("calls_used", flat=True).get(pk=task_id))


# -- 4 --------------------------------------------------------------------------------------------

def concurrent_proposals(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """4. Alternating: a call that runs at once (the workers may dispatch it while the later
    copies still arrive: those must answer its status, never dispatch again), and one that needs
    an approval (one request; the harness approves it, then it runs)."""
    needs_approval = index % 2 == 1
    tool = NEEDS_APPROVAL if needs_approval else REFUND
    run = start_task(world, goal="chaos: 50 identical proposals")
    operation_id = run.operation_id(world, tool)
    body = dict(principal=world.agent, task_id=run.task_id, call_id=f"call-{uuid.uuid4().hex[:12]}",
                step_id=run.step_id, tool_name=tool, arguments=refund_arguments(order(), 120 if needs_approval else 25),
                expected_version=run.version, fencing_token=run.lease_token)
    results = at_once([lambda: call_propose(**body)] * CONTENDERS, rng)
    trial = Trial({operation_id: Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=1)})

    def bad(message: str) -> None:
        trial.findings.append(Finding(invariants.VIOLATION, operation_id, message))

    if unexpected := _unexpected(results, {"ok"}):
        bad(f"identical proposals refused: {unexpected[:3]}")
    answers = [value for kind, value in results if kind == "ok"]
    if sum(answer.created for answer in answers) != 1:
        bad(f"{sum(answer.created for answer in answers)} of {len(answers)} answers say created, not 1")
    if {answer.operation_id for answer in answers} - {operation_id}:
        bad(f"answers name other operations: {sorted({a.operation_id for a in answers} - {operation_id})}")
    wanted = "awaiting_approval" if needs_approval else "dispatched"
    if {answer.decision for answer in answers} - {wanted}:
        bad(f"decisions {sorted({answer.decision for answer in answers})}, expected {wanted}")
    if _ledger_counts(run.task_id) != (1, 1, 1):
        bad("operations, calls, budget charges = {}, {}, {} for one call".format(*_ledger_counts(run.task_id)))
    requests = list(ApprovalRequest.objects.filter(operation_id=operation_id))
    if len(requests) != (1 if needs_approval else 0):
        bad(f"{len(requests)} approval requests")
    if needs_approval and len(requests) == 1:
        decisions.approval_approve(approval_id=requests[0].approval_id, reviewer=world.reviewer,
                                           reason="chaos: approve the one request")
    return trial


# -- 5 --------------------------------------------------------------------------------------------

def _other_arguments(base: dict, rng: random.Random) -> dict:
    """Valid arguments that differ from `base` (a 400 would not test the intent check)."""
    changed = dict(base)
    field = rng.choice(("amount", "reason", "order_id"))
    if field == "amount":
        changed["amount"] = rng.choice([a for a in (1, 5, 10, 24, 26, 50, 99, 150) if a != base["amount"]])
    elif field == "reason":
        changed["reason"] = f"chaos {rng.randrange(10**6)}"
    else:
        changed["order_id"] = order()
    return changed


def call_id_mismatch(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """5. Alternating: the other-argument copies come after the first call, one by one; or all of
    them race the first."""
    racing = index % 2 == 1
    run = start_task(world, goal="chaos: one call ID, other arguments")
    operation_id = run.operation_id(world, REFUND)
    call_id = f"call-{uuid.uuid4().hex[:12]}"
    first = refund_arguments(order(), 25)
    others: list[dict] = []
    for _ in range(rng.randint(2, 8)):
        # Pairwise distinct: two identical "other" bodies are one intent, and the second is
        # rightly answered as a repeat of the first (a harness bug the first 200-trial run found).
        while (candidate := _other_arguments(first, rng)) in others:
            pass
        others.append(candidate)

    def job(arguments: dict) -> Callable[[], object]:
        return lambda: call_propose(principal=world.agent, task_id=run.task_id, call_id=call_id,
                                    step_id=run.step_id, tool_name=REFUND, arguments=arguments,
                                    expected_version=run.version, fencing_token=run.lease_token)

    if racing:
        results = at_once([job(arguments) for arguments in [first, *others]], rng)
    else:
        results = at_once([job(first)], rng)
        for arguments in others:
            results += at_once([job(arguments)], rng)
    bodies = [first, *others]
    winners = [i for i, (kind, _) in enumerate(results) if kind == "ok"]
    trial = Trial()

    def bad(message: str) -> None:
        trial.findings.append(Finding(invariants.VIOLATION, operation_id, message))

    if unexpected := _unexpected(results, {"ok", "mismatch"}):
        bad(f"other outcomes than created or 422: {unexpected[:3]}")
    if len(winners) != 1 or (not racing and winners != [0]):
        bad(f"{len(winners)} proposals accepted (positions {winners}), expected exactly the first one")
    if any(getattr(value, "status", None) != 422 for kind, value in results if kind == "mismatch"):
        bad("an intent mismatch that is not an HTTP 422")
    if _ledger_counts(run.task_id) != (1, 1, 1):
        bad("operations, calls, budget charges = {}, {}, {} after one accepted call".format(*_ledger_counts(run.task_id)))
    if not winners:
        return trial
    accepted = bodies[winners[0]]
    operation = Operation.objects.filter(pk=operation_id).first()
    if operation is not None and operation.arguments != accepted:
        bad(f"the ledger holds {operation.arguments}, but the accepted call was {accepted}")

    def effect_is_the_accepted_call(operation: Operation, attempts: list[Attempt]) -> list[str]:
        seen = [(effect["payload"].get("order_id"), float(effect["payload"].get("amount") or 0)) for effect in
                provider_effects(stack.payments.base_url, key=operation.idempotency_key)]
        wanted = [(accepted["order_id"], float(accepted["amount"]))]
        return [] if seen == wanted else [f"provider effects {seen}, expected the accepted call's {wanted}"]

    trial.expectations[operation_id] = Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=1,
                                              extra=effect_is_the_accepted_call)
    return trial


# -- 12 -------------------------------------------------------------------------------------------

def stale_lease(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """12. The old holder (its lease past expiry: the takeover is asked with a clock 61 s ahead)
    commits — a task transition or the step's proposal, alternating — at the moment 1–7 other
    workers try to take the task over."""
    old_proposes = index % 2 == 0
    run = start_task(world, goal="chaos: two workers, one task", owner="old", ttl_seconds=60)
    operation_id = run.operation_id(world, REFUND)
    arguments = refund_arguments(order(), 25)
    later = timezone.now() + timedelta(seconds=61)
    contenders = rng.randint(1, 7)
    version = run.version

    def old_commit():
        if old_proposes:
            return call_propose(principal=world.agent, task_id=run.task_id, call_id="call-old", step_id=run.step_id,
                                tool_name=REFUND, arguments=arguments, expected_version=version,
                                fencing_token=run.lease_token)
        # A real move (running → running would be a no-op that writes nothing, found by the
        # first 200-trial run): the old holder starts waiting on something external.
        return run_services.task_transition(task_id=run.task_id, to=TaskStatus.WAITING_EXTERNAL,
                                            expected_version=version, fencing_token=run.lease_token,
                                            actor="worker:old", reason="the old holder's late commit")

    takeovers = [lambda owner=f"new{i}": decisions.lease_acquire(task_id=run.task_id, owner=owner,
                                                                     ttl_seconds=600, now=later)
                 for i in range(contenders)]
    order_of_jobs = [old_commit, *takeovers]
    results = at_once(order_of_jobs, rng)
    trial = Trial()

    def bad(message: str) -> None:
        trial.findings.append(Finding(invariants.VIOLATION, operation_id, message))

    old_kind, _ = results[0]
    won = [value for kind, value in results[1:] if kind == "ok"]
    if old_kind not in ("ok", "conflict"):
        bad(f"the old holder's commit ended {old_kind}: {results[0][1]!r}")
    if unexpected := _unexpected(results[1:], {"ok", "conflict"}):
        bad(f"takeovers failed otherwise than by conflict: {unexpected[:3]}")
    if len(won) != 1:
        bad(f"{len(won)} of {contenders} takeovers won, not 1")
        return trial
    lease = Lease.objects.get(pk=run.task_id)
    if (lease.owner, lease.fencing_token) != (won[0].owner, run.lease_token + 1):
        bad(f"lease is {lease.owner} with token {lease.fencing_token}; expected {won[0].owner}, {run.lease_token + 1}")
    takeover = Event.objects.filter(entity=Event.Entity.LEASE, entity_id=run.task_id, actor=f"worker:{won[0].owner}").order_by("id").first()
    if old_kind == "ok":
        # It landed: then before the takeover, never after.
        landed = (Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation_id).order_by("id").first()
                  if old_proposes else
                  Event.objects.filter(entity=Event.Entity.TASK, entity_id=run.task_id, actor="worker:old").order_by("-id").first())
        if takeover is None or landed is None or landed.id > takeover.id:
            bad(f"the old holder's commit (event {landed and landed.id}) landed after the takeover "
                f"(event {takeover and takeover.id})")
    # After the takeover the old token writes nothing, whatever it tries.
    def next_move() -> str:
        current = Task.objects.values_list("status", flat=True).get(pk=run.task_id)
        return TaskStatus.WAITING_EXTERNAL if current == TaskStatus.RUNNING else TaskStatus.RUNNING

    for attempt, late in (("transition", lambda: run_services.task_transition(
            task_id=run.task_id, to=next_move(), expected_version=Task.objects.get(pk=run.task_id).version,
            fencing_token=run.lease_token, actor="worker:old")),
                          ("proposal", lambda: call_propose(
            principal=world.agent, task_id=run.task_id, call_id="call-old-late", step_id="late",
            tool_name=REFUND, arguments=refund_arguments(order(), 10),
            expected_version=Task.objects.get(pk=run.task_id).version, fencing_token=run.lease_token))):
        try:
            late()
            bad(f"the stale token's {attempt} committed after the takeover")
        except Conflict:
            pass
    # The new holder finishes the step: the old holder's operation if it landed, else a new one.
    task = Task.objects.get(pk=run.task_id)
    if task.status != TaskStatus.RUNNING:
        run_services.task_transition(task_id=run.task_id, to=TaskStatus.RUNNING, expected_version=task.version,
                                     fencing_token=lease.fencing_token, actor=f"worker:{lease.owner}")
    answer = call_propose(principal=world.agent, task_id=run.task_id, call_id="call-new", step_id=run.step_id,
                          tool_name=REFUND, arguments=arguments,
                          expected_version=Task.objects.get(pk=run.task_id).version,
                          fencing_token=lease.fencing_token)
    if answer.operation_id != operation_id:
        bad(f"the new holder's step is operation {answer.operation_id}, not {operation_id}")
    if answer.created == (old_kind == "ok" and old_proposes):
        bad(f"the new holder's proposal created={answer.created}, but the old one landed={old_kind == 'ok'}")
    if Operation.objects.filter(task_id=run.task_id).count() != 1:
        bad(f"{Operation.objects.filter(task_id=run.task_id).count()} operations for one step")
    trial.expectations[operation_id] = Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=1)
    return trial
