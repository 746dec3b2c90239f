"""Forms of the support console's actions. They only parse input; the rules live in
`ledger.support`. The queue's filters are a FilterSet (ledger/filters.py)."""

from __future__ import annotations

import json

from django import forms
from django.forms.fields import InvalidJSONInput

from console.lib.reveal import as_json, hidden_characters, json_escaping_hidden

REASON_WIDGET = forms.Textarea(attrs={"rows": 2, "required": True})


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=2000, widget=REASON_WIDGET,
                             error_messages={"required": "Every support action needs a reason."})


class ConfirmForm(ReasonForm):
    remote_id = forms.CharField(label="Remote ID (the provider's receipt)", max_length=200,
                                error_messages={"required": "Confirming needs the provider's remote ID."})


class EscalateForm(ReasonForm):
    assignee = forms.ChoiceField(label="Assign to", choices=[],
                                 error_messages={"required": "Choose who takes it over."})

    def __init__(self, *args, staff: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["assignee"].choices = [("", "Choose a person…")] + [(u, u) for u in staff]


class CompensatedForm(ReasonForm):
    evidence = forms.CharField(label="Evidence (a reference, a receipt, a ticket)", max_length=2000,
                               error_messages={"required": "Settling a compensation case needs evidence."})


class RevealingJSONField(forms.JSONField):
    """JSON a person edits, hidden characters shown as JSON escapes: the text the field shows
    parses to the value it was given, byte for byte."""

    def prepare_value(self, value):
        if isinstance(value, InvalidJSONInput):
            return value
        return json_escaping_hidden(value)


class CompensateForm(ReasonForm):
    tool = forms.ChoiceField(label="Compensating tool", choices=[])
    arguments = RevealingJSONField(label="Arguments (JSON)", widget=forms.Textarea(attrs={"rows": 4}),
                                error_messages={"required": "The compensating call needs its arguments.",
                                                "invalid": "The arguments must be valid JSON."})

    def __init__(self, *args, tools: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tool"].choices = [(t, t) for t in tools]

    def hidden_characters(self) -> int:
        """How many characters of the arguments shown cannot be seen as themselves (the page
        says so beside the escapes)."""
        try:
            value = json.loads(self["arguments"].value() or "null")
        except (TypeError, ValueError):
            return 0
        return len(hidden_characters(as_json(value)))
