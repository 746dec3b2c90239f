"""console.lib.canonical: RFC 8785 canonical JSON and the intent hash bound to it."""

from __future__ import annotations

import hashlib
import json
import random
import unicodedata
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console.lib.canonical import arguments_hash, canonical_json, intent_hash, intent_hash_of

REFUND = {"order_id": "ord-1", "amount": 120, "currency": "EUR", "reason": "damaged"}
PRINCIPAL = "agent:acme/agent"


def h(arguments, *, tool="payments.refund", principal=PRINCIPAL) -> str:
    return intent_hash(tool=tool, arguments=arguments, principal=principal)


def test_it_is_a_sha256_hex_digest():
    digest = h(REFUND)
    assert len(digest) == 64
    assert int(digest, 16) >= 0


def test_key_order_does_not_change_the_hash():
    reordered = dict(reversed(list(REFUND.items())))
    assert list(reordered) != list(REFUND)
    assert h(reordered) == h(REFUND)


def test_nested_key_order_does_not_change_the_hash():
    a = {"to": ["a@example.com"], "meta": {"x": 1, "y": {"b": 2, "a": 1}}}
    b = {"meta": {"y": {"a": 1, "b": 2}, "x": 1}, "to": ["a@example.com"]}
    assert h(a, tool="mail.send") == h(b, tool="mail.send")


def test_keys_are_sorted_by_utf16_code_units_as_rfc8785_says():
    # U+1F600 (surrogate pair D83D DE00) sorts before U+FB01 in UTF-16, after it in code points.
    assert canonical_json({"\ufb01": 1, "\U0001f600": 2}) == '{"\U0001f600":2,"\ufb01":1}'.encode()


def test_json_whitespace_and_layout_do_not_change_the_hash():
    compact = json.loads('{"order_id":"ord-1","amount":120,"currency":"EUR","reason":"damaged"}')
    spaced = json.loads('{\n  "reason" : "damaged",\n  "currency" : "EUR" ,"amount": 120, "order_id":"ord-1"\n}')
    assert h(compact) == h(spaced)


def test_unicode_escapes_and_literal_characters_hash_equal():
    escaped = json.loads('{"reason": "caf\\u00e9 \\u2603 \\ud83d\\ude00", "order_id": "\\u006f1"}')
    literal = json.loads('{"reason": "café ☃ 😀", "order_id": "o1"}')
    assert escaped == literal
    assert h(escaped) == h(literal)
    # The canonical form writes the characters themselves, UTF-8 encoded, not escapes.
    assert canonical_json(escaped) == '{"order_id":"o1","reason":"café ☃ 😀"}'.encode()


def test_it_does_not_normalize_unicode_forms():
    # RFC 8785 hashes what was sent: NFC and NFD spellings are different intents.
    nfc = unicodedata.normalize("NFC", "café")
    nfd = unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    assert h({**REFUND, "reason": nfc}) != h({**REFUND, "reason": nfd})


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (1, 1.0),
        (100, 1e2),
        (json.loads("1e2"), json.loads("100")),
        (json.loads("1E+2"), json.loads("100.0")),
        (-0.0, 0),
        (json.loads("-0.0"), json.loads("0")),
        (0.5, json.loads("5e-1")),
        (120, json.loads("120.000")),
    ],
)
def test_number_forms_rfc8785_treats_as_equal_hash_equal(left, right):
    assert canonical_json(left) == canonical_json(right)
    assert h({**REFUND, "amount": left}) == h({**REFUND, "amount": right})


@pytest.mark.parametrize(
    ("decimal", "number"),
    [
        (Decimal("120"), 120),
        (Decimal("120.00"), 120),
        (Decimal("120.00"), 120.0),
        (Decimal("1E+2"), 100),
        (Decimal("-0"), 0),
        (Decimal("0.00"), 0.0),
        (Decimal("25.50"), 25.5),
        (Decimal("0.1"), 0.1),
        (Decimal("199.99"), 199.99),
    ],
)
def test_a_decimal_amount_hashes_like_the_equal_float_or_int(decimal, number):
    assert h({**REFUND, "amount": decimal}) == h({**REFUND, "amount": number})


@settings(max_examples=200, deadline=None, database=None)
@given(st.decimals(min_value=Decimal("-1000000000"), max_value=Decimal("1000000000"), places=4,
                   allow_nan=False, allow_infinity=False))
def test_any_decimal_amount_hashes_like_its_float(decimal):
    assert h({**REFUND, "amount": decimal}) == h({**REFUND, "amount": float(decimal)})


def test_decimals_inside_lists_and_nested_objects_are_canonicalized():
    a = {"items": [{"amount": Decimal("1.50")}, Decimal("2")], "total": (Decimal("3.5"),)}
    b = {"items": [{"amount": 1.5}, 2], "total": [3.5]}
    assert h(a) == h(b)


def test_different_values_hash_differently():
    assert h(REFUND) != h({**REFUND, "amount": 121})
    assert h(REFUND) != h({**REFUND, "amount": 120.01})
    assert h(REFUND) != h({**REFUND, "amount": "120"})
    assert h(REFUND) != h({**REFUND, "order_id": "ord-2"})
    assert h(REFUND) != h({k: v for k, v in REFUND.items() if k != "reason"})
    assert h(REFUND) != h({**REFUND, "extra": None})


def test_different_tools_hash_differently():
    assert h(REFUND, tool="payments.refund") != h(REFUND, tool="payments.charge")


def test_different_principals_hash_differently():
    assert h(REFUND, principal="agent:acme/agent") != h(REFUND, principal="agent:acme/other")
    assert h(REFUND, principal="agent:acme/agent") != h(REFUND, principal="agent:globex/agent")


def test_the_fields_cannot_be_shifted_into_one_another():
    # Tool, arguments and principal are keys of one object, not concatenated strings.
    assert intent_hash(tool="a", arguments={}, principal="bc") != intent_hash(tool="ab", arguments={}, principal="c")


def test_the_arguments_hash_is_the_canonical_hash_of_the_arguments_alone():
    reordered = dict(reversed(list(REFUND.items())))
    assert arguments_hash(REFUND) == arguments_hash(reordered)
    assert arguments_hash(REFUND) != h(REFUND)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _shuffled(value, rnd: random.Random):
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


@settings(max_examples=100, deadline=None, database=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6), st.randoms(use_true_random=False))
def test_any_reordering_or_json_round_trip_of_the_arguments_hashes_equal(arguments, rnd):
    round_tripped = json.loads(json.dumps(_shuffled(arguments, rnd), ensure_ascii=rnd.random() < 0.5))
    assert h(round_tripped) == h(arguments)


@settings(max_examples=200, deadline=None, database=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6), st.text(max_size=12), st.text(max_size=12))
def test_the_intent_hash_from_the_arguments_canonical_json_is_the_hash_of_the_whole_intent(arguments, tool, principal):
    """A proposal has the arguments' canonical JSON already (their own hash): the intent hash
    is built around it, and must equal the canonical hash of the one object."""
    whole = hashlib.sha256(canonical_json({"tool": tool, "arguments": arguments, "principal": principal})).hexdigest()
    assert intent_hash_of(tool=tool, arguments_json=canonical_json(arguments), principal=principal) == whole
    assert intent_hash(tool=tool, arguments=arguments, principal=principal) == whole
