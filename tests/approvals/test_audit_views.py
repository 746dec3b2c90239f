"""The audit review list page, its review action, the flag on the operation's page and the
dashboard's daily counts."""

from __future__ import annotations

import pytest
from django.urls import reverse

from approvals.models import AuditReview
from console.models import Event, Role
from ledger.proposals import call_propose
from tests.conftest import make_user
from tests.fixtures.api import refund, start_task

pytestmark = pytest.mark.django_db

LIST = "/audit/"


def review_url(entry: AuditReview) -> str:
    return reverse("audit:review", args=[entry.pk])


@pytest.fixture
def entries(agent) -> list[AuditReview]:
    run = start_task(agent)
    ids = [call_propose(principal=agent, task_id=run.task_id, call_id=f"call-{n}", step_id=f"step-{n}",
                        tool_name="payments.refund", arguments=refund(10 + n), expected_version=run.version,
                        fencing_token=run.fencing_token).operation_id for n in range(3)]
    return [AuditReview.objects.get(pk=i) for i in ids]


def test_the_list_shows_unreviewed_calls_with_review_controls(client, reviewer, entries):
    client.force_login(reviewer)
    body = client.get(LIST).content.decode()
    for entry in entries:
        assert f'id="audit-{entry.pk}"' in body
        assert review_url(entry) in body
    assert body.count('value="flagged"') == 3


def test_marking_reviewed_moves_the_row_to_the_reviewed_filter(client, reviewer, entries):
    client.force_login(reviewer)
    response = client.post(review_url(entries[0]), {"verdict": "reviewed", "note": "", "back": "unreviewed"})
    assert response.status_code == 302 and response.headers["Location"] == "/audit/?status=unreviewed"
    assert f'id="audit-{entries[0].pk}"' not in client.get(LIST).content.decode()
    reviewed = client.get(LIST + "?status=reviewed").content.decode()
    assert f'id="audit-{entries[0].pk}"' in reviewed and f'id="audit-{entries[1].pk}"' not in reviewed
    assert 'value="flagged"' not in reviewed


def test_a_flag_without_a_note_is_400_with_the_reason_and_changes_nothing(client, reviewer, entries):
    client.force_login(reviewer)
    response = client.post(review_url(entries[0]), {"verdict": "flagged", "note": ""})
    assert response.status_code == 400
    assert "A flag needs a note" in response.content.decode()
    assert AuditReview.objects.get(pk=entries[0].pk).status == "unreviewed"


def test_a_flag_shows_on_the_operations_page_and_in_the_flagged_filter(client, reviewer, entries):
    client.force_login(reviewer)
    client.post(review_url(entries[1]), {"verdict": "flagged", "note": "refund went to the wrong order"})
    assert Event.objects.filter(entity=Event.Entity.AUDIT, entity_id=entries[1].pk, to_status="flagged").exists()
    flagged = client.get(LIST + "?status=flagged").content.decode()
    assert f'id="audit-{entries[1].pk}"' in flagged and "refund went to the wrong order" in flagged
    page = client.get(reverse("operations:detail", args=[entries[1].pk])).content.decode()
    assert 'id="audit-flag"' in page and "refund went to the wrong order" in page
    other = client.get(reverse("operations:detail", args=[entries[0].pk])).content.decode()
    assert 'id="audit-flag"' not in other and 'id="audit-status"' in other


def test_an_admin_sees_the_list_without_controls_and_posting_is_403(client, tenant, entries):
    admin = make_user("tenant-admin", tenant, Role.ADMIN)
    client.force_login(admin)
    body = client.get(LIST).content.decode()
    assert f'id="audit-{entries[0].pk}"' in body and 'value="flagged"' not in body
    response = client.post(review_url(entries[0]), {"verdict": "reviewed"})
    assert response.status_code == 403
    assert AuditReview.objects.get(pk=entries[0].pk).status == "unreviewed"


def test_a_reviewer_below_the_tier_sees_why_there_are_no_controls(client, tenant, entries):
    low = make_user("low", tenant, Role.REVIEWER, max_tier=0)
    client.force_login(low)
    body = client.get(LIST).content.decode()
    assert "Needs a reviewer of L1 or above" in body and 'value="flagged"' not in body
    assert client.post(review_url(entries[0]), {"verdict": "reviewed"}).status_code == 403


def test_another_tenants_reviewer_sees_nothing_and_gets_404(client, outsider, entries):
    client.force_login(outsider)
    body = client.get(LIST + "?status=all").content.decode()
    assert not any(entry.pk in body for entry in entries)
    assert client.post(review_url(entries[0]), {"verdict": "reviewed"}).status_code == 404


def test_review_is_post_only_and_anonymous_visitors_go_to_login(client, reviewer, entries):
    assert client.get(LIST).status_code == 302
    client.force_login(reviewer)
    assert client.get(review_url(entries[0])).status_code == 405


def test_an_unknown_filter_falls_back_to_unreviewed(client, reviewer, entries):
    client.force_login(reviewer)
    body = client.get(LIST + "?status=bogus").content.decode()
    assert f'id="audit-{entries[0].pk}"' in body


def test_the_dashboard_counts_todays_audited_reviewed_and_flagged_calls(client, reviewer, entries):
    client.force_login(reviewer)
    client.post(review_url(entries[0]), {"verdict": "reviewed"})
    client.post(review_url(entries[1]), {"verdict": "flagged", "note": "odd"})
    body = client.get(reverse("dashboard")).content.decode()
    assert '<dd id="audit-today-audited">3</dd>' in body
    assert '<dd id="audit-today-reviewed">1</dd>' in body
    assert 'id="audit-today-flagged"><a href="/audit/?status=flagged">1</a>' in body
    assert "(1 unreviewed)" in body
    assert 'class="audit-plot"' in body


def test_support_staff_see_no_audit_panel_on_the_dashboard(client, support_user, entries):
    client.force_login(support_user)
    assert 'id="audit-today"' not in client.get(reverse("dashboard")).content.decode()
