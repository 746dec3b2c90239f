"""What support staff do about operations whose outcome is unknown: one function per action.

Each action is composed from the ledger's transition services (`ledger.services`), which do the
compare-and-set and write the event. What this module adds:

- who may act: support staff (or a tenant admin) of the operation's tenant; a reviewer may look
  but not act; anyone else learns nothing (NotFound);
- a required reason, and the evidence each action needs, stored in the event;
- asking the provider *before* the transaction (never network I/O inside `atomic`);
- "exactly one action counts": under a row lock the operation must still be waiting for a
  person, or the action is refused with Conflict naming who resolved it.

Provider answers are evidence records, not transitions: an event of kind `provider_answer`
with entity `provider_query`, `entity_id` = operation ID and `to_status` = the answer's state
(found, processing, absent, error, unsupported); the raw answer and the moment it was asked are
in `evidence`. Compensating an effect is a new operation with its own approval
(`ledger.compensation`).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from approvals.models import Tool
from console.access import tenant_ids_for
from console.lib.errors import Conflict, DomainError, InvalidInput, NotFound, NotPermitted
from console.lib.transitions import record_event
from console.models import Event, Membership, Role
from ledger import services
from ledger.adapters import adapter_for
from ledger.adapters.base import ABSENT, ERROR, FOUND, PROCESSING, QueryAnswer, effect_differences
from ledger.models import OPERATION_TERMINAL, Operation, OperationStatus

PROVIDER_QUERY_ENTITY = Event.Entity.PROVIDER_QUERY
UNSUPPORTED = "unsupported"
# Who may look at the queue and an operation, and who may act on it.
VIEW_ROLES = (Role.SUPPORT, Role.REVIEWER, Role.ADMIN)
ACT_ROLES = (Role.SUPPORT, Role.ADMIN)
# An operation a person may still resolve (compensation_required waits for a compensating
# operation, or for `support_mark_compensated`).
RESOLVABLE = frozenset({OperationStatus.UNKNOWN, OperationStatus.MANUAL})


class ProviderDenied(DomainError):
    """The provider's own answer contradicts what the person claims."""

    code, status = "provider_denied", 422


def user_ref(user: AbstractBaseUser) -> str:
    return f"user:{user.get_username()}"


# ------------------------------------------------------------------------------ access


def operation_for_viewer(*, operation_id: str, user: AbstractBaseUser) -> Operation:
    """The operation, if the user holds a viewing role in its tenant; NotFound otherwise (an
    outsider learns nothing, not even that the ID exists)."""
    operation = Operation.objects.select_related("tool", "tenant").filter(pk=operation_id).first()
    if operation is None or operation.tenant_id not in tenant_ids_for(user, *VIEW_ROLES):
        raise NotFound(f"No operation {operation_id}.")
    return operation


def can_act(user: AbstractBaseUser, tenant_id: int) -> bool:
    return tenant_id in tenant_ids_for(user, *ACT_ROLES)


def _operation_for_actor(operation_id: str, user: AbstractBaseUser) -> Operation:
    operation = operation_for_viewer(operation_id=operation_id, user=user)
    if not can_act(user, operation.tenant_id):
        raise NotPermitted("Only support staff of this tenant may act on its operations.")
    return operation


def _require_reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("Every support action needs a reason.", details={"field": "reason"})
    return reason


def resolved_by(operation_id: str) -> Event | None:
    """The event that took the operation out of the hands of support (or the latest one)."""
    return (
        Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation_id)
        .order_by("-id").first()
    )


def _already_resolved(operation: Operation) -> Conflict:
    event = resolved_by(operation.operation_id)
    if event is None:
        return Conflict(f"This operation is {operation.status}.", details={"status": operation.status})
    when = event.created_at.astimezone(UTC).strftime("%H:%M:%S")
    return Conflict(
        f"Already resolved by {event.actor}: {event.to_status.replace('_', ' ')} at {when} UTC.",
        details={"status": event.to_status, "by": event.actor, "event_id": event.id},
    )


def _locked_resolvable(operation_id: str, allowed: frozenset[str] = RESOLVABLE) -> Operation:
    """Inside `atomic`: lock the row (PostgreSQL) and check that it still waits for a person.
    On SQLite the lock is a no-op; the compare-and-set in `transition()` still lets only one
    writer through, and the loser's Conflict is mapped the same way by the caller."""
    operation = Operation.objects.select_for_update().get(pk=operation_id)
    if operation.status not in allowed:
        raise _already_resolved(operation)
    return operation


def _as_resolution_conflict(operation_id: str, exc: Conflict) -> Conflict:
    operation = Operation.objects.filter(pk=operation_id).first()
    if operation is None or operation.status in RESOLVABLE:
        return exc
    return _already_resolved(operation)


# ---------------------------------------------------------------------- provider queries


def _can_ask(tool: Tool) -> bool:
    try:
        adapter = adapter_for(tool)
    except LookupError:
        return False
    return adapter.can_query and tool.idempotency != Tool.Idempotency.NONE


def _ask_provider(operation: Operation) -> tuple[QueryAnswer, datetime, int]:
    """Network I/O: call only outside any transaction."""
    asked_at = timezone.now()
    started = time.monotonic()
    tool = operation.tool
    if not _can_ask(tool):
        answer = QueryAnswer(UNSUPPORTED, raw={"note": f"{tool.name} cannot be asked about a key"})
    else:
        answer = adapter_for(tool).query(key=operation.idempotency_key, timeout=tool.timeout_seconds)
    return answer, asked_at, int((time.monotonic() - started) * 1000)


def provider_query_run(*, operation_id: str, actor: str) -> Event:
    """Ask the provider about the operation's key and record the answer as evidence (the body of
    the `ledger.query_provider` task). Changes no status."""
    operation = Operation.objects.select_related("tool").filter(pk=operation_id).first()
    if operation is None:
        raise NotFound(f"No operation {operation_id}.")
    answer, asked_at, latency_ms = _ask_provider(operation)
    return record_event(
        entity=PROVIDER_QUERY_ENTITY, entity_id=operation_id, tenant_id=operation.tenant_id,
        kind=Event.Kind.PROVIDER_ANSWER, to_status=answer.state, actor=actor,
        reason=f"asked {operation.tool.name} about key {operation.idempotency_key}",
        evidence={"key": operation.idempotency_key, "raw": answer.raw, "receipt": answer.receipt,
                  "asked_at": asked_at.isoformat(), "latency_ms": latency_ms,
                  "operation_status": operation.status, "attempt": operation.attempt_count},
    )


def support_request_provider_query(*, operation_id: str, user: AbstractBaseUser) -> Operation:
    """Enqueue `ledger.query_provider` once the request's transaction (if any) commits."""
    operation = _operation_for_actor(operation_id, user)
    from ledger.tasks import query_provider

    actor = user_ref(user)
    transaction.on_commit(lambda: query_provider.delay(operation_id, actor))
    return operation


def latest_provider_answer(operation_id: str) -> Event | None:
    return (
        Event.objects.filter(entity=PROVIDER_QUERY_ENTITY, entity_id=operation_id)
        .order_by("-id").first()
    )


def no_effect_evidence(operation: Operation, answer: Event | None = None) -> dict[str, Any]:
    """Whether the provider has proved there is no effect *and* the old request can no longer
    land: the latest answer says absent and was asked after the last attempt's start plus the
    tool's timeout. Returns {"ok", "why", "answer", "horizon"} for the form and the event."""
    answer = answer if answer is not None else latest_provider_answer(operation.operation_id)
    last = operation.attempts.order_by("-number").first()
    horizon = (last.started_at if last else operation.created_at) + timedelta(
        seconds=operation.tool.timeout_seconds)
    result: dict[str, Any] = {"ok": False, "answer": answer, "horizon": horizon, "why": ""}
    if answer is None:
        result["why"] = "Nobody has asked the provider yet: query it first."
        return result
    if answer.to_status == FOUND:
        result["why"] = "The provider has the effect: confirm it with its remote ID instead."
        return result
    if answer.to_status != ABSENT:
        result["why"] = f"The provider's latest answer is “{answer.to_status}”, not “absent”."
        return result
    asked_at = parse_datetime(answer.evidence.get("asked_at") or "") or answer.created_at
    if asked_at < horizon:
        result["why"] = ("The provider was asked before the last attempt could have stopped "
                         f"({horizon:%H:%M:%S} UTC): query it again.")
        return result
    result.update(ok=True, why="The provider has no effect for this key and the last attempt has stopped.")
    return result


def _no_effect_or_refuse(operation: Operation) -> dict[str, Any]:
    check = no_effect_evidence(operation)
    if not check["ok"]:
        raise InvalidInput(check["why"], details={"field": "evidence"})
    answer: Event = check["answer"]
    return {"provider_query_event": answer.id, "answer": answer.to_status,
            "asked_at": answer.evidence.get("asked_at"), "raw": answer.evidence.get("raw"),
            "old_request_stopped_by": check["horizon"].isoformat()}


# ------------------------------------------------------------------------------ actions


def support_confirm(*, operation_id: str, user: AbstractBaseUser, remote_id: str, reason: str) -> Operation:
    """unknown | manual → confirmed with the receipt a person found. When the provider can be
    asked, it is asked first (outside the transaction) and the confirm is refused if it denies
    the effect: no effect for the key, still processing, or a different remote ID."""
    operation = _operation_for_actor(operation_id, user)
    reason = _require_reason(reason)
    remote_id = (remote_id or "").strip()
    if not remote_id:
        raise InvalidInput("Confirming needs the provider's remote ID.", details={"field": "remote_id"})
    if operation.status not in RESOLVABLE:
        raise _already_resolved(operation)
    answer, asked_at, latency_ms = _ask_provider(operation)
    evidence: dict[str, Any] = {"by": user_ref(user), "remote_id": remote_id, "query": answer.state,
                                "raw": answer.raw, "asked_at": asked_at.isoformat(), "latency_ms": latency_ms}
    receipt: dict[str, Any] = {"remote_id": remote_id, "provider": operation.tool.adapter, "via": "support",
                               "entered_by": user_ref(user)}
    if answer.state == FOUND:
        found = answer.receipt or {}
        provider_id = str(found.get("remote_id") or found.get("message_id") or "")
        if provider_id != remote_id:
            raise ProviderDenied(
                f"The provider has {provider_id or 'another effect'} for this key, not {remote_id}.",
                details={"field": "remote_id", "provider_remote_id": provider_id})
        differences = effect_differences(adapter_for(operation.tool), operation.arguments, found)
        if differences:
            raise ProviderDenied(
                "The provider's effect differs from what was approved: " + ", ".join(sorted(differences))
                + ". Do not confirm it: propose a compensation instead.",
                details={"field": "remote_id", "differences": differences})
        receipt = {**found, "via": "support", "entered_by": user_ref(user)}
    elif answer.state in (ABSENT, PROCESSING):
        raise ProviderDenied(
            "The provider has no effect for this key." if answer.state == ABSENT
            else "The provider is still processing this key; wait for it to finish.",
            details={"field": "remote_id", "query": answer.state})
    elif answer.state == ERROR:
        evidence["note"] = "the provider could not tell; confirmed on the person's receipt"
    try:
        with transaction.atomic():
            _locked_resolvable(operation_id)
            return services.operation_confirm(operation_id=operation_id, receipt=receipt, actor=user_ref(user),
                                              reason=reason, evidence=evidence)
    except Conflict as exc:
        raise _as_resolution_conflict(operation_id, exc) from exc


def support_mark_retry_safe(*, operation_id: str, user: AbstractBaseUser, reason: str) -> Operation:
    """unknown | manual → retry_safe, only on the provider's recent "absent"; the dispatch is
    enqueued on commit and reuses the operation ID and key (attempt + 1)."""
    operation = _operation_for_actor(operation_id, user)
    reason = _require_reason(reason)
    try:
        with transaction.atomic():
            operation = _locked_resolvable(operation_id)
            evidence = {"by": user_ref(user), **_no_effect_or_refuse(operation)}
            return services.operation_mark_retry_safe(operation_id=operation_id, actor=user_ref(user),
                                                      reason=reason, evidence=evidence)
    except Conflict as exc:
        raise _as_resolution_conflict(operation_id, exc) from exc


def support_fail(*, operation_id: str, user: AbstractBaseUser, reason: str) -> Operation:
    """unknown | manual → failed (no effect), on the same evidence as a retry."""
    operation = _operation_for_actor(operation_id, user)
    reason = _require_reason(reason)
    try:
        with transaction.atomic():
            operation = _locked_resolvable(operation_id)
            evidence = {"by": user_ref(user), **_no_effect_or_refuse(operation)}
            return services.operation_fail(operation_id=operation_id, actor=user_ref(user), reason=reason,
                                           evidence=evidence)
    except Conflict as exc:
        raise _as_resolution_conflict(operation_id, exc) from exc


def support_staff_of(tenant_id: int):
    """People who may be handed an operation of this tenant."""
    ids = Membership.objects.filter(tenant_id=tenant_id, role=Role.SUPPORT).values("user_id")
    return get_user_model().objects.filter(pk__in=ids, is_active=True).order_by("username")


def _notify_assignee(assignee, operation: Operation, *, by: str, reason: str) -> None:
    if not assignee.email:
        return
    send_mail(
        subject=f"[Countersign] Operation {operation.operation_id} is yours",
        message=(f"{by} assigned you operation {operation.operation_id} ({operation.tool.name}, "
                 f"call {operation.call_id}).\n\nReason: {reason}\n\n/operations/{operation.operation_id}/\n"),
        from_email=None, recipient_list=[assignee.email], fail_silently=True,
    )


def support_escalate(*, operation_id: str, user: AbstractBaseUser, assignee: str, reason: str) -> Operation:
    """unknown → manual, assigned to a named support person of the tenant (manual → manual
    re-assigns). The assignment is in the event's evidence; the assignee is emailed on commit."""
    operation = _operation_for_actor(operation_id, user)
    reason = _require_reason(reason)
    person = support_staff_of(operation.tenant_id).filter(username=assignee).first()
    if person is None:
        raise InvalidInput("Escalate to a support person of this tenant.", details={"field": "assignee"})
    evidence = {"assigned_to": person.get_username(), "assigned_by": user_ref(user)}
    try:
        with transaction.atomic():
            locked = _locked_resolvable(operation_id)
            if locked.status == OperationStatus.MANUAL:
                record_event(entity=Operation.EVENT_ENTITY, entity_id=operation_id, tenant_id=locked.tenant_id,
                             kind=Event.Kind.REASSIGNED, to_status=OperationStatus.MANUAL, actor=user_ref(user), reason=reason,
                             evidence=evidence)
            else:
                services.operation_escalate_manual(operation_id=operation_id, actor=user_ref(user), reason=reason,
                                                   evidence=evidence)
            transaction.on_commit(lambda: _notify_assignee(person, operation, by=user_ref(user), reason=reason))
    except Conflict as exc:
        raise _as_resolution_conflict(operation_id, exc) from exc
    operation.refresh_from_db()
    return operation


def support_mark_compensated(*, operation_id: str, user: AbstractBaseUser, evidence: str, reason: str) -> Operation:
    """compensation_required → compensated, settled by a person outside the ledger (a transfer
    reversed at the bank, the customer agreed to keep the difference) with the evidence of it.
    Refused while a compensating operation is still under way: it could yet take effect."""
    operation = _operation_for_actor(operation_id, user)
    reason = _require_reason(reason)
    evidence = (evidence or "").strip()
    if not evidence:
        raise InvalidInput("Settling a compensation case needs evidence (a reference, a receipt, a ticket).",
                           details={"field": "evidence"})
    with transaction.atomic():
        _locked_resolvable(operation_id, allowed=frozenset({OperationStatus.COMPENSATION_REQUIRED}))
        under_way = (operation.compensations.exclude(status__in=OPERATION_TERMINAL)
                     .order_by("created_at").first())
        if under_way is not None:
            raise Conflict(f"The compensation {under_way.operation_id} is still {under_way.status}: let it finish, "
                           "or have it rejected, before settling this by hand.",
                           details={"compensation": under_way.operation_id, "status": under_way.status})
        return services.operation_mark_compensated(
            operation_id=operation_id, actor=user_ref(user), reason=reason,
            evidence={"by": user_ref(user), "evidence": evidence})
