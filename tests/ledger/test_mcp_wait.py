"""How the MCP server waits for a tool call's answer (`ledger.mcp_server._wait`, used by every
tool call and by `countersign_wait`): it reads the call once and then waits on the doorbell for
the call to be final, not for each status on the way (`dispatched`), which cost a read of the
call, its detail and a new watch per status."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.db import connection

from console.lib.procs import wait_until
from ledger import longpoll, mcp_server
from ledger import services as ledger_services
from ledger.models import Fact, Operation
from tests.fixtures.api import call_body
from tests.ledger.test_api_call_get_until import rings_heard  # noqa: F401 - the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_a_call_that_runs_is_read_once_and_waited_for_until_it_is_final(api, agent, running_task, monkeypatch,
                                                                        rings_heard):  # noqa: F811
    proposed = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task),
                        format="json").json()
    operation_id = proposed["operation_id"]
    reads = []
    read_once = threading.Event()
    real_state = mcp_server._call_state

    def counted_state(*args):
        state = real_state(*args)
        reads.append(state[1])
        read_once.set()
        return state

    monkeypatch.setattr(mcp_server, "_call_state", counted_state)
    dispatch_heard = rings_heard

    def move_on():
        # Once the waiter read the call and watches it: dispatched; once the doorbell took that in
        # (read it, or knew from the ring that `dispatched` answers nothing): confirmed. (A ring
        # between the read and the watch would be heard by no watch: the waiter's `since` covers
        # that case, but then no ring with a watch ever comes, and `dispatch_heard` stays unset.)
        try:
            read_once.wait(20)
            wait_until(lambda: any(bell.watches for bell in list(longpoll.Doorbell._by_loop.values())),
                       timeout=20, what="the waiter's watch", interval=0.005)
            dispatch_heard.clear()
            _, attempt = ledger_services.operation_dispatch(operation_id=operation_id, worker="test-worker")
            dispatch_heard.wait(20)
            ledger_services.operation_record_outcome(
                operation_id=operation_id, attempt_number=attempt.number, fencing_token=attempt.fencing_token,
                fact=Fact.KNOWN_SUCCESS, receipt={"id": "re_1"})
        finally:
            connection.close()

    mover = threading.Thread(target=move_on)
    mover.start()
    asyncio.run(mcp_server._wait(agent, "call-1", running_task.task_id, 30))
    mover.join(timeout=30)

    assert dispatch_heard.is_set()
    assert Operation.objects.get(pk=operation_id).status == "confirmed"
    assert reads == ["authorized"]


def test_the_wait_ends_once_the_call_waits_for_a_person(api, agent, running_task):
    """dispatched → unknown → manual: not final, but only a person moves it on (perhaps hours
    later): the agent hears it then, not when its wait runs out."""
    operation_id = api.post(f"/api/v1/tasks/{running_task.task_id}/calls", call_body(running_task),
                            format="json").json()["operation_id"]
    _, attempt = ledger_services.operation_dispatch(operation_id=operation_id, worker="test-worker")
    ledger_services.operation_record_outcome(operation_id=operation_id, attempt_number=attempt.number,
                                             fencing_token=attempt.fencing_token, fact=Fact.UNKNOWN,
                                             error_class="timeout")

    def escalate():
        try:
            ledger_services.operation_escalate_manual(operation_id=operation_id, actor="system:reconciler",
                                                      reason="provider could not tell")
        finally:
            connection.close()

    async def wait_while_it_is_escalated():
        waiting = asyncio.create_task(mcp_server._wait(agent, "call-1", running_task.task_id, 30))
        await asyncio.sleep(0)  # whether it reads the call before the move or after, it must end
        began = asyncio.get_running_loop().time()
        await asyncio.to_thread(escalate)
        await waiting
        return asyncio.get_running_loop().time() - began

    assert asyncio.run(wait_while_it_is_escalated()) < 15  # not the 30 s asked for
