"""The chaos scenarios: each trial creates fresh operations (unique task, step and order IDs, so
unique keys), injects one fault with real processes and signals, waits for the system to go quiet
(a condition with a deadline, never a fixed sleep) and returns what to check.

Numbers follow the issue: 1 kill after provider success, 2 kill before the dispatch commit,
7 duplicate delivery, 8 timeout on a tool without idempotency, 3 zombie worker, 10 retry burst,
11 approval stale while queued, 9 worker clocks off by ±30 s; 6 the database connection cut
mid-commit (dbdrop.py); 4 concurrent identical proposals, 5 one call ID with other arguments and
12 two workers claiming one task (races.py); 13–15 pool children or workers killed, or workers
stopped, at random moments under a mixed-fault load (random_kills.py); 16 authority withdrawn
(tool disabled, agent deactivated, tier raised, tenant stopped) at a random moment around
dispatch (authority.py); 19 the API server killed at a seam of a dispatch it runs itself
(server_kills.py).
"""

from __future__ import annotations

import random
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest
from chaos import invariants
from chaos.authority import authority_withdrawn
from chaos.dbdrop import connection_drop
from chaos.invariants import Expect, Finding
from chaos.races import call_id_mismatch, concurrent_proposals, stale_lease
from chaos.random_kills import random_faults
from chaos.server_kills import kill_server_mid_dispatch
from chaos.stack import ChaosStack
from chaos.tool_kills import kill_http_tool, kill_mcp_tool
from chaos.world import (  # noqa: F401 - ensure_world and QUIET_SECONDS are used through this module
    NEEDS_APPROVAL,
    NO_IDEMPOTENCY,
    NO_RETRY,
    QUIET_SECONDS,
    REFUND,
    Trial,
    World,
    ensure_world,
    kill,
    order,
    propose,
    wait_status,
)
from console.lib.procs import wait_until
from console.models import Event
from ledger import decisions
from ledger.liveness import due_work
from ledger.models import Attempt, Operation, OperationStatus
from ledger.retry import backoff_bounds
from ledger.tasks import dispatch_operation
from runs import services as run_services
from runs.models import Task, TaskStatus
from sandbox.client import effects as provider_effects


def stale_attempts_kept(operation: Operation, attempts: list[Attempt]) -> list[str]:
    first = attempts[0] if attempts else None
    if first is None or not first.stale or first.finished_at is None:
        return ["the zombie's attempt 1 was not kept as stale evidence"]
    return []


# -- the scenarios -------------------------------------------------------------------------------

def kill_after_provider(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """1. The provider committed; the worker dies before the receipt commits. The sweeper marks the
    operation unknown at its deadline; reconciliation finds the effect: confirmed, 1 effect."""
    seam = "after_provider_call"
    p = propose(world, tool=REFUND, order_id=order(), before=lambda op: stack.arm(seam, op))
    pid = stack.wait_blocked(seam, p.operation_id)
    kill(pid)
    return Trial({p.operation_id: Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=1)})


def kill_before_dispatch(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """2. The worker dies inside the claim transaction, before `dispatched` commits: nothing was
    recorded and nothing sent. The message is redelivered (reject on worker lost) or the sweeper
    re-enqueues the still-authorized operation: dispatched again, 1 attempt, 1 effect."""
    seam = "before_dispatch_commit"
    p = propose(world, tool=REFUND, order_id=order(), before=lambda op: stack.arm(seam, op))
    pid = stack.wait_blocked(seam, p.operation_id)
    kill(pid)
    return Trial({p.operation_id: Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=1)})


_RESULT = re.compile(r"Task ledger\.dispatch_operation\[([0-9a-f-]+)\] (succeeded in [0-9.e-]+s: '[^']*'|raised .*)")


def _dispatch_results(stack: ChaosStack) -> dict[str, str]:
    """What each dispatch message did, by Celery task ID, from the workers' logs."""
    results = {}
    for child in stack.worker_children:
        if child.log_path and child.log_path.exists():
            results.update(dict(_RESULT.findall(child.log_path.read_text(errors="replace"))))
    return results


def duplicate_delivery(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """7. The broker delivers one dispatch several times: one or two copies race the original, and
    one more arrives after the operation is confirmed (as after a visibility timeout). Every copy
    is a no-op: 1 attempt, 1 effect."""
    p = propose(world, tool=REFUND, order_id=order())
    copies = [dispatch_operation.apply_async(args=[p.operation_id], queue="fast").id
              for _ in range(rng.choice((1, 2)))]
    trial = Trial({p.operation_id: Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=1)})
    wait_status(p.operation_id, {OperationStatus.CONFIRMED}, timeout=30)
    copies.append(dispatch_operation.apply_async(args=[p.operation_id], queue="fast").id)
    try:
        wait_until(lambda: all(task_id in _dispatch_results(stack) for task_id in copies), timeout=30,
                   what="every duplicate delivery to be consumed")
    except TimeoutError:
        # A copy the broker lost is not a protocol failure (the broker is at-least-once *and*
        # lossy; the ledger and the sweeper do not need it), but it is worth seeing: a note.
        missing = [task_id for task_id in copies if task_id not in _dispatch_results(stack)]
        trial.notes.append(f"{p.operation_id}: the broker never delivered copies {missing} within 30s "
                           f"(worker restarts so far: {len(stack.restarts)})")
    results = _dispatch_results(stack)
    for task_id in copies:
        result = results.get(task_id, "")
        if result and not re.search(r": '(noop:[a-z_]+|deferred:[a-z_]+|confirmed)'$", result):
            trial.findings.append(Finding(invariants.VIOLATION, p.operation_id,
                                          f"duplicate delivery {task_id} {result}"))
    return trial


def timeout_without_idempotency(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """8. The provider commits, then the reply times out, on a tool that can neither dedupe nor be
    asked: unknown, then manual — no blind retry. 1 attempt, 1 effect (for a person to look at)."""
    p = propose(world, tool=NO_IDEMPOTENCY, order_id=order("fault-timeout-after-commit"))
    return Trial({p.operation_id: Expect(frozenset({OperationStatus.MANUAL}), effects=1, attempts=1)})


def zombie_worker(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """3. A worker is SIGSTOPped past its dispatch deadline, then resumed (SIGCONT) after the
    system moved on without it. Its late writes are refused (its attempt kept as stale evidence)
    and no status goes back. Two variants, alternating:

    - frozen after `dispatched` committed, before calling the provider: the sweeper marks the
      operation unknown, reconciliation finds no effect once the old request's horizon passed,
      declares it retry-safe, and attempt 2 (new fencing token) confirms on another worker. The
      zombie then either is fenced before it sends or replays the same key: 2 attempts, 1 effect.
    - frozen after the provider succeeded, before recording: the sweeper marks it unknown and
      reconciliation confirms from the provider; the zombie's success arrives late: 1 attempt,
      1 effect.
    """
    seam = "before_provider_call" if index % 2 == 0 else "after_provider_call"
    p = propose(world, tool=REFUND, order_id=order(), before=lambda op: stack.arm(seam, op))
    pid = stack.wait_blocked(seam, p.operation_id)
    kill(pid, signal.SIGSTOP)
    attempts = 2 if seam == "before_provider_call" else 1
    trial = Trial({p.operation_id: Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=attempts,
                                          extra=stale_attempts_kept)})
    try:
        wait_status(p.operation_id, {OperationStatus.CONFIRMED, OperationStatus.MANUAL, OperationStatus.FAILED}, what="the takeover to settle")
        events_before = Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=p.operation_id).count()
    finally:
        stack.release(seam, p.operation_id)
        kill(pid, signal.SIGCONT)
    wait_until(lambda: Attempt.objects.filter(operation_id=p.operation_id, number=1, finished_at__isnull=False)
               .exists(), timeout=30, what="the zombie's late result")
    events_after = Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=p.operation_id).count()
    if events_after != events_before:
        trial.findings.append(Finding(invariants.VIOLATION, p.operation_id,
                                      f"the zombie's late result wrote {events_after - events_before} event(s)"))
    return trial


def retry_burst(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """10. 429s and 503s: retried within max attempts, never sooner than the backoff (or the
    provider's Retry-After) allows; a tool that retries nothing stops at attempt 1."""
    case = index % 3
    if case == 0:  # every attempt rate limited: retried, then failed, never more than max
        p = propose(world, tool=REFUND, order_id=order(rng.choice(("fault-429-always", "fault-5xx-before-commit-always"))))
        expect = Expect(frozenset({OperationStatus.FAILED}), effects=0, max_attempts=4, extra=_backoff_respected)
    elif case == 1:  # one 503 / 429, then success
        p = propose(world, tool=REFUND, order_id=order(rng.choice(("fault-5xx-before-commit", "fault-429"))))
        expect = Expect(frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=2, extra=_backoff_respected)
    else:  # not retryable on this tool: one attempt, failed
        p = propose(world, tool=NO_RETRY, order_id=order("fault-429-always"))
        expect = Expect(frozenset({OperationStatus.FAILED}), effects=0, attempts=1)
    return Trial({p.operation_id: expect})


# Scheduling slack on top of the backoff window: the broker's ETA, the sweeper's re-enqueue,
# and the circuit breaker's cooldown (it may hold retries back, never bring them forward).
BACKOFF_EARLY_TOLERANCE = 0.25
BACKOFF_LATE_SLACK = 12.0


def _backoff_respected(operation: Operation, attempts: list[Attempt]) -> list[str]:
    problems = []
    tool = operation.tool
    for before, after in zip(attempts, attempts[1:], strict=False):
        if before.finished_at is None:
            problems.append(f"attempt {before.number} never finished but attempt {after.number} ran")
            continue
        retry_after = (before.raw_response or {}).get("retry_after")
        low, high = backoff_bounds(tool, before.number)
        if retry_after is not None:
            low = max(low, min(float(retry_after), tool.backoff_cap_seconds))
            high = max(high, low)
        gap = (after.started_at - before.finished_at).total_seconds()
        if gap < low - BACKOFF_EARLY_TOLERANCE:
            problems.append(f"attempt {after.number} came {gap:.2f}s after {before.number}, before the "
                            f"backoff floor {low:.2f}s")
        if gap > high + BACKOFF_LATE_SLACK:
            problems.append(f"attempt {after.number} came {gap:.2f}s after {before.number}, well past the "
                            f"backoff ceiling {high:.2f}s")
    return problems


def approval_goes_stale(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """11. The approval expires, or the task moves to a new version, while the authorized dispatch
    waits in the queue: the dispatcher's re-check refuses it. Not dispatched, 0 effects."""
    p = propose(world, tool=NEEDS_APPROVAL, order_id=order(), amount=120)
    if p.approval_id is None:
        raise AssertionError(f"expected an approval request, got {p.decision}")
    expires = index % 2 == 0
    # One transaction, so the dispatch message (published on commit) cannot overtake the fault.
    with transaction.atomic():
        decisions.approval_approve(approval_id=p.approval_id, reviewer=world.reviewer, reason="chaos")
        if expires:
            ApprovalRequest.objects.filter(pk=p.approval_id).update(
                expires_at=timezone.now() - timedelta(milliseconds=1))
        else:
            # A real commit of the agent's (waiting for approval and back is Countersign's and
            # keeps the version; the approval moved the task back to running already).
            task = Task.objects.get(pk=p.task_id)
            run_services.task_transition(task_id=p.task_id, to=TaskStatus.WAITING_EXTERNAL,
                                         expected_version=task.version, fencing_token=p.lease_token,
                                         actor=world.agent.ref, reason="the agent moved on while the approval was queued")
    wanted = frozenset({OperationStatus.EXPIRED}) if expires else frozenset({OperationStatus.CANCELLED})
    return Trial({p.operation_id: Expect(wanted, effects=0, attempts=0)})


def clock_skew(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """9. Every worker's clock is off by ±30 s (the stack starts them skewed; beat is not). Safety
    must not depend on clocks: at most one effect, exactly one once confirmed; a skewed worker may
    push an operation to `manual` early, which is safe."""
    fault = rng.choice(("ok", "fault-timeout-after-commit", "fault-429", "fault-5xx-after-commit"))
    p = propose(world, tool=REFUND, order_id=order(fault))
    return Trial({p.operation_id: Expect(frozenset({OperationStatus.CONFIRMED, OperationStatus.MANUAL}))})


@dataclass(frozen=True)
class Scenario:
    number: int
    name: str
    run: Callable[[ChaosStack, World, random.Random, int], Trial]
    workers: int = 2
    worker_skews: tuple[float, ...] = ()
    db_proxy: bool = False  # the workers reach PostgreSQL through the chaos proxy (scenario 6)
    api_server: bool = False  # the stack serves the agent API over HTTP
    needs_postgres: bool = False  # no server connection to drop on SQLite
    pool: str | None = None  # the product's pool (CELERY_WORKER_POOL), or e.g. "prefork"
    concurrency: int = 1
    restart_stalled: bool = False  # the stack restarts a worker that stops progressing, as make run does
    mcp_server: bool = False  # the stack runs the chaos MCP server (scenario 17)

    def stack_options(self) -> dict:
        return {"workers": self.workers, "worker_skews": self.worker_skews, "db_proxy": self.db_proxy,
                "api_server": self.api_server, "pool": self.pool, "concurrency": self.concurrency,
                "restart_stalled": self.restart_stalled, "mcp_server": self.mcp_server}


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario(1, "kill-after-provider", kill_after_provider),
    Scenario(2, "kill-before-dispatch", kill_before_dispatch),
    Scenario(7, "duplicate-delivery", duplicate_delivery),
    Scenario(8, "timeout-no-idempotency", timeout_without_idempotency),
    Scenario(3, "zombie-worker", zombie_worker),
    Scenario(10, "retry-burst", retry_burst),
    Scenario(11, "approval-stale", approval_goes_stale),
    Scenario(9, "clock-skew", clock_skew, worker_skews=(30.0, -30.0)),
    Scenario(6, "db-connection-drop", connection_drop, db_proxy=True, api_server=True, needs_postgres=True),
    Scenario(4, "concurrent-proposals", concurrent_proposals),
    Scenario(5, "call-id-mismatch", call_id_mismatch),
    Scenario(12, "stale-lease", stale_lease),
    Scenario(13, "random-kill-pool-child", random_faults("pool-child"), pool="prefork", concurrency=2,
             restart_stalled=True),
    Scenario(14, "random-kill-worker", random_faults("worker"), pool=None, restart_stalled=True),
    Scenario(15, "random-stop-worker", random_faults("stop"), pool=None, restart_stalled=True),
    Scenario(16, "kill-http-tool", kill_http_tool),
    Scenario(17, "kill-mcp-tool", kill_mcp_tool, mcp_server=True),
    Scenario(18, "authority-withdrawn", authority_withdrawn),
    Scenario(19, "kill-server-mid-dispatch", kill_server_mid_dispatch, api_server=True),
)}


def get_scenario(name: str) -> Scenario:
    for scenario in SCENARIOS.values():
        if name in (scenario.name, str(scenario.number)):
            return scenario
    raise KeyError(f"unknown scenario {name!r}; known: {', '.join(f'{s.number}/{s.name}' for s in SCENARIOS.values())}")


# While a worker lives, nothing due for one may wait longer than this (the stack's clocks
# re-enqueue a lost dispatch after 2 s, and a worker clock skewed by 30 s may age a row by 30 s).
DUE_AGE_LIMIT_SECONDS = 45.0


class Oldest:
    """The oldest due operation's age, sampled while a trial settles."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def sample(self) -> bool:
        self.seconds = max(self.seconds, due_work(timezone.now())[1] or 0.0)
        return True


def run_trial(scenario: Scenario, stack: ChaosStack, world: World, rng: random.Random, index: int,
              *, quiet_seconds: float = QUIET_SECONDS, notes: list[str] | None = None) -> list[Finding]:
    """Drive one trial, wait until its operations settle (or the quiet period runs out), then
    check the invariants against the provider's effect log. Observations that are not findings
    (e.g. a message the broker lost) are appended to `notes`."""
    try:
        trial = scenario.run(stack, world, rng, index)
    except Exception as exc:  # noqa: BLE001 - a trial that could not be driven is a finding, not a crash
        return [Finding(invariants.VIOLATION, "-", f"trial {index} could not be driven: {type(exc).__name__}: {exc}")]
    if notes is not None:
        notes.extend(trial.notes)
    findings = list(trial.findings)
    ids = list(trial.expectations)
    oldest = Oldest()
    try:
        wait_until(lambda: oldest.sample() and all(invariants.is_settled(op) for op in ids), timeout=quiet_seconds,
                   what="the trial's operations to settle")
    except TimeoutError:
        pass  # whatever has not settled is counted as stuck or lost below
    if oldest.seconds > DUE_AGE_LIMIT_SECONDS:
        findings.append(Finding(invariants.STUCK, "-", f"an operation due for a worker waited {oldest.seconds:.0f} s "
                                                        f"(limit {DUE_AGE_LIMIT_SECONDS:.0f} s) while workers lived"))
    for operation_id, expect in trial.expectations.items():
        operation = Operation.objects.filter(pk=operation_id).first()
        if operation is None:
            # Possible only when the trial never got its call into the ledger (scenario 6's agent
            # getting no answer at all); the trial's own finding says why. Not a crash of the run.
            findings.append(Finding(invariants.VIOLATION, operation_id, "the operation was never created"))
            continue
        count = (trial.effects(operation) if trial.effects is not None
                 else len(provider_effects(stack.payments.base_url, key=operation.idempotency_key)))
        found = invariants.check_operation(operation_id, effects=count)
        findings.extend(found)
        if invariants.is_settled(operation_id):
            findings.extend(invariants.check_expectations(operation_id, expect, effects=count))
    return findings
