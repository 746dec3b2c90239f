"""Exports of decisions (CSV and JSON) with the inbox's filters, scoped to the user's tenants."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse

from approvals.selectors import EXPORT_FIELDS
from ledger import decisions
from tests.factories import make_pending_approval

pytestmark = pytest.mark.django_db


def csv_rows(response) -> list[dict[str, str]]:
    text = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


@pytest.fixture
def decided(agent, outsider_agent, reviewer, senior, senior2, outsider):
    refund = make_pending_approval(agent, risk_tier=3)
    decisions.approval_approve(approval_id=refund.approval_id, reviewer=reviewer, reason="looks right")
    mail = make_pending_approval(agent, tool_name="mail.send", risk_tier=2)
    decisions.approval_reject(approval_id=mail.approval_id, reviewer=senior, reason="=HYPERLINK(\"x\")")
    big = make_pending_approval(agent, risk_tier=4)
    decisions.approval_approve(approval_id=big.approval_id, reviewer=senior, reason="first of two")
    decisions.approval_approve(approval_id=big.approval_id, reviewer=senior2, reason="second")
    make_pending_approval(agent, risk_tier=3)  # undecided: no rows
    theirs = make_pending_approval(outsider_agent, risk_tier=2)
    decisions.approval_approve(approval_id=theirs.approval_id, reviewer=outsider, reason="elsewhere")
    return {"refund": refund, "mail": mail, "big": big, "theirs": theirs}


def test_the_csv_lists_every_decision_in_the_users_tenants(client, reviewer, decided):
    client.force_login(reviewer)
    response = client.get(reverse("approvals:export_csv"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = csv_rows(response)
    assert list(rows[0]) == list(EXPORT_FIELDS)
    assert [(r["approval_id"], r["reviewer"], r["verdict"]) for r in rows] == [
        (decided["refund"].approval_id, "reviewer", "approve"),
        (decided["mail"].approval_id, "senior", "reject"),
        (decided["big"].approval_id, "senior", "approve"),
        (decided["big"].approval_id, "senior2", "approve"),
    ]
    first = rows[0]
    refund = decided["refund"]
    assert (first["reason"], first["arguments_hash"], first["call_id"], first["operation_id"], first["task_id"],
            first["risk_tier"], first["tool"], first["tenant"], first["approval_status"]) == (
        "looks right", refund.arguments_hash, refund.call_id, refund.operation_id, refund.task_id,
        "3", "payments.refund", "acme", "approved")
    assert first["decided_at"]
    # A reason that a spreadsheet would run as a formula is quoted as text.
    assert rows[1]["reason"] == "'=HYPERLINK(\"x\")"
    assert decided["theirs"].approval_id not in {r["approval_id"] for r in rows}


def test_the_inbox_filters_apply_to_the_export(client, reviewer, decided):
    client.force_login(reviewer)
    rows = csv_rows(client.get(reverse("approvals:export_csv") + "?tool=mail.send"))
    assert [r["approval_id"] for r in rows] == [decided["mail"].approval_id]
    rows = csv_rows(client.get(reverse("approvals:export_csv") + "?tier=4"))
    assert {r["approval_id"] for r in rows} == {decided["big"].approval_id}
    rows = csv_rows(client.get(reverse("approvals:export_csv") + f"?q={decided['refund'].call_id}"))
    assert [r["approval_id"] for r in rows] == [decided["refund"].approval_id]


def test_the_json_export_has_the_same_rows(client, reviewer, decided):
    client.force_login(reviewer)
    data = client.get(reverse("approvals:export_json")).json()
    assert data["count"] == 4 == len(data["decisions"])
    assert set(data["decisions"][0]) == set(EXPORT_FIELDS)
    assert data["decisions"][1]["reason"] == "=HYPERLINK(\"x\")"  # JSON needs no quoting
    assert data["decisions"][3]["risk_tier"] == 4
    filtered = client.get(reverse("approvals:export_json") + "?tier=2").json()
    assert [d["approval_id"] for d in filtered["decisions"]] == [decided["mail"].approval_id]


def test_an_outsider_exports_only_their_own_tenant(client, outsider, decided):
    client.force_login(outsider)
    data = client.get(reverse("approvals:export_json")).json()
    assert [d["approval_id"] for d in data["decisions"]] == [decided["theirs"].approval_id]
    rows = csv_rows(client.get(reverse("approvals:export_csv")))
    assert [r["tenant"] for r in rows] == ["globex"]


def test_support_staff_and_anonymous_visitors_export_nothing(client, support_user, decided):
    response = client.get(reverse("approvals:export_csv"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    client.force_login(support_user)
    assert client.get(reverse("approvals:export_json")).json() == {"decisions": [], "count": 0}


def test_the_inbox_links_to_the_export_with_its_filters(client, reviewer, decided):
    client.force_login(reviewer)
    body = client.get(reverse("approvals:inbox") + "?tool=mail.send").content.decode()
    assert 'href="/approvals/export.csv?tool=mail.send"' in body
    assert 'href="/approvals/export.json?tool=mail.send"' in body
