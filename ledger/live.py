"""Live streams of the support console (registered from `LedgerConfig.ready`).

- "unknown" (`/ws/live/unknown/<filters>/`): an operation that becomes unknown, manual or
  compensation_required is appended to the queue (`#unknown-rows`, when it matches the page's
  filters and the page is the last one: the queue is oldest first); one that moves within the
  queue has its cells updated in place; one that leaves is deleted (`#op-<operation_id>`). The
  counts and figures are re-rendered.
- "operation" (`/ws/live/operation/<operation_id>/`): the detail page's status, provider
  answers, evidence, timeline and attempts follow the operation and its provider queries.

HTML parsing shapes the fragments: htmx parses a websocket message inside a <template>, where a
top-level <tbody> is kept only while no non-table element came before it. So table fragments
(<tbody> wrappers) come first, then everything else; rows are never replaced whole, only their
cells (by id), because a bare top-level <tr> would swallow the <tbody> wrappers after it.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib.auth.models import AbstractBaseUser
from django.template.loader import render_to_string

from console import live
from console.lib.errors import NotFound
from ledger import support
from ledger import support_selectors as selectors
from ledger.filters import QueueFilterSet
from ledger.models import Operation
from ledger.support_context import live_detail_context
from ledger.support_selectors import QUEUE_STATUSES

QUEUE = frozenset(QUEUE_STATUSES)


def read_queue_arg(arg: str) -> tuple[QueueFilterSet, bool]:
    """The page's filters (`QueueFilterSet.live_arg`), and whether it is the queue's last page."""
    filters, data = QueueFilterSet.from_arg(arg)
    return filters, data.get("more") != "1"


def render_unknown(user: AbstractBaseUser, events: Sequence, arg: str) -> str:
    touched: dict[str, None] = {}
    entered: set[str] = set()
    tenant_ids = selectors.viewer_tenant_ids(user)
    for event in events:
        if event.entity != Operation.EVENT_ENTITY or event.tenant_id not in tenant_ids:
            continue
        if event.to_status in QUEUE or event.from_status in QUEUE:
            touched.setdefault(event.entity_id, None)
        if event.to_status in QUEUE and event.from_status not in QUEUE:
            entered.add(event.entity_id)
    if not touched:
        return ""
    filters, last_page = read_queue_arg(arg)
    rows = selectors.queue_rows_by_id(user, list(touched))
    matching = set(
        filters.apply(Operation.objects.filter(operation_id__in=list(rows))).values_list("operation_id", flat=True)
    )
    table_parts: list[str] = []
    cell_parts: list[str] = []
    for operation_id in touched:
        row = rows.get(operation_id)
        if row is None or operation_id in entered:
            # Left the queue, or (re-)entered it: whatever copy the page has goes.
            table_parts.append(f'<tbody hx-swap-oob="delete:#op-{operation_id}"></tbody>')
        if row is None:
            continue
        if operation_id in entered:
            if last_page and operation_id in matching:
                table_parts.append(render_to_string("ledger/_queue_rows_oob.html", {"rows": [row]}))
        else:
            cell_parts.append(render_to_string("ledger/_queue_cells_oob.html", {"row": row}))
    counts = selectors.status_counts(user)
    cell_parts.append(render_to_string("ledger/_queue_summary.html", {
        "counts": counts, "total": sum(counts.values()), "figures": selectors.figures(user, counts), "oob": True,
        "filters": filters,
    }))
    return "".join(table_parts + cell_parts)


def render_operation(user: AbstractBaseUser, events: Sequence, arg: str) -> str:
    if not any(e.entity_id == arg for e in events):
        return ""
    try:
        operation = support.operation_for_viewer(operation_id=arg, user=user)
    except NotFound:
        return ""
    context = live_detail_context(user, operation)
    context["oob"] = True
    return render_to_string("ledger/_detail_oob.html", context)


live.register(live.Stream(name="unknown", entities=(Operation.EVENT_ENTITY,), render=render_unknown,
                          roles=support.VIEW_ROLES))
live.register(live.Stream(name="operation", entities=(Operation.EVENT_ENTITY, support.PROVIDER_QUERY_ENTITY),
                          render=render_operation, roles=support.VIEW_ROLES))
