"""The inbox filter form's widgets written in Python.

Django renders each widget through its template engine, and each option of a select through
an include of its own: the inbox's filter form (six selects, one search box) was a sixth of the
page's server time (bench/inbox.py). `InboxFormRenderer` writes the same HTML as Django's
`select.html`, `select_option.html`, `text.html`, `search.html` and `attrs.html` (tested
against them) from the context Django builds, and leaves every other template to Django.
"""

from __future__ import annotations

from typing import Any

from django.forms.renderers import DjangoTemplates
from django.utils.html import conditional_escape, escape


def _attrs(attrs: dict[str, Any]) -> str:
    out = []
    for name, value in attrs.items():
        if value is False:
            continue
        out.append(f" {escape(name)}" if value is True else f' {escape(name)}="{escape(str(value))}"')
    return "".join(out)


def _select(widget: dict[str, Any]) -> str:
    out = [f'<select name="{escape(widget["name"])}"{_attrs(widget["attrs"])}>']
    for group_name, options, _index in widget["optgroups"]:
        if group_name:
            out.append(f'\n  <optgroup label="{conditional_escape(group_name)}">')
        for option in options:
            out.append(f'\n  <option value="{escape(str(option["value"]))}"{_attrs(option["attrs"])}>'
                       f'{conditional_escape(option["label"])}</option>\n')
        if group_name:
            out.append("\n  </optgroup>")
    out.append("\n</select>")
    return "".join(out)


def _input(widget: dict[str, Any]) -> str:
    value = "" if widget["value"] is None else f' value="{escape(str(widget["value"]))}"'
    return f'<input type="{escape(widget["type"])}" name="{escape(widget["name"])}"{value}{_attrs(widget["attrs"])}>'


WRITERS = {
    "django/forms/widgets/select.html": _select,
    "django/forms/widgets/text.html": _input,
    "django/forms/widgets/search.html": _input,
}


class InboxFormRenderer(DjangoTemplates):
    def render(self, template_name: str, context: dict[str, Any], request=None) -> str:
        writer = WRITERS.get(template_name)
        if writer is None:
            return super().render(template_name, context, request=request)
        return writer(context["widget"])
