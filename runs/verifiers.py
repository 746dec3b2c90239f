"""Verification: a task succeeds on evidence from the environment, never on the agent's word.

Each success criterion names a `kind`; its verifier reads the ledger (and, where the ledger
cannot know, asks the provider) and answers met / not yet / contradicted. A task type lists
the kinds it must satisfy, so a refund task cannot "succeed" on an empty criteria list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ledger.adapters import adapter_for
from ledger.adapters.base import FOUND
from ledger.models import Operation, OperationStatus
from runs.models import Task

MET, PENDING, FAILED = "met", "pending", "failed"

# The criteria kinds a task type must carry (and pass) to succeed.
REQUIRED_KINDS: dict[str, set[str]] = {
    "refund": {"refund_confirmed"},
    "contract_email": {"mail_delivered"},
}


@dataclass
class Verdict:
    result: str  # met, pending, failed
    evidence: dict[str, Any] = field(default_factory=dict)


def _amount(value: Any) -> Decimal | None:
    try:
        return Decimal(str(value))
    except (ArithmeticError, ValueError, TypeError):
        return None


def verify_refund_confirmed(task: Task, criterion: dict[str, Any]) -> Verdict:
    """A confirmed refund in this task's ledger, for the order, whose *receipt* amount equals
    both the approved arguments and the criterion."""
    operations = Operation.objects.filter(task=task, tool__name="payments.refund")
    order_id = criterion.get("order_id")
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
        wanted = _amount(criterion.get("amount", op.arguments.get("amount")))
        evidence = {"operation_id": op.operation_id, "receipt": op.receipt, "approved_amount": str(approved)}
        if receipt_amount is None or receipt_amount != approved or receipt_amount != wanted:
            return Verdict(FAILED, {**evidence, "reason": f"receipt amount {receipt_amount} ≠ approved {approved}"
                                                            f" / criterion {wanted}"})
        return Verdict(MET, evidence)
    if any(op.status in (OperationStatus.PLANNED, OperationStatus.AUTHORIZED, OperationStatus.DISPATCHED, OperationStatus.UNKNOWN, OperationStatus.RETRY_SAFE, OperationStatus.MANUAL)
           for op in operations):
        return Verdict(PENDING, {"statuses": [op.status for op in operations]})
    return Verdict(FAILED, {"reason": "no refund was confirmed", "statuses": [op.status for op in operations]})


def verify_mail_delivered(task: Task, criterion: dict[str, Any]) -> Verdict:
    """The mail provider holds the email (asked by its Message-ID), sent to exactly the
    approved recipients, which are the criterion's."""
    wanted = sorted(criterion.get("to") or [])
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
    if any(op.status not in (OperationStatus.CONFIRMED, OperationStatus.FAILED, OperationStatus.REJECTED, OperationStatus.EXPIRED, OperationStatus.CANCELLED) for op in operations):
        return Verdict(PENDING, {"statuses": [op.status for op in operations]})
    return Verdict(FAILED, {"reason": "no confirmed email to the approved recipients", "wanted": wanted})


VERIFIERS: dict[str, Callable[[Task, dict[str, Any]], Verdict]] = {
    "refund_confirmed": verify_refund_confirmed,
    "mail_delivered": verify_mail_delivered,
}


def verify(task: Task) -> Verdict:
    """All criteria met → met; any contradicted → failed; otherwise pending. Runs outside any
    transaction (it may ask a provider)."""
    criteria = [c for c in (task.success_criteria or []) if isinstance(c, dict)]
    kinds = {c.get("kind") for c in criteria}
    missing = REQUIRED_KINDS.get(task.task_type, set()) - kinds
    if missing:
        return Verdict(FAILED, {"reason": f"the contract lacks required criteria: {sorted(missing)}"})
    if not criteria:
        return Verdict(FAILED, {"reason": "no success criteria to verify"})
    results = []
    for criterion in criteria:
        verifier = VERIFIERS.get(criterion.get("kind"))
        if verifier is None:
            return Verdict(FAILED, {"reason": f"no verifier for criterion kind {criterion.get('kind')!r}"})
        results.append({"criterion": criterion, **_as_dict(verifier(task, criterion))})
    if any(r["result"] == FAILED for r in results):
        return Verdict(FAILED, {"criteria": results})
    if all(r["result"] == MET for r in results):
        return Verdict(MET, {"criteria": results})
    return Verdict(PENDING, {"criteria": results})


def _as_dict(verdict: Verdict) -> dict[str, Any]:
    return {"result": verdict.result, "evidence": verdict.evidence}
