"""Scenario 18 `authority-withdrawn`: authority taken away at a random moment while calls are
proposed, approved and dispatched by the stack's real workers.

A load of refunds (some run at once at L1, some wait for the chaos reviewer at L3; a mix of
provider faults so that retries, unknowns and reconciliations are under way) is proposed by an
agent of its own with tools of their own. At a random moment one withdrawal commits, by index:

- `tool-disabled`: both tools disabled;
- `agent-deactivated`: the agent deactivated;
- `tier-raised`: both tools' base tier raised to L4 (two approvers; the reviewer then rejects
  what is asked again);
- `tenant-stopped`: the tenant stopped, and resumed a moment later.

The invariant on top of the usual ones: **no dispatch on withdrawn authority**. An attempt whose
claim committed before the withdrawal may go on and finish; an attempt that committed after it
is a violation. The harness tells them apart by the ledger's own rows: the attempts of the agent's
operations visible the moment the withdrawal's commit returned (a claim not among them committed
later), and, for a stop, those visible the moment before the resume began; each attempt's
`started_at` (taken at the end of its claim) is reported beside them.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from approvals import stops
from approvals.models import ApprovalRequest, ApprovalStatus, Stop, StopStatus, Tool
from chaos import invariants
from chaos.invariants import SETTLED, Expect, Finding
from chaos.stack import ChaosStack
from chaos.world import (
    AUTHORITY,
    AUTHORITY_APPROVAL,
    CHAOS_TOOLS,
    Trial,
    World,
    order,
    refund_arguments,
    start_task,
)
from console.lib.errors import DomainError
from console.lib.procs import wait_until
from console.models import AgentPrincipal, Membership, Role
from ledger import control, decisions
from ledger.models import Attempt, Operation
from ledger.proposals import call_propose

MODES = ("tool-disabled", "agent-deactivated", "tier-raised", "tenant-stopped")
AGENT_NAME = "chaos-authority-agent"
ADMIN = "chaos-admin"
# Faults that keep attempts, retries and reconciliations under way when the withdrawal lands.
FAULT_MIX = ("ok", "ok", "ok", "fault-5xx-before-commit", "fault-429", "fault-timeout-after-commit",
             "fault-lost-reply", "fault-5xx-after-commit")
CALLS_PER_TRIAL = 12
APPROVAL_SHARE = 0.35  # of the calls go to the L3 tool and wait for the reviewer
WITHDRAW_AFTER = (0.1, 2.5)  # seconds after the load began, uniform
STOP_HOLDS = (0.5, 3.0)  # seconds a tenant stop holds before it is resumed
RAISED_TIER = 4
SETTLE_SECONDS = 60.0


@dataclass
class Withdrawal:
    mode: str
    committed_at: object = None  # when the withdrawal's commit returned (harness clock = ledger clock here)
    visible: frozenset[int] = frozenset()  # the agent's attempts visible right after that commit
    resumed_at: object = None  # a stop: when its resume began
    visible_before_resume: frozenset[int] | None = None
    in_flight: int = 0  # attempts claimed before the withdrawal and not yet finished at it

    @property
    def done(self) -> bool:
        return self.committed_at is not None

    def withdrawn_now(self) -> bool:
        return self.done and (self.mode != "tenant-stopped" or self.resumed_at is None)


@dataclass
class AuthorityWorld:
    world: World
    agent: AgentPrincipal
    admin: object
    tools: dict[str, Tool] = field(default_factory=dict)


def ensure_authority_world(world: World) -> AuthorityWorld:
    """The scenario's own agent and admin, with authority restored as the trial starts: tools
    enabled at their tiers, the agent active, no stop of the tenant in force."""
    with transaction.atomic():
        admin, _ = get_user_model().objects.get_or_create(username=ADMIN)
        Membership.objects.get_or_create(user=admin, tenant=world.tenant, role=Role.ADMIN)
        agent = AgentPrincipal.objects.filter(tenant=world.tenant, name=AGENT_NAME).first()
        if agent is None:
            agent = AgentPrincipal(tenant=world.tenant, name=AGENT_NAME)
            agent.set_token(f"chaos-{uuid.uuid4().hex}")
        agent.is_active = True
        agent.save()
        agent.allowed_tools.set(Tool.objects.filter(name__in=(AUTHORITY, AUTHORITY_APPROVAL)))
        for name in (AUTHORITY, AUTHORITY_APPROVAL):
            Tool.objects.filter(name=name).update(enabled=True, base_tier=CHAOS_TOOLS[name]["base_tier"])
    for stop_id in Stop.objects.filter(tenant=world.tenant, status=StopStatus.STOPPED).values_list("stop_id", flat=True):
        control.stop_resume(stop_id=stop_id, user=admin, reason="chaos: a new trial")
    return AuthorityWorld(world=world, agent=AgentPrincipal.objects.select_related("tenant").get(pk=agent.pk),
                          admin=admin, tools={t.name: t for t in Tool.objects.filter(name__in=(AUTHORITY, AUTHORITY_APPROVAL))})


def _agent_attempts(agent: AgentPrincipal) -> frozenset[int]:
    return frozenset(Attempt.objects.filter(operation__principal_id=agent.pk).values_list("id", flat=True))


def _withdraw(aw: AuthorityWorld, withdrawal: Withdrawal) -> None:
    """Commit the withdrawal the way an administrator's save does, then note what the ledger
    held at that moment."""
    names = (AUTHORITY, AUTHORITY_APPROVAL)
    if withdrawal.mode == "tool-disabled":
        with transaction.atomic():
            Tool.objects.filter(name__in=names).update(enabled=False)
    elif withdrawal.mode == "agent-deactivated":
        with transaction.atomic():
            AgentPrincipal.objects.filter(pk=aw.agent.pk).update(is_active=False)
    elif withdrawal.mode == "tier-raised":
        with transaction.atomic():
            Tool.objects.filter(name__in=names).update(base_tier=RAISED_TIER)
    else:
        stops.stop_create(tenant_id=aw.world.tenant.pk, scope=Stop.Scope.TENANT, user=aw.admin,
                          reason="chaos: authority withdrawn at a random moment")
    withdrawal.committed_at = timezone.now()
    withdrawal.visible = _agent_attempts(aw.agent)
    withdrawal.in_flight = Attempt.objects.filter(pk__in=withdrawal.visible, finished_at__isnull=True).count()


def _resume(aw: AuthorityWorld, withdrawal: Withdrawal) -> None:
    withdrawal.visible_before_resume = _agent_attempts(aw.agent)
    withdrawal.resumed_at = timezone.now()
    for stop_id in Stop.objects.filter(tenant=aw.world.tenant, status=StopStatus.STOPPED).values_list("stop_id", flat=True):
        control.stop_resume(stop_id=stop_id, user=aw.admin, reason="chaos: resumed")


def _review(aw: AuthorityWorld, withdrawal: Withdrawal, stop: threading.Event, problems: list[str]) -> None:
    """The reviewer: approves what waits while authority holds (or again after a resume),
    rejects what waits once it is withdrawn. A decision the product refuses is not a finding."""
    try:
        while not stop.wait(0.05):
            waiting = list(ApprovalRequest.objects.filter(operation__principal_id=aw.agent.pk, status=ApprovalStatus.PENDING)
                           .order_by("pk").values_list("approval_id", flat=True))
            for approval_id in waiting:
                try:
                    if withdrawal.withdrawn_now() and withdrawal.mode != "tenant-stopped":
                        decisions.approval_reject(approval_id=approval_id, reviewer=aw.world.reviewer,
                                                  reason="chaos: authority was withdrawn")
                    elif not withdrawal.withdrawn_now():
                        decisions.approval_approve(approval_id=approval_id, reviewer=aw.world.reviewer,
                                                   reason="chaos: approved")
                except DomainError:
                    pass
    except Exception as exc:  # noqa: BLE001 - reported as a finding by the trial
        problems.append(f"the reviewer failed: {type(exc).__name__}: {exc}")
    finally:
        connection.close()


def _withdrawer(aw: AuthorityWorld, withdrawal: Withdrawal, rng: random.Random, began: float,
                problems: list[str]) -> None:
    try:
        time.sleep(max(0.0, began + rng.uniform(*WITHDRAW_AFTER) - time.monotonic()))
        _withdraw(aw, withdrawal)
        if withdrawal.mode == "tenant-stopped":
            time.sleep(rng.uniform(*STOP_HOLDS))
            _resume(aw, withdrawal)
    except Exception as exc:  # noqa: BLE001
        problems.append(f"the withdrawal failed: {type(exc).__name__}: {exc}")
    finally:
        connection.close()


def _load(aw: AuthorityWorld, withdrawal: Withdrawal, rng: random.Random, problems: list[str]) -> list[str]:
    """Propose the calls; once authority is withdrawn a refusal is the expected answer."""
    ids = []
    for _ in range(CALLS_PER_TRIAL):
        tool = AUTHORITY_APPROVAL if rng.random() < APPROVAL_SHARE else AUTHORITY
        run = start_task(aw.world, goal="chaos: authority withdrawn")
        was_withdrawn = withdrawal.withdrawn_now()
        # Read afresh, as the API's token check does: a deactivated agent is no longer let in.
        agent = AgentPrincipal.objects.select_related("tenant").filter(pk=aw.agent.pk, is_active=True).first()
        if agent is None:
            continue
        try:
            proposal = call_propose(principal=agent, task_id=run.task_id, call_id=f"call-{uuid.uuid4().hex[:12]}",
                                    step_id=run.step_id, tool_name=tool,
                                    arguments=refund_arguments(order(rng.choice(FAULT_MIX))),
                                    expected_version=run.version, fencing_token=run.lease_token)
        except DomainError as exc:
            if not (was_withdrawn or withdrawal.done):
                problems.append(f"a proposal was refused before any withdrawal: {exc}")
            continue
        if proposal.operation_id:
            ids.append(proposal.operation_id)
        elif not (was_withdrawn or withdrawal.done):
            problems.append(f"a proposal was refused before any withdrawal: {list(proposal.reasons)}")
        time.sleep(rng.uniform(0, 0.25))
    return ids


def dispatched_on_withdrawn_authority(withdrawal: Withdrawal):
    """The scenario's invariant for one operation, as an `Expect.extra`."""

    def check(operation: Operation, attempts: list[Attempt]) -> list[str]:
        problems = []
        for attempt in attempts:
            if attempt.pk in withdrawal.visible:
                continue  # claimed before the withdrawal committed: it may finish
            if (withdrawal.mode == "tenant-stopped" and withdrawal.visible_before_resume is not None
                    and attempt.pk not in withdrawal.visible_before_resume):
                continue  # claimed after the resume
            problems.append(f"attempt {attempt.number} (started {attempt.started_at.isoformat()}) committed after "
                            f"the withdrawal ({withdrawal.mode}) committed at {withdrawal.committed_at.isoformat()}")
        return problems

    return check


def authority_withdrawn(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    aw = ensure_authority_world(world)
    withdrawal = Withdrawal(mode=MODES[index % len(MODES)])
    problems: list[str] = []
    stop_reviewing = threading.Event()
    began = time.monotonic()
    threads = [threading.Thread(target=_review, args=(aw, withdrawal, stop_reviewing, problems),
                                name="chaos-reviewer", daemon=True),
               threading.Thread(target=_withdrawer, args=(aw, withdrawal, random.Random(rng.random()), began, problems),
                                name="chaos-withdrawer", daemon=True)]
    for thread in threads:
        thread.start()
    try:
        ids = _load(aw, withdrawal, rng, problems)
        threads[1].join(timeout=30)
        try:
            wait_until(lambda: all(invariants.is_settled(op) for op in ids), timeout=SETTLE_SECONDS,
                       what="the trial's operations to settle")
        except TimeoutError:
            pass  # counted as stuck by the run
    finally:
        stop_reviewing.set()
        for thread in threads:
            thread.join(timeout=30)
        close_old_connections()
    trial = Trial({op: Expect(SETTLED, extra=dispatched_on_withdrawn_authority(withdrawal)) for op in ids})
    trial.findings.extend(Finding(invariants.VIOLATION, "-", problem) for problem in problems)
    if not withdrawal.done:
        trial.findings.append(Finding(invariants.VIOLATION, "-", "the withdrawal never committed"))
    trial.notes.append(f"trial {index}: {withdrawal.mode}, {len(ids)} operation(s), "
                       f"{withdrawal.in_flight} attempt(s) in flight at the withdrawal")
    return trial
