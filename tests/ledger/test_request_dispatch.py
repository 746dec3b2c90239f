"""Dispatch in the request: a call the gate runs at once, proposed by an agent that waits for its outcome
(`?wait=`), is dispatched by the request that proposed it, in the server's own thread, right after
the proposal commits with its claim: no broker hop, no worker pickup, no ring back to the server.
The protocol is the worker's (`ledger.dispatcher`: the same claim, fencing token and receipt), so
a server that dies mid-dispatch is recovered as a lost worker is (tests/chaos, `kill-server-*`).

Against the real payments sandbox, which counts its effects. The proposals go through the ASGI
view (`propose_call`), as an agent's do."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError, connection, connections
from django.db.backends.utils import CursorWrapper
from django.test import AsyncClient

from approvals.models import Tool
from approvals.tools import tool_save
from console.models import AgentPrincipal, Event
from ledger import dispatcher, request_dispatch, seams, services
from ledger.dispatcher import run_dispatch
from ledger.models import Attempt, Call, Operation
from tests.conftest import AGENT_TOKEN
from tests.fixtures.api import call_body, refund
from tests.fixtures.dispatch import AtTheClaim, effects_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60),
              pytest.mark.usefixtures("sandbox_settings", "tools")]

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}


def post(path: str, body: dict):
    async def run():
        try:
            return await AsyncClient().post(path, json.dumps(body), content_type="application/json", headers=AUTH)
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(run())


def propose(running_task, *, wait: float | None = 20, **changes):
    query = "" if wait is None else f"?wait={wait}"
    return post(f"/api/v1/tasks/{running_task.task_id}/calls{query}", call_body(running_task, **changes))


def test_a_waiting_proposal_is_dispatched_by_its_own_request(running_task, enqueued, payments_url, unique):
    response = propose(running_task, arguments=refund(order_id=unique("ord")))

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["status"], body["final"]) == ("confirmed", True)
    assert body["result"]["object"] == "refund" and body["result"]["id"].startswith("re_")
    operation = Operation.objects.get()
    (attempt,) = Attempt.objects.all()
    # The server's thread ran it: nothing went through the broker.
    assert enqueued.dispatches == []
    assert attempt.worker.startswith("server:")
    assert len(effects_of(payments_url, operation)) == 1


def test_the_answer_is_what_the_receipt_wrote_with_no_read_after_it(
        running_task, enqueued, payments_url, unique, monkeypatch):
    from ledger import api

    reads = []
    read = api._as_now
    monkeypatch.setattr(api, "_as_now", lambda proposal: reads.append(proposal) or read(proposal))
    response = propose(running_task, arguments=refund(order_id=unique("ord")))

    body = response.json()
    assert (body["status"], body["final"]) == ("confirmed", True)
    assert reads == []  # the receipt's statement was the request's last
    operation = Operation.objects.get()
    assert (body["status"], body["result"]) == (operation.status, operation.result)


def test_a_repeat_of_the_proposal_answers_from_the_ledger_and_sends_nothing_again(
        running_task, enqueued, payments_url, unique):
    arguments = refund(order_id=unique("ord"))
    first = propose(running_task, arguments=arguments)
    again = propose(running_task, arguments=arguments)

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert Attempt.objects.count() == 1 and enqueued.dispatches == []
    assert len(effects_of(payments_url, Operation.objects.get())) == 1


def test_without_a_wait_the_dispatch_goes_through_the_broker(running_task, enqueued):
    response = propose(running_task, wait=None)

    assert response.status_code == 201 and response.json()["status"] == "authorized"
    assert enqueued.dispatched_ids() == [Operation.objects.get().operation_id]
    assert not Attempt.objects.exists()


def test_a_tool_on_the_slow_queue_is_left_to_its_workers(running_task, enqueued):
    """Slow tools have workers of their own: a server thread does not wait on them."""
    Tool.objects.filter(name="payments.refund").update(queue=Tool.Queue.SLOW)

    response = propose(running_task, wait=0.2)

    assert response.status_code == 201 and response.json()["status"] == "authorized"
    assert enqueued.dispatches == [(Operation.objects.get().operation_id, {"queue": "slow", "countdown": None})]
    assert not Attempt.objects.exists()


def test_with_dispatch_in_request_off_every_dispatch_goes_through_the_broker(running_task, enqueued, settings):
    settings.DISPATCH_IN_REQUEST = False

    response = propose(running_task, wait=0.2)

    assert response.status_code == 201 and response.json()["status"] == "authorized"
    assert enqueued.dispatched_ids() == [Operation.objects.get().operation_id]
    assert not Attempt.objects.exists()


def test_a_claim_the_dispatcher_defers_is_left_to_the_broker_and_the_wait_goes_on(running_task, enqueued, settings):
    settings.TENANT_MAX_IN_FLIGHT = 0  # every claim is deferred: the tenant is at its limit

    response = propose(running_task, wait=0.3)

    assert response.status_code == 201 and response.json()["status"] == "authorized"
    ((operation_id, options),) = enqueued.dispatches
    assert operation_id == Operation.objects.get().operation_id and options["countdown"] > 0
    assert not Attempt.objects.exists()


def test_a_call_whose_order_has_another_refund_in_flight_goes_in_authorized_and_waits_its_turn(
        running_task, enqueued, payments_url, unique):
    """The claim's load guards run before the proposal's write: one that defers the call leaves
    it `authorized`, with no attempt, for the broker to dispatch once the order is free."""
    order_id = unique("ord")
    first = propose(running_task, wait=None, arguments=refund(order_id=order_id, amount=10))
    services.operation_dispatch(operation_id=first.json()["operation_id"], worker="elsewhere")
    enqueued.dispatches.clear()

    second = propose(running_task, wait=0.3, call_id="call-2", step_id="step-2",
                     arguments=refund(order_id=order_id, amount=15))

    assert (second.status_code, second.json()["status"]) == (201, "authorized"), second.content
    operation = Operation.objects.get(pk=second.json()["operation_id"])
    assert (operation.status, operation.attempt_count) == ("authorized", 0)
    assert not operation.attempts.exists()
    ((operation_id, options),) = enqueued.dispatches
    assert operation_id == operation.operation_id and options["countdown"] > 0
    assert effects_of(payments_url, operation) == []


def test_the_proposal_and_its_claim_commit_together(running_task, enqueued, payments_url, unique, monkeypatch):
    """One commit before the provider is called (the proposal with its claim), not two: no
    moment where the call is `authorized` with nothing on its way."""
    commits, at_the_provider = [], []
    real_commit = type(connections["default"])._commit
    monkeypatch.setattr(type(connections["default"]), "_commit",
                        lambda self: commits.append(self.alias) or real_commit(self))
    real_adapter = dispatcher.adapter_for

    def adapter_for(tool):
        adapter = real_adapter(tool)
        execute = adapter.execute
        adapter.execute = lambda *args, **kwargs: at_the_provider.append(len(commits)) or execute(*args, **kwargs)
        return adapter

    monkeypatch.setattr(dispatcher, "adapter_for", adapter_for)

    response = propose(running_task, arguments=refund(order_id=unique("ord")))

    assert response.json()["status"] == "confirmed"
    assert at_the_provider == [1]
    moves = list(Event.objects.filter(entity=Operation.EVENT_ENTITY).order_by("id").values_list("to_status", flat=True))
    assert moves == ["planned", "authorized", "dispatched", "confirmed"]


def test_the_call_is_inserted_dispatched_with_its_attempt_and_never_updated_before_the_provider_call(
        running_task, enqueued, payments_url, unique, monkeypatch):
    """The gate decided in this transaction, on the configuration it holds: the claim has only
    its load guards left to check, so the proposal's one write inserts the operation already
    `dispatched`, with its first attempt and its three moves. No statement moves it again
    before the provider is called."""
    table = Operation._meta.db_table
    before_the_provider, statements = [], []
    real_execute = CursorWrapper._execute  # every thread's connection: the request runs in its own

    def execute(self, sql, *args, **kwargs):
        statements.append(sql)
        return real_execute(self, sql, *args, **kwargs)

    monkeypatch.setattr(CursorWrapper, "_execute", execute)
    real_adapter = dispatcher.adapter_for

    def adapter_for(tool):
        adapter = real_adapter(tool)
        execute = adapter.execute
        adapter.execute = (lambda *args, **kwargs: before_the_provider.extend(statements)
                           or execute(*args, **kwargs))
        return adapter

    monkeypatch.setattr(dispatcher, "adapter_for", adapter_for)
    response = propose(running_task, arguments=refund(order_id=unique("ord")))

    assert response.json()["status"] == "confirmed"
    assert [sql for sql in before_the_provider if f'UPDATE "{table}"' in sql] == []
    (attempt,) = Attempt.objects.all()
    assert (attempt.number, attempt.fencing_token) == (1, 1) and attempt.worker == request_dispatch.server_name()
    moves = list(Event.objects.filter(entity=Operation.EVENT_ENTITY).order_by("id")
                 .values_list("from_status", "to_status", "actor"))
    assert moves[0][1] == "planned"
    assert moves[1:3] == [("planned", "authorized", "system:gate"),
                          ("authorized", "dispatched", f"worker:{request_dispatch.server_name()}")]


def test_the_claim_reads_nothing_the_proposals_statements_did_not(running_task, enqueued, payments_url, unique,
                                                                    monkeypatch):
    """The proposal's task statement reads the agent, the circuit breaker, the tenant's calls in
    flight and the configuration for the claim (`task_for_claim_sql`): the claim in the same
    transaction sends no statement of its own before its write."""
    claim_reads = []
    monkeypatch.setattr(dispatcher, "_lock_for_claim", lambda operation_id: claim_reads.append(operation_id))

    response = propose(running_task, arguments=refund(order_id=unique("ord")))

    assert response.json()["status"] == "confirmed"
    assert claim_reads == []


def test_an_agent_deactivated_after_its_request_was_authenticated_is_refused_with_nothing_written(
        running_task, enqueued, payments_url, unique, monkeypatch):
    """The proposal checks the agent's row as it is in its own transaction (share-locked until
    the commit, as the claim locks it), not the one the request's authentication loaded."""
    if connection.vendor != "postgresql":
        pytest.skip("a second writer while the request's transaction is open (SQLite takes one at a time)")
    from ledger import proposals

    real = proposals._lock_task

    def deactivated_meanwhile(**kwargs):
        def deactivate():
            try:
                AgentPrincipal.objects.filter(pk=kwargs["principal"].pk).update(is_active=False)
            finally:
                connection.close()

        other = threading.Thread(target=deactivate)
        other.start()
        other.join(timeout=30)
        return real(**kwargs)

    monkeypatch.setattr(proposals, "_lock_task", deactivated_meanwhile)

    response = propose(running_task, arguments=refund(order_id=unique("ord")))

    assert response.status_code == 403, response.content
    assert not Operation.objects.exists() and enqueued.dispatches == []


@pytest.mark.parametrize("trial", range(4))
def test_a_tool_disabled_while_a_waiting_proposal_runs_is_never_sent_unless_its_claim_committed_first(
        running_task, enqueued, payments_url, unique, trial):
    """The proposal holds the configuration still from its task statement to its commit (the
    claim's own rule): a change committed before is seen (refused, nothing written), one after
    waits for the commit (the call was claimed on the authority it had: sent once, recorded).
    Real threads on PostgreSQL, released together."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers (SQLite takes one at a time)")
    start = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def disable():
        try:
            start.wait(timeout=30)
            Tool.objects.filter(name="payments.refund").update(enabled=False)
        finally:
            connection.close()

    def agent():
        try:
            start.wait(timeout=30)
            outcomes["response"] = propose(running_task, arguments=refund(order_id=unique("ord")))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=disable), threading.Thread(target=agent)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    response = outcomes["response"]
    if response.status_code == 403:
        assert not Operation.objects.exists() and not Attempt.objects.exists()
    else:
        assert (response.status_code, response.json()["status"]) == (201, "confirmed"), response.content
        assert len(effects_of(payments_url, Operation.objects.get())) == 1
    assert enqueued.dispatches == []


def _meanwhile_at_the_claim(monkeypatch, change, *, passes: int = 1) -> list[bool]:
    """While the proposal's request has read its task and judged its call (at its claim, before
    its write), `change` runs and commits on a connection of its own, on the first `passes`
    passes of the proposal. Returns, per change, whether it finished without waiting for the
    proposal."""
    real = request_dispatch.claim
    finished: list[bool] = []

    def meanwhile(*args, **kwargs):
        if len(finished) < passes:
            def write() -> None:
                try:
                    change()
                finally:
                    connection.close()

            other = threading.Thread(target=write)
            other.start()
            other.join(timeout=10)
            finished.append(not other.is_alive())
        return real(*args, **kwargs)

    monkeypatch.setattr(request_dispatch, "claim", meanwhile)
    return finished


@pytest.mark.parametrize("change", ["tool disabled", "agent deactivated"])
def test_a_change_committed_while_a_dispatching_proposal_judges_its_call_does_not_wait_and_is_seen(
        agent, running_task, enqueued, payments_url, unique, monkeypatch, change):
    """The proposal share-locks the agent's row and the configuration's generation with its
    write, held to its commit, not from its task statement on: a change that commits while its
    gate runs does not wait for it (every dispatching proposal of an agent, and of the whole
    system for the configuration, held those rows for the whole of its gate before). The write
    finds either row moved since it was read: nothing is written, the proposal reads again and
    is refused."""
    if connection.vendor != "postgresql":
        pytest.skip("a second writer while the request's transaction is open (SQLite takes one at a time)")
    finished = _meanwhile_at_the_claim(monkeypatch, {
        "tool disabled": lambda: Tool.objects.filter(name="payments.refund").update(enabled=False),
        "agent deactivated": lambda: AgentPrincipal.objects.filter(pk=agent.pk).update(is_active=False),
    }[change])

    response = propose(running_task, arguments=refund(order_id=unique("ord")))

    assert finished == [True]
    assert response.status_code == 403, response.content
    assert not Operation.objects.exists() and not Attempt.objects.exists() and enqueued.dispatches == []


def test_a_dispatching_proposal_whose_authority_keeps_moving_gives_up_with_nothing_written(
        running_task, enqueued, payments_url, unique, monkeypatch):
    """A configuration that changes at every pass (each change leaves the call allowed) makes
    the proposal read again a few times, then answer 409 with nothing written: the agent
    proposes the call again."""
    if connection.vendor != "postgresql":
        pytest.skip("a second writer while the request's transaction is open (SQLite takes one at a time)")

    def touch() -> None:
        tool = Tool.objects.get(name="payments.refund")
        tool.description += "."
        tool_save(tool=tool)

    finished = _meanwhile_at_the_claim(monkeypatch, touch, passes=100)

    response = propose(running_task, arguments=refund(order_id=unique("ord")))

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "conflict"
    assert finished == [True] * len(finished) and len(finished) > 1
    assert not Operation.objects.exists() and not Call.objects.exists() and enqueued.dispatches == []
    monkeypatch.undo()  # the configuration stays still now
    settled = propose(running_task, arguments=refund(order_id=unique("ord")))
    assert (settled.status_code, settled.json()["status"]) == (201, "confirmed"), settled.content


def test_a_configuration_change_waits_for_the_dispatching_proposal_that_holds_it(
        running_task, enqueued, payments_url, unique):
    """A tool disabled while the proposal's claim is about to commit waits for that commit: the
    call was claimed on the authority it had, and is sent once and recorded."""
    if connection.vendor != "postgresql":
        pytest.skip("waits on PostgreSQL's row lock (SQLite takes one writer at a time)")
    with AtTheClaim(lambda: Tool.objects.filter(name="payments.refund").update(enabled=False),
                    what="the configuration change waiting for the proposal") as at_the_claim:
        response = propose(running_task, arguments=refund(order_id=unique("ord")))

    assert at_the_claim.errors == []
    assert (response.status_code, response.json()["status"]) == (201, "confirmed"), response.content
    assert len(effects_of(payments_url, Operation.objects.get())) == 1
    assert not Tool.objects.get(name="payments.refund").enabled


def test_a_tool_saved_while_its_dispatching_proposal_commits_fails_neither(
        running_task, enqueued, payments_url, unique):
    """The tool's save changes the configuration generation, so it waits for the proposal that
    holds it; the proposal's commit checks its operation's foreign key to the tool (KEY SHARE on
    the tool's row). The save must not hold a lock that check waits for (FOR UPDATE did: each
    waited for the other, and PostgreSQL aborted one as a deadlock)."""
    if connection.vendor != "postgresql":
        pytest.skip("waits on PostgreSQL's row lock (SQLite takes one writer at a time)")

    def save() -> None:
        tool = Tool.objects.get(name="payments.refund")
        tool.description = "Refunds, edited while a call of it was proposed."
        tool_save(tool=tool)

    with AtTheClaim(save, what="the tool's save waiting for the proposal") as at_the_claim:
        response = propose(running_task, arguments=refund(order_id=unique("ord")))

    assert at_the_claim.errors == []
    assert (response.status_code, response.json()["status"]) == (201, "confirmed"), response.content
    assert len(effects_of(payments_url, Operation.objects.get())) == 1
    assert Tool.objects.get(name="payments.refund").description.endswith("proposed.")


def test_a_claim_that_fails_takes_its_proposal_with_it_and_the_agent_proposes_again(
        running_task, enqueued, payments_url, unique):
    """Nothing committed, nothing published, nothing sent: the agent is told to try again (503,
    the API's error shape), and its second proposal runs as the first would have."""
    def database_gone(name: str, operation_id: str) -> None:
        if name == "before_dispatch_commit":
            raise OperationalError("the connection was lost")

    arguments = refund(order_id=unique("ord"))
    previous = seams.install(database_gone)
    try:
        refused = propose(running_task, arguments=arguments)
    finally:
        seams.install(previous)

    assert refused.status_code == 503, refused.content
    assert refused.json()["error"]["code"] == "unavailable" and refused.headers["Retry-After"]
    assert not Operation.objects.exists() and not Call.objects.exists() and enqueued.dispatches == []
    again = propose(running_task, arguments=arguments)
    assert (again.status_code, again.json()["status"]) == (201, "confirmed")
    assert len(effects_of(payments_url, Operation.objects.get())) == 1


def test_the_request_holds_no_database_connection_during_the_provider_call(
        running_task, enqueued, monkeypatch, unique):
    """A server's connections are a pool of a few; a provider may take its whole timeout."""
    if connection.settings_dict.get("CONN_MAX_AGE"):
        pytest.skip("connections kept per thread (embedded SQLite), not a pool's")
    held = []
    real = dispatcher.adapter_for

    def adapter_for(tool):
        adapter = real(tool)
        execute = adapter.execute

        def watched(*args, **kwargs):
            held.append(connection.connection is not None)
            return execute(*args, **kwargs)

        adapter.execute = watched
        return adapter

    monkeypatch.setattr(dispatcher, "adapter_for", adapter_for)
    response = propose(running_task, arguments=refund(order_id=unique("ord")))

    assert response.json()["status"] == "confirmed"
    assert held == [False]


def test_when_the_servers_dispatch_slots_are_taken_the_call_goes_through_the_broker(running_task, enqueued, settings):
    """A server runs at most DISPATCH_IN_REQUEST_SLOTS provider calls at once (a hanging provider
    must not pile up threads in it): past that, workers take them, as before."""
    settings.DISPATCH_IN_REQUEST_SLOTS = 1
    with request_dispatch.slot() as taken:  # another agent's call holds the only slot
        assert taken
        response = propose(running_task, wait=0.2)

    assert response.status_code == 201 and response.json()["status"] == "authorized"
    assert enqueued.dispatched_ids() == [Operation.objects.get().operation_id]
    assert not Attempt.objects.exists()


def test_a_slot_is_given_back_whatever_the_proposal_answered(running_task, enqueued, settings, unique):
    settings.DISPATCH_IN_REQUEST_SLOTS = 1
    refused = propose(running_task, tool="no.such.tool")
    ran = propose(running_task, call_id="call-2", step_id="step-2", arguments=refund(order_id=unique("ord")))

    assert refused.status_code == 400
    assert ran.json()["status"] == "confirmed" and enqueued.dispatches == []


def test_a_worker_message_that_races_the_requests_claim_finds_nothing_to_do(
        running_task, enqueued, payments_url, unique):
    """A worker's dispatch of the same operation (a message the sweeper published, say) arrives
    while the request's claim is about to commit: the operation is not committed yet, so the
    worker finds nothing; once it is, a late message finds it moved on and leaves it. One
    attempt, one effect. Real threads on PostgreSQL."""
    if connection.vendor != "postgresql":
        pytest.skip("a second writer while the request's transaction is open (SQLite takes one at a time)")
    at_seam, release = threading.Event(), threading.Event()
    operations: list[str] = []

    def hold_the_request_before_its_commit(name: str, operation_id: str) -> None:
        if name == "before_dispatch_commit" and not operations:
            operations.append(operation_id)
            at_seam.set()
            assert release.wait(timeout=30)

    previous = seams.install(hold_the_request_before_its_commit)
    worker: dict = {}

    def racing_worker():
        try:
            assert at_seam.wait(timeout=30)
            worker["before"] = run_dispatch(operations[0], worker="racing-worker")
        finally:
            connection.close()

    thread = threading.Thread(target=racing_worker)
    thread.start()
    try:
        # The body read here: the agent's thread touches no database connection of its own.
        path = f"/api/v1/tasks/{running_task.task_id}/calls?wait=20"
        body = call_body(running_task, arguments=refund(order_id=unique("ord")))
        agent = threading.Thread(target=lambda: worker.update(response=post(path, body)))
        agent.start()
        thread.join(timeout=30)
        release.set()
        agent.join(timeout=30)
    finally:
        release.set()
        seams.install(previous)

    assert worker["response"].json()["status"] == "confirmed"
    assert worker["before"] == "missing"
    assert run_dispatch(operations[0], worker="late-worker") == "noop:confirmed"
    (attempt,) = Attempt.objects.all()
    assert attempt.worker.startswith("server:")
    assert len(effects_of(payments_url, Operation.objects.get())) == 1
