"""URL templates for tools configured as data: `https://host/orders/{order_id}?notify={notify}`.

Placeholders name arguments and may stand in the path and in query values only, never in the
scheme, the host or a query parameter's name: an agent's arguments choose *which* order, never
*which server*. Rendering escapes every value for where it stands — a path value is one
percent-encoded segment (a "/" or ".." in it cannot climb the path), a query value is
form-encoded — so no argument can change the request's shape.

A query parameter whose value is exactly one placeholder is left out when that argument is
absent (or null): optional arguments need no template of their own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TemplateError(ValueError):
    """The template itself is malformed (found when it is saved)."""


@dataclass(frozen=True)
class UrlTemplate:
    base: str  # scheme://host[:port] (no placeholders)
    path: str  # with placeholders
    query: tuple[tuple[str, str], ...]  # (name, value template)

    @property
    def path_names(self) -> list[str]:
        return _names(self.path)

    @property
    def query_names(self) -> list[str]:
        return [name for _, value in self.query for name in _names(value)]

    @property
    def names(self) -> list[str]:
        return [*self.path_names, *self.query_names]

    def render(self, values: dict[str, Any]) -> str:
        """The URL with `values` escaped into it; KeyError for a path placeholder without a
        value, ValueError for a value that is not a scalar."""
        path = PLACEHOLDER.sub(lambda m: _segment(_scalar(m.group(1), values[m.group(1)])), self.path)
        pairs: list[tuple[str, str]] = []
        for name, value in self.query:
            whole = PLACEHOLDER.fullmatch(value)
            if whole and values.get(whole.group(1)) is None:
                continue
            pairs.append((name, PLACEHOLDER.sub(lambda m: _scalar(m.group(1), values[m.group(1)]), value)))
        return self.base + path + ("?" + urlencode(pairs) if pairs else "")


def parse(template: str) -> UrlTemplate:
    template = template.strip()
    if not template:
        raise TemplateError("The URL is empty.")
    if any(ch in template for ch in "\r\n\t "):
        raise TemplateError("The URL contains whitespace.")
    for match in PLACEHOLDER.finditer(template):
        if not NAME.fullmatch(match.group(1)):
            raise TemplateError(f"{match.group(0)} is not a placeholder: write {{argument_name}}.")
    if PLACEHOLDER.sub("", template).count("{") or PLACEHOLDER.sub("", template).count("}"):
        raise TemplateError("Unbalanced braces in the URL.")
    head, _, query = template.partition("?")
    if "#" in template:
        raise TemplateError("A URL template has no fragment (#).")
    split = urlsplit(head)
    if split.scheme not in ("http", "https") or not split.netloc:
        raise TemplateError("The URL must start with http:// or https:// and a host.")
    if "{" in split.netloc or "{" in split.scheme:
        raise TemplateError("Placeholders may stand in the path and the query only, not in the host.")
    base = f"{split.scheme}://{split.netloc}"
    path = head[len(base):] or "/"
    pairs: list[tuple[str, str]] = []
    for part in filter(None, query.split("&")):
        name, eq, value = part.partition("=")
        if not eq or not name:
            raise TemplateError(f"Query part {part!r} is not name=value.")
        if "{" in name:
            raise TemplateError("A query parameter's name cannot be a placeholder.")
        pairs.append((name, value))
    return UrlTemplate(base=base, path=path, query=tuple(pairs))


def _names(text: str) -> list[str]:
    return [m.group(1) for m in PLACEHOLDER.finditer(text)]


def _scalar(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return json.dumps(value)
    raise ValueError(f"argument {name!r} is a {type(value).__name__}; only scalars go into a URL")


def _segment(text: str) -> str:
    encoded = quote(text, safe="")
    # "." and ".." are segments a server would resolve: encode their dots too.
    return encoded.replace(".", "%2E") if encoded in (".", "..") else encoded
