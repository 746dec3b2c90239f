"""JSON in, with a nesting budget checked before any recursive code reads it.

`json.loads`, DRF's validation and the canonical hash all recurse once per level of nesting: a
body of a few kilobytes nested tens of thousands deep exhausts the interpreter's recursion
limit (a RecursionError, a 500, and under DEBUG a traceback page that takes minutes to render).
`loads` counts the nesting of brackets outside strings with one linear scan first, so a body
over the budget is refused as invalid input before anything recursive sees it.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Deep enough for any tool's arguments or an OTLP attribute; far below the recursion limit of
# the code that walks the value afterwards.
MAX_DEPTH = 64

# A string (with its escapes) or a bracket; characters in between are skipped by the scanner.
# One character per repetition inside the string: no nested quantifier, so no backtracking blowup.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


class TooDeep(ValueError):
    pass


class Unstorable(ValueError):
    """A string no database here can keep: PostgreSQL's text and jsonb refuse U+0000, and an
    unpaired surrogate (a lone `\\ud800` escape) has no UTF-8 form."""


# U+0000 or any surrogate: paired escapes are already joined into one character by the parser,
# so a surrogate left in a parsed string is an unpaired one.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def check_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > max_depth:
                raise TooDeep(f"JSON nested deeper than {max_depth} levels.")
        elif token in ("]", "}"):
            depth -= 1


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value.")


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH, constants: bool = False) -> Any:
    """Parse JSON, refusing nesting over `max_depth` with TooDeep. NaN and ±Infinity only with
    `constants` (OTLP exporters send them). Every failure is a ValueError (TooDeep, Unstorable,
    JSONDecodeError, UnicodeDecodeError)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    check_depth(text, max_depth)
    try:
        value = json.loads(text, parse_constant=None if constants else _reject_constant)
    except RecursionError as exc:  # only if max_depth were set above what the parser can take
        raise TooDeep("JSON nested too deeply.") from exc
    check_storable(value)
    return value


def check_storable(value: Any) -> None:
    """Refuse U+0000 and unpaired surrogates in any key or string, with Unstorable. Iterative
    (a stack, no recursion), so it holds for any depth."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings = (item,)
        elif isinstance(item, dict):
            strings = tuple(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
            continue
        else:
            continue
        for string in strings:
            if _UNSTORABLE.search(string):
                raise Unstorable("A string may not hold U+0000 or an unpaired surrogate "
                                 f"(found in {string[:40]!r}).")
