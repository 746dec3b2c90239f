"""The policy gate: step 1 of dispatch (docs/architecture.md, "Dispatch, in this order").

    validate the arguments against the tool's JSON schema → authorize the principal → check the
    task's budgets → compute the risk tier (base tier, raised — never lowered — by every
    matching escalation rule) → the tier's requirement decides.

The gate reads and decides; it writes nothing. The proposal pipeline (`ledger.proposals`) acts
on the result: a refusal is an event, a spent budget pauses the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import models
from django.utils import timezone
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from approvals import caps as budget_caps
from approvals.caps import CapState, Limit
from approvals.catalog import Catalog
from approvals.catalog import current as current_catalog
from approvals.models import EscalationRule, PolicyTier, Tool
from approvals.stops import active_stop
from console.lib.canonical import canonical_json, digest
from console.lib.errors import InvalidInput, NotPermitted
from console.models import AgentPrincipal
from runs import services as run_services
from runs.models import Task


class Decision(models.TextChoices):
    """What the gate decides for a call, in the words the agent API answers with."""

    DISPATCHED = "dispatched"  # runs at once
    AWAITING_APPROVAL = "awaiting_approval"
    REFUSED = "refused"


_DECISION_BY_REQUIREMENT = {
    PolicyTier.Requirement.RUN: Decision.DISPATCHED,
    PolicyTier.Requirement.RUN_AUDIT: Decision.DISPATCHED,
    PolicyTier.Requirement.ONE_APPROVAL: Decision.AWAITING_APPROVAL,
    PolicyTier.Requirement.TWO_APPROVALS: Decision.AWAITING_APPROVAL,
    PolicyTier.Requirement.FORBIDDEN: Decision.REFUSED,
}

# Task constraints the gate enforces, with the JSON types they must have (also checked when a
# contract is registered, so a typo'd type fails at once rather than silently never binding).
BUDGET_KEYS = ("max_tool_calls", "max_writes", "max_amount", "deadline")
CONSTRAINT_TYPES: dict[str, str] = {
    "max_tool_calls": "integer",
    "max_writes": "integer",
    "max_amount": "number",
    "approval_threshold": "number",
    "deadline": "datetime",
}


@dataclass(frozen=True)
class GateResult:
    decision: Decision
    arguments_hash: str
    risk_tier: int | None = None
    requirement: str = ""
    approvals_needed: int = 0
    approval_ttl_seconds: int = 0
    shows_preview: bool = False
    reasons: tuple[str, ...] = ()
    # Budgets that ran out: the pipeline pauses the task (`paused` when a budget runs
    # out). A call that merely does not fit into what is left is refused, nothing more.
    exhausted_budgets: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        return self.decision == Decision.REFUSED

    @property
    def needs_approval(self) -> bool:
        return self.decision == Decision.AWAITING_APPROVAL


def evaluate(*, principal: AgentPrincipal, task: Task, tool: Tool, arguments: dict[str, Any],
             catalog: Catalog | None = None) -> GateResult:
    catalog = catalog or current_catalog()
    args_hash = validate_arguments(tool=tool, arguments=arguments)
    authorize(principal=principal, task=task, tool=tool, catalog=catalog)
    return decide(task=task, tool=tool, arguments=arguments, args_hash=args_hash, catalog=catalog)


def decide(*, task: Task, tool: Tool, arguments: dict[str, Any], args_hash: str,
           catalog: Catalog | None = None, caps: CapState | None = None) -> GateResult:
    """Budgets, risk tier and policy, for arguments already validated (`validate_arguments`)
    and a principal already authorized (`authorize`): the rest of `evaluate`. `catalog`: the
    configuration read under the caller's generation token (default: the current one).
    `caps`: the budget caps covering the call and their counters (`approvals.caps`); a proposal
    passes them read under lock, and without them they are read as they stand."""
    catalog = catalog or current_catalog()
    if caps is None:
        caps = cap_state(task=task, agent_id=task.actor_id, tool=tool, catalog=catalog)
    refusals, exhausted = check_budgets(task=task, tool=tool, arguments=arguments, caps=caps)
    if refusals:
        return GateResult(decision=Decision.REFUSED, arguments_hash=args_hash, reasons=tuple(refusals),
                          exhausted_budgets=tuple(exhausted))
    return _policy_verdict(task=task, tool=tool, arguments=arguments, args_hash=args_hash, catalog=catalog)


def reevaluate(*, principal: AgentPrincipal | None, task: Task, tool: Tool, arguments: dict[str, Any], args_hash: str,
               catalog: Catalog | None = None) -> GateResult:
    """The gate's verdict now on a call proposed earlier (the dispatcher's re-check at the
    moment of effect): the principal and the tool as they are (`authorize`, less the stops,
    which hold a call rather than refuse it), then the tier and the policy as they are. The
    budgets are not counted again: the call reserved its share when it was proposed. A
    withdrawn authorization is a refusal with its reason, not an exception. `principal` None:
    a call people asked for (a compensation), which no agent's authority stands behind."""
    catalog = catalog or current_catalog()
    try:
        if principal is not None:
            authorize_principal(principal=principal, task=task, tool=tool, catalog=catalog)
        elif not tool.enabled:
            raise NotPermitted(f"The tool {tool.name} is disabled.", details={"tool": tool.name})
    except NotPermitted as exc:
        return GateResult(decision=Decision.REFUSED, arguments_hash=args_hash, reasons=(exc.message,))
    return _policy_verdict(task=task, tool=tool, arguments=arguments, args_hash=args_hash, catalog=catalog)


def _policy_verdict(*, task: Task, tool: Tool, arguments: dict[str, Any], args_hash: str,
                    catalog: Catalog) -> GateResult:
    tier, reasons = risk_tier(tool=tool, task=task, arguments=arguments, catalog=catalog)
    policy = catalog.tier(tier)
    if policy is None:
        # Fail closed: a tier nobody configured is not a tier anybody may run.
        return GateResult(decision=Decision.REFUSED, arguments_hash=args_hash, risk_tier=tier,
                          reasons=(*reasons, f"no policy is configured for L{tier}"))
    decision = _DECISION_BY_REQUIREMENT[policy.requirement]
    if decision == Decision.REFUSED:
        reasons = [*reasons, f"L{tier} is forbidden by policy"]
    return GateResult(
        decision=decision,
        arguments_hash=args_hash,
        risk_tier=tier,
        requirement=policy.requirement,
        approvals_needed=policy.approvals_needed,
        approval_ttl_seconds=policy.approval_ttl_seconds,
        # The adapter can draw one and the tier shows it (the approval page reads the same).
        shows_preview=policy.shows_preview and tool.has_preview,
        reasons=tuple(reasons),
    )


# --- 1. schema ------------------------------------------------------------------------------

def canonical_arguments(arguments: Any) -> bytes:
    """The arguments' canonical (RFC 8785) JSON, or InvalidInput for what JSON cannot say
    exactly (integers beyond 2^53, NaN, non-string keys)."""
    if not isinstance(arguments, dict):
        raise InvalidInput("arguments must be a JSON object.", details={"arguments": type(arguments).__name__})
    try:
        return canonical_json(arguments)
    except (ValueError, TypeError) as exc:  # rfc8785.CanonicalizationError is a ValueError
        raise InvalidInput(
            "The arguments cannot be canonicalized (RFC 8785).", details={"arguments": str(exc)}
        ) from exc


def canonical_arguments_hash(arguments: Any) -> str:
    """The hash of `canonical_arguments`."""
    return digest(canonical_arguments(arguments))


def validate_arguments(*, tool: Tool, arguments: dict[str, Any]) -> str:
    """Validate against the tool's schema (Draft 2020-12, formats checked); return the hash."""
    check_arguments(tool=tool, arguments=arguments)
    return canonical_arguments_hash(arguments)


# A schema's validator, by the identity of the schema object: one per Tool row loaded (the
# policy catalog keeps its rows for a configuration), instead of one per call. Emptied when full.
_validators: dict[int, tuple[dict, Draft202012Validator]] = {}
MAX_VALIDATORS = 256


def _validator(schema: dict) -> Draft202012Validator:
    kept = _validators.get(id(schema))
    if kept is not None and kept[0] is schema:
        return kept[1]
    # Checked here, once per schema: iter_errors does not check it, and an unknown type or a
    # malformed keyword would otherwise raise from inside the validation.
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    if len(_validators) >= MAX_VALIDATORS:
        _validators.clear()
    _validators[id(schema)] = (schema, validator)
    return validator


def check_arguments(*, tool: Tool, arguments: dict[str, Any]) -> None:
    """`validate_arguments` without the hash, for a caller that has it already."""
    if not isinstance(arguments, dict):
        raise InvalidInput("arguments must be a JSON object.", details={"arguments": type(arguments).__name__})
    try:
        errors = sorted(_validator(tool.json_schema).iter_errors(arguments),
                        key=lambda e: (list(e.absolute_path), e.message))
    except SchemaError as exc:  # the admin saved a broken schema: nothing can pass
        raise InvalidInput(f"The schema of {tool.name} is invalid; nothing can be validated against it.",
                           details={"tool": tool.name, "schema_error": exc.message}) from exc
    if errors:
        raise InvalidInput(
            f"The arguments do not match the schema of {tool.name}.",
            details={"tool": tool.name, "errors": [
                {"path": ".".join(str(p) for p in e.absolute_path), "message": e.message, "validator": e.validator}
                for e in errors
            ]},
        )


# --- 2. authorization -----------------------------------------------------------------------

def authorize(*, principal: AgentPrincipal, task: Task, tool: Tool, catalog: Catalog | None = None) -> None:
    authorize_principal(principal=principal, task=task, tool=tool, catalog=catalog)
    stop = active_stop(tenant_id=task.tenant_id, agent_id=principal.pk, tool_id=tool.pk, catalog=catalog)
    if stop is not None:
        raise NotPermitted(_stopped(stop), details={"stop_id": stop.stop_id, "scope": stop.scope})


def stop_refusal(*, task: Task, principal: AgentPrincipal, tool: Tool, args_hash: str,
                 catalog: Catalog | None = None) -> GateResult | None:
    """A stop in force over this call, as the gate's refusal with its reason (a proposal
    records it like any refusal, so a repeat is answered the same); None when nothing stops it."""
    stop = active_stop(tenant_id=task.tenant_id, agent_id=principal.pk, tool_id=tool.pk, catalog=catalog)
    if stop is None:
        return None
    return GateResult(decision=Decision.REFUSED, arguments_hash=args_hash, reasons=(_stopped(stop),))


def _stopped(stop) -> str:
    return f"Stopped: {stop.describe()} ({stop.reason}). No new calls until it is resumed."


def authorize_principal(*, principal: AgentPrincipal, task: Task, tool: Tool, catalog: Catalog | None = None) -> None:
    if not principal.is_active or task.tenant_id != principal.tenant_id:
        raise NotPermitted("This principal may not act on this task.", details={"task_id": task.task_id})
    if not tool.enabled:
        raise NotPermitted(f"The tool {tool.name} is disabled.", details={"tool": tool.name})
    if tool.pk not in (catalog or current_catalog()).allowed_tool_ids(principal.pk):
        raise NotPermitted(f"{principal.ref} may not use {tool.name}.", details={"tool": tool.name})


# --- 3. budgets -----------------------------------------------------------------------------

def call_amount(tool: Tool, arguments: dict[str, Any]) -> Decimal:
    """What a call spends of `max_amount`: the `amount` argument of a write call."""
    amount = arguments.get("amount")
    if tool.kind != Tool.Kind.WRITE or isinstance(amount, bool) or not isinstance(amount, int | float):
        return Decimal(0)
    return Decimal(str(amount))


def parse_deadline(value: Any) -> datetime:
    """ISO 8601; a time without an offset is UTC."""
    if not isinstance(value, str):
        raise ValueError("expected an ISO 8601 date-time string")
    parsed = datetime.fromisoformat(value)
    if timezone.is_naive(parsed):
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def cap_state(*, task: Task, agent_id: int | None, tool: Tool, catalog: Catalog | None = None,
              counters=None) -> CapState:
    """The budget caps covering a call of `tool` by the agent in the task, and their counters:
    `counters` as the proposal locked them, or else read without a lock."""
    catalog = catalog or current_catalog()
    covering = budget_caps.caps_covering(catalog=catalog, tenant_id=task.tenant_id, agent_id=agent_id, tool_id=tool.pk)
    if not covering:
        return CapState()
    day = budget_caps.tenant_day(task.tenant)
    if counters is None:
        counters = run_services.budget_counters_read(budget_caps.counter_keys(covering, task_id=task.task_id, day=day))
    spent = {(row.scope_key, row.period): budget_caps.Spent(calls=row.calls, writes=row.writes,
                                                            amount=Decimal(row.amount)) for row in counters}
    return CapState(caps=covering, day=day, spent=spent)


def task_limits(task: Task, *, caps: CapState | None = None) -> dict[str, Limit]:
    """The limits that bind the task's own counters (the contract's, lowered by the caps); without
    `caps`, the tenant's and the task's agent's caps as they are now."""
    if caps is None:
        covering = budget_caps.caps_covering(catalog=current_catalog(), tenant_id=task.tenant_id,
                                             agent_id=task.actor_id, tool_id=None)
        return budget_caps.task_limits(task, covering, _limit)
    return budget_caps.task_limits(task, caps.caps, _limit)


def _why(limit: Limit) -> str:
    """Where a limit comes from, when it is not the contract's own."""
    if limit.source == "contract":
        return ""
    asked = f"; the contract asked for {_num(limit.contract_asked)}" if limit.contract_asked is not None else ""
    return f" (capped by {limit.source}{asked})"


def check_budgets(*, task: Task, tool: Tool, arguments: dict[str, Any], now=None,
                  caps: CapState | None = None) -> tuple[list[str], list[str]]:
    """(reasons for refusal, budgets that ran out). The task's budgets are the least of its
    contract's and of the caps per task; the caps per day and a tool's cap per task refuse
    without pausing the task."""
    constraints = task.constraints or {}
    caps = caps or CapState()
    limits = task_limits(task, caps=caps)
    refusals: list[str] = []
    exhausted: list[str] = []
    max_calls = limits.get("max_tool_calls")
    if max_calls is not None and task.calls_used >= max_calls.value:
        refusals.append(f"tool call budget spent: {task.calls_used} of {_num(max_calls.value)}{_why(max_calls)}")
        exhausted.append("max_tool_calls")
    if tool.kind == Tool.Kind.WRITE:
        max_writes = limits.get("max_writes")
        if max_writes is not None and task.writes_used >= max_writes.value:
            refusals.append(f"write budget spent: {task.writes_used} of {_num(max_writes.value)}{_why(max_writes)}")
            exhausted.append("max_writes")
    max_amount = limits.get("max_amount")
    amount = call_amount(tool, arguments)
    if max_amount is not None and amount:
        limit = max_amount.value
        used = Decimal(task.amount_used)
        if used >= limit:
            refusals.append(f"amount budget spent: {_num(used)} of {_num(limit)}{_why(max_amount)}")
            exhausted.append("max_amount")
        elif used + amount > limit:
            refusals.append(f"amount {_num(amount)} exceeds what is left of the budget: "
                            f"{_num(limit - used)} of {_num(limit)}{_why(max_amount)}")
    refusals += budget_caps.check_caps(state=caps, task=task, tool=tool, amount=amount)
    refusals += budget_caps.check_cost(state=caps, task=task, now=now)
    if constraints.get("deadline") is not None:
        try:
            deadline = parse_deadline(constraints["deadline"])
        except ValueError:
            deadline = None
        if deadline is None:
            refusals.append(f"the task's deadline {constraints['deadline']!r} is not a date-time")
        elif (now or timezone.now()) >= deadline:
            refusals.append(f"the task's deadline {deadline.isoformat()} has passed")
            exhausted.append("deadline")
    return refusals, exhausted


def _limit(value: Any) -> Decimal | None:
    """A budget's limit; a value of the wrong type (stored by something other than the API)
    binds as 0 — a budget nobody can read is spent, not unlimited."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        return Decimal(0)
    try:
        limit = Decimal(str(value))
    except InvalidOperation:
        return Decimal(0)
    return limit if limit.is_finite() else Decimal(0)


def _num(value: Decimal) -> str:
    return format(value.normalize(), "f")


# --- 4. risk tier ---------------------------------------------------------------------------

MISSING = object()

_SYMBOL = {c.value: c.label for c in EscalationRule.Comparison}


def resolve_path(arguments: Any, path: str) -> Any:
    """`amount`, `to.0`, `customer.address.country`; MISSING when any part is absent."""
    value = arguments
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return MISSING
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def rule_matches(rule: EscalationRule, arguments: dict[str, Any]) -> tuple[bool, Any]:
    actual = resolve_path(arguments, rule.argument_path)
    if actual is MISSING:
        return False, actual
    expected = rule.value
    op = rule.comparison
    try:
        if op in (EscalationRule.Comparison.GT, EscalationRule.Comparison.GTE, EscalationRule.Comparison.LT, EscalationRule.Comparison.LTE):
            # Order only numbers with numbers and strings with strings; anything else is no match.
            if not ((_is_number(actual) and _is_number(expected))
                    or (isinstance(actual, str) and isinstance(expected, str))):
                return False, actual
            matched = {EscalationRule.Comparison.GT: actual > expected, EscalationRule.Comparison.GTE: actual >= expected,
                       EscalationRule.Comparison.LT: actual < expected, EscalationRule.Comparison.LTE: actual <= expected}[op]
        elif op == EscalationRule.Comparison.EQ:
            matched = actual == expected
        elif op == EscalationRule.Comparison.NE:
            matched = actual != expected
        elif op == EscalationRule.Comparison.IN:
            matched = isinstance(expected, list | str) and actual in expected
        elif op == EscalationRule.Comparison.CONTAINS:
            matched = isinstance(actual, list | str | dict) and expected in actual
        else:
            matched = False
    except TypeError:
        matched = False
    return bool(matched), actual


def _show(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def risk_tier(*, tool: Tool, task: Task | None, arguments: dict[str, Any],
              catalog: Catalog | None = None) -> tuple[int, list[str]]:
    """The tool's base tier raised — never lowered — by every matching rule, with reasons."""
    catalog = catalog or current_catalog()
    tier = tool.base_tier
    reasons = [f"{tool.name}: base tier L{tool.base_tier}" + (" (preview)" if tool.has_preview else "")]
    for rule in catalog.rules(tool):
        matched, actual = rule_matches(rule, arguments)
        if not matched:
            continue
        effect = f"L{rule.tier}" if rule.tier > tier else f"L{rule.tier} (tier stays L{tier})"
        reasons.append(f"{rule.argument_path} {_show(actual)} {_SYMBOL.get(rule.comparison, rule.comparison)} "
                       f"{_show(rule.value)} → {effect}")
        tier = max(tier, rule.tier)
    threshold = (task.constraints or {}).get("approval_threshold") if task is not None else None
    amount = call_amount(tool, arguments)
    if _is_number(threshold) and amount and amount > Decimal(str(threshold)):
        floor = _lowest_approval_tier(catalog)
        if floor is not None:
            effect = f"L{floor}" if floor > tier else f"L{floor} (tier stays L{tier})"
            reasons.append(f"amount {_num(amount)} > task approval_threshold {_show(threshold)} → {effect}")
            tier = max(tier, floor)
    return tier, reasons


def _lowest_approval_tier(catalog: Catalog) -> int | None:
    levels = [level for level, tier in catalog.tiers().items() if tier.requirement in (PolicyTier.Requirement.ONE_APPROVAL, PolicyTier.Requirement.TWO_APPROVALS)]
    return min(levels, default=None)
