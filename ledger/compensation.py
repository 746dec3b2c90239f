"""Compensation: undoing an effect is a NEW operation (Azure's Compensating Transaction), linked
to the one it compensates, through the gate and with its own approval — never an edit of the
original, which stays in the ledger as it happened."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from approvals import gate
from approvals import services as approval_services
from approvals.models import ApprovalRequest, PolicyTier, Tool
from console.lib.canonical import intent_hash
from console.lib.errors import IllegalTransition, InvalidInput, NotPermitted
from console.lib.ids import derive_operation_id
from ledger import services
from ledger.models import Call, Operation, OperationStatus
from ledger.support import _operation_for_actor, _require_reason, user_ref
from runs import services as run_services

# An effect happened (confirmed) or may have happened (in doubt, or already judged so).
COMPENSABLE = frozenset({OperationStatus.CONFIRMED, OperationStatus.COMPENSATION_REQUIRED, OperationStatus.UNKNOWN, OperationStatus.MANUAL})


def check_compensation_rule(*, original: Operation, tool: Tool, arguments: dict[str, Any]) -> None:
    """The compensation acts on the same business object as the original: its tool is one the
    original tool's `compensation_rule` names, and each argument the rule lists is the same as
    the original's ("same") or a number no larger ("at_most")."""
    rule = original.tool.compensation_rule or {}
    if tool.name not in rule:
        allowed = ", ".join(sorted(rule)) or "none (settle it by hand with evidence)"
        raise InvalidInput(f"{original.tool.name} is not compensated with {tool.name}; allowed: {allowed}.",
                           details={"field": "tool", "allowed": sorted(rule)})
    # "same" first: naming another order is the graver mistake, and the one to report.
    for argument, check in sorted(rule[tool.name].items(), key=lambda item: (item[1] != "same", item[0])):
        intended, proposed = original.arguments.get(argument), arguments.get(argument)
        if check == "same" and proposed != intended:
            raise InvalidInput(f"A compensation of {original.operation_id} must name the same {argument} "
                               f"({intended!r}), not {proposed!r}.",
                               details={"field": f"arguments.{argument}", "expected": intended})
        if check == "at_most" and not (_number(proposed) and _number(intended) and proposed <= intended):
            raise InvalidInput(f"A compensation of {original.operation_id} may have {argument} at most "
                               f"{intended!r}, not {proposed!r}.",
                               details={"field": f"arguments.{argument}", "at_most": intended})


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def compensation_propose(*, operation_id: str, user: AbstractBaseUser, tool_name: str,
                         arguments: dict[str, Any], reason: str) -> tuple[Operation, ApprovalRequest]:
    """Propose the compensating operation for `operation_id`: schema-checked and tiered by the
    gate like any call, but always at a tier that needs a reviewer's approval. An operation
    still in doubt moves to `compensation_required` in the same transaction.

    The proposer is the support person (a console principal), recorded on the approval request
    as `proposed_by`, who may not approve it. The original agent's authority is not asked for:
    the compensation is the person's act, so it works for a deactivated agent; what it may do is
    bounded instead by the original tool's compensation rule (same order, same recipient)."""
    reason = _require_reason(reason)
    original = _operation_for_actor(operation_id, user)
    if original.status not in COMPENSABLE:
        raise IllegalTransition(f"A {original.status} operation has no effect to compensate.",
                                details={"status": original.status})
    if not isinstance(arguments, dict):
        raise InvalidInput("Arguments must be a JSON object.")
    tool = Tool.objects.filter(name=tool_name, enabled=True).first()
    if tool is None:
        raise InvalidInput(f"Unknown tool {tool_name!r}.", details={"tool": tool_name})
    task, principal = original.task, original.principal
    args_hash = gate.validate_arguments(tool=tool, arguments=arguments)
    check_compensation_rule(original=original, tool=tool, arguments=arguments)
    tier, reasons = gate.risk_tier(tool=tool, task=task, arguments=arguments)
    approval_tiers = PolicyTier.objects.filter(requirement__in=(PolicyTier.Requirement.ONE_APPROVAL, PolicyTier.Requirement.TWO_APPROVALS))
    floor = approval_tiers.order_by("level").values_list("level", flat=True).first()
    if floor is None:
        raise NotPermitted("No policy tier requires approval, so no compensation can be approved.")
    if tier < floor:
        reasons.append(f"a compensation always needs approval → L{floor}")
        tier = floor
    policy = PolicyTier.objects.get(level=tier)
    if policy.requirement == PolicyTier.Requirement.FORBIDDEN:
        raise NotPermitted(f"L{tier} is forbidden by policy.")
    actor = user_ref(user)
    with transaction.atomic():
        original = Operation.objects.select_for_update().get(pk=original.pk)
        if original.status not in COMPENSABLE:
            raise IllegalTransition(f"The operation became {original.status} meanwhile.")
        if original.status in (OperationStatus.UNKNOWN, OperationStatus.MANUAL):
            services.operation_require_compensation(operation_id=original.operation_id, actor=actor, reason=reason,
                                                    evidence={"compensating_tool": tool.name})
        number = original.compensations.count() + 1
        step_id = f"{original.step.step_id}~compensate-{number}"
        call_id = f"comp{number}-{original.operation_id.removeprefix('op_')[:24]}"
        compensating_id = derive_operation_id(tenant=task.tenant.slug, task_id=task.task_id, step_id=step_id,
                                              tool=tool.name)
        step = run_services.step_get_or_create(task=task, step_id=step_id)
        operation = Operation.objects.create(
            operation_id=compensating_id, tenant_id=task.tenant_id, task=task, step=step, tool=tool,
            tool_schema_version=tool.schema_version, principal=principal, call_id=call_id, arguments=arguments,
            arguments_hash=args_hash, intent_hash=intent_hash(tool=tool.name, arguments=arguments, principal=actor),
            idempotency_key=compensating_id, business_key="", risk_tier=tier, compensates=original,
        )
        Call.objects.create(task=task, call_id=call_id, operation=operation, arguments_hash=args_hash)
        services.operation_created_event(operation, actor=actor)
        approval = approval_services.approval_request_create(
            operation=operation, task_type=task.task_type, call_id=call_id, state_version=task.version, risk_tier=tier,
            approvals_needed=policy.approvals_needed, ttl_seconds=policy.approval_ttl_seconds,
            reasons=[f"compensates {original.operation_id}: {reason}", *reasons], actor=actor, proposed_by=user,
        )
    return operation, approval
