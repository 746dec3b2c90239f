"""The one shape of every state change: compare-and-set, validate against TRANSITIONS, write,
and append the event row, all in one transaction.

Models that move through states declare `TRANSITIONS` (status → allowed next statuses) and
`EVENT_ENTITY`; each app's services call `transition()` once per verb.
"""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from django.utils import timezone

from console.lib.errors import Conflict, IllegalTransition


def record_event(
    *,
    entity: str,
    entity_id: str,
    tenant_id: int | None,
    to_status: str,
    actor: str,
    from_status: str = "",
    reason: str = "",
    evidence: dict[str, Any] | None = None,
):
    from console.live import ring_doorbell_on_commit
    from ledger.models import Event

    ring_doorbell_on_commit()
    return Event.objects.create(
        tenant_id=tenant_id,
        entity=entity,
        entity_id=str(entity_id),
        from_status=from_status,
        to_status=to_status,
        actor=actor,
        reason=reason,
        evidence=evidence or {},
    )


def transition(
    obj: models.Model,
    *,
    to: str,
    actor: str,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    guard: dict[str, Any] | None = None,
    changes: dict[str, Any] | None = None,
) -> bool:
    """Move `obj` from the status it was read with to `to`.

    `guard` adds conditions to the compare-and-set (e.g. `version=3`, `fencing_token=7`);
    `changes` are written with the status (F() expressions allowed). Returns False when the
    object is already in `to` (a no-op, no event). Raises IllegalTransition for a move not in
    TRANSITIONS and Conflict when another writer changed the row first.
    """
    model = type(obj)
    current = obj.status
    if current == to:
        return False
    if to not in model.TRANSITIONS.get(current, frozenset()):
        raise IllegalTransition(
            f"{model.EVENT_ENTITY} {obj.pk} cannot go from {current} to {to}.",
            details={"entity": model.EVENT_ENTITY, "id": str(obj.pk), "from": current, "to": to},
        )
    values = {"status": to, **(changes or {})}
    if any(f.name == "updated_at" for f in model._meta.fields):
        values.setdefault("updated_at", timezone.now())
    with transaction.atomic():
        updated = model.objects.filter(pk=obj.pk, status=current, **(guard or {})).update(**values)
        if updated != 1:
            raise Conflict(
                f"{model.EVENT_ENTITY} {obj.pk} changed while moving from {current} to {to}; read it again.",
                details={"entity": model.EVENT_ENTITY, "id": str(obj.pk), "expected": current},
            )
        record_event(
            entity=model.EVENT_ENTITY,
            entity_id=str(obj.pk),
            tenant_id=getattr(obj, "tenant_id", None),
            from_status=current,
            to_status=to,
            actor=actor,
            reason=reason,
            evidence=evidence,
        )
    if any(hasattr(value, "resolve_expression") for value in values.values()):
        obj.refresh_from_db(fields=list(values))  # F() expressions: read what the database computed
    else:
        for field, value in values.items():
            setattr(obj, field, value)
    return True
