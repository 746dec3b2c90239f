"""Success criteria as data: the kinds a contract may name, their normal form, and the pure
comparisons the verifiers make (a path into a result, JSON equality, containment).

No database and no app here: `runs.verifiers` reads the ledger and judges each criterion with
these; the agent API validates the shapes (`runs.api`) within the limits below.

A criterion is an object with a `kind`:
- `operation_confirmed` `{tool, arguments?}`: some operation of this task on that tool, whose
  arguments contain the subset, is confirmed.
- `result_matches` `{call_id | tool, path, equals | contains}`: a confirmed call's result, at the
  path (a JSON pointer `/a/0/b` or a dotted path `a.0.b`), equals or contains the value.
- `human` `{description}`: a reviewer of the tenant confirms it on the console, with evidence.
  A plain string in the contract is this kind, its text the description.
- `verifier` `{name, params?}`: a function registered in `runs.verifiers` (code-defined checks).
  `{"kind": "<registered name>", ...}` is shorthand for it, the other keys its params.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

OPERATION_CONFIRMED = "operation_confirmed"
RESULT_MATCHES = "result_matches"
HUMAN = "human"
VERIFIER = "verifier"
KINDS = (OPERATION_CONFIRMED, RESULT_MATCHES, HUMAN, VERIFIER)

# A criterion's verdict. `review`: met as far as the ledger can tell, waiting for a person.
MET, PENDING, FAILED, REVIEW = "met", "pending", "failed", "review"

# Bounds of what a contract may say (the API refuses more with a 400).
MAX_CRITERIA = 20
MAX_DESCRIPTION = 2000
MAX_PATH_LENGTH = 256
MAX_PATH_SEGMENTS = 16
MAX_VALUE_BYTES = 4096  # one expected value or argument subset, as compact JSON
MAX_VALUE_DEPTH = 8
# What a verdict quotes of a value it found (a result may be large).
QUOTE_CHARS = 500


def normalize(criteria: Iterable[Any], registered: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The normal form: a string becomes a `human` criterion; a registered verifier's name used
    as kind becomes `{"kind": "verifier", "name", "params"}`. Anything else is kept as it is
    (the API has refused what is malformed; a verifier judges what is left)."""
    names = set(registered)
    out: list[dict[str, Any]] = []
    for item in criteria:
        if isinstance(item, str):
            out.append({"kind": HUMAN, "description": item})
        elif isinstance(item, dict) and item.get("kind") in names:
            params = {key: value for key, value in item.items() if key != "kind"}
            out.append({"kind": VERIFIER, "name": item["kind"], "params": params})
        else:
            out.append(item)
    return out


# --- paths -----------------------------------------------------------------------------------


class BadPath(ValueError):
    pass


def path_segments(path: str) -> list[str]:
    """A JSON pointer (RFC 6901: `/a/0/b`, `~1` for `/`, `~0` for `~`) or a dotted path
    (`a.0.b`); the empty string is the whole value. Bounded in length and segments."""
    if not isinstance(path, str):
        raise BadPath("A path is a string.")
    if len(path) > MAX_PATH_LENGTH:
        raise BadPath(f"A path has at most {MAX_PATH_LENGTH} characters.")
    if path == "":
        return []
    if path.startswith("/"):
        raw = path[1:].split("/")
        for part in raw:
            if "~" in part.replace("~0", "").replace("~1", ""):
                raise BadPath("In a JSON pointer '~' is written '~0' and '/' is written '~1'.")
        segments = [part.replace("~1", "/").replace("~0", "~") for part in raw]
    else:
        segments = path.split(".")
        if any(part == "" for part in segments):
            raise BadPath("A dotted path has no empty segment (start with '/' for a JSON pointer).")
    if len(segments) > MAX_PATH_SEGMENTS:
        raise BadPath(f"A path has at most {MAX_PATH_SEGMENTS} segments.")
    return segments


_MISSING = object()


def resolve(value: Any, path: str) -> Any:
    """The value at `path`, or `MISSING` when the path leads nowhere. A segment indexes a list
    when it is a non-negative integer written without leading zeros."""
    for segment in path_segments(path):
        if isinstance(value, dict):
            if segment not in value:
                return _MISSING
            value = value[segment]
        elif isinstance(value, list):
            if not segment.isdigit() or (len(segment) > 1 and segment[0] == "0") or int(segment) >= len(value):
                return _MISSING
            value = value[int(segment)]
        else:
            return _MISSING
    return value


MISSING = _MISSING


# --- comparisons -----------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: 30 and 30.0 are one number (canonical JSON says so), true is
    not 1, and objects compare by keys whatever their order."""
    if _is_number(a) and _is_number(b):
        return a == b and not (isinstance(a, float) and math.isnan(a))
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is not type(b):
        return False
    return a == b


def is_subset(subset: Any, value: Any) -> bool:
    """Every key of `subset` is in `value` with a value that is (recursively) a subset of it;
    lists and scalars compare equal."""
    if isinstance(subset, dict):
        return isinstance(value, dict) and all(k in value and is_subset(v, value[k]) for k, v in subset.items())
    return json_equal(subset, value)


def contains(value: Any, wanted: Any) -> bool:
    """A string contains a substring; a list contains an element equal to `wanted`; an object
    contains a subset object."""
    if isinstance(value, str):
        return isinstance(wanted, str) and wanted in value
    if isinstance(value, list):
        return any(json_equal(item, wanted) for item in value)
    if isinstance(value, dict):
        return isinstance(wanted, dict) and is_subset(wanted, value)
    return False


def quote(value: Any) -> Any:
    """A value as a verdict may quote it: small values whole, large ones cut (as JSON text)."""
    if value is _MISSING:
        return None
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return value if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…"


def value_depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0). Only called on values within the API's
    body nesting budget, so the recursion is bounded."""
    if isinstance(value, dict):
        return 1 + max((value_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((value_depth(v) for v in value), default=0)
    return 0


def value_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def describe(criterion: dict[str, Any]) -> str:
    """One line a person reads on the run page."""
    kind = criterion.get("kind")
    if kind == HUMAN:
        return str(criterion.get("description", ""))
    if kind == OPERATION_CONFIRMED:
        subset = criterion.get("arguments") or {}
        args = f" with {json.dumps(subset, ensure_ascii=False, sort_keys=True)}" if subset else ""
        return f"a confirmed {criterion.get('tool')} operation{args}"
    if kind == RESULT_MATCHES:
        source = f"call {criterion['call_id']}" if criterion.get("call_id") else f"any {criterion.get('tool')} call"
        how, wanted = ("contains", criterion["contains"]) if "contains" in criterion else ("equals", criterion.get("equals"))
        where = criterion.get("path") or "(whole result)"
        return f"{source}: result {where} {how} {json.dumps(wanted, ensure_ascii=False)}"
    if kind == VERIFIER:
        params = criterion.get("params") or {}
        return f"verifier {criterion.get('name')}" + (f" {json.dumps(params, ensure_ascii=False, sort_keys=True)}"
                                                      if params else "")
    return json.dumps(criterion, ensure_ascii=False, sort_keys=True)[:QUOTE_CHARS]
