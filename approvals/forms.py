"""Forms of the reviewer console: the inbox filters (GET) and the two decisions (POST)."""

from __future__ import annotations

from django import forms

from approvals.selectors import AGE_WINDOWS, InboxFilters
from console.models import RiskTier

AGE_LABELS = {
    "15m": "Under 15 minutes",
    "1h": "Under 1 hour",
    "24h": "Under 24 hours",
    "older": "Older than 24 hours",
}


class InboxFilterForm(forms.Form):
    q = forms.CharField(
        required=False, max_length=128, label="Search",
        widget=forms.TextInput(attrs={
            "type": "search", "placeholder": "Call, task, operation or approval ID", "autocomplete": "off",
        }),
    )
    tool = forms.ChoiceField(required=False, label="Tool")
    tier = forms.TypedChoiceField(
        required=False, label="Tier", coerce=int, empty_value=None,
        choices=[("", "Any tier"), *[(t.value, t.label) for t in RiskTier]],
    )
    task_type = forms.ChoiceField(required=False, label="Task type")
    age = forms.ChoiceField(
        required=False, label="Age", choices=[("", "Any age"), *[(k, AGE_LABELS[k]) for k in AGE_WINDOWS]],
    )

    def __init__(self, *args, tools: list[str], task_types: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tool"].choices = [("", "Any tool"), *[(t, t) for t in tools]]
        self.fields["task_type"].choices = [("", "Any task type"), *[(t, t) for t in task_types]]

    def filters(self) -> InboxFilters:
        """The valid filters; a value that does not validate (a stale link) is ignored."""
        if not self.is_bound:
            return InboxFilters()
        self.is_valid()
        data = {name: self.cleaned_data.get(name) for name in self.fields if name not in self.errors}
        return InboxFilters(
            q=(data.get("q") or "").strip(),
            tool=data.get("tool") or "",
            tier=data.get("tier"),
            task_type=data.get("task_type") or "",
            age=data.get("age") or "",
        )


class ApproveForm(forms.Form):
    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))
    # What the reviewer saw: the service refuses if the arguments changed since.
    arguments_hash = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)


class RejectForm(forms.Form):
    # Not required here: the service owns the rule ("a rejection needs a reason") and its error
    # is shown on this field.
    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 3}))
