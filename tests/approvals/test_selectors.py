"""The reviewer console's reads: scope, inbox order and filters, per-row annotations, display."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import selectors
from approvals.filters import InboxFilterSet
from approvals.models import ApprovalRequest
from console.models import Membership, Role
from ledger import decisions
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


def test_the_scope_holds_the_tenants_and_tier_of_a_reviewer(reviewer, tenant, other_tenant):
    scope = selectors.reviewer_scope(reviewer)
    assert scope.tenant_ids == {tenant.id}
    assert scope.max_tier == {tenant.id: 3}
    assert scope.can_decide_tier(tenant.id, 3)
    assert not scope.can_decide_tier(tenant.id, 4)
    assert not scope.can_decide_tier(other_tenant.id, 0)


def test_support_staff_have_no_inbox_and_an_admin_may_look_but_not_decide(support_user, tenant):
    assert selectors.reviewer_scope(support_user).tenant_ids == set()
    admin = make_user("tenant-admin", tenant, Role.ADMIN)
    scope = selectors.reviewer_scope(admin)
    assert scope.tenant_ids == {tenant.id}
    assert not scope.can_decide_tier(tenant.id, 0)


def test_an_inactive_reviewer_has_no_scope(reviewer):
    reviewer.is_active = False
    reviewer.save()
    assert selectors.reviewer_scope(reviewer).tenant_ids == set()


def test_the_inbox_holds_only_pending_unexpired_requests_soonest_expiry_first(reviewer, make_approval):
    later = make_approval(ttl_seconds=3000)
    sooner = make_approval(ttl_seconds=60)
    decided = make_approval()
    decisions.approval_reject(approval_id=decided.approval_id, reviewer=reviewer, reason="no")
    lapsed = make_approval()
    ApprovalRequest.objects.filter(pk=lapsed.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    scope = selectors.reviewer_scope(reviewer)
    rows = list(selectors.inbox(reviewer, scope, InboxFilterSet.of()))
    assert [r.approval_id for r in rows] == [sooner.approval_id, later.approval_id]


def test_the_inbox_excludes_other_tenants(reviewer, make_approval, outsider_agent):
    from tests.factories import make_pending_approval

    mine = make_approval()
    make_pending_approval(outsider_agent)
    scope = selectors.reviewer_scope(reviewer)
    assert [r.approval_id for r in selectors.inbox(reviewer, scope, InboxFilterSet.of())] == [mine.approval_id]


def test_rows_carry_the_approvals_given_and_whether_i_decided(senior, senior2, make_approval):
    l4 = make_approval(risk_tier=4)
    decisions.approval_approve(approval_id=l4.approval_id, reviewer=senior)
    row_for_senior = selectors.inbox(senior, selectors.reviewer_scope(senior), InboxFilterSet.of()).get()
    row_for_senior2 = selectors.inbox(senior2, selectors.reviewer_scope(senior2), InboxFilterSet.of()).get()
    assert (row_for_senior.approvals_given, row_for_senior.decided_by_me) == (1, True)
    assert (row_for_senior2.approvals_given, row_for_senior2.decided_by_me) == (1, False)


def test_the_age_filter_splits_new_from_old(reviewer, make_approval):
    new = make_approval()
    old = make_approval(ttl_seconds=3 * 86400)
    ApprovalRequest.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=2))
    scope = selectors.reviewer_scope(reviewer)

    def ids(age):
        return {r.approval_id for r in selectors.inbox(reviewer, scope, InboxFilterSet.of(age=age))}

    assert ids("1h") == {new.approval_id}
    assert ids("older") == {old.approval_id}


def test_tier_counts_cover_every_tier(reviewer, make_approval):
    make_approval(risk_tier=2, tool_name="mail.send")
    make_approval(risk_tier=4)
    make_approval(risk_tier=4)
    assert selectors.tier_counts(selectors.reviewer_scope(reviewer)) == {0: 0, 1: 0, 2: 1, 3: 0, 4: 2}


def test_rows_by_id_show_decided_requests_too_but_never_another_tenants(reviewer, make_approval, outsider_agent):
    from tests.factories import make_pending_approval

    mine = make_approval()
    decisions.approval_approve(approval_id=mine.approval_id, reviewer=reviewer)
    theirs = make_pending_approval(outsider_agent)
    rows = selectors.inbox_rows_by_id(reviewer, selectors.reviewer_scope(reviewer),
                                      [mine.approval_id, theirs.approval_id])
    assert set(rows) == {mine.approval_id}
    assert rows[mine.approval_id].status == "approved"


def test_secret_arguments_are_masked_and_values_read_as_text():
    rows = selectors.masked_arguments(
        {"to": ["a@example.com", "b@example.com"], "token": "s3cret", "meta": {"x": 1}, "n": 5, "ok": True},
        ["token"],
    )
    by_name = {r["name"]: r for r in rows}
    assert by_name["token"] == {"name": "token", "text": selectors.MASK, "block": False, "masked": True}
    # As the JSON sent: two addresses never read like one string holding a comma.
    assert by_name["to"]["text"] == '[\n  "a@example.com",\n  "b@example.com"\n]'
    assert by_name["to"]["block"]
    assert by_name["meta"]["block"] and '"x": 1' in by_name["meta"]["text"]
    assert (by_name["n"]["text"], by_name["ok"]["text"]) == ("5", "true")
    assert selectors.masked_preview({"body": "s3cret", "to": "a"}, ["body"]) == {"body": selectors.MASK, "to": "a"}


def test_a_reviewer_in_two_tenants_keeps_each_tenants_tier(reviewer, tenant, other_tenant):
    Membership.objects.create(user=reviewer, tenant=other_tenant, role=Role.REVIEWER, max_tier=4)
    scope = selectors.reviewer_scope(reviewer)
    assert scope.max_tier == {tenant.id: 3, other_tenant.id: 4}
    assert scope.highest_tier() == 4


def test_a_request_carries_its_tools_and_tasks_type_from_creation(make_approval):
    mail = make_approval(tool_name="mail.send", risk_tier=2, task_type="notify")
    stored = ApprovalRequest.objects.get(pk=mail.pk)
    assert (stored.tool.name, stored.task_type) == ("mail.send", "notify")


def test_the_backfill_copies_tool_and_task_type_from_the_operation_and_task(make_approval):
    import importlib

    from django.apps import apps

    from approvals.models import Tool

    refund = make_approval(task_type="billing")
    mail = make_approval(tool_name="mail.send", risk_tier=2, task_type="notify")
    # Rows as they were before the columns existed (wrong values stand in for the missing ones).
    ApprovalRequest.objects.update(tool=Tool.objects.get(name="orders.lookup"), task_type="")
    migration = importlib.import_module("approvals.migrations.0005_backfill_request_tool_task_type")
    migration.backfill(apps, None)
    got = dict(ApprovalRequest.objects.values_list("approval_id", "task_type"))
    tools = dict(ApprovalRequest.objects.values_list("approval_id", "tool__name"))
    assert got == {refund.approval_id: "billing", mail.approval_id: "notify"}
    assert tools == {refund.approval_id: "payments.refund", mail.approval_id: "mail.send"}


def test_the_tenant_and_requested_by_filters(policy, tenant, other_tenant, make_approval, outsider_agent):
    from tests.conftest import make_agent
    from tests.factories import make_pending_approval

    user = make_user("two-tenants", tenant, Role.REVIEWER, max_tier=4)
    Membership.objects.create(user=user, tenant=other_tenant, role=Role.REVIEWER, max_tier=4)
    second_agent = make_agent(tenant, "second", "second-agent-token")
    first = make_approval()
    second = make_approval(agent=second_agent)
    elsewhere = make_pending_approval(outsider_agent)
    scope = selectors.reviewer_scope(user)

    def ids(**filters):
        return {r.approval_id for r in selectors.inbox(user, scope, InboxFilterSet.of(**filters))}

    assert ids() == {first.approval_id, second.approval_id, elsewhere.approval_id}
    assert ids(tenant="globex") == {elsewhere.approval_id}
    assert ids(tenant="acme") == {first.approval_id, second.approval_id}
    assert ids(requested_by=second_agent.pk) == {second.approval_id}
    assert ids(requested_by=second_agent.pk, tenant="globex") == set()
    choices = selectors.filter_choices(scope)
    assert choices["tenants"] == [("acme", "Acme"), ("globex", "Globex")]
    assert {label for _, label in choices["agents"]} == {"agent (acme)", "second (acme)", "outsider (globex)"}


def test_a_tier_whose_policy_shows_previews_shows_them_and_one_that_does_not_hides_them(policy):
    from approvals.models import PolicyTier

    assert selectors.tier_shows_preview(2)
    assert not selectors.tier_shows_preview(3)
    PolicyTier.objects.filter(level=3).update(shows_preview=True)
    PolicyTier.objects.filter(level=2).update(shows_preview=False)
    assert selectors.tier_shows_preview(3)
    assert not selectors.tier_shows_preview(2)


def test_a_tier_nobody_configured_shows_no_preview(policy):
    from approvals.models import PolicyTier

    PolicyTier.objects.filter(level=2).delete()
    assert not selectors.tier_shows_preview(2)
