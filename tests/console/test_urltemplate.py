"""console.lib.urltemplate: placeholders in path and query only, each value escaped for where
it stands."""

from __future__ import annotations

import pytest

from console.lib.urltemplate import TemplateError, parse


def test_path_values_are_one_segment_and_query_values_are_form_encoded():
    template = parse("https://api.example.com/v1/orders/{order_id}/refunds?note={note}&mode=fast")
    assert template.path_names == ["order_id"] and template.query_names == ["note"]
    url = template.render({"order_id": "a/b?c#d", "note": "x&y=z é"})
    assert url == "https://api.example.com/v1/orders/a%2Fb%3Fc%23d/refunds?note=x%26y%3Dz+%C3%A9&mode=fast"


def test_scalars_render_as_json_and_an_absent_optional_query_value_is_left_out():
    template = parse("http://h/items/{n}?flag={flag}&limit={limit}")
    assert template.render({"n": 3, "flag": True}) == "http://h/items/3?flag=true"
    assert template.render({"n": 2.5, "flag": None, "limit": 0}) == "http://h/items/2.5?limit=0"


def test_dot_segments_cannot_climb():
    assert parse("http://h/a/{x}/b").render({"x": ".."}) == "http://h/a/%2E%2E/b"


def test_a_non_scalar_value_is_refused():
    with pytest.raises(ValueError, match="only scalars"):
        parse("http://h/a/{x}").render({"x": {"a": 1}})


@pytest.mark.parametrize(("template", "words"), [
    ("http://{host}/a", "not in the host"),
    ("http://h/a?{name}=1", "name cannot be a placeholder"),
    ("http://h/a/{x", "Unbalanced"),
    ("/relative/{x}", "http://"),
    ("http://h/a#frag", "fragment"),
    ("http://h/a b", "whitespace"),
])
def test_malformed_templates_are_refused(template, words):
    with pytest.raises(TemplateError, match=words):
        parse(template)
