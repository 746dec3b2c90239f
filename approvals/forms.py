"""Forms of the reviewer console: the two decisions and the edited arguments (POST). The inbox's
filters are a FilterSet (approvals/filters.py)."""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms


class ApproveForm(forms.Form):
    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))
    # What the reviewer saw: the service refuses if the arguments changed since.
    arguments_hash = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)


class RejectForm(forms.Form):
    # Not required here: the service owns the rule ("a rejection needs a reason") and its error
    # is shown on this field.
    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 3}))


# ------------------------------------------------------------------------- edit arguments

class ArgumentsForm(forms.Form):
    """A form generated from a tool's JSON schema (top-level properties).

    Strings (an enum: a choice), numbers, integers, booleans and lists of scalars (one per
    line) get their own input; anything nested is edited as JSON. The values are parsed here
    and validated against the schema by the service (the gate's validator), whose errors come
    back onto the fields. Secret fields are never sent to the browser: left empty, they keep
    their value. Arguments the schema does not describe are carried over unchanged.
    """

    reason = forms.CharField(required=False, max_length=2000, label="Why you changed it",
                             widget=forms.Textarea(attrs={"rows": 2}))
    arguments_hash = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)

    def __init__(self, *args, schema: dict[str, Any], current: dict[str, Any], secret_fields: list[str],
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.schema = schema if isinstance(schema, dict) else {}
        self.current = dict(current or {})
        self.secret = set(secret_fields or [])
        properties = self.schema.get("properties") or {}
        self.required_names = set(self.schema.get("required") or [])
        self.kinds: dict[str, str] = {}
        self.argument_names: list[str] = []
        for name, spec in properties.items():
            spec = spec if isinstance(spec, dict) else {}
            field, kind = self._field(name, spec)
            self.kinds[name] = kind
            self.argument_names.append(name)
            self.fields[f"arg__{name}"] = field
            if not self.is_bound:
                self.initial[f"arg__{name}"] = self._initial(name, kind)
        # The reason and the hash after the arguments.
        self.order_fields([f"arg__{n}" for n in self.argument_names] + ["reason", "arguments_hash"])

    def _field(self, name: str, spec: dict[str, Any]) -> tuple[forms.Field, str]:
        typ = spec.get("type")
        label = name
        help_text = spec.get("description", "")
        if name in self.secret:
            return forms.CharField(required=False, label=label, strip=False,
                                   help_text="Secret: leave empty to keep the current value.",
                                   widget=forms.PasswordInput(render_value=False)), "secret"
        if "enum" in spec and all(isinstance(v, str) for v in spec["enum"]):
            choices = [("", "—"), *[(v, v) for v in spec["enum"]]]
            return forms.ChoiceField(required=False, choices=choices, label=label, help_text=help_text), "string"
        if typ == "string":
            long = spec.get("maxLength", 10_000) > 200
            widget = forms.Textarea(attrs={"rows": 6}) if long else forms.TextInput()
            return forms.CharField(required=False, strip=False, label=label, help_text=help_text,
                                   widget=widget), "string"
        if typ in ("number", "integer"):
            return forms.CharField(required=False, label=label, help_text=help_text,
                                   widget=forms.TextInput(attrs={"inputmode": "decimal"})), typ
        if typ == "boolean":
            return forms.TypedChoiceField(required=False, label=label, help_text=help_text,
                                          choices=[("", "—"), ("true", "true"), ("false", "false")]), "boolean"
        items = spec.get("items") if isinstance(spec.get("items"), dict) else {}
        if typ == "array" and items.get("type") in ("string", "number", "integer"):
            return forms.CharField(required=False, strip=False, label=label,
                                   help_text=(help_text + " " if help_text else "") + "One per line.",
                                   widget=forms.Textarea(attrs={"rows": 3})), f"lines:{items['type']}"
        return forms.CharField(required=False, strip=False, label=label,
                               help_text=(help_text + " " if help_text else "") + "JSON.",
                               widget=forms.Textarea(attrs={"rows": 4, "class": "mono"})), "json"

    def _initial(self, name: str, kind: str) -> Any:
        if name not in self.current or kind == "secret":
            return ""
        value = self.current[name]
        if kind == "boolean":
            return "true" if value is True else "false" if value is False else ""
        if kind.startswith("lines:") and isinstance(value, list):
            return "\n".join(str(v) for v in value)
        if kind == "json":
            return json.dumps(value, indent=2, ensure_ascii=False)
        return "" if value is None else str(value)

    def _parse(self, name: str, kind: str, raw: str) -> Any:
        if kind in ("number", "integer"):
            try:
                number = Decimal(raw.strip())
            except InvalidOperation as exc:
                raise forms.ValidationError("Enter a number.") from exc
            if not number.is_finite():
                raise forms.ValidationError("Enter a finite number.")
            if number == number.to_integral_value():
                return int(number)
            if kind == "integer":
                raise forms.ValidationError("Enter a whole number.")
            return float(number)
        if kind == "boolean":
            return raw == "true"
        if kind.startswith("lines:"):
            lines = [line.strip() for line in raw.splitlines() if line.strip()]
            item = kind.split(":", 1)[1]
            if item == "string":
                return lines
            return [self._parse(name, item, line) for line in lines]
        if kind == "json":
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise forms.ValidationError(f"Not valid JSON: {exc}") from exc
        return raw

    def arguments(self) -> dict[str, Any]:
        """The edited arguments (call after is_valid()); parse errors are added to the fields."""
        result = {k: v for k, v in self.current.items() if k not in self.kinds}
        for name in self.argument_names:
            key = f"arg__{name}"
            kind = self.kinds[name]
            raw = self.cleaned_data.get(key, "") if hasattr(self, "cleaned_data") else ""
            raw = "" if raw is None else str(raw)
            if kind == "secret":
                if raw:
                    result[name] = raw
                elif name in self.current:
                    result[name] = self.current[name]
                continue
            if raw.strip() == "" and kind != "string":
                continue  # absent: the schema says whether that is allowed
            if raw == "" and kind == "string" and name not in self.required_names and name not in self.current:
                continue
            try:
                result[name] = self._parse(name, kind, raw)
            except forms.ValidationError as exc:
                self.add_error(key, exc)
        return result

    def add_schema_errors(self, errors: list[dict[str, Any]]) -> None:
        """The gate's schema errors onto the fields they name (the rest above the form)."""
        for error in errors:
            path = str(error.get("path") or "")
            head = path.split(".", 1)[0]
            message = error.get("message", "invalid")
            if not head and error.get("validator") == "required":
                match = re.match(r"'([^']+)' is a required property", message)
                head = match.group(1) if match else ""
            if head and f"arg__{head}" in self.fields:
                self.add_error(f"arg__{head}", message)
            else:
                self.add_error(None, message)
