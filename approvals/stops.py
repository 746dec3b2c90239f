"""Emergency stops: a tenant, an agent or a tool stopped at once, and resumed with one click.

A stop writes only its own row and its event. What it holds back is read where each move is
decided: the gate refuses new proposals (`approvals.gate.authorize`), a pending approval cannot
be given (`approvals.services.refuse_if_frozen`), the dispatcher's claim holds authorized
and retry-safe operations (`ledger.dispatcher`), and the sweeper does not push them. Resuming
pushes them again (`ledger.control.stop_resume`).
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from approvals.catalog import Catalog
from approvals.catalog import current as current_catalog
from approvals.models import Stop, StopStatus, Tool
from console.access import reviewer_max_tier
from console.lib.errors import Conflict, InvalidInput, NotFound, NotPermitted
from console.lib.ids import new_id
from console.lib.transitions import record_event, transition
from console.models import AgentPrincipal, Event, Membership, RiskTier, Role


def user_ref(user: AbstractBaseUser) -> str:
    return f"user:{user.get_username()}"


def may_stop(user: AbstractBaseUser, *, tenant_id: int, scope: str) -> bool:
    """Admins of the tenant stop anything in it; reviewers who may approve L4 there stop tools."""
    if not user.is_authenticated or not user.is_active:
        return False
    if user.is_superuser or Membership.objects.filter(user=user, tenant_id=tenant_id, role=Role.ADMIN).exists():
        return True
    max_tier = reviewer_max_tier(user, tenant_id)
    return scope == Stop.Scope.TOOL and max_tier is not None and max_tier >= RiskTier.L4


def active_stop(*, tenant_id: int, agent_id: int | None = None, tool_id: int | None = None,
                catalog: Catalog | None = None) -> Stop | None:
    """The stop in force over a call of this agent with this tool in this tenant, if any, read
    from the configuration's cache (`catalog`: the one the caller read under its generation
    token; default: the current one, one query for the token)."""
    keys = {"tenant", f"agent:{agent_id}", f"tool:{tool_id}"}
    return next((stop for stop in (catalog or current_catalog()).stops(tenant_id) if stop.scope_key in keys), None)


def stopped_operations_q() -> Q:
    """Operations (by their tenant, principal and tool columns) under a stop in force; an
    empty `Q(pk__in=[])` when nothing is stopped."""
    return _stopped_q(agent_field="principal_id")


def stopped_requests_q() -> Q:
    """Approval requests (by their tenant, requesting agent and tool) frozen by a stop in force."""
    return _stopped_q(agent_field="requested_by_id")


def in_scope_q(stop: Stop, *, agent_field: str) -> Q:
    """The rows (with tenant_id, tool_id and `agent_field`) within one stop's scope."""
    if stop.scope == Stop.Scope.AGENT:
        return Q(**{agent_field: stop.agent_id})
    if stop.scope == Stop.Scope.TOOL:
        return Q(tenant_id=stop.tenant_id, tool_id=stop.tool_id)
    return Q(tenant_id=stop.tenant_id)


def _stopped_q(*, agent_field: str) -> Q:
    q = Q(pk__in=[])
    for stop in Stop.objects.filter(status=StopStatus.STOPPED).only("tenant_id", "scope", "agent_id", "tool_id"):
        q |= in_scope_q(stop, agent_field=agent_field)
    return q


def _scope_key(scope: str, agent: AgentPrincipal | None, tool: Tool | None) -> str:
    if scope == Stop.Scope.AGENT:
        return f"agent:{agent.pk}"
    if scope == Stop.Scope.TOOL:
        return f"tool:{tool.pk}"
    return "tenant"


def stop_create(*, tenant_id: int, scope: str, user: AbstractBaseUser, reason: str,
                agent: AgentPrincipal | None = None, tool: Tool | None = None) -> Stop:
    """Stop a tenant, one of its agents or a tool within it, at once. A second stop of the
    same scope while one holds is a conflict (resume first)."""
    reason = (reason or "").strip()
    if scope not in Stop.Scope.values:
        raise InvalidInput(f"Unknown scope {scope!r}.", details={"scope": scope})
    if not reason:
        raise InvalidInput("A stop needs a reason: everyone it holds back is told why.", details={"field": "reason"})
    if (scope == Stop.Scope.AGENT) != (agent is not None) or (scope == Stop.Scope.TOOL) != (tool is not None):
        raise InvalidInput("An agent stop names an agent, a tool stop a tool, a tenant stop neither.",
                           details={"scope": scope})
    if agent is not None and agent.tenant_id != tenant_id:
        raise NotFound("No such agent in this tenant.")
    if not may_stop(user, tenant_id=tenant_id, scope=scope):
        raise NotPermitted("Only the tenant's admins (and, for a tool, its L4 reviewers) may stop it.")
    stop = Stop(stop_id=new_id("stp"), tenant_id=tenant_id, scope=scope, agent=agent, tool=tool,
                scope_key=_scope_key(scope, agent, tool), reason=reason, stopped_by=user)
    try:
        with transaction.atomic():
            stop.save(force_insert=True)
            record_event(entity=Stop.EVENT_ENTITY, entity_id=stop.stop_id, tenant_id=tenant_id,
                         kind=Event.Kind.CREATED, to_status=stop.status, actor=user_ref(user),
                         reason=f"stopped {stop.describe()}: {reason}",
                         evidence={"scope": scope, "agent_id": stop.agent_id, "tool_id": stop.tool_id})
    except IntegrityError as exc:
        raise Conflict(f"{stop.describe().capitalize()} is already stopped.") from exc
    return stop


def stop_resume(*, stop_id: str, user: AbstractBaseUser, reason: str = "") -> Stop:
    """stopped → resumed. Already resumed: a no-op."""
    with transaction.atomic():
        stop = (Stop.objects.select_for_update(of=("self",)).select_related("tenant", "agent", "tool")
                .filter(pk=stop_id).first())
        if stop is None:
            raise NotFound(f"No stop {stop_id}.")
        if not may_stop(user, tenant_id=stop.tenant_id, scope=stop.scope):
            raise NotPermitted("Only the tenant's admins (and, for a tool, its L4 reviewers) may resume it.")
        reason = (reason or "").strip()
        transition(stop, to=StopStatus.RESUMED, actor=user_ref(user),
                   reason=f"resumed {stop.describe()}" + (f": {reason}" if reason else ""),
                   changes={"resumed_by": user, "resumed_at": timezone.now(), "resume_reason": reason})
    return stop
