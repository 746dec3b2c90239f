"""GET /api/v1/calls/{call_id}?wait=: a poll that starts after the call became final, or after
the status the agent last saw, answers at once instead of waiting its full time."""

from __future__ import annotations

import pytest

from ledger import services as ledger_services
from ledger.models import Fact
from tests.fixtures.api import assert_error
from tests.ledger.test_api_call_get import get, proposed  # noqa: F401 - the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def confirm(operation_id: str) -> None:
    _, attempt = ledger_services.operation_dispatch(operation_id=operation_id, worker="test-worker")
    ledger_services.operation_record_outcome(
        operation_id=operation_id, attempt_number=attempt.number, fencing_token=attempt.fencing_token,
        fact=Fact.KNOWN_SUCCESS, receipt={"id": "re_1"})


def test_a_poll_of_a_final_call_answers_at_once(proposed, waits):  # noqa: F811
    confirm(proposed["operation_id"])

    response = get("/api/v1/calls/call-1", wait=20)

    assert waits == []  # not the 20 s asked for: nothing more will happen
    assert response.json()["status"] == "confirmed"


def test_a_poll_that_names_an_older_status_answers_at_once(proposed, waits):  # noqa: F811
    response = get("/api/v1/calls/call-1", wait=20, seen="planned")

    assert waits == []
    assert response.json()["status"] == "authorized"


def test_a_poll_that_names_the_current_status_waits_for_a_change(proposed, waits):  # noqa: F811
    response = get("/api/v1/calls/call-1", wait=0.3, seen="authorized")

    assert waits == [(0.3, None)]
    assert response.json()["status"] == "authorized"


def test_seen_must_name_a_status(proposed):  # noqa: F811
    error = assert_error(get("/api/v1/calls/call-1", wait=1, seen="sent"), 400, "invalid")
    assert "seen" in error["details"]["fields"]
