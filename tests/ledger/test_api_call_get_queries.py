"""What a long-poll of GET /api/v1/calls/{call_id} costs the database: a poll that needs no
waiting is answered in one hop, one that waits reads the agent and the call, and one ring of
the doorbell reads every waiting call's status once and answers the polls whose call moved."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
from django.test import RequestFactory

from ledger import api as ledger_api
from ledger import longpoll
from ledger import services as ledger_services
from ledger.models import Call
from ledger.selectors import FINAL_STATUSES, call_detail
from tests.conftest import AGENT_TOKEN
from tests.fixtures.api import call_body, refund

HEADER = f"Bearer {AGENT_TOKEN}"


def request_for(task_id: str):
    return RequestFactory().get("/api/v1/calls/call-1", {"task_id": task_id})


def propose(api, run, n: int) -> list[dict]:
    return [api.post(f"/api/v1/tasks/{run.task_id}/calls",
                     call_body(run, call_id=f"call-{i}", step_id=f"step-{i}"), format="json").json()
            for i in range(1, n + 1)]


@pytest.fixture
def reads(monkeypatch) -> list[list[int]]:
    """The calls each of the doorbell's shared status reads was for."""
    made: list[list[int]] = []
    real = longpoll.call_operation_statuses

    def counted(call_pks):
        made.append(sorted(call_pks))
        return real(call_pks)

    monkeypatch.setattr(longpoll, "call_operation_statuses", counted)
    return made


@pytest.mark.django_db
def test_a_poll_that_needs_no_waiting_is_answered_from_the_agent_the_call_and_one_read(
        api, running_task, django_assert_num_queries):
    propose(api, running_task, 1)
    # The agent; the call with its operation, tool, step and task; its attempts and call IDs in
    # one statement. No approval is looked up for a call the gate ran at once.
    with django_assert_num_queries(3):
        look = ledger_api._look(request_for(running_task.task_id), HEADER, "call-1", 0.0, None, None)
    assert look.response.status_code == 200


@pytest.mark.django_db
def test_a_poll_that_waits_reads_only_the_agent_and_the_call(api, running_task, django_assert_num_queries):
    propose(api, running_task, 1)
    with django_assert_num_queries(2):
        look = ledger_api._look(request_for(running_task.task_id), HEADER, "call-1", 10.0, None, None)
    assert (look.response, look.baseline) == (None, "authorized")


@pytest.mark.django_db
def test_the_answer_after_a_change_reads_the_operation_its_attempts_and_its_call_ids_in_one_statement(
        api, running_task, django_assert_num_queries):
    [proposed] = propose(api, running_task, 1)
    ledger_services.operation_dispatch(operation_id=proposed["operation_id"], worker="test-worker")
    call = Call.objects.get(call_id="call-1")
    with django_assert_num_queries(1):
        response = ledger_api._answer(request_for(running_task.task_id), call)
    assert response.status_code == 200


@pytest.mark.django_db
def test_the_answer_of_a_held_call_adds_its_approval_and_the_approvals_given(
        api, running_task, django_assert_num_queries):
    held = api.post(f"/api/v1/tasks/{running_task.task_id}/calls",
                    call_body(running_task, arguments=refund(250)), format="json").json()
    assert held["status"] == "planned"
    call = Call.objects.get(call_id="call-1")
    with django_assert_num_queries(3):
        response = ledger_api._answer(request_for(running_task.task_id), call)
    assert response.status_code == 200


@pytest.mark.django_db
def test_an_operation_is_read_with_its_attempts_and_call_ids_in_one_more_statement(
        api, running_task, django_assert_num_queries):
    [proposed] = propose(api, running_task, 1)
    ledger_services.operation_dispatch(operation_id=proposed["operation_id"], worker="test-worker")
    # The agent, the operation with its tool, step and task, its attempts and call IDs.
    with django_assert_num_queries(3):
        response = api.get(f"/api/v1/operations/{proposed['operation_id']}")
    assert response.status_code == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_one_ring_reads_every_waiting_call_once_and_answers_only_the_polls_whose_call_moved(
        api, running_task, monkeypatch, reads):
    proposed = propose(api, running_task, 4)
    calls = {call.call_id: call for call in Call.objects.all()}
    monkeypatch.setattr(longpoll, "FALLBACK_POLL_SECONDS", 3600)

    def moved(operation_ids: list[str]) -> None:
        for operation_id in operation_ids:
            ledger_services.operation_dispatch(operation_id=operation_id, worker="test-worker")

    async def scenario():
        # A bell with no listener, rung by hand: exactly one ring.
        bell = longpoll.Doorbell(asyncio.get_running_loop())
        since = bell.rings
        polls = {call_id: asyncio.create_task(bell.watch(
                     call.pk, "authorized", 30, since=since, answer=partial(lambda c: call_detail(c)["status"], call)))
                 for call_id, call in calls.items()}
        await asyncio.sleep(0)  # every poll is watching
        await longpoll.db_hop(moved)([answer["operation_id"] for answer in proposed[:2]])
        bell._ring()
        woken = await asyncio.gather(polls["call-1"], polls["call-2"])
        still_waiting = [call_id for call_id, poll in polls.items() if not poll.done()]
        for poll in polls.values():
            poll.cancel()
        return woken, still_waiting, bell.reads

    woken, still_waiting, bell_reads = asyncio.run(scenario())

    # Answered with the status the shared read found; two polls woken at once build their
    # answers in hops of their own (in parallel).
    assert woken == [("dispatched", None), ("dispatched", None)]
    assert still_waiting == ["call-3", "call-4"]
    assert bell_reads == 1
    assert reads == [sorted(call.pk for call in calls.values())]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_the_one_poll_a_ring_wakes_is_answered_in_the_hop_that_read_its_status(api, running_task, monkeypatch):
    [proposed] = propose(api, running_task, 1)
    call = Call.objects.get(call_id="call-1")
    monkeypatch.setattr(longpoll, "FALLBACK_POLL_SECONDS", 3600)

    async def scenario():
        bell = longpoll.Doorbell(asyncio.get_running_loop())
        poll = asyncio.create_task(bell.watch(call.pk, "authorized", 30, since=bell.rings,
                                              answer=lambda: call_detail(call)["status"]))
        await asyncio.sleep(0)
        await longpoll.db_hop(ledger_services.operation_dispatch)(
            operation_id=proposed["operation_id"], worker="test-worker")
        bell._ring()
        return await poll, bell.reads

    assert asyncio.run(scenario()) == (("dispatched", "dispatched"), 1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_ring_heard_before_the_poll_watches_makes_it_look_at_once(api, running_task, monkeypatch):
    """The commit fell between the poll's read and its watch: the ring counted since then makes
    the watch read at once instead of waiting for a ring that already came."""
    [proposed] = propose(api, running_task, 1)
    call = Call.objects.get(call_id="call-1")
    monkeypatch.setattr(longpoll, "FALLBACK_POLL_SECONDS", 3600)

    async def scenario():
        bell = longpoll.Doorbell(asyncio.get_running_loop())
        since = bell.rings
        await longpoll.db_hop(ledger_services.operation_dispatch)(
            operation_id=proposed["operation_id"], worker="test-worker")
        bell._ring()  # nobody watches yet
        return await bell.watch(call.pk, "authorized", 30, since=since)

    assert asyncio.run(scenario()) == ("dispatched", None)


@pytest.mark.django_db
def test_a_poll_until_final_that_waits_reads_only_the_agent_and_the_call(api, running_task, django_assert_num_queries):
    propose(api, running_task, 1)
    with django_assert_num_queries(2):
        look = ledger_api._look(request_for(running_task.task_id), HEADER, "call-1", 10.0, "planned", None,
                                FINAL_STATUSES)
    assert (look.response, look.baseline) == (None, "planned")


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_one_ring_reads_once_for_polls_that_wait_for_any_change_and_for_final_ones(api, running_task, monkeypatch):
    """Polls with and without `until` share the ring's one read; a move to `dispatched` answers
    the ones that wait for any change and leaves the ones that wait for the call to be final."""
    proposed = propose(api, running_task, 2)
    calls = [Call.objects.get(call_id=f"call-{i}") for i in (1, 2)]
    monkeypatch.setattr(longpoll, "FALLBACK_POLL_SECONDS", 3600)

    async def scenario():
        bell = longpoll.Doorbell(asyncio.get_running_loop())
        since = bell.rings
        polls = [asyncio.create_task(bell.watch(call.pk, "authorized", 30, since=since, until=until))
                 for call in calls for until in (None, FINAL_STATUSES)]
        await asyncio.sleep(0)
        await longpoll.db_hop(lambda: [ledger_services.operation_dispatch(
            operation_id=answer["operation_id"], worker="test-worker") for answer in proposed])()
        bell._ring()
        woken = await asyncio.gather(polls[0], polls[2])
        still_waiting = [not poll.done() for poll in polls]
        for poll in polls:
            poll.cancel()
        return woken, still_waiting, bell.reads

    woken, still_waiting, reads = asyncio.run(scenario())
    assert woken == [("dispatched", None), ("dispatched", None)]
    assert still_waiting == [False, True, False, True]
    assert reads == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_ring_during_the_read_that_answered_a_poll_does_not_build_its_answer_again(api, running_task, monkeypatch):
    """The commit that makes a call final rings more than once (its events); a ring heard while
    the read that answered the poll runs makes one more read, which leaves the answered poll alone
    (before it leaves the bell, it is still watching)."""
    [proposed] = propose(api, running_task, 1)
    call = Call.objects.get(call_id="call-1")
    monkeypatch.setattr(longpoll, "FALLBACK_POLL_SECONDS", 3600)
    built = []

    def answer():
        built.append(call.pk)
        return call_detail(call)["status"]

    async def scenario():
        bell = longpoll.Doorbell(asyncio.get_running_loop())
        poll = asyncio.create_task(bell.watch(call.pk, "authorized", 30, since=bell.rings, answer=answer))
        await asyncio.sleep(0)
        await longpoll.db_hop(ledger_services.operation_dispatch)(
            operation_id=proposed["operation_id"], worker="test-worker")
        bell._ring()
        await asyncio.sleep(0)  # the read is under way
        bell._ring()
        result = await poll
        await bell.checker
        return result

    assert asyncio.run(scenario()) == ("dispatched", "dispatched")
    assert built == [call.pk]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("servers_loop", [True, False])
def test_the_servers_listener_stays_after_the_last_poll_others_stop_with_it(monkeypatch, servers_loop):
    # A poll after a quiet spell must not subscribe again: on Redis publish/subscribe a fresh
    # subscription can wait for a receiver that went idle. The server's loop lives as long as the
    # process; a loop of `async_to_sync` or a test does not, and its bell stops with its last poll.
    from console import doorbell

    subscriptions = []

    async def scenario():
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(doorbell, "SERVER_LOOP", loop if servers_loop else None)
        bell = longpoll.Doorbell.for_loop()
        subscribe = bell._subscribe

        async def counted():
            subscriptions.append(1)
            await subscribe()

        monkeypatch.setattr(bell, "_subscribe", counted)
        for _ in range(2):
            async with bell.waiting():
                pass
        return bell.listener is not None and not bell.listener.done(), longpoll.Doorbell.for_loop() is bell

    if servers_loop:
        assert asyncio.run(scenario()) == (True, True)
        assert subscriptions == [1]
    else:
        assert asyncio.run(scenario()) == (False, False)
        assert subscriptions == [1, 1]


def confirm(operation_id: str) -> None:
    _, attempt = ledger_services.operation_dispatch(operation_id=operation_id, worker="test-worker")
    ledger_services.operation_record_outcome(operation_id=operation_id, attempt_number=attempt.number,
                                             fencing_token=attempt.fencing_token, fact="known_success",
                                             receipt={"id": "re_1"})


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_ring_that_says_what_moved_reads_only_for_the_polls_it_may_answer(api, running_task, monkeypatch, reads):
    """A ring says what its commit moved: a poll until final reads nothing at `dispatched`, nor at
    another record's move; it reads, alone, when its operation became final. A ring that does not
    say (a datagram, a tail poll) reads for every poll, as before."""
    proposed = propose(api, running_task, 2)
    calls = [Call.objects.get(call_id=f"call-{n}") for n in (1, 2)]
    monkeypatch.setattr(longpoll, "FALLBACK_POLL_SECONDS", 3600)
    first, second = (answer["operation_id"] for answer in proposed)

    async def scenario():
        bell = longpoll.Doorbell(asyncio.get_running_loop())
        polls = [asyncio.create_task(bell.watch(call.pk, "authorized", 30, since=bell.rings, until=FINAL_STATUSES,
                                                operation_id=call.operation_id)) for call in calls]
        await asyncio.sleep(0)
        await longpoll.db_hop(ledger_services.operation_dispatch)(operation_id=first, worker="test-worker")
        bell._ring([("operation", first, "dispatched")])
        bell._ring([("task", running_task.task_id, "running"), ("operation", "op_other", "confirmed")])
        await longpoll.db_hop(confirm)(second)
        bell._ring([("operation", second, "dispatched"), ("operation", second, "confirmed")])
        answered = await polls[1]
        assert not polls[0].done()
        bell._ring(None)
        for _ in range(100):
            if len(reads) == 2:
                break
            await asyncio.sleep(0.01)
        polls[0].cancel()
        return answered

    assert asyncio.run(scenario()) == ("confirmed", None)
    assert reads == [[calls[1].pk], [calls[0].pk]]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_rings_heard_before_the_poll_watches_make_it_read_only_if_they_may_answer_it(api, running_task, monkeypatch):
    [proposed] = propose(api, running_task, 1)
    call = Call.objects.get(call_id="call-1")
    monkeypatch.setattr(longpoll, "FALLBACK_POLL_SECONDS", 3600)

    async def scenario():
        bell = longpoll.Doorbell(asyncio.get_running_loop())
        since = bell.rings
        bell._ring([("operation", "op_other", "confirmed")])  # nobody watches yet; not this call
        quiet = await bell.watch(call.pk, "authorized", 0.2, since=since, until=FINAL_STATUSES,
                                 operation_id=call.operation_id)
        reads_then = bell.reads
        since = bell.rings
        await longpoll.db_hop(confirm)(proposed["operation_id"])
        bell._ring([("operation", proposed["operation_id"], "confirmed")])  # before the watch: this call
        moved = await bell.watch(call.pk, "authorized", 30, since=since, until=FINAL_STATUSES,
                                 operation_id=call.operation_id)
        return quiet, reads_then, moved

    assert asyncio.run(scenario()) == (None, 0, ("confirmed", None))
