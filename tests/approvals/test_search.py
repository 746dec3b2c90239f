"""The inbox's search by ID: the same matches as a plain `icontains` over the four IDs, and on
PostgreSQL an ID is looked up in the trigram index rather than found by reading every pending
request."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Q

from approvals import selectors
from approvals.filters import InboxFilterSet
from approvals.models import ApprovalRequest
from ledger import decisions

pytestmark = pytest.mark.django_db


def old_search(q: str) -> Q:
    """The search as it was before the trigram index: one OR over the four columns."""
    return (Q(call_id__icontains=q) | Q(operation__operation_id__icontains=q) | Q(task__task_id__icontains=q)
            | Q(approval_id__icontains=q))


@pytest.fixture
def requests(reviewer, make_approval):
    first = make_approval(call_id="call_Mixed-Case_01")
    second = make_approval(call_id="toolu_0123456789abcdef")
    # A call ID holding another request's approval ID (in capitals): a search for that ID finds both.
    third = make_approval(call_id=f"x-{first.approval_id.upper()}-y")
    fourth = make_approval(call_id="odd%chars_here\\and there")
    decided = make_approval(call_id="call_decided_0123456789")
    decisions.approval_reject(approval_id=decided.approval_id, reviewer=reviewer, reason="no")
    return [first, second, third, fourth, decided]


def queries(requests: list[ApprovalRequest]) -> list[str]:
    first, second, _, _, decided = requests
    return [
        first.approval_id, first.approval_id.upper(), f"  {first.approval_id}  ", first.approval_id[:12],
        first.approval_id[-10:], second.operation_id, second.operation_id.upper(), second.task_id,
        second.call_id, second.call_id[3:], decided.approval_id, decided.call_id, "call_mixed-case_01",
        "odd%chars_here\\and", "chars_here", "%", "_", "\\", "c", "call", "apr_", "nothing-like-this-anywhere",
        "there", "here\\and there",
    ]


def test_the_inbox_search_finds_what_the_old_filter_found(reviewer, requests):
    scope = selectors.reviewer_scope(reviewer)
    for q in queries(requests):
        found = set(selectors.inbox_ids(scope, InboxFilterSet.of(q=q)))
        expected = set(selectors.pending_in_scope(scope).filter(old_search(q.strip())).values_list("pk", flat=True))
        assert found == expected, q
    # the capitals of a call ID are no obstacle, and the ID in another call's ID is found too
    first, _, third, _, _ = requests
    assert set(selectors.inbox_ids(scope, InboxFilterSet.of(q=first.approval_id))) == {
        first.approval_id, third.approval_id}


def test_the_search_of_any_status_finds_what_the_old_filter_found(reviewer, requests):
    """The decisions' export searches requests of every status."""
    scope = selectors.reviewer_scope(reviewer)
    every = ApprovalRequest.objects.filter(tenant_id__in=scope.tenant_ids)
    for q in queries(requests):
        found = set(InboxFilterSet.of(q=q).apply(every).values_list("pk", flat=True))
        assert found == set(every.filter(old_search(q.strip())).values_list("pk", flat=True)), q


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the trigram index is PostgreSQL's")
def test_a_search_by_id_reads_the_trigram_index_not_every_pending_request(reviewer, requests):
    """With ten thousand pending requests (copies of one, analysed), PostgreSQL looks an ID up
    in the trigram index, one column at a time; the four columns ORed together it priced above
    reading the whole table, so it read the table."""
    columns = [f.column for f in ApprovalRequest._meta.concrete_fields]
    copied = {"approval_id": "'apr_' || md5(i::text)", "call_id": "'call-' || i"}
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO approvals_approvalrequest ({', '.join(columns)}) "
            f"SELECT {', '.join(copied.get(c, c) for c in columns)} "
            "FROM approvals_approvalrequest, generate_series(1, 10000) AS i WHERE approval_id = %s",
            [requests[1].approval_id])
        # As a database that grew to this size would have them: the index's own statistics
        # (written when it is built or vacuumed, never by an insert) and the table's.
        cursor.execute("REINDEX INDEX approval_search_trgm_idx")
        cursor.execute("ANALYZE approvals_approvalrequest")
    scope = selectors.reviewer_scope(reviewer)
    ids = selectors.inbox_ids(scope, InboxFilterSet.of(q=requests[0].approval_id))[:26]
    sql, params = ids.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert plan.count("approval_search_trgm_idx") == 4, plan
    assert "Seq Scan" not in plan, plan
    assert set(ids) == {requests[0].approval_id, requests[2].approval_id}
