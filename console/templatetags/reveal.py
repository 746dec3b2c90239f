"""{% load reveal %}: `{{ text|reveal }}` shows hidden characters as flagged escapes and
punycode beside international domains (console/lib/reveal.py); `{{ value|as_json }}` shows a
value as the JSON the agent sent. Both are for everything that came from an agent."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from console.lib import reveal as lib

register = template.Library()


@register.filter(name="reveal")
def reveal(value: Any) -> SafeString:
    return mark_safe(lib.reveal_html("" if value is None else str(value)))  # noqa: S308 - escaped by reveal_html


@register.filter(name="reveal_text")
def reveal_text(value: Any) -> str:
    """For attributes: hidden characters as plain escapes, autoescaped as usual."""
    return lib.reveal_text("" if value is None else str(value))


@register.filter(name="as_json")
def as_json(value: Any) -> str:
    return lib.as_json(value)


@register.filter(name="has_hidden")
def has_hidden(value: Any) -> bool:
    return bool(lib.hidden_characters(value if isinstance(value, str) else lib.as_json(value)))
