"""The Python client against a real server (uvicorn, a Celery worker, the sandbox providers):
a call the gate runs returns its result; a held call returns once a reviewer approves, raises
Rejected when one rejects; a refusal raises Refused; a restart under the same idempotency key
continues the same task and gets the same operation, with one effect at the provider."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from countersign import (
    AsyncClient,
    Client,
    CountersignUnavailable,
    LeaseLost,
    Refused,
    Rejected,
    StaleFencingToken,
    TaskFinished,
    criteria,
    link_span,
)

from console.lib.procs import wait_until
from ledger.models import Operation
from runs.models import Lease, Task
from sandbox import client as sandbox
from tests.asgi import free_port
from tests.clients.conftest import decide, judged, logged_in, pending_approval
from tests.conftest import AGENT_TOKEN

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

CONTRACT = {"task_type": "refund", "goal": "Refund the broken kettle", "inputs": {"order_id": "ord-42"}}


def refund(order_id: str, amount: float) -> dict:
    return {"order_id": order_id, "amount": amount, "currency": "EUR", "reason": "broken"}


def effects(stack, operation_id: str) -> list[dict]:
    return sandbox.effects(stack.payments.base_url, key=Operation.objects.get(pk=operation_id).idempotency_key)


@pytest.fixture
def client(stack, agent):
    with Client(stack.url, AGENT_TOKEN) as client:
        yield client


def test_a_call_the_gate_runs_returns_its_result(stack, client):
    task = client.start_task(key="thread-auto", **CONTRACT)
    assert task.status == "running" and task.fencing_token is not None

    result = task.call("payments.refund", refund("ord-1", 30), step_id="refund-ord-1")

    [operation] = Operation.objects.filter(task_id=task.task_id)
    assert operation.status == "confirmed"
    assert result == operation.result and result is not None
    assert len(effects(stack, operation.operation_id)) == 1
    task.close()


def test_a_held_call_returns_after_a_reviewer_approves(stack, client, reviewer):
    task = client.start_task(key="thread-approve", **CONTRACT)
    assert task.needs_approval("payments.refund", refund("ord-2", 80))
    assert not task.needs_approval("payments.refund", refund("ord-2", 30))

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(task.call, "payments.refund", refund("ord-2", 80), step_id="refund-ord-2")
        approval = pending_approval(task.call_id("payments.refund", "refund-ord-2"))
        assert not waiting.done()
        decide(stack, approval.approval_id, "approve", reason="fine")
        result = waiting.result(timeout=120)

    operation = Operation.objects.get(pk=approval.operation_id)
    assert operation.status == "confirmed" and result == operation.result
    assert len(effects(stack, operation.operation_id)) == 1
    task.finish(evidence={"refunded": operation.operation_id})
    assert judged(task.task_id).status == "succeeded"


def test_a_rejection_raises_rejected_with_the_reviewers_reason(stack, client, reviewer):
    task = client.start_task(key="thread-reject", **CONTRACT)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(task.call, "payments.refund", refund("ord-3", 80), step_id="refund-ord-3")
        approval = pending_approval(task.call_id("payments.refund", "refund-ord-3"))
        decide(stack, approval.approval_id, "reject", reason="not ours")
        with pytest.raises(Rejected) as rejected:
            waiting.result(timeout=120)

    assert rejected.value.reason == "not ours"
    assert rejected.value.by == "user:reviewer"
    assert effects(stack, approval.operation_id) == []
    task.close()


def test_a_refusal_raises_refused_with_the_gates_reasons(stack, client):
    task = client.start_task(key="thread-refuse", **CONTRACT, constraints={"max_amount": 20})
    with pytest.raises(Refused) as refused:
        task.call("payments.refund", refund("ord-4", 30), step_id="refund-ord-4")
    assert refused.value.reasons
    assert not Operation.objects.filter(task_id=task.task_id).exists()
    task.close()


def test_a_restart_with_the_same_key_continues_the_task_and_gets_the_same_operation(stack, client):
    first = client.start_task(key="thread-restart", **CONTRACT)
    before = first.call_answer("payments.refund", refund("ord-5", 30), step_id="refund-ord-5")
    first.close()

    with Client(stack.url, AGENT_TOKEN) as restarted:
        again = restarted.start_task(key="thread-restart", **CONTRACT)
        after = again.call_answer("payments.refund", refund("ord-5", 30), step_id="refund-ord-5")
        again.close()

    assert again.task_id == first.task_id
    assert again.fencing_token > first.fencing_token  # the old process can no longer commit
    assert after["operation_id"] == before["operation_id"] and after["status"] == "confirmed"
    assert Operation.objects.filter(task_id=first.task_id).count() == 1
    assert len(effects(stack, after["operation_id"])) == 1


def test_a_repeated_proposal_of_a_call_that_ran_carries_its_result(stack, client):
    task = client.start_task(key="thread-repeat", **CONTRACT)
    result = task.call("payments.refund", refund("ord-8", 30), step_id="refund-ord-8")

    again = task.propose("payments.refund", refund("ord-8", 30), step_id="refund-ord-8")
    assert again["status"] == "confirmed" and again["final"]
    assert again["result"] == result and result is not None
    task.close()


def test_a_restart_after_finish_learns_that_its_task_is_finished(stack, client):
    task = client.start_task(key="thread-finished", **CONTRACT)
    task.call("payments.refund", refund("ord-9", 30), step_id="refund-ord-9")
    # Waits for the verdict: a criterion not settled yet would send the task back to `running`
    # (which takes a lease again), and that is not what this test is about.
    assert task.finish(evidence={"refunded": "ord-9"}, wait=60)["status"] == "succeeded"

    with Client(stack.url, AGENT_TOKEN) as restarted:
        with pytest.raises(TaskFinished) as finished:
            restarted.start_task(key="thread-finished", **CONTRACT)
        assert finished.value.task["task_id"] == task.task_id
        assert finished.value.task["status"] == "succeeded"
        assert restarted.task_by_key("thread-finished")["task_id"] == task.task_id
        assert restarted.task_by_key("thread-never-started") is None


def test_tools_lists_what_the_agent_may_call_with_its_schema(client):
    tools = {tool["name"]: tool for tool in client.tools()}
    assert tools["payments.refund"]["input_schema"]["required"] == ["order_id", "amount", "currency", "reason"]


def test_the_async_client_runs_a_call(stack, agent):
    async def scenario() -> tuple[str, object]:
        async with AsyncClient(stack.url, AGENT_TOKEN) as client:
            task = await client.start_task(key="thread-async", **CONTRACT)
            result = await task.call("payments.refund", refund("ord-6", 30), step_id="refund-ord-6")
            await task.finish(evidence={"result": result})
            return task.task_id, result

    task_id, result = asyncio.run(scenario())
    [operation] = Operation.objects.filter(task_id=task_id)
    assert operation.status == "confirmed" and result == operation.result
    assert judged(task_id).status == "succeeded"


def test_an_unreachable_server_raises_countersign_unavailable(db):
    with Client(f"http://127.0.0.1:{free_port()}", AGENT_TOKEN, retries=2) as client:
        with pytest.raises(CountersignUnavailable):
            client.start_task(key="thread-offline", **CONTRACT)


def test_link_span_sets_the_attributes_the_span_ingest_reads():
    from opentelemetry.sdk.trace import TracerProvider

    with TracerProvider().get_tracer("agent").start_as_current_span("tool") as span:
        link_span(task_id="t-1", step_id="refund", call_id="c/1", operation_id="op-1")
    assert span.attributes["countersign.task_id"] == "t-1"
    assert span.attributes["countersign.step_id"] == "refund"
    assert span.attributes["gen_ai.tool.call.id"] == "c/1"
    assert span.attributes["countersign.call_id"] == "c/1"
    assert span.attributes["countersign.operation_id"] == "op-1"


def test_the_lease_is_renewed_in_the_background_while_the_task_is_open(client):
    task = client.start_task(key="thread-lease", **CONTRACT, ttl_seconds=3)
    granted = Lease.objects.get(task_id=task.task_id).expires_at

    wait_until(lambda: Lease.objects.get(task_id=task.task_id).expires_at > granted, timeout=30,
               what="a renewal of the lease")
    lease = Lease.objects.get(task_id=task.task_id)
    assert lease.owner == "thread-lease" and lease.fencing_token == task.fencing_token
    task.close()
    assert not task._renewer.is_alive()


def test_a_process_replaced_by_its_restart_gets_lease_lost(stack, client):
    replaced = client.start_task(key="thread-replaced", **CONTRACT, renew=False)
    with Client(stack.url, AGENT_TOKEN) as restarted:
        successor = restarted.start_task(key="thread-replaced", **CONTRACT, renew=False)

        with pytest.raises(StaleFencingToken) as stale:
            replaced.call("payments.refund", refund("ord-7", 30), step_id="refund-ord-7")
        assert stale.value.current == successor.fencing_token and isinstance(stale.value, LeaseLost)
        with pytest.raises(StaleFencingToken):
            replaced.fail("gave up")
        successor.fail("the test is over")

    assert not Operation.objects.filter(task_id=replaced.task_id).exists()
    assert Task.objects.get(pk=replaced.task_id).status == "failed"


def review(stack, task_id: str, decision: str, evidence: str, *, username: str = "reviewer") -> None:
    """A reviewer logs in and decides the task's success review on its run page's form."""
    with logged_in(stack, username) as browser:
        answer = browser.post(f"/runs/{task_id}/review/{decision}/", data={"evidence": evidence})
        assert answer.status_code == 302, answer.text[:500]


def test_finish_waits_for_the_verdicts_and_a_reviewer_confirms_the_human_criterion(stack, client, reviewer):
    task = client.start_task(key="thread-criteria", **CONTRACT, success_criteria=[
        criteria.operation_confirmed("payments.refund", order_id="ord-c1"),
        criteria.result_matches("/status", tool="payments.refund", equals="succeeded"),
        criteria.human("The customer was told about the refund"),
    ])
    task.call("payments.refund", refund("ord-c1", 30), step_id="refund-ord-c1")

    ruled = task.finish(evidence={"refund": "done"}, wait=60)

    assert ruled["status"] == "waiting_review" and task.status == "waiting_review"
    assert [(v["criterion"]["kind"], v["result"]) for v in ruled["verdicts"]] == [
        ("operation_confirmed", "met"), ("result_matches", "met"), ("human", "review"),
        ("verifier", "met"),  # the refund task type's own check
    ]
    review(stack, task.task_id, "confirm", "Emailed the customer; reply in ticket CS-12.")
    assert Task.objects.get(pk=task.task_id).status == "succeeded"
    assert client.task(task.task_id)["verdicts"][2]["evidence"]["review"]["by"] == "user:reviewer"


def test_the_criteria_helpers_refuse_an_ambiguous_result_check():
    with pytest.raises(ValueError):
        criteria.result_matches("/status", tool="payments.refund", call_id="c1", equals=1)
    with pytest.raises(ValueError):
        criteria.result_matches("/status", tool="payments.refund")
    assert criteria.result_matches("", call_id="c1", equals=None) == {
        "kind": "result_matches", "path": "", "call_id": "c1", "equals": None}


class CountedRequests:
    """The agent's requests to the server, as (method, path, query)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict]] = []

    def __call__(self, request: httpx.Request) -> None:
        self.sent.append((request.method, request.url.path, dict(request.url.params)))

    def polls(self) -> list[dict]:
        return [query for method, path, query in self.sent if method == "GET" and path.startswith("/api/v1/calls/")]

    def proposals(self) -> list[dict]:
        return [query for method, path, query in self.sent if method == "POST" and path.endswith("/calls")]


def counted_client(stack) -> tuple[Client, CountedRequests]:
    counted = CountedRequests()
    http = httpx.Client(base_url=stack.url, timeout=35, headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
                        event_hooks={"request": [counted]})
    return Client(stack.url, AGENT_TOKEN, http=http), counted


def test_a_call_the_gate_runs_is_proposed_and_waited_for_in_one_request(stack, agent):
    """The proposal asks the server to wait (`?wait=`): it answers once the call is final, so
    the agent sends one request per call and no poll."""
    client, counted = counted_client(stack)
    with client:
        task = client.start_task(key="thread-one-poll", renew=False, **CONTRACT)
        results = [task.call("payments.refund", refund(f"ord-p{i}", 10), step_id=f"refund-p{i}") for i in range(3)]

    assert all(result is not None for result in results)
    assert Operation.objects.filter(task_id=task.task_id, status="confirmed").count() == 3
    assert [float(query["wait"]) > 0 for query in counted.proposals()] == [True] * 3
    assert counted.polls() == []


def test_a_call_held_for_a_person_is_waited_for_in_one_poll(stack, agent, reviewer):
    """The server answers a held call's proposal at once; the client then waits in one poll
    that the server answers once the call is final (`until=final`), not at `approved`."""
    client, counted = counted_client(stack)
    with client, ThreadPoolExecutor(1) as pool:
        task = client.start_task(key="thread-held-poll", renew=False, **CONTRACT)
        waiting = pool.submit(task.call, "payments.refund", refund("ord-h1", 80), step_id="refund-h1")
        approval = pending_approval(task.call_id("payments.refund", "refund-h1"))
        decide(stack, approval.approval_id, "approve", reason="fine")
        assert waiting.result(timeout=120) is not None

    assert [query.get("until") for query in counted.polls()] == ["final"]


def test_a_proposal_answered_final_is_not_polled(stack, agent):
    client, counted = counted_client(stack)
    with client:
        task = client.start_task(key="thread-no-poll", renew=False, constraints={"max_amount": 10}, **CONTRACT)
        with pytest.raises(Refused):
            task.call("payments.refund", refund("ord-r1", 30), step_id="refund-r1")

    assert counted.polls() == []
    assert [method for method, path, _ in counted.sent if path.endswith("/calls")] == ["POST"]


def test_the_async_client_proposes_and_waits_in_one_request_too(stack, agent):
    counted = CountedRequests()

    async def count(request: httpx.Request) -> None:
        counted(request)

    async def run():
        http = httpx.AsyncClient(base_url=stack.url, timeout=35, headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
                                 event_hooks={"request": [count]})
        async with AsyncClient(stack.url, AGENT_TOKEN, http=http) as client:
            task = await client.start_task(key="thread-one-poll-async", renew=False, **CONTRACT)
            return await task.call("payments.refund", refund("ord-pa", 10), step_id="refund-pa")

    assert asyncio.run(run()) is not None
    assert [float(query["wait"]) > 0 for query in counted.proposals()] == [True]
    assert counted.polls() == []
