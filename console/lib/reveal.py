"""What a reviewer reads is what runs.

Arguments, previews and task contracts come from agents. A right-to-left override (U+202E) can
make "ceo@acme.test\\u202emoc.live@" read as another address; a zero-width space can split a
word that a person reads whole; a non-breaking space looks like a space. `reveal_html` escapes
a text for HTML and shows every such character as a visible, flagged escape (`\\u202e` in a
<mark> naming the character); an address whose domain is not ASCII is followed by the form it
is sent in (punycode). `as_json` shows a value as the JSON the agent sent, not as Python.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

import idna
from django.utils.html import escape

# Categories that are never visible as themselves: controls, format characters (bidi controls,
# zero-width characters, tags), line and paragraph separators, private use, surrogates,
# unassigned code points.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})
# Letters that render as blank space (Hangul fillers, Braille blank, a combining joiner).
_BLANK_LOOKING = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u17b4\u17b5")
_ALLOWED = frozenset("\n\t ")
_CONTROL_NAMES = {"\r": "CARRIAGE RETURN", "\x00": "NULL", "\x0b": "LINE TABULATION", "\x0c": "FORM FEED",
                  "\x1b": "ESCAPE", "\x7f": "DELETE", "\x85": "NEXT LINE"}
# An address-like token: what a mail header would take as one address.
_ADDRESS = re.compile(r"[^\s@<>,;\"'()\[\]]+@[^\s@<>,;\"'()\[\]]+")


def is_hidden(char: str) -> bool:
    if char in _ALLOWED:
        return False
    category = unicodedata.category(char)
    return category in _HIDDEN_CATEGORIES or category == "Zs" or char in _BLANK_LOOKING


def hidden_characters(text: str) -> list[str]:
    """The characters of `text` that a person cannot see as themselves, in order."""
    return [char for char in text if is_hidden(char)]


def _escape_of(char: str) -> str:
    code = ord(char)
    if char == "\r":
        return "\\r"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _marked(char: str) -> str:
    name = _CONTROL_NAMES.get(char) or unicodedata.name(char, "")
    title = f"U+{ord(char):04X} {name}".strip()
    return f'<mark class="hidden-char" title="{escape(title)}">{_escape_of(char)}</mark>'


_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _reveal_chars(text: str) -> str:
    if text.isascii() and not _ASCII_CONTROL.search(text):
        return escape(text)  # the common case: nothing hidden, one escape for the whole text
    out: list[str] = []
    start = 0
    for i, char in enumerate(text):
        if is_hidden(char):
            out.append(escape(text[start:i]))
            out.append(_marked(char))
            start = i + 1
    out.append(escape(text[start:]))
    return "".join(out)


def reveal_text(text: str) -> str:
    """`text` with hidden characters as plain escapes (for attributes such as a title)."""
    return "".join(_escape_of(char) if is_hidden(char) else char for char in text)


def ascii_domain(domain: str) -> str | None:
    """The domain as DNS and SMTP take it (IDNA 2008 with UTS 46 mapping), or None."""
    try:
        return idna.encode(domain, uts46=True).decode("ascii")
    except (idna.IDNAError, UnicodeError):
        return None


def reveal_html(text: str) -> str:
    """`text` escaped for HTML, hidden characters as flagged escapes, punycode beside IDNs."""
    out: list[str] = []
    position = 0
    for match in _ADDRESS.finditer(text):
        out.append(_reveal_chars(text[position:match.end()]))
        position = match.end()
        local, _, domain = match.group().rpartition("@")
        if domain.isascii():
            continue
        encoded = ascii_domain(domain)
        shown = f"{local}@{encoded}" if encoded else "not a valid domain"
        out.append(f' <span class="idn" title="The domain as it is sent">({_reveal_chars(shown)})</span>')
    out.append(_reveal_chars(text[position:]))
    return "".join(out)


def as_json(value: Any) -> str:
    """A value as JSON, indented, keys in the order they were sent, non-ASCII as itself (the
    hidden characters among it are for `reveal_html` to show)."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON has no longer escape: a surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_escaping_hidden(value: Any) -> str:
    """`value` as JSON text for a person to edit and submit: hidden characters written as JSON
    escapes (`\\u202e`), which parse back to the very same characters, so the text shows them
    and the value it stands for is unchanged. Everything else as `as_json` writes it."""
    return "".join(_json_escape(char) if is_hidden(char) else char for char in as_json(value))
