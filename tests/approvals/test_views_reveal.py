"""What the reviewer sees is what runs: hidden characters shown as flagged escapes, punycode
beside international domains, values as the JSON the agent sent (approval page, preview, inbox)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.factories import make_pending_approval, make_task

pytestmark = pytest.mark.django_db

HOSTILE_MAIL = {"to": ["ceo@acme.test\u202emoc.live@", "bob@bücher.example"], "subject": "Pay\u200bment",
                "body": "Hello"}


def detail(client, reviewer, approval) -> str:
    client.force_login(reviewer)
    return client.get(reverse("approvals:detail", args=[approval.approval_id])).content.decode()


def test_hidden_characters_in_arguments_and_preview_are_escaped_and_flagged(client, reviewer, agent):
    approval = make_pending_approval(agent, tool_name="mail.send", risk_tier=2, arguments=HOSTILE_MAIL)
    body = detail(client, reviewer, approval)
    assert "\u202e" not in body and "\u200b" not in body
    assert "ceo@acme.test<mark" in body and "\\u202e</mark>" in body and "\\u200b</mark>" in body
    assert 'id="hidden-chars-warning"' in body and "holds 2 characters" in body
    # in the arguments and in the email preview alike
    assert body.count("\\u202e</mark>") >= 2


def test_an_international_domain_shows_its_punycode(client, reviewer, agent):
    approval = make_pending_approval(agent, tool_name="mail.send", risk_tier=2, arguments=HOSTILE_MAIL)
    body = detail(client, reviewer, approval)
    assert "bob@bücher.example" in body and "(bob@xn--bcher-kva.example)" in body


def test_one_string_with_a_comma_and_two_addresses_look_different(client, reviewer, agent):
    one = make_pending_approval(agent, tool_name="mail.send", risk_tier=2, call_id="call-one",
                                arguments={"to": ["bob@acme.test, evil@x.test"], "subject": "S", "body": "B"})
    two = make_pending_approval(agent, tool_name="mail.send", risk_tier=2, call_id="call-two",
                                arguments={"to": ["bob@acme.test", "evil@x.test"], "subject": "S", "body": "B"})
    assert "&quot;bob@acme.test, evil@x.test&quot;" in detail(client, reviewer, one)
    assert "&quot;bob@acme.test&quot;,\n  &quot;evil@x.test&quot;" in detail(client, reviewer, two)


def test_a_clean_call_raises_no_flag(client, reviewer, agent):
    approval = make_pending_approval(agent, tool_name="mail.send", risk_tier=2)
    assert 'id="hidden-chars-warning"' not in detail(client, reviewer, approval)


def test_inputs_criteria_and_constraints_show_as_json_not_python(client, reviewer, agent):
    task = make_task(agent, inputs={"amount": 30, "gift": True, "note": None},
                     success_criteria=[{"check": "refunded", "strict": False}], constraints={"cap": None})
    approval = make_pending_approval(agent, task=task)
    body = detail(client, reviewer, approval)
    assert "True" not in body and "None" not in body and "{&#x27;" not in body
    assert "&quot;gift&quot;: true" in body and "&quot;note&quot;: null" in body
    assert "&quot;strict&quot;: false" in body


def test_the_inbox_escapes_hidden_characters_in_the_goal(client, reviewer, agent):
    task = make_task(agent, goal="Refund order 7\u202e01 ro")
    make_pending_approval(agent, task=task)
    client.force_login(reviewer)
    body = client.get(reverse("approvals:inbox")).content.decode()
    assert "\u202e" not in body and "\\u202e</mark>" in body


def test_the_run_page_shows_the_contract_as_json(client, reviewer, agent):
    task = make_task(agent, goal="Refund\u200b", inputs={"amount": 30, "gift": True, "note": None},
                     success_criteria=["refund confirmed"], constraints={"cap": None})
    client.force_login(reviewer)
    body = client.get(reverse("runs:detail", args=[task.task_id])).content.decode()
    assert "{&#x27;amount&#x27;: 30" not in body and "True" not in body
    assert "&quot;amount&quot;: 30" in body and "&quot;gift&quot;: true" in body and "&quot;cap&quot;: null" in body
    assert "\u200b" not in body
