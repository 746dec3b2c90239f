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

import base64
import binascii
from collections.abc import Sequence
from urllib.parse import parse_qs, urlencode

from django.contrib.auth.models import AbstractBaseUser
from django.template.loader import render_to_string

from console import live
from console.lib.errors import NotFound
from ledger import support
from ledger import support_selectors as selectors
from ledger.models import Operation
from ledger.support_selectors import QUEUE_STATUSES, QueueFilters

QUEUE = frozenset(QUEUE_STATUSES)


def encode_queue_arg(filters: QueueFilters, *, last_page: bool = True) -> str:
    params = {k: v for k, v in (("status", filters.status), ("tool", filters.tool), ("q", filters.q)) if v}
    if not last_page:
        params["more"] = "1"
    if not params:
        return "all"
    return base64.urlsafe_b64encode(urlencode(sorted(params.items())).encode()).decode().rstrip("=")


def decode_queue_arg(arg: str) -> tuple[QueueFilters, bool]:
    if not arg or arg == "all":
        return QueueFilters(), True
    try:
        raw = base64.urlsafe_b64decode(arg + "=" * (-len(arg) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return QueueFilters(), True
    params = {k: v[0] for k, v in parse_qs(raw).items()}
    status = params.get("status", "")
    return QueueFilters(status=status if status in QUEUE else "", tool=params.get("tool", ""),
                        q=params.get("q", "")), params.get("more") != "1"


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
    filters, last_page = decode_queue_arg(arg)
    rows = selectors.queue_rows_by_id(user, list(touched))
    matching = set(
        selectors.apply_filters(Operation.objects.filter(operation_id__in=list(rows)), filters)
        .values_list("operation_id", flat=True)
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
    from ledger.views import live_detail_context

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
