"""The one shape of every state change: compare-and-set, validate against TRANSITIONS, write,
and append the event row, all in one transaction.

Models that move through states declare `TRANSITIONS` (status → allowed next statuses) and
`EVENT_ENTITY`; each app's services call `transition()` once per verb.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from functools import cache
from typing import Any

from django.db import connections, models, router, transaction
from django.utils import timezone

from console.doorbell import ring_doorbell_on_commit
from console.lib import audit, django_private, sql
from console.lib.errors import Conflict, IllegalTransition
from console.models import Event


def event_row(
    *,
    entity: str,
    entity_id: str,
    tenant_id: int | None,
    kind: str,
    actor: str,
    to_status: str = "",
    from_status: str = "",
    reason: str = "",
    evidence: dict[str, Any] | None = None,
) -> Event:
    """An unsaved event row, for `record_events` (several events written in one INSERT).
    Only `transition()` writes kind TRANSITION: a status change goes through it."""
    if (kind == Event.Kind.TRANSITION) != bool(from_status):
        raise ValueError("A transition names the status it leaves; no other kind of event does.")
    # Every field given (an event is built for every move): the chain's fields are filled in by
    # the database, which links the row into its tenant's hash chain when it is written
    # (console/lib/audit.py).
    row = django_private.unsaved_instance(Event, {
        "id": None, "tenant_id": tenant_id, "entity": entity, "entity_id": str(entity_id), "kind": kind,
        "from_status": from_status, "to_status": to_status, "actor": actor, "reason": reason,
        "evidence": evidence or {}, "created_at": timezone.now(), "content_hash": "", "chain_seq": None,
        "prev_hash": "", "hash": "",
    })
    row.content_hash = audit.content_hash(row)
    return row


def record_events(rows: list[Event]) -> list[Event]:
    """Append event rows built by `event_row` in one statement (inside the caller's transaction)."""
    ring_doorbell_on_commit(rows)
    ids = sql.insert(Event, [sql.values_of(row) for row in rows], returning=("id",))
    for row, (pk,) in zip(rows, ids, strict=True):
        row.pk = pk
        row._state.adding = False
    return rows


def record_event(**fields: Any) -> Event:
    """Append one event row (the keyword arguments of `event_row`) inside the caller's transaction."""
    return record_events([event_row(**fields)])[0]


def transition(
    obj: models.Model,
    *,
    to: str,
    actor: str,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    guard: dict[str, Any] | None = None,
    changes: dict[str, Any] | None = None,
    also_insert: Sequence[models.Model] = (),
    also_update: Sequence[sql.Update] = (),
    unless: sql.Unless | None = None,
) -> bool:
    """Move `obj` from the status it was read with to `to`.

    `guard` adds conditions to the compare-and-set (e.g. `version=3`, `fencing_token=7`);
    `changes` are written with the status (F() expressions allowed). `also_insert` (unsaved
    instances, saved with their primary keys set) and `also_update` ((model, where, values))
    are written only if the move is, in the same statement where the database can. With
    `unless` (a statement and its parameters), nothing is written if it finds a row, and
    sql.Declined is raised. Returns False when the object is already in `to` (a no-op, no
    event). Raises IllegalTransition for a move not in TRANSITIONS and Conflict when another
    writer changed the row first.

    On PostgreSQL a move without F() expressions is one statement, atomic on its own: called
    outside a transaction, it opens none (no BEGIN and COMMIT round trips).
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
    if _has_updated_at(model):
        values.setdefault("updated_at", timezone.now())
    computed = [field for field, value in values.items() if hasattr(value, "resolve_expression")]
    if computed and unless is not None:
        raise ValueError("`unless` is for moves without F() expressions")
    filters = {"pk": obj.pk, "status": current, **(guard or {})}
    # No savepoint: callers hold the row (or their compare-and-set decides) inside their own
    # transaction, and a lost compare-and-set writes nothing, so the Conflict is raised after
    # the block and leaves the caller's transaction usable. A failed event insert still aborts
    # the whole transaction: the status never moves without its event row.
    event = event_row(entity=model.EVENT_ENTITY, entity_id=str(obj.pk), tenant_id=getattr(obj, "tenant_id", None),
                      kind=Event.Kind.TRANSITION, from_status=current, to_status=to, actor=actor, reason=reason,
                      evidence=evidence)
    one_statement = not computed and sql.connection_for(model).vendor == "postgresql"
    declined = False
    with nullcontext() if one_statement else transaction.atomic(savepoint=False):
        if computed:
            # F() expressions: the database computes them; RETURNING reads them back in the
            # same statement instead of a second SELECT.
            row = _update_returning(model, filters, values, computed)
            updated = 0 if row is None else 1
            if updated:
                record_events([event])
                pks = [sql.insert(type(extra), [sql.values_of(extra)], returning=("pk",))[0][0]
                       for extra in also_insert]
                for update_model, where, update_values in also_update:
                    sql.update(update_model, where=where, values=update_values)
        else:
            # The row, its event and the rows that go with the move in one statement where the
            # database can (PostgreSQL).
            inserts = [(type(row), sql.values_of(row)) for row in (event, *also_insert)]
            try:
                written = sql.update_then_write(model, where=filters, values=values, inserts=inserts,
                                                updates=also_update, unless=unless)
            except sql.Declined:
                written, declined = None, True  # raised after the block, as the Conflict is
            updated = 0 if written is None else 1
            if updated:
                pks = written[1:]
                ring_doorbell_on_commit([event])
    if declined:
        raise sql.Declined
    if updated != 1:
        raise Conflict(
            f"{model.EVENT_ENTITY} {obj.pk} changed while moving from {current} to {to}; read it again.",
            details={"entity": model.EVENT_ENTITY, "id": str(obj.pk), "expected": current},
        )
    for extra, pk in zip(also_insert, pks, strict=True):
        extra.pk = pk
        extra._state.adding = False
    for field, value in values.items():
        if field in computed:
            value = model._meta.get_field(field).to_python(row[computed.index(field)])
        setattr(obj, field, value)
    return True


@cache
def _has_updated_at(model: type[models.Model]) -> bool:
    return any(f.name == "updated_at" for f in model._meta.fields)


def _update_returning(model: type[models.Model], filters: dict[str, Any], values: dict[str, Any],
                      returning: list[str]) -> tuple | None:
    """`UPDATE … SET values WHERE filters RETURNING returning` (PostgreSQL and SQLite ≥ 3.35);
    the row, or None when no row matched. Filters and values are on the model's own columns."""
    using = router.db_for_write(model)
    sql, params = django_private.update_sql(model, filters=filters, values=values, using=using)
    conn = connections[using]
    columns = ", ".join(conn.ops.quote_name(model._meta.get_field(name).column) for name in returning)
    with conn.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {columns}", params)
        return cursor.fetchone()
