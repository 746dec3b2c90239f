"""runs.criteria: paths into a result, JSON equality and containment, the normal form."""

from __future__ import annotations

import pytest

from runs import criteria as C

RESULT = {"refund": {"id": "re_1", "status": "succeeded"}, "items": [{"sku": "a"}, {"sku": "b"}],
          "a/b": {"~x": 1}, "0": "zero-key"}


@pytest.mark.parametrize(("path", "expected"), [
    ("", RESULT),
    ("/refund/status", "succeeded"),
    ("refund.status", "succeeded"),
    ("/items/1/sku", "b"),
    ("items.0.sku", "a"),
    ("/a~1b/~0x", 1),
    ("0", "zero-key"),
])
def test_a_path_finds_the_value(path, expected):
    assert C.resolve(RESULT, path) == expected


@pytest.mark.parametrize("path", ["/refund/amount", "items.2", "items.01", "items.-1", "refund.status.x",
                                  "/items/sku"])
def test_a_path_that_leads_nowhere_is_missing(path):
    assert C.resolve(RESULT, path) is C.MISSING


@pytest.mark.parametrize("path", ["a..b", ".a", "/a~2", "x" * (C.MAX_PATH_LENGTH + 1),
                                  ".".join(["a"] * (C.MAX_PATH_SEGMENTS + 1))])
def test_a_bad_or_unbounded_path_is_refused(path):
    with pytest.raises(C.BadPath):
        C.path_segments(path)


@pytest.mark.parametrize(("a", "b", "equal"), [
    (30, 30.0, True), (True, 1, False), (False, 0, False), ("1", 1, False), (None, None, True),
    ({"a": 1, "b": [1, 2]}, {"b": [1, 2.0], "a": 1}, True), ([1, 2], [2, 1], False), ({"a": 1}, {"a": 1, "b": 2}, False),
])
def test_json_equality(a, b, equal):
    assert C.json_equal(a, b) is equal


@pytest.mark.parametrize(("value", "wanted", "found"), [
    ("refund re_1 succeeded", "re_1", True), ("abc", "x", False), ("abc", 1, False),
    ([1, {"a": 2}], {"a": 2}, True), ([1, 2], 3, False),
    ({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 2}}, True), ({"a": 1}, {"a": 2}, False),
    (5, 5, False),
])
def test_containment(value, wanted, found):
    assert C.contains(value, wanted) is found


def test_the_normal_form_reads_free_text_as_human_and_a_registered_name_as_a_verifier():
    assert C.normalize(["told the customer", {"kind": "refund_confirmed", "amount": 3}, {"kind": "human",
                                                                                         "description": "x"}],
                       registered={"refund_confirmed"}) == [
        {"kind": "human", "description": "told the customer"},
        {"kind": "verifier", "name": "refund_confirmed", "params": {"amount": 3}},
        {"kind": "human", "description": "x"},
    ]
