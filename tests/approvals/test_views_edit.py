"""The edit-and-approve page (approvals/views.py): the form generated from the tool's schema, its
errors on their fields, and who may use it. The service behind it, ledger.decisions'
approval_edit_and_approve, is tested in tests/ledger/test_decisions_edit.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from approvals.models import ApprovalRequest, ApprovalStatus
from tests.ledger.test_decisions_edit import fresh, op, propose, snapshot

pytestmark = pytest.mark.django_db

A = ApprovalStatus


@pytest.fixture
def l3(agent) -> ApprovalRequest:
    return propose(agent, amount=120)


def edit_url(approval: ApprovalRequest) -> str:
    return reverse("approvals:edit", args=[approval.approval_id])


def form_data(approval: ApprovalRequest, **values: Any) -> dict[str, Any]:
    data = {"arg__order_id": "ord-42", "arg__amount": "120", "arg__currency": "EUR", "arg__reason": "damaged",
            "reason": "checked with the customer", "arguments_hash": approval.arguments_hash}
    data.update(values)
    return data


def test_the_edit_form_is_generated_from_the_tools_schema(client, reviewer, l3):
    client.force_login(reviewer)
    response = client.get(edit_url(l3))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'name="arg__amount"' in body and 'value="120"' in body
    assert '<select name="arg__currency"' in body and '<option value="GBP">' in body
    assert f'value="{l3.arguments_hash}"' in body
    detail = client.get(reverse("approvals:detail", args=[l3.approval_id])).content.decode()
    assert f'href="{edit_url(l3)}"' in detail


def test_posting_the_edit_approves_the_new_call_and_shows_it(client, reviewer, l3):
    client.force_login(reviewer)
    response = client.post(edit_url(l3), form_data(l3, arg__amount="80.50"))
    new = ApprovalRequest.objects.get(call_id="call-1-edit-1")
    assert response.status_code == 302
    assert response["Location"] == reverse("approvals:detail", args=[new.approval_id])
    assert op(new.operation_id).arguments["amount"] == 80.5
    page = client.get(response["Location"]).content.decode()
    assert 'id="edited-from"' in page and l3.approval_id in page
    old_page = client.get(reverse("approvals:detail", args=[l3.approval_id])).content.decode()
    assert 'id="superseded-note"' in old_page and new.approval_id in old_page


def test_a_schema_error_is_shown_on_its_field(client, reviewer, l3):
    client.force_login(reviewer)
    before = snapshot()
    response = client.post(edit_url(l3), form_data(l3, arg__amount="-3"))
    assert response.status_code == 400
    assert "-3" in response.context["form"].errors["arg__amount"][0]  # the gate's validator, on its field
    response = client.post(edit_url(l3), form_data(l3, arg__amount="lots"))
    assert response.status_code == 400
    assert response.context["form"].errors["arg__amount"] == ["Enter a number."]
    assert snapshot() == before


def test_a_tier_above_the_editor_is_refused_with_403(client, reviewer, l3):
    client.force_login(reviewer)
    response = client.post(edit_url(l3), form_data(l3, arg__amount="250"))
    assert response.status_code == 403
    assert fresh(l3).status == A.PENDING


def test_an_outsider_cannot_see_or_edit(client, outsider, l3):
    client.force_login(outsider)
    assert client.get(edit_url(l3)).status_code == 404
    assert client.post(edit_url(l3), form_data(l3, arg__amount="80")).status_code == 404
    assert fresh(l3).status == A.PENDING
