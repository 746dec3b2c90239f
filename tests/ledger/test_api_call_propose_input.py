"""A proposal's body is read without DRF's input serializer when every field is plainly what the
serializer accepts (it deep-copies its eight fields on every request an agent waits on). Such a
body must give exactly the serializer's validated data; any other body goes to the serializer,
which answers with its errors as before."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from ledger import api as ledger_api
from ledger.proposals import MAX_CALL_ID, MAX_STEP_ID
from tests.fixtures.api import call_body

# Near every limit and kind of value the serializer tells apart.
TEXT = st.one_of(
    st.text(max_size=8),
    st.text(min_size=MAX_CALL_ID - 2, max_size=MAX_CALL_ID + 2),
    st.text(min_size=MAX_STEP_ID - 2, max_size=MAX_STEP_ID + 2),
    st.text(min_size=98, max_size=102),
    st.sampled_from(["", " ", " a", "a ", "a\tb", "a\x00b", "a\ud800", "\u00a0", "call-1", "payments.refund"]),
)
NOT_TEXT = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.lists(st.integers(), max_size=2),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
INTEGER = st.one_of(st.integers(min_value=-3, max_value=5), st.integers(), st.sampled_from([2**53, 2**63 - 1, 2**63]),
                    st.booleans(), st.floats(), st.just("3"), st.none())
ARGUMENTS = st.one_of(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5)), max_size=3),
                      NOT_TEXT, st.text(max_size=5))
ANY_VALUE = {
    "call_id": st.one_of(TEXT, NOT_TEXT),
    "step_id": st.one_of(TEXT, NOT_TEXT),
    "tool": st.one_of(TEXT, NOT_TEXT),
    "arguments": ARGUMENTS,
    "expected_version": INTEGER,
    "fencing_token": INTEGER,
    "dry_run": st.one_of(st.booleans(), st.none(), st.integers(0, 1), st.just("false")),
    "extra": st.integers(),
}


def plain_text(max_size: int):
    return st.text(min_size=1, max_size=max_size).filter(lambda text: text.isprintable() and text == text.strip())


# A body the serializer accepts, then up to two of its keys dropped or given any value above.
VALID = st.fixed_dictionaries({
    "call_id": plain_text(MAX_CALL_ID), "step_id": plain_text(MAX_STEP_ID), "tool": plain_text(100),
    "arguments": st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    "expected_version": st.integers(0, 10**6), "fencing_token": st.integers(0, 10**6),
}, optional={"dry_run": st.just(False), "extra": st.integers()})
DROPPED = object()
CHANGES = st.lists(st.sampled_from(sorted(ANY_VALUE)).flatmap(
    lambda key: st.tuples(st.just(key), st.one_of(st.just(DROPPED), ANY_VALUE[key]))), max_size=2)


def changed(body: dict, changes: list) -> dict:
    body = dict(body)
    for key, value in changes:
        if value is DROPPED:
            body.pop(key, None)
        else:
            body[key] = value
    return body


BODY = st.builds(changed, VALID, CHANGES)


def serializer_says(body):
    serializer = ledger_api.CallProposeApi.InputSerializer(data=body)
    return dict(serializer.validated_data) if serializer.is_valid() else None


@seed(20261203)
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.one_of(BODY, st.lists(st.integers(), max_size=2), st.text(max_size=3), st.none()))
def test_a_body_read_plainly_is_what_the_serializer_validates(body):
    plain = ledger_api.plain_proposal_input(body)
    if plain is not None:
        assert plain == serializer_says(body)


@pytest.mark.django_db
def test_a_usual_proposal_is_read_plainly(running_task):
    body = call_body(running_task)
    assert ledger_api.plain_proposal_input(body) == serializer_says(body) is not None
    assert ledger_api.plain_proposal_input({**body, "dry_run": False}) == serializer_says(body)


@pytest.mark.django_db
def test_the_post_of_a_usual_proposal_does_not_run_the_input_serializer(api, running_task, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the input serializer ran")

    monkeypatch.setattr(ledger_api.CallProposeApi.InputSerializer, "is_valid", refuse)
    response = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task), format="json")
    assert response.status_code == 201, response.content


@pytest.mark.django_db
def test_a_body_that_is_not_plain_still_gets_the_serializers_errors(api, running_task):
    body = {**call_body(running_task), "call_id": "a\tb", "expected_version": "3"}
    response = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", body, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["error"]["details"]["fields"]
    assert set(fields) == {"call_id", "expected_version"}
