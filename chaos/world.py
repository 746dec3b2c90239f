"""What every chaos trial starts from: the chaos tenant, agent, reviewer and tool variants
(ensure_world), a fresh running task with its lease (start_task), one proposal (propose), and the
small helpers the scenarios share."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.db import transaction

from approvals.defaults import REFUND_SCHEMA, ensure_policy_defaults
from approvals.models import Tool
from chaos.invariants import Expect, Finding
from chaos.stack import TOOL_TIMEOUT_SECONDS
from console.lib.ids import derive_operation_id
from console.lib.procs import wait_until
from console.models import AgentPrincipal, Membership, Role, Tenant
from ledger import decisions
from ledger.models import Operation
from ledger.proposals import call_propose
from runs import services as run_services
from runs.models import Task, TaskStatus

QUIET_SECONDS = 60.0
TENANT_SLUG = "chaos"
AGENT_NAME = "chaos-agent"
REVIEWER = "chaos-reviewer"

# Tool variants of payments.refund, so a chaos run never edits the product's own tools.
REFUND = "chaos.refund"  # native idempotency key, retries rate limits and 503s
NO_IDEMPOTENCY = "chaos.refund-no-idempotency"  # scenario 8: the provider cannot be asked
NO_RETRY = "chaos.refund-no-retry"  # scenario 10: nothing is retryable
NEEDS_APPROVAL = "chaos.refund-approval"  # scenario 11: L3, one reviewer
AUTHORITY = "chaos.refund-authority"  # scenario 18: runs at once (L1); disabled or raised mid-trial
AUTHORITY_APPROVAL = "chaos.refund-authority-approval"  # scenario 18: L3, one reviewer

_TOOL_BASE = dict(
    adapter="payments.refund", json_schema=REFUND_SCHEMA, kind=Tool.Kind.WRITE, queue=Tool.Queue.FAST,
    timeout_seconds=TOOL_TIMEOUT_SECONDS, max_attempts=4, total_deadline_seconds=300,
    backoff_base_seconds=0.5, backoff_cap_seconds=4.0, business_key="order_id", enabled=True,
    retryable_errors=["rate_limited", "unavailable", "connect"], idempotency=Tool.Idempotency.NATIVE, base_tier=1,
    description="Chaos harness variant of payments.refund.",
)
CHAOS_TOOLS = {
    REFUND: {},
    NO_IDEMPOTENCY: {"idempotency": Tool.Idempotency.NONE},
    NO_RETRY: {"retryable_errors": []},
    NEEDS_APPROVAL: {"base_tier": 3},
    AUTHORITY: {"base_tier": 1},
    AUTHORITY_APPROVAL: {"base_tier": 3},
}


@dataclass
class World:
    tenant: Tenant
    agent: AgentPrincipal
    reviewer: object
    api_token: str  # the agent's bearer token, for scenarios that go through the HTTP API


def ensure_world() -> World:
    """Tools, tenant, agent and reviewer of the chaos runs; idempotent. The agent gets a fresh
    bearer token each time (only its hash is stored): one chaos run per database."""
    ensure_policy_defaults()
    api_token = f"chaos-{uuid.uuid4().hex}"
    with transaction.atomic():
        for name, overrides in CHAOS_TOOLS.items():
            Tool.objects.update_or_create(name=name, defaults={**_TOOL_BASE, **overrides})
        tenant, _ = Tenant.objects.get_or_create(slug=TENANT_SLUG, defaults={"name": "Chaos"})
        agent = AgentPrincipal.objects.filter(tenant=tenant, name=AGENT_NAME).first()
        if agent is None:
            agent = AgentPrincipal(tenant=tenant, name=AGENT_NAME)
        agent.set_token(api_token)
        agent.save()
        agent.allowed_tools.set(Tool.objects.filter(name__in=CHAOS_TOOLS))
        reviewer, _ = get_user_model().objects.get_or_create(username=REVIEWER)
        Membership.objects.update_or_create(user=reviewer, tenant=tenant, role=Role.REVIEWER,
                                            defaults={"max_tier": 4})
    return World(tenant=tenant, agent=agent, reviewer=reviewer, api_token=api_token)


# -- one trial ---------------------------------------------------------------------------------

@dataclass
class Trial:
    expectations: dict[str, Expect] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)  # found while driving the trial
    notes: list[str] = field(default_factory=list)
    # How many effects the provider holds for an operation; None: the payments sandbox's log,
    # by the operation's key.
    effects: Callable[[Operation], int] | None = None


@dataclass
class Proposed:
    operation_id: str
    task_id: str
    lease_token: int
    approval_id: str | None
    decision: str


@dataclass(frozen=True)
class Running:
    task_id: str
    lease_token: int
    step_id: str = "refund"

    @property
    def version(self) -> int:
        return Task.objects.values_list("version", flat=True).get(pk=self.task_id)

    def operation_id(self, world: World, tool: str) -> str:
        return derive_operation_id(tenant=world.tenant.slug, task_id=self.task_id, step_id=self.step_id, tool=tool)


def start_task(world: World, *, goal: str, owner: str = "chaos-harness", ttl_seconds: int = 3600) -> Running:
    """A fresh task, leased by `owner` and running."""
    agent = world.agent
    task = run_services.task_create(principal=agent, task_type="chaos", goal=goal)
    lease = decisions.lease_acquire(task_id=task.task_id, owner=owner, ttl_seconds=ttl_seconds)
    for to in (TaskStatus.PLANNING, TaskStatus.RUNNING):
        version = Task.objects.get(pk=task.task_id).version
        run_services.task_transition(task_id=task.task_id, to=to, expected_version=version,
                                     fencing_token=lease.fencing_token, actor=agent.ref)
    return Running(task.task_id, lease.fencing_token)


def refund_arguments(order_id: str, amount: float = 25, **changes) -> dict:
    return {"order_id": order_id, "amount": amount, "currency": "EUR", "reason": "chaos", **changes}


def propose(world: World, *, tool: str, order_id: str, amount: float = 25,
            before: Callable[[str], None] | None = None, arguments: dict | None = None) -> Proposed:
    """A fresh task, leased and running, proposing one refund (or, given `arguments`, one call
    of another tool). `before(operation_id)` runs before the proposal commits its dispatch (to
    arm a seam for exactly this operation)."""
    run = start_task(world, goal=f"chaos {tool} {order_id}")
    operation_id = run.operation_id(world, tool)
    if before is not None:
        before(operation_id)
    proposal = call_propose(
        principal=world.agent, task_id=run.task_id, call_id=f"call-{uuid.uuid4().hex[:12]}", step_id=run.step_id,
        tool_name=tool, arguments=refund_arguments(order_id, amount) if arguments is None else arguments,
        expected_version=run.version, fencing_token=run.lease_token,
    )
    if proposal.operation_id != operation_id:
        raise AssertionError(f"operation ID {proposal.operation_id} is not the derived {operation_id}")
    return Proposed(operation_id, run.task_id, run.lease_token, proposal.approval_id, proposal.decision)


def order(kind: str = "ok") -> str:
    return f"{kind}-{uuid.uuid4().hex[:12]}"


def status(operation_id: str) -> str:
    return Operation.objects.values_list("status", flat=True).get(pk=operation_id)


def wait_status(operation_id: str, statuses, *, timeout: float = QUIET_SECONDS, what: str = "") -> None:
    wanted = frozenset(statuses)
    wait_until(lambda: status(operation_id) in wanted, timeout=timeout,
               what=what or f"{operation_id} in {sorted(wanted)}", interval=0.05)


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


