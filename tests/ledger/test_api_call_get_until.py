"""GET /api/v1/calls/{call_id}?wait=&until=final: one poll per call. The poll answers only once
the call is final (or when `wait` runs out, with the status as it is then), not at the statuses
it passes on the way (`dispatched`), so an agent waits once instead of once per status.

As in test_api_call_get, the ledger moves from a thread of its own, started by signals from the
view and from the doorbell — no sleeps."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection

from ledger import longpoll
from ledger import services as ledger_services
from ledger.models import Fact
from tests.fixtures.api import assert_error, call_body, refund, start_task
from tests.ledger.test_api_call_get import get, poll_started, proposed  # noqa: F401 - the fixtures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture
def rings_heard(monkeypatch) -> threading.Event:
    """Set when the doorbell of a waiting poll has taken in a ring: read what it may answer, or
    known from what the ring says moved that nothing it may answer did."""
    heard = threading.Event()
    real = longpoll.Doorbell._ring

    def spy(self, moved=None):
        real(self, moved)
        if self.watches:
            heard.set()

    monkeypatch.setattr(longpoll.Doorbell, "_ring", spy)
    return heard


def in_thread(*steps: Callable[[], object]) -> threading.Thread:
    def run():
        try:
            for step in steps:
                if step() is False:
                    return
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def dispatch(operation_id: str):
    return lambda: ledger_services.operation_dispatch(operation_id=operation_id, worker="test-worker")


def record(operation_id: str, fact: str, **kwargs):
    def run():
        ledger_services.operation_record_outcome(operation_id=operation_id, attempt_number=1, fencing_token=1,
                                                 fact=fact, **kwargs)
    return run


@pytest.mark.parametrize(("fact", "kwargs", "final"), [
    (Fact.KNOWN_SUCCESS, {"receipt": {"id": "re_1"}, "result": {"refund_id": "re_1"}}, "confirmed"),
    (Fact.KNOWN_FAILURE, {"error_class": "declined"}, "failed"),
])
def test_it_does_not_answer_at_dispatched_and_answers_once_the_call_is_final(
        proposed, poll_started, rings_heard, fact, kwargs, final):  # noqa: F811
    operation_id = proposed["operation_id"]
    # The call is dispatched; only once the waiting poll's doorbell has taken in that ring (and
    # not answered) does the outcome come.
    changer = in_thread(lambda: poll_started.wait(20), rings_heard.clear, dispatch(operation_id),
                        lambda: rings_heard.wait(20), record(operation_id, fact, **kwargs))
    response = get("/api/v1/calls/call-1", wait=30, until="final")
    changer.join(timeout=30)

    body = response.json()
    assert (body["status"], body["final"]) == (final, True)
    assert [attempt["number"] for attempt in body["attempts"]] == [1]


def test_it_answers_when_a_reviewer_rejects_a_held_call(api, running_task, poll_started):  # noqa: F811
    held = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task, arguments=refund(120)),
                    format="json").json()
    assert held["status"] == "planned"
    changer = in_thread(lambda: poll_started.wait(20), lambda: ledger_services.operation_reject(
        operation_id=held["operation_id"], actor="user:reviewer", reason="not this one"))
    body = get("/api/v1/calls/call-1", wait=30, until="final").json()
    changer.join(timeout=30)

    assert (body["status"], body["final"], body["decision"]["reason"]) == ("rejected", True, "not this one")


def test_a_refused_call_is_answered_at_once(api, agent, waits):
    run = start_task(agent, constraints={"max_amount": 10})
    api.post(f"/api/v1/tasks/{run.task_id}/calls", call_body(run), format="json")

    body = get("/api/v1/calls/call-1", wait=20, until="final").json()

    assert waits == []  # not the 20 s asked for
    assert (body["status"], body["final"]) == ("refused", True)


def test_a_poll_that_runs_out_answers_the_status_as_it_is(proposed, poll_started, rings_heard, waits):  # noqa: F811
    # Dispatched while the poll waits, never confirmed: the poll answers `dispatched` when its
    # wait runs out, not at the move.
    changer = in_thread(lambda: poll_started.wait(20), rings_heard.clear, dispatch(proposed["operation_id"]))
    response = get("/api/v1/calls/call-1", wait=1.5, until="final")
    changer.join(timeout=30)

    assert waits == [(1.5, None)]  # the move did not end the wait
    assert rings_heard.is_set()  # the doorbell heard the move and went on waiting
    assert (response.json()["status"], response.json()["final"]) == ("dispatched", False)


def test_a_status_past_seen_does_not_answer_it(proposed, waits):  # noqa: F811
    """`seen` names the status the agent last saw; with `until=final` only a final one answers."""
    response = get("/api/v1/calls/call-1", wait=0.3, seen="planned", until="final")

    assert waits == [(0.3, None)]
    assert response.json()["status"] == "authorized"


def test_wait_zero_answers_at_once(proposed):  # noqa: F811
    assert get("/api/v1/calls/call-1", wait=0, until="final").json()["status"] == "authorized"


@pytest.mark.parametrize("until", ["confirmed", "FINAL", "change", "final,dispatched"])
def test_any_other_value_of_until_is_400(proposed, until):  # noqa: F811
    error = assert_error(get("/api/v1/calls/call-1", wait=1, until=until), 400, "invalid")
    assert list(error["details"]["fields"]) == ["until"]


def test_it_answers_once_the_call_waits_for_a_person(proposed, poll_started, rings_heard, waits):  # noqa: F811
    # dispatched → unknown (the reply was lost) → manual (reconciliation gave up): `manual` is not
    # final, but nothing moves it again without a person, which may take hours. The poll answers
    # it then, not when its wait runs out.
    operation_id = proposed["operation_id"]
    changer = in_thread(lambda: poll_started.wait(20), rings_heard.clear, dispatch(operation_id),
                        lambda: rings_heard.wait(20), record(operation_id, Fact.UNKNOWN, error_class="timeout"),
                        lambda: ledger_services.operation_escalate_manual(
                            operation_id=operation_id, actor="system:reconciler", reason="provider could not tell"))
    body = get("/api/v1/calls/call-1", wait=30, until="final").json()
    changer.join(timeout=30)

    assert waits == [(30.0, "manual")]  # ended by `manual`, not by the 30 s asked for
    assert (body["status"], body["final"]) == ("manual", False)
