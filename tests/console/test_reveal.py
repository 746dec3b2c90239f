"""What a reviewer reads is what runs: invisible and direction-changing characters become
visible escapes, international domains show their punycode, values show as JSON."""

from __future__ import annotations

import json

import pytest
from django.template import Context, Template

from console.lib.reveal import as_json, hidden_characters, reveal_html


def test_a_right_to_left_override_is_shown_as_a_flagged_escape():
    html = reveal_html("ceo@acme.test\u202emoc.live@")
    assert "\u202e" not in html
    assert '<mark class="hidden-char" title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u202e</mark>' in html
    assert html.startswith("ceo@acme.test<mark")


@pytest.mark.parametrize("char", ["\u200b", "\u200d", "\u2066", "\u2069", "\u061c", "\ufeff", "\u00a0", "\r",
                                  "\x00", "\u2028", "\u3164", "\U000e0041"])
def test_every_invisible_or_control_character_is_escaped(char):
    html = reveal_html(f"a{char}b")
    assert char not in html and "hidden-char" in html
    assert hidden_characters(f"a{char}b") == [char]


def test_plain_text_newlines_and_tabs_pass_unchanged_but_html_is_escaped():
    assert reveal_html("Dear Bob,\n\tthanks & <b>bye</b>") == "Dear Bob,\n\tthanks &amp; &lt;b&gt;bye&lt;/b&gt;"
    assert hidden_characters("Dear Bob,\n\tthanks") == []


def test_an_international_domain_shows_its_punycode_beside_it():
    html = reveal_html("bob@bücher.example")
    assert html == 'bob@bücher.example <span class="idn" title="The domain as it is sent">(bob@xn--bcher-kva.example)</span>'


def test_values_show_as_the_json_the_agent_sent_not_python():
    assert as_json({"amount": 30, "ok": True, "note": None}) == '{\n  "amount": 30,\n  "ok": true,\n  "note": null\n}'
    assert as_json(["bob@acme.test, evil@x.test"]) == '[\n  "bob@acme.test, evil@x.test"\n]'
    assert as_json("é") == '"é"'


def test_the_template_filters_escape_and_mark_up(db):
    template = Template("{% load reveal %}{{ value|reveal }}|{{ data|as_json|reveal }}")
    html = template.render(Context({"value": "<i>x\u200by</i>", "data": {"a": "\u202e"}}))
    assert html.startswith("&lt;i&gt;x<mark")
    # json.dumps keeps non-ASCII as is (ensure_ascii=False): the override is escaped by reveal.
    assert '&quot;a&quot;: &quot;<mark class="hidden-char" title="U+202E' in html


@pytest.mark.parametrize("value", [
    {"body": "a\u202eb\u200bc\u00a0d\x7fe", "to": ["x@y.test"]},
    ["\U000e0041 tag", "\U0001f600 seen as itself", "\ud800 lone surrogate"],
    {"k\u2066ey": [1, None, True, "plain"]},
])
def test_json_for_a_form_writes_hidden_characters_as_escapes_that_parse_back_exactly(value):
    from console.lib.reveal import hidden_characters, json_escaping_hidden

    text = json_escaping_hidden(value)

    assert hidden_characters(text) == []
    assert json.loads(text) == value
