"""The support console's operation page shows an agent's arguments and goal with hidden
characters as marked escapes, as the approval pages do (console/lib/reveal.py)."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from ledger.models import OperationStatus
from tests.factories import make_operation, make_task

pytestmark = pytest.mark.django_db


def test_the_operation_page_escapes_hidden_characters(client, agent, support_user):
    task = make_task(agent, goal="Mail the\u200b customer")
    operation = make_operation(agent, "mail.send", task=task, status=OperationStatus.UNKNOWN,
                               arguments={"to": ["ceo@acme.test\u202emoc.live@"], "subject": "S", "body": "B"})
    client.force_login(support_user)
    body = client.get(reverse("operations:detail", args=[operation.operation_id])).content.decode()
    arguments = re.search(r"<summary[^>]*>Arguments</summary><pre[^>]*>(.*?)</pre>", body, re.S).group(1)
    goal = re.search(r"<dt>Goal</dt><dd>(.*?)</dd>", body, re.S).group(1)
    assert "\u202e" not in arguments and "\\u202e</mark>" in arguments
    assert "\u200b" not in goal and "\\u200b</mark>" in goal


def test_the_compensation_form_prefills_hidden_characters_as_escapes_and_submits_them_exactly(
        client, agent, support_user):
    """The form's JSON shows a bidi override as the JSON escape `\\u202e` (which parses back to
    the same character), and the page says the arguments hold such characters."""
    import html
    import json

    from ledger import services as ledger_services
    from ledger.models import Operation
    from tests.fixtures.support import make_operation as make_support_operation

    arguments = {"to": ["customer@example.com"], "subject": "About your refund",
                 "body": "Refunded \u202e00.001 EUR\u202c by mistake;\u00a0reversing it."}
    original = make_support_operation(agent, tool_name="mail.send", arguments=arguments)
    ledger_services.operation_confirm(operation_id=original.operation_id, receipt={"remote_id": "m_1"},
                                      actor="system:reconciler", reason="found")
    client.force_login(support_user)
    page = client.get(reverse("operations:detail", args=[original.operation_id])).content.decode()
    prefilled = html.unescape(re.search(r'<textarea[^>]*id="id_compensate-arguments"[^>]*>(.*?)</textarea>',
                                        page, re.S).group(1))

    assert "\u202e" not in prefilled and "\u00a0" not in prefilled
    assert "\\u202e" in prefilled and "\\u00a0" in prefilled
    assert json.loads(prefilled) == arguments
    assert 'id="compensate-hidden-warning"' in page

    response = client.post(reverse("operations:compensate", args=[original.operation_id]),
                           {"compensate-tool": "mail.send", "compensate-arguments": prefilled.strip(),
                            "compensate-reason": "sent by mistake"})

    assert response.status_code == 302
    assert Operation.objects.get(compensates=original).arguments["body"] == arguments["body"]


def test_the_compensation_form_shows_no_warning_for_plain_arguments(client, agent, support_user):
    from ledger import services as ledger_services
    from tests.fixtures.support import make_operation as make_support_operation

    original = make_support_operation(agent, tool_name="mail.send", arguments={
        "to": ["customer@example.com"], "subject": "S", "body": "Plain — ünïcode is visible"})
    ledger_services.operation_confirm(operation_id=original.operation_id, receipt={"remote_id": "m_1"},
                                      actor="system:reconciler", reason="found")
    client.force_login(support_user)
    page = client.get(reverse("operations:detail", args=[original.operation_id])).content.decode()

    assert 'id="compensate-form"' in page and 'id="compensate-hidden-warning"' not in page
    assert "ünïcode" in page
