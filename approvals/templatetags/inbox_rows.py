"""{% load inbox_rows %}: `{% inbox_rows rows %}` renders the inbox's rows; the live inbox
stream (approvals/live.py) sends the same rows from `render_rows`.

A row is written here in Python rather than as an included template: 25 rows through the
template engine (an include, a url tag and a dozen filters each) were the largest share of the
inbox's server time (bench/inbox.py). Every value that came from an agent or a person is escaped
(`escape`, or `reveal_html` for the task's goal, which shows hidden characters); the rest are
integers and fixed words.
"""

from __future__ import annotations

from collections.abc import Iterable

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator
from django.utils.timesince import timesince, timeuntil

from console.lib.reveal import hidden_characters, reveal_html, reveal_text

register = template.Library()

_HIDDEN_BADGE = (' <span class="badge badge--plain badge--red" title="The goal holds characters that cannot be seen'
                 ' as themselves">hidden characters</span>')
_PLACEHOLDER = "apr_placeholder"


def _detail_url_prefix() -> tuple[str, str]:
    # One reverse() for the whole page instead of one per row; approval IDs are [0-9a-z_] and
    # need no quoting in a path.
    url = reverse("approvals:detail", args=[_PLACEHOLDER])
    head, _, tail = url.partition(_PLACEHOLDER)
    return head, tail


def _time(value, *, countdown: bool = False, until: bool = False) -> str:
    local = timezone.localtime(value)
    text = timeuntil(value) if until else f"{timesince(value)} ago"
    return (f'<time{" data-countdown" if countdown else ""} datetime="{local.isoformat()}" '
            f'title="{local.strftime("%Y-%m-%d %H:%M:%S")} UTC">{escape(text)}</time>')


def render_row(row, *, oob: str = "", url: tuple[str, str] | None = None) -> str:
    """One inbox row (`<tr id="approval-…">`). `row` comes from `selectors.inbox_rows` (or
    `inbox_rows_by_id`) and `selectors.decorate_rows`; `oob` is "" on the page, "insert" for a
    new row the stream adds at the top, "replace" for a row the stream swaps in place."""
    head, tail = url or _detail_url_prefix()
    detail_url = f"{head}{row.approval_id}{tail}"
    tier = int(row.risk_tier)
    status = row.status
    is_open = row.is_open
    call_id = escape(row.call_id)
    swap = ' hx-swap-oob="outerHTML"' if oob == "replace" else ""
    classes = "inbox-row" + (" is-new" if oob == "insert" else "") + ("" if is_open else " is-muted")
    goal = row.task.goal or ""
    if status == "pending":
        expires = _time(row.expires_at, countdown=True, until=True)
    else:
        expires = '<span class="muted">—</span>'
    needs = ""
    if row.approvals_needed > 1 and status == "pending":
        needs = f'<span class="small muted">{int(row.approvals_given)} of {int(row.approvals_needed)} approvals</span>'
    flag = ""
    if is_open and not row.can_decide_tier:
        flag = f'<span class="badge badge--plain badge--red">needs L{tier} reviewer</span>\n    '
    elif is_open and row.decided_by_me:
        flag = '<span class="small muted">you approved; needs another reviewer</span>'
    if is_open and row.can_decide_tier and not row.decided_by_me:
        action = (f'<a class="btn btn--small btn--primary" href="{detail_url}">Review'
                  f'<span class="sr-only"> {call_id}</span></a>')
    else:
        action = f'<a class="btn btn--small" href="{detail_url}">View<span class="sr-only"> {call_id}</span></a>'
    return (
        f'<tr id="approval-{escape(row.approval_id)}" data-href="{detail_url}" class="{classes}"'
        f'{swap}>\n'
        f'  <td><span class="risk risk--L{tier}">L{tier}</span></td>\n'
        f'  <td><a class="inbox-row__link mono" href="{detail_url}">{escape(Truncator(row.call_id).chars(32))}</a>\n'
        f'    <div class="muted small mono" title="Operation ID">{escape(Truncator(row.operation_id).chars(24))}'
        f'</div></td>\n'
        f'  <td><code class="nowrap">{escape(row.tool.name)}</code></td>\n'
        f'  <td><div>{escape(row.task_type)}{_HIDDEN_BADGE if hidden_characters(goal) else ""}</div>'
        f'<div class="muted small truncate" title="{escape(reveal_text(goal))}">{reveal_html(goal)}</div></td>\n'
        f'  <td class="nowrap">{_time(row.created_at)}</td>\n'
        f'  <td>{expires}</td>\n'
        f'  <td><div class="cluster">\n'
        f'    <span class="badge badge--{escape(status)}">{escape(status)}</span>\n'
        f'    {needs}\n'
        f'    {flag}\n'
        f'  </div></td>\n'
        f'  <td class="actions">{action}</td>\n'
        f'</tr>\n'
    )


def render_rows(rows: Iterable, *, oob: str = "") -> SafeString:
    url = _detail_url_prefix()
    return mark_safe("".join(render_row(row, oob=oob, url=url) for row in rows))  # noqa: S308 - escaped above


@register.simple_tag
def inbox_rows(rows: Iterable, oob: str = "") -> SafeString:
    return render_rows(rows, oob=oob)
