"""Verification: a task succeeds on evidence from the environment, never on the agent's word.

A contract's success criteria are data (`runs.criteria`): each is judged here from the ledger
(and, for a code-defined check that needs it, the provider) as met, pending (not yet: the
agent may go on), failed (contradicted), or review (a `human` criterion: a reviewer of the
tenant decides, `runs.services.task_review_decide`). A task type may carry criteria of its own
(`TASK_TYPE_CRITERIA`), always judged beside the contract's, so a refund task cannot "succeed"
on an empty or human-only list without a confirmed refund.

Code-defined checks are functions registered under a name (`register`); a contract names one
with `{"kind": "verifier", "name": …, "params": {…}}`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ledger.adapters import adapter_for
from ledger.adapters.base import FOUND
from ledger.models import Call, Operation, OperationStatus
from runs import criteria as C
from runs.criteria import FAILED, MET, PENDING, REVIEW
from runs.models import Task

# Operations that may still end confirmed: their criterion is not yet judged.
OPEN_STATUSES = frozenset({OperationStatus.PLANNED, OperationStatus.AUTHORIZED, OperationStatus.DISPATCHED,
                           OperationStatus.UNKNOWN, OperationStatus.RETRY_SAFE, OperationStatus.MANUAL})


@dataclass
class Verdict:
    result: str  # met, pending, failed, review
    evidence: dict[str, Any] = field(default_factory=dict)


Check = Callable[[Task, dict[str, Any]], Verdict]
VERIFIERS: dict[str, Check] = {}


def register(name: str) -> Callable[[Check], Check]:
    """Register a code-defined check under `name`: `check(task, params) -> Verdict`. A name is
    also shorthand for a criterion's kind, so it may not be one of the data kinds."""
    if name in C.KINDS:
        raise ValueError(f"{name!r} is a criterion kind; register the check under another name.")

    def decorator(check: Check) -> Check:
        VERIFIERS[name] = check
        return check
    return decorator


# --- code-defined checks ---------------------------------------------------------------------


def _amount(value: Any) -> Decimal | None:
    try:
        return Decimal(str(value))
    except (ArithmeticError, ValueError, TypeError):
        return None


@register("refund_confirmed")
def verify_refund_confirmed(task: Task, params: dict[str, Any]) -> Verdict:
    """A confirmed refund in this task's ledger, for the order, whose *receipt* amount equals
    both the approved arguments and the criterion."""
    operations = Operation.objects.filter(task=task, tool__name="payments.refund")
    order_id = params.get("order_id")
    if order_id is not None:
        operations = [op for op in operations if op.arguments.get("order_id") == order_id]
    operations = list(operations)
    if not operations:
        return Verdict(FAILED, {"reason": "no refund operation in this task", "order_id": order_id})
    for op in operations:
        if op.status != OperationStatus.CONFIRMED:
            continue
        receipt_amount = _amount((op.receipt or {}).get("amount"))
        approved = _amount(op.arguments.get("amount"))
        wanted = _amount(params.get("amount", op.arguments.get("amount")))
        evidence = {"operation_id": op.operation_id, "receipt": op.receipt, "approved_amount": str(approved)}
        if receipt_amount is None or receipt_amount != approved or receipt_amount != wanted:
            return Verdict(FAILED, {**evidence, "reason": f"receipt amount {receipt_amount} ≠ approved {approved}"
                                                            f" / criterion {wanted}"})
        return Verdict(MET, evidence)
    if any(op.status in OPEN_STATUSES for op in operations):
        return Verdict(PENDING, {"statuses": [op.status for op in operations]})
    return Verdict(FAILED, {"reason": "no refund was confirmed", "statuses": [op.status for op in operations]})


@register("mail_delivered")
def verify_mail_delivered(task: Task, params: dict[str, Any]) -> Verdict:
    """The mail provider holds the email (asked by its Message-ID), sent to exactly the
    approved recipients, which are the criterion's."""
    wanted = sorted(params.get("to") or [])
    operations = list(Operation.objects.filter(task=task, tool__name="mail.send").select_related("tool"))
    confirmed = [op for op in operations if op.status == OperationStatus.CONFIRMED]
    for op in confirmed:
        approved = sorted(op.arguments.get("to") or [])
        if wanted and approved != wanted:
            continue
        answer = adapter_for(op.tool).query(key=op.idempotency_key, timeout=op.tool.timeout_seconds)
        evidence = {"operation_id": op.operation_id, "query": answer.state, "provider": answer.raw}
        if answer.state != FOUND:
            return Verdict(PENDING if answer.state in ("processing", "error") else FAILED, evidence)
        delivered = sorted((answer.receipt or {}).get("to") or [])
        if delivered != approved:
            return Verdict(FAILED, {**evidence, "reason": f"delivered to {delivered}, approved {approved}"})
        return Verdict(MET, evidence)
    if any(op.status in OPEN_STATUSES for op in operations):
        return Verdict(PENDING, {"statuses": [op.status for op in operations]})
    return Verdict(FAILED, {"reason": "no confirmed email to the approved recipients", "wanted": wanted})


# Judged for every task of the type, beside its contract's criteria (unless the contract names
# the same verifier itself, with its own params).
TASK_TYPE_CRITERIA: dict[str, list[dict[str, Any]]] = {
    "refund": [{"kind": C.VERIFIER, "name": "refund_confirmed", "params": {}}],
    "contract_email": [{"kind": C.VERIFIER, "name": "mail_delivered", "params": {}}],
}


# --- criteria as data ------------------------------------------------------------------------


def _operation_evidence(op: Operation) -> dict[str, Any]:
    return {"operation_id": op.operation_id, "call_id": op.call_id, "status": op.status,
            "receipt": C.quote(op.receipt)}


def check_operation_confirmed(task: Task, criterion: dict[str, Any]) -> Verdict:
    """Some operation of this task on the tool, whose arguments contain the subset, confirmed."""
    subset = criterion.get("arguments") or {}
    operations = [op for op in Operation.objects.filter(task=task, tool__name=criterion.get("tool")).order_by(
        "created_at", "operation_id") if C.is_subset(subset, op.arguments)]
    for op in operations:
        if op.status == OperationStatus.CONFIRMED:
            return Verdict(MET, _operation_evidence(op))
    statuses = {op.operation_id: op.status for op in operations}
    if any(op.status in OPEN_STATUSES for op in operations):
        return Verdict(PENDING, {"reason": "not confirmed yet", "statuses": statuses})
    reason = "no operation on this tool with these arguments" if not operations else "none was confirmed"
    return Verdict(FAILED, {"reason": reason, "statuses": statuses})


def check_result_matches(task: Task, criterion: dict[str, Any]) -> Verdict:
    """A confirmed call's result (by call ID, or any call of the tool) at the path equals or
    contains the value."""
    if criterion.get("call_id"):
        call = Call.objects.filter(task=task, call_id=criterion["call_id"]).select_related("operation").first()
        if call is None:
            return Verdict(FAILED, {"reason": "no such call in this task", "call_id": criterion["call_id"]})
        if call.operation is None:
            return Verdict(FAILED, {"reason": "the gate refused this call", "call_id": call.call_id})
        operations = [call.operation]
    else:
        operations = list(Operation.objects.filter(task=task, tool__name=criterion.get("tool")).order_by(
            "created_at", "operation_id"))
    path = criterion.get("path", "")
    test = ((lambda found: C.contains(found, criterion["contains"])) if "contains" in criterion
            else (lambda found: C.json_equal(found, criterion.get("equals"))))
    found_values = []
    for op in operations:
        if op.status != OperationStatus.CONFIRMED:
            continue
        found = C.resolve(op.result, path)
        if found is not C.MISSING and test(found):
            return Verdict(MET, {"operation_id": op.operation_id, "call_id": op.call_id, "path": path,
                                 "found": C.quote(found)})
        found_values.append({"operation_id": op.operation_id, "found": C.quote(found),
                             "missing": found is C.MISSING})
    statuses = {op.operation_id: op.status for op in operations}
    if any(op.status in OPEN_STATUSES for op in operations):
        return Verdict(PENDING, {"reason": "not confirmed yet", "statuses": statuses, "checked": found_values[:5]})
    reason = "no result matches" if found_values else "no confirmed call to read a result from"
    return Verdict(FAILED, {"reason": reason, "path": path, "checked": found_values[:5], "statuses": statuses})


def check_human(task: Task, criterion: dict[str, Any]) -> Verdict:
    """Not the ledger's to judge: a reviewer of the tenant decides on the console."""
    return Verdict(REVIEW, {"reason": "waiting for a reviewer of the tenant"})


def check_verifier(task: Task, criterion: dict[str, Any]) -> Verdict:
    check = VERIFIERS.get(criterion.get("name"))
    if check is None:
        return Verdict(FAILED, {"reason": f"no verifier registered as {criterion.get('name')!r}"})
    params = criterion.get("params") or {}
    return check(task, params if isinstance(params, dict) else {})


CHECKS: dict[str, Check] = {
    C.OPERATION_CONFIRMED: check_operation_confirmed,
    C.RESULT_MATCHES: check_result_matches,
    C.HUMAN: check_human,
    C.VERIFIER: check_verifier,
}


def effective_criteria(task: Task) -> list[tuple[dict[str, Any], str]]:
    """The criteria judged for this task, each with where it comes from (`contract` or
    `task type`): the contract's, in normal form, then the type's not already named."""
    contract = C.normalize(task.success_criteria if isinstance(task.success_criteria, list) else [],
                           VERIFIERS)
    named = {c.get("name") for c in contract if isinstance(c, dict) and c.get("kind") == C.VERIFIER}
    defaults = [c for c in TASK_TYPE_CRITERIA.get(task.task_type, []) if c.get("name") not in named]
    return [(c, "contract") for c in contract] + [(c, "task type") for c in defaults]


def judge(task: Task, criterion: Any) -> Verdict:
    if not isinstance(criterion, dict) or criterion.get("kind") not in CHECKS:
        kind = criterion.get("kind") if isinstance(criterion, dict) else type(criterion).__name__
        return Verdict(FAILED, {"reason": f"no verifier for criterion kind {kind!r}"})
    return CHECKS[criterion["kind"]](task, criterion)


def verify(task: Task) -> Verdict:
    """Every criterion judged. Any contradicted → failed; else any not yet → pending; else any
    human → review; else met. Runs outside any transaction (a check may ask a provider)."""
    judged = effective_criteria(task)
    if not judged:
        return Verdict(FAILED, {"reason": "no success criteria to verify", "criteria": []})
    results = []
    for criterion, source in judged:
        verdict = judge(task, criterion)
        results.append({"criterion": criterion, "source": source, "description": describe_criterion(criterion),
                        "result": verdict.result, "evidence": verdict.evidence})
    outcomes = {r["result"] for r in results}
    overall = next((outcome for outcome in (FAILED, PENDING, REVIEW) if outcome in outcomes), MET)
    if overall != REVIEW:
        # A reviewer is asked only about a task whose other criteria all passed.
        for r in results:
            if r["result"] == REVIEW:
                r["result"], r["evidence"] = PENDING, {"reason": "a reviewer is asked once every other "
                                                                 "criterion is met"}
    return Verdict(overall, {"criteria": results})


def describe_criterion(criterion: Any) -> str:
    return C.describe(criterion) if isinstance(criterion, dict) else str(criterion)[:C.QUOTE_CHARS]


def criteria_rows(task: Task) -> list[dict]:
    """Each success criterion with its last verdict; before the first verification, the
    criteria that will be judged (the contract's and the task type's), not judged yet."""
    if task.verdicts:
        return task.verdicts
    return [{"criterion": criterion, "source": source, "description": describe_criterion(criterion),
             "result": "", "evidence": {}} for criterion, source in effective_criteria(task)]
