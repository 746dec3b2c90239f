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
