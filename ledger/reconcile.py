"""Reconciling `unknown` outcomes with the provider (step 8 of dispatch in docs/architecture.md).

found → confirmed (or compensation_required when the effect differs from the approved intent:
amount, currency, order); still processing → wait; provably absent *and* the old request can no longer
land → retry_safe (same operation ID and key); cannot tell within the window → manual, a case
for support staff. A tool without a way to ask goes to manual at once: no blind retry.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from approvals.models import Tool
from console.lib.errors import Conflict
from console.models import Event
from console.tracing import tracer
from ledger import services
from ledger.adapters import adapter_for
from ledger.adapters.base import ABSENT, FOUND, PROCESSING, effect_differences
from ledger.models import Operation, OperationStatus

ACTOR = "system:reconciler"


def _unknown_since(operation: Operation):
    event = (
        Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id, to_status=OperationStatus.UNKNOWN)
        .order_by("-id").first()
    )
    return event.created_at if event else operation.updated_at


def run_reconcile(operation_id: str, *, worker: str, now=None) -> str:
    now = now or timezone.now()
    operation = Operation.objects.select_related("tool").filter(pk=operation_id).first()
    if operation is None:
        return "missing"
    if operation.status != OperationStatus.UNKNOWN:
        return f"noop:{operation.status}"
    tool = operation.tool
    adapter = adapter_for(tool)
    attributes = {"countersign.operation_id": operation_id, "countersign.task_id": operation.task_id,
                  "gen_ai.tool.name": tool.name, "gen_ai.tool.call.id": operation.call_id}
    token = operation.fencing_token
    with tracer.start_as_current_span("reconcile", attributes=attributes) as span:
        try:
            if tool.kind == Tool.Kind.READ:
                services.operation_mark_retry_safe(
                    operation_id=operation_id, actor=ACTOR, fencing_token=token,
                    reason="a read has no side effect; ask again", evidence={"read_only": True, "worker": worker})
                return "retry_safe"
        except Conflict:
            return "raced"
        if tool.idempotency == Tool.Idempotency.NONE or not adapter.can_query:
            return _escalate(operation, "the provider cannot be asked about this key; no blind retry", {})
        answer = adapter.query(key=operation.idempotency_key, timeout=tool.timeout_seconds)
        span.set_attribute("countersign.reconcile.answer", answer.state)
        evidence = {"query": answer.state, "raw": answer.raw, "worker": worker, "at": now.isoformat()}
        tries = operation.reconcile_attempts + 1
        try:
            if answer.state == FOUND:
                differences = effect_differences(adapter, operation.arguments, answer.receipt or {})
                if differences:
                    # An effect happened, but not the one that was approved: a case for
                    # compensation, with the difference as evidence — never a confirmation.
                    services.operation_require_compensation(
                        operation_id=operation_id, actor=ACTOR, fencing_token=token,
                        reason="the provider's effect differs from the approved intent: "
                               + ", ".join(sorted(differences)),
                        evidence={**evidence, "differences": differences, "receipt": answer.receipt})
                    return OperationStatus.COMPENSATION_REQUIRED
                services.operation_confirm(operation_id=operation_id, receipt=answer.receipt or {}, actor=ACTOR,
                                           reason="the provider has the effect", evidence=evidence,
                                           fencing_token=token)
                return "confirmed"
            last = operation.attempts.order_by("-number").first()
            # The old request may still land until its client timeout has surely passed; the
            # dispatch deadline (claim + timeout + grace) bounds it, and a worker that stalled
            # past it finds its token fenced before it sends (dispatcher._call_provider).
            started = last.started_at if last else operation.updated_at
            horizon = max(operation.dispatch_deadline or started,
                          started + timedelta(seconds=tool.timeout_seconds + settings.DISPATCH_GRACE_SECONDS / 2))
            if answer.state == ABSENT and now >= horizon:
                evidence["old_request_stopped_by"] = horizon.isoformat()
                services.operation_mark_retry_safe(operation_id=operation_id, actor=ACTOR, evidence=evidence,
                                                   reason="the provider has no effect and the old request stopped",
                                                   fencing_token=token)
                return "retry_safe"
            if now - _unknown_since(operation) >= timedelta(seconds=settings.RECONCILE_WINDOW_SECONDS):
                return _escalate(operation, f"provider could not tell within {settings.RECONCILE_WINDOW_SECONDS:.0f}s "
                                            f"(last answer: {answer.state})", evidence)
        except Conflict:
            return "raced"  # someone (support staff, another reconciler) resolved it first
        wait = horizon if answer.state == ABSENT else now + timedelta(
            seconds=min(10.0, 0.5 * 2 ** min(tries, 5)) if answer.state != PROCESSING else 1.0)
        services.operation_schedule_reconcile(operation_id=operation_id, at=wait, tries=tries)
        return f"waiting:{answer.state}"


def _escalate(operation: Operation, reason: str, evidence: dict) -> str:
    try:
        services.operation_escalate_manual(operation_id=operation.operation_id, actor=ACTOR, reason=reason,
                                           evidence=evidence, fencing_token=operation.fencing_token)
    except Conflict:
        return "raced"
    return "manual"
