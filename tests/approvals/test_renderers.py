"""The inbox filter form written in Python (approvals/renderers.py) is the HTML Django's widget
templates write, in every state the page shows."""

from __future__ import annotations

import pytest
from django.forms.renderers import DjangoTemplates

from approvals.filters import InboxFilterSet
from approvals.renderers import InboxFormRenderer

CHOICES = {
    "tools": ["mail.send", "payments.refund", 'odd<"&>'],
    "task_types": ["billing", "refund & returns"],
    "tenants": [("acme", "Acme"), ("globex", "Globex <GmbH>")],
    "agents": [(7, "support-bot"), (9, "refund-bot (acme)")],
}


@pytest.mark.parametrize("data", [
    None,
    {"tier": "3"},
    {"q": 'call-"1" <x>', "tool": "payments.refund", "task_type": "refund & returns", "tenant": "globex",
     "requested_by": "9", "age": "24h", "tier": "4"},
    {"tool": "no-such-tool", "tier": "nine", "requested_by": "x", "age": "never"},  # invalid: marked so
])
def test_every_field_is_written_as_djangos_templates_write_it(data):
    def fields(renderer) -> list[str]:
        form = InboxFilterSet(data, **CHOICES).form
        form.renderer = renderer
        form.is_valid()
        return [str(field) for field in form]

    assert fields(InboxFormRenderer()) == fields(DjangoTemplates())
