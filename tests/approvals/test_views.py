"""The reviewer console's pages and decisions, through the Django test client."""

from __future__ import annotations

import pytest
from django.urls import reverse

from approvals.filters import InboxFilterSet
from approvals.live import read_inbox_arg, render_approval, render_inbox, render_inbox_counts
from approvals.models import ApprovalDecision, ApprovalRequest
from console.models import Event, Role
from ledger import decisions
from ledger import services as ledger_services
from ledger.compensation import compensation_propose
from ledger.models import Operation
from tests.conftest import make_user
from tests.fixtures.support import make_operation

pytestmark = pytest.mark.django_db


def inbox_url(**params) -> str:
    from urllib.parse import urlencode

    return reverse("approvals:inbox") + (f"?{urlencode(params)}" if params else "")


def detail_url(approval: ApprovalRequest) -> str:
    return reverse("approvals:detail", args=[approval.approval_id])


def approve_url(approval: ApprovalRequest) -> str:
    return reverse("approvals:approve", args=[approval.approval_id])


def reject_url(approval: ApprovalRequest) -> str:
    return reverse("approvals:reject", args=[approval.approval_id])


def fresh(approval: ApprovalRequest) -> tuple[ApprovalRequest, Operation]:
    approval = ApprovalRequest.objects.get(pk=approval.pk)
    return approval, Operation.objects.get(pk=approval.operation_id)


@pytest.fixture
def mine(make_approval):
    return make_approval(risk_tier=3)


@pytest.fixture
def theirs(outsider_agent):
    from tests.factories import make_pending_approval

    return make_pending_approval(outsider_agent, risk_tier=2)


# ------------------------------------------------------------------------------------ inbox


def test_anonymous_visitors_are_sent_to_the_login_page(client, mine):
    for url in (inbox_url(), detail_url(mine)):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))
    response = client.post(approve_url(mine))
    assert response.status_code == 302
    assert fresh(mine)[0].status == "pending"


def test_a_reviewer_sees_only_their_tenants_requests(client, reviewer, mine, theirs):
    client.force_login(reviewer)
    response = client.get(inbox_url())
    assert response.status_code == 200
    body = response.content.decode()
    assert f'id="approval-{mine.approval_id}"' in body
    assert theirs.approval_id not in body
    assert response.context["active_nav"] == "approvals"


def test_the_inbox_lists_the_most_urgent_request_first(client, reviewer, make_approval):
    later = make_approval(ttl_seconds=3600)
    sooner = make_approval(ttl_seconds=120)
    client.force_login(reviewer)
    rows = client.get(inbox_url()).context["rows"]
    assert [r.approval_id for r in rows] == [sooner.approval_id, later.approval_id]


def test_higher_tiers_are_listed_but_marked_and_without_a_review_button(client, reviewer, make_approval):
    l4 = make_approval(risk_tier=4)
    client.force_login(reviewer)
    body = client.get(inbox_url()).content.decode()
    row = body[body.index(f'id="approval-{l4.approval_id}"'):]
    row = row[:row.index("</tr>")]
    assert "needs L4 reviewer" in row
    assert ">Review<" not in row
    assert ">View<" in row


def test_filters_and_search_narrow_the_list(client, reviewer, make_approval):
    refund = make_approval(risk_tier=3, call_id="call-refund-abc")
    mail = make_approval(tool_name="mail.send", risk_tier=2, task_type="notify", call_id="call-mail-xyz")
    client.force_login(reviewer)

    def ids(**params):
        return {r.approval_id for r in client.get(inbox_url(**params)).context["rows"]}

    assert ids() == {refund.approval_id, mail.approval_id}
    assert ids(tool="mail.send") == {mail.approval_id}
    assert ids(tier=3) == {refund.approval_id}
    assert ids(task_type="notify") == {mail.approval_id}
    assert ids(q="refund-abc") == {refund.approval_id}
    assert ids(q=mail.operation_id) == {mail.approval_id}
    assert ids(q=refund.task_id) == {refund.approval_id}
    assert ids(age="15m") == {refund.approval_id, mail.approval_id}
    assert ids(age="older") == set()
    assert ids(tenant="acme") == {refund.approval_id, mail.approval_id}
    assert ids(requested_by=refund.requested_by_id) == {refund.approval_id, mail.approval_id}
    # a stale or hand-made value is ignored, not an error
    assert ids(tier="L9") == {refund.approval_id, mail.approval_id}
    assert ids(tenant="globex") == {refund.approval_id, mail.approval_id}  # not one of mine
    assert ids(requested_by="x") == {refund.approval_id, mail.approval_id}


def test_an_htmx_request_gets_only_the_table_fragment(client, reviewer, mine):
    client.force_login(reviewer)
    response = client.get(inbox_url(tool="payments.refund"), HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="inbox-results"')
    assert "<html" not in body
    assert f'id="approval-{mine.approval_id}"' in body
    assert "HX-Request" in response["Vary"]


def test_the_inbox_counts_pending_requests_per_tier(client, reviewer, make_approval):
    make_approval(risk_tier=3)
    make_approval(risk_tier=3)
    make_approval(risk_tier=4)
    client.force_login(reviewer)
    counts = client.get(inbox_url()).context["counts"]
    assert counts == {0: 0, 1: 0, 2: 0, 3: 2, 4: 1}


def test_the_inbox_paginates(client, reviewer, make_approval):
    for _ in range(27):
        make_approval()
    client.force_login(reviewer)
    first = client.get(inbox_url())
    assert len(first.context["rows"]) == 25
    second = client.get(inbox_url(page=2))
    assert len(second.context["rows"]) == 2


@pytest.mark.parametrize("n", [3, 30])
def test_the_inbox_query_count_does_not_grow_with_rows(client, reviewer, agent, make_approval, n,
                                                       django_assert_max_num_queries):
    for i in range(n):
        approval = make_approval(risk_tier=3 + (i % 2))
        if i % 3 == 0 and approval.risk_tier == 4:
            ApprovalDecision.objects.create(request=approval, reviewer=reviewer, verdict="approve",
                                            arguments_hash=approval.arguments_hash)
    client.force_login(reviewer)
    # Session, user, scope (with tenants), tools, the cached choices (task types, agents: cold
    # here), cursor, tier counts, page IDs, rows — the same for 3 and 30 rows.
    with django_assert_max_num_queries(11):
        response = client.get(inbox_url())
    assert response.status_code == 200
    assert len(response.context["rows"]) == min(n, 25)
    # Every filter at once: one COUNT more (the tier counts no longer give the total).
    filters = {"tool": "payments.refund", "tier": 3, "task_type": "refund", "tenant": "acme",
               "requested_by": agent.pk, "age": "24h", "q": "call"}
    with django_assert_max_num_queries(12):
        response = client.get(inbox_url(**filters))
    assert len(response.context["rows"]) == min((n + 1) // 2, 25)


def test_the_detail_query_count_does_not_grow_with_decisions(client, senior, senior2, make_approval,
                                                             django_assert_max_num_queries):
    from approvals.models import NotificationChannel

    for target in ("a@example.com", "b@example.com"):
        NotificationChannel.objects.create(tier=4, kind="email", target=target)
    approval = make_approval(risk_tier=4)
    client.force_login(senior)
    client.post(approve_url(approval), {"reason": "ok"})
    assert approval.notifications.count() == 2
    # 7, plus one for the notifications (channels joined), one for the request it edits, two
    # for the trace so far (its spans, the prices), and one for a stop that would freeze it.
    with django_assert_max_num_queries(12):
        response = client.get(detail_url(approval))
    assert response.status_code == 200


# ----------------------------------------------------------------------------------- detail


def test_the_detail_page_shows_the_trace_so_far_read_only(client, reviewer, mine, make_approval):
    import json
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Span

    now = timezone.now()

    def span(task, trace, span_id, name, *, parent="", linked=True):
        return Span.objects.create(tenant_id=task.tenant_id, trace_id=trace * 32, span_id=span_id * 16,
                                   parent_span_id=parent * 16 if parent else "", name=name,
                                   start_time=now, end_time=now + timedelta(milliseconds=5), duration_ms=5,
                                   task=task if linked else None)

    span(mine.task, "a", "1", "agent run")
    span(mine.task, "a", "2", "tool call payments.refund", parent="1", linked=False)  # same trace
    other = make_approval()
    span(other.task, "b", "3", "another task's span")
    client.force_login(reviewer)
    response = client.get(detail_url(mine))
    body = response.content.decode()
    assert 'id="run-waterfall"' in body and 'data-active="false"' in body
    spans = json.loads(body.split('<script id="run-spans" type="application/json">')[1].split("</script>")[0])
    assert sorted(row[3] for row in spans) == ["agent run", "tool call payments.refund"]
    assert "2 spans" in body
    theirs = client.get(detail_url(other)).content.decode()
    assert "another task&#x27;s span" in theirs or "another task's span" in theirs
    assert "agent run" not in theirs


def test_an_outsider_gets_404_on_another_tenants_request(client, outsider, mine):
    client.force_login(outsider)
    assert client.get(detail_url(mine)).status_code == 404
    assert client.post(approve_url(mine)).status_code == 404
    assert client.post(reject_url(mine), {"reason": "no"}).status_code == 404
    assert fresh(mine)[0].status == "pending"


def test_an_unknown_id_is_404(client, reviewer):
    client.force_login(reviewer)
    assert client.get(reverse("approvals:detail", args=["apr_nope"])).status_code == 404


def test_the_detail_shows_the_call_the_contract_and_why(client, reviewer, mine):
    client.force_login(reviewer)
    response = client.get(detail_url(mine))
    body = response.content.decode()
    assert response.status_code == 200
    for text in (mine.call_id, mine.operation_id, "payments.refund", "amount &gt; 50", "Refund the damaged order",
                 "refund confirmed by the provider", "max_amount", "ord-1001", mine.arguments_hash):
        assert text in body, text
    assert 'ws-connect="/ws/live/approval/' + mine.approval_id + '/"' in body
    assert "data-countdown" in body
    assert 'id="approve-button"' in body


def test_secret_arguments_are_masked(client, reviewer, make_approval, policy):
    tool = policy["payments.refund"]
    tool.secret_fields = ["reason"]
    tool.save()
    approval = make_approval(arguments={"order_id": "ord-7", "amount": 80, "currency": "EUR",
                                        "reason": "card 4242-4242"})
    client.force_login(reviewer)
    body = client.get(detail_url(approval)).content.decode()
    assert "4242-4242" not in body
    assert "••••••••" in body


def test_a_mail_call_shows_the_email_as_it_will_be_sent(client, reviewer, make_approval):
    approval = make_approval(tool_name="mail.send", risk_tier=2)
    client.force_login(reviewer)
    body = client.get(detail_url(approval)).content.decode()
    assert "The email as it will be sent" in body
    assert "customer@example.com" in body
    assert "Your refund" in body


def test_a_tier_without_shows_preview_hides_the_preview_and_says_so(client, reviewer, make_approval):
    from approvals.models import PolicyTier

    PolicyTier.objects.filter(level=2).update(shows_preview=False)
    approval = make_approval(tool_name="mail.send", risk_tier=2)
    client.force_login(reviewer)
    body = client.get(detail_url(approval)).content.decode()
    assert "The email as it will be sent" not in body
    assert 'id="preview-off"' in body
    assert "The preview is off for L2" in body


def test_a_tier_with_shows_preview_shows_the_preview_of_a_tool_at_a_higher_tier(client, reviewer, make_approval):
    from approvals.models import PolicyTier

    approval = make_approval(tool_name="mail.send", risk_tier=3)
    client.force_login(reviewer)
    body = client.get(detail_url(approval)).content.decode()
    assert "The email as it will be sent" not in body and 'id="preview-off"' in body
    PolicyTier.objects.filter(level=3).update(shows_preview=True)
    body = client.get(detail_url(approval)).content.decode()
    assert "The email as it will be sent" in body and 'id="preview-off"' not in body


def test_a_tool_without_a_preview_says_nothing_about_previews(client, reviewer, mine):
    client.force_login(reviewer)
    body = client.get(detail_url(mine)).content.decode()
    assert 'id="preview"' not in body and 'id="preview-off"' not in body


def test_the_detail_warns_when_the_task_version_moved(client, reviewer, mine):
    from runs.models import Task

    Task.objects.filter(pk=mine.task_id).update(version=mine.state_version + 2)
    client.force_login(reviewer)
    body = client.get(detail_url(mine)).content.decode()
    assert 'id="version-warning"' in body
    assert f"version {mine.state_version} when the agent asked" in body


def test_an_l3_reviewer_sees_an_l4_request_without_decision_controls(client, reviewer, make_approval):
    l4 = make_approval(risk_tier=4)
    client.force_login(reviewer)
    body = client.get(detail_url(l4)).content.decode()
    assert 'id="needs-higher"' in body
    assert 'id="approve-button"' not in body


# -------------------------------------------------------------------------------- decisions


def test_approving_moves_the_request_to_approved_and_the_operation_to_authorized(client, reviewer, mine):
    client.force_login(reviewer)
    response = client.post(approve_url(mine), {"reason": "looks right", "arguments_hash": mine.arguments_hash})
    assert response.status_code == 302
    approval, operation = fresh(mine)
    assert approval.status == "approved"
    assert operation.status == "authorized"
    decision = ApprovalDecision.objects.get(request=approval)
    assert (decision.reviewer, decision.verdict, decision.reason) == (reviewer, "approve", "looks right")
    assert Event.objects.filter(entity="approval", entity_id=mine.approval_id, to_status="approved").exists()


def test_an_htmx_approval_returns_the_review_panel(client, reviewer, mine):
    client.force_login(reviewer)
    response = client.post(approve_url(mine), {"arguments_hash": mine.arguments_hash}, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="review"')
    assert 'badge--approved' in body
    assert 'badge--authorized' in body


def test_rejecting_without_a_reason_is_400_and_changes_nothing(client, reviewer, mine):
    client.force_login(reviewer)
    events = Event.objects.count()
    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = client.post(reject_url(mine), {"reason": "   "}, **headers)
        assert response.status_code == 400
        assert "A rejection needs a reason." in response.content.decode()
        assert 'aria-invalid="true"' in response.content.decode()
    approval, operation = fresh(mine)
    assert (approval.status, operation.status) == ("pending", "planned")
    assert not ApprovalDecision.objects.exists()
    assert Event.objects.count() == events


def test_rejecting_with_a_reason_rejects_the_request_and_the_operation(client, reviewer, mine):
    client.force_login(reviewer)
    response = client.post(reject_url(mine), {"reason": "wrong order"})
    assert response.status_code == 302
    approval, operation = fresh(mine)
    assert (approval.status, operation.status) == ("rejected", "rejected")


def test_an_l3_reviewer_posting_approve_on_an_l4_request_gets_403_and_changes_nothing(client, reviewer,
                                                                                      make_approval):
    l4 = make_approval(risk_tier=4)
    client.force_login(reviewer)
    events = Event.objects.count()
    response = client.post(approve_url(l4), {"arguments_hash": l4.arguments_hash})
    assert response.status_code == 403
    assert "you may approve up to L3" in response.content.decode()
    assert client.post(reject_url(l4), {"reason": "no"}).status_code == 403
    approval, operation = fresh(l4)
    assert (approval.status, operation.status) == ("pending", "planned")
    assert not ApprovalDecision.objects.exists()
    assert Event.objects.count() == events


def test_an_l4_request_needs_two_distinct_seniors(client, senior, senior2, make_approval):
    l4 = make_approval(risk_tier=4)
    client.force_login(senior)
    assert client.post(approve_url(l4), {"arguments_hash": l4.arguments_hash}).status_code == 302
    approval, operation = fresh(l4)
    assert (approval.status, operation.status) == ("pending", "planned")

    again = client.post(approve_url(l4), {"arguments_hash": l4.arguments_hash})
    assert again.status_code == 409
    assert "second approver" in again.content.decode()
    assert fresh(l4)[0].status == "pending"

    client.force_login(senior2)
    assert client.post(approve_url(l4), {"arguments_hash": l4.arguments_hash}).status_code == 302
    approval, operation = fresh(l4)
    assert (approval.status, operation.status) == ("approved", "authorized")
    assert set(approval.decisions.values_list("reviewer__username", flat=True)) == {"senior", "senior2"}


def test_deciding_an_already_decided_request_says_who_decided(client, reviewer, senior, mine):
    client.force_login(senior)
    client.post(approve_url(mine), {"arguments_hash": mine.arguments_hash})
    client.force_login(reviewer)
    response = client.post(reject_url(mine), {"reason": "too late"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 409
    assert "Already approved by senior" in response.content.decode()
    assert fresh(mine)[0].status == "approved"


@pytest.mark.parametrize("headers", [{}, {"HTTP_HX_REQUEST": "true"}], ids=["page", "htmx"])
def test_approving_a_request_whose_tier_was_raised_says_it_now_needs_more_approvals(
        client, senior, make_approval, headers):
    from approvals.models import Tool

    l3 = make_approval(risk_tier=3)
    Tool.objects.filter(name="payments.refund").update(base_tier=4)
    client.force_login(senior)

    response = client.post(approve_url(l3), {"arguments_hash": l3.arguments_hash}, follow=True, **headers)

    body = response.content.decode()
    assert response.status_code == 200
    assert "Your approval is recorded (1 of 2)" in body
    assert "the policy now requires L4, 2 approval(s)" in body
    approval, operation = fresh(l3)
    assert (approval.status, operation.status) == ("pending", "planned")


def test_approving_a_call_refused_now_is_409_with_the_reason(client, reviewer, mine):
    from approvals.models import Tool

    Tool.objects.filter(name="payments.refund").update(enabled=False)
    client.force_login(reviewer)

    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = client.post(approve_url(mine), {"arguments_hash": mine.arguments_hash}, **headers)
        assert response.status_code == 409
        assert "The tool payments.refund is disabled" in response.content.decode()
    approval, operation = fresh(mine)
    assert (approval.status, operation.status) == ("pending", "planned")
    assert not ApprovalDecision.objects.exists()


def test_approving_other_arguments_than_shown_is_409(client, reviewer, mine):
    client.force_login(reviewer)
    response = client.post(approve_url(mine), {"arguments_hash": "0" * 64})
    assert response.status_code == 409
    assert fresh(mine)[0].status == "pending"


def test_an_expired_request_cannot_be_approved(client, reviewer, mine):
    from datetime import timedelta

    from django.utils import timezone

    ApprovalRequest.objects.filter(pk=mine.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    client.force_login(reviewer)
    response = client.post(approve_url(mine))
    assert response.status_code == 409
    assert "expired" in response.content.decode()
    assert fresh(mine)[1].status == "planned"


def test_decisions_are_post_only(client, reviewer, mine):
    client.force_login(reviewer)
    assert client.get(approve_url(mine)).status_code == 405
    assert client.get(reject_url(mine)).status_code == 405


# ------------------------------------------------------------------------------------- live


def _events_for(approval: ApprovalRequest) -> list[Event]:
    return list(Event.objects.filter(entity="approval", entity_id=approval.approval_id).order_by("id"))


def test_the_inbox_stream_inserts_a_new_pending_request_out_of_band(reviewer, mine):
    html = render_inbox(reviewer, _events_for(mine), "all")
    assert '<tbody hx-swap-oob="afterbegin:#inbox-rows">' in html
    assert f'<tr id="approval-{mine.approval_id}"' in html
    # The counts follow in a second message of their own.
    counts = render_inbox_counts(reviewer, _events_for(mine), "all")
    assert 'id="inbox-counts" aria-label="Pending requests per tier" hx-swap-oob="true"' in counts
    assert 'id="inbox-total">1<' in counts


def test_the_inbox_stream_replaces_a_decided_request_with_its_new_status(reviewer, mine):

    decisions.approval_reject(approval_id=mine.approval_id, reviewer=reviewer, reason="no")
    html = render_inbox(reviewer, _events_for(mine), "all")
    assert "afterbegin" not in html
    row = html[html.index(f'<tr id="approval-{mine.approval_id}"'):]
    row = row[:row.index(">")]
    assert 'hx-swap-oob="outerHTML"' in row
    assert "badge--rejected" in html


def test_the_inbox_stream_respects_the_pages_filters(reviewer, mine):
    assert "afterbegin" not in render_inbox(reviewer, _events_for(mine), InboxFilterSet.of(tool="mail.send").live_arg())
    assert "afterbegin" in render_inbox(reviewer, _events_for(mine), InboxFilterSet.of(tool="payments.refund").live_arg())
    assert "afterbegin" not in render_inbox(reviewer, _events_for(mine), InboxFilterSet.of().live_arg(page=2))


def test_the_inbox_arg_round_trips_the_filters_and_page(agent):
    values = {"q": "call 1/2", "tool": "payments.refund", "tier": 0, "task_type": "refund", "age": "1h",
              "tenant": "acme", "requested_by": agent.pk}
    arg = InboxFilterSet.of(**values).live_arg(page=3)
    assert "/" not in arg and "?" not in arg and "%" not in arg
    filters, page = read_inbox_arg(arg)
    assert (filters.active(), page) == (values, 3)
    assert InboxFilterSet.of().live_arg() == "all"


def test_an_inbox_arg_that_does_not_read_is_page_one_unfiltered_and_a_bad_value_is_ignored():
    from base64 import urlsafe_b64encode

    def arg(raw: str) -> str:
        return urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    for unreadable in ("all", "", "%%%", "//8", arg("page=x"), arg("&".join(f"f{i}=1" for i in range(2000)))):
        filters, page = read_inbox_arg(unreadable)
        assert (filters.active(), page) == ({}, 1)
    # As on the page, a value that does not validate drops that filter only.
    filters, page = read_inbox_arg(arg("tier=9&requested_by=abc&age=forever&tool=mail.send&page=0"))
    assert (filters.active(), page) == ({"tool": "mail.send"}, 1)


def test_the_inbox_stream_shows_nothing_of_another_tenant(reviewer, theirs):
    assert theirs.approval_id not in render_inbox(reviewer, _events_for(theirs), "all")


def test_the_approval_stream_follows_the_operation_status(reviewer, mine):

    decisions.approval_approve(approval_id=mine.approval_id, reviewer=reviewer)
    events = list(Event.objects.order_by("id"))
    html = render_approval(reviewer, events, mine.approval_id)
    assert 'id="approval-status-card"' in html and 'hx-swap-oob="true"' in html
    assert "badge--authorized" in html
    assert 'id="decision-panel"' in html  # closed: the forms go
    assert render_approval(reviewer, events, "apr_other") == ""


def test_an_unknown_outcome_after_approval_links_to_the_support_view(reviewer, mine):
    from ledger import services as ledger_services

    decisions.approval_approve(approval_id=mine.approval_id, reviewer=reviewer)
    events = list(Event.objects.order_by("id"))
    assert "operation-support-link" not in render_approval(reviewer, events, mine.approval_id)
    ledger_services.operation_dispatch(operation_id=mine.operation_id, worker="w1")
    ledger_services.operation_mark_unknown(operation_id=mine.operation_id, actor="system:test", reason="timeout")
    html = render_approval(reviewer, list(Event.objects.order_by("id")), mine.approval_id)
    assert "badge--unknown" in html
    assert f'href="{reverse("operations:detail", args=[mine.operation_id])}"' in html


def test_the_pagination_links_nearby_pages_only(client, reviewer, make_approval, monkeypatch):
    from approvals import views

    monkeypatch.setattr(views, "PAGE_SIZE", 1)
    for _ in range(8):
        make_approval()
    client.force_login(reviewer)
    response = client.get(inbox_url(page=1))
    assert response.context["page_range"] == [1, 2, 3, "…", 8]
    body = response.content.decode()
    assert "page=8" in body and "page=5" not in body
    assert response.context["page"].paginator.count == 8


# ------------------------------------------------------------------------- separation of duties


@pytest.fixture
def proposed_by_admin(agent, tenant):
    """A compensation proposed by a person who is support staff and an L4 reviewer."""
    admin = make_user("admin", tenant, Role.SUPPORT, Role.REVIEWER, max_tier=4)
    original = make_operation(agent)
    ledger_services.operation_confirm(operation_id=original.operation_id, receipt={"remote_id": "re_1"},
                                      actor="system:reconciler", reason="found")
    _, approval = compensation_propose(
        operation_id=original.operation_id, user=admin, tool_name="payments.refund",
        arguments={**original.arguments, "amount": 20}, reason="refunded twice")
    return admin, approval


def test_the_page_says_who_proposed_and_the_proposer_finds_no_approve_button(client, proposed_by_admin):
    admin, approval = proposed_by_admin
    client.force_login(admin)
    page = client.get(detail_url(approval)).content.decode()
    assert 'id="proposed-by"><strong>admin</strong>' in page
    assert 'id="proposed-by-me"' in page and 'id="approve-form"' not in page


def test_the_proposers_approval_is_refused_with_the_one_error_and_a_403(client, proposed_by_admin):
    admin, approval = proposed_by_admin
    client.force_login(admin)
    response = client.post(approve_url(approval), {"arguments_hash": approval.arguments_hash})
    assert response.status_code == 403
    assert "You proposed this call" in response.content.decode()
    assert fresh(approval)[0].status == "pending" and not ApprovalDecision.objects.filter(request=approval).exists()


def test_another_reviewer_sees_the_proposer_and_approves(client, proposed_by_admin, reviewer):
    _, approval = proposed_by_admin
    client.force_login(reviewer)
    page = client.get(detail_url(approval)).content.decode()
    assert 'id="proposed-by"><strong>admin</strong>' in page and 'id="approve-form"' in page
    response = client.post(approve_url(approval), {"arguments_hash": approval.arguments_hash})
    assert response.status_code == 302
    assert fresh(approval)[0].status == "approved"
