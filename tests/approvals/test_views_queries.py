"""The inbox and the detail page run the same number of queries whatever the number of pending
requests: the rows are one query, the per-tier counts one (PendingCount), the page's IDs one."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals.models import ApprovalDecision

pytestmark = pytest.mark.django_db

INBOX_PAGES = {
    "inbox": ("", {}),
    "inbox, tier filter": ("?tier=3", {}),
    "inbox, every filter": ("?tool=payments.refund&tier=3&task_type=refund&tenant=acme&age=24h&q=call", {}),
    "inbox, fragment": ("?tier=4", {"HTTP_HX_REQUEST": "true"}),
}


def queries(client, url: str, **headers) -> int:
    cache.clear()  # the filter choices are cached for a minute: count them every time
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url, **headers)
    assert response.status_code == 200
    return len(captured)


def file_pending(make_approval, reviewer, n: int) -> list:
    made = []
    for i in range(n):
        approval = make_approval(risk_tier=3 + (i % 2))
        if i % 4 == 1:  # some L4 rows this reviewer has already approved once
            ApprovalDecision.objects.create(request=approval, reviewer=reviewer, verdict="approve",
                                            arguments_hash=approval.arguments_hash)
        made.append(approval)
    return made


def page_queries(client, approval) -> dict[str, int]:
    inbox = reverse("approvals:inbox")
    out = {name: queries(client, inbox + query, **headers) for name, (query, headers) in INBOX_PAGES.items()}
    detail = reverse("approvals:detail", args=[approval.approval_id])
    client.get(detail)  # the policy catalog is read once per generation, then kept in process
    out["detail"] = queries(client, detail)
    return out


def test_the_inbox_and_the_detail_page_run_as_many_queries_for_10_and_for_50_pending(
        client, senior, make_approval):
    client.force_login(senior)
    ten = page_queries(client, file_pending(make_approval, senior, 10)[-2])
    # The same kind of request each time (L3, undecided): the 10th and the 50th.
    fifty = page_queries(client, file_pending(make_approval, senior, 40)[-2])
    assert ten == fifty
    # Session, user, scope (with the layout's roles), tools, choices (task types, agents),
    # cursor, tier counts, page IDs, rows; a filtered page 1 that fits on the page needs no COUNT.
    assert ten["inbox"] == 10
    assert ten["inbox, every filter"] == ten["inbox"]
    assert ten["detail"] <= 11


def test_a_filtered_list_longer_than_a_page_adds_only_its_count(client, senior, make_approval, monkeypatch):
    from approvals import views

    monkeypatch.setattr(views, "PAGE_SIZE", 4)
    file_pending(make_approval, senior, 6)
    client.force_login(senior)
    inbox = reverse("approvals:inbox")
    unfiltered = queries(client, inbox)
    assert queries(client, inbox + "?tool=payments.refund") == unfiltered + 1
    assert queries(client, inbox + "?tool=payments.refund&page=2") == unfiltered + 1
    response = client.get(inbox + "?tool=payments.refund")
    assert response.context["page"].paginator.count == 6
    assert len(response.context["rows"]) == 4
