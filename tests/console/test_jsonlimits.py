"""console.lib.jsonlimits: the nesting budget is counted before parsing, outside strings only."""

from __future__ import annotations

import pytest

from console.lib import jsonlimits


def test_it_parses_what_json_parses():
    assert jsonlimits.loads(b'{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}


def test_nesting_at_the_budget_passes_and_one_more_level_is_too_deep():
    assert jsonlimits.loads("[" * 64 + "]" * 64, max_depth=64)
    with pytest.raises(jsonlimits.TooDeep):
        jsonlimits.loads("[" * 65 + "]" * 65, max_depth=64)


def test_it_refuses_depth_before_parsing_even_a_broken_body():
    with pytest.raises(jsonlimits.TooDeep):
        jsonlimits.loads("[" * 100_000)  # would be a RecursionError in json.loads


@pytest.mark.parametrize("text", ['"[[[["', r'"\"[[[[\\"', '{"k": "]]]{{{"}'])
def test_brackets_and_escaped_quotes_inside_strings_do_not_count(text):
    jsonlimits.loads(text, max_depth=1)


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", "{", '"unterminated', b"\xff"])
def test_every_failure_is_a_value_error(text):
    with pytest.raises(ValueError):
        jsonlimits.loads(text)
