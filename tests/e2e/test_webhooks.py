"""Decision webhooks end to end: the product as it runs (ASGI server, a real Celery worker, the
sandbox providers; tests/stack.py), an agent over HTTP, a reviewer approving over HTTP, and a
real HTTP receiver started by the test, which first answers 500. The signed events arrive, the
500 is retried with the same message ID, and a LangGraph thread interrupted for the approval is
resumed from the webhook (`countersign.langgraph.resume_on_webhook`)."""

from __future__ import annotations

import pytest
import standardwebhooks
from countersign import Client
from countersign import webhooks as client_webhooks
from countersign.langgraph import approvals_waiting, resume_on_webhook
from langchain_core.messages import ToolMessage

from console.lib.procs import wait_until
from console.lib.standard_webhooks import new_secret
from console.models import AgentPrincipal
from ledger.models import WebhookDelivery, WebhookEvent, WebhookStatus
from tests.clients.conftest import decide, judged, pending_approval
from tests.clients.langgraph_agent import langgraph_refund
from tests.conftest import AGENT_TOKEN
from tests.fixtures.webhook_receiver import WebhookReceiver
from tests.stack import FullStack, HttpAgent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

SECRET = new_secret()


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    stack = FullStack(env={"AGENT_E2E_WEBHOOK_SECRET": SECRET, "WEBHOOK_BACKOFF_SECONDS": "0.2",
                           "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"}).start()
    yield stack
    stack.stop()


@pytest.fixture
def receiver(agent):
    with WebhookReceiver(answers=[500]) as r:
        AgentPrincipal.objects.filter(pk=agent.pk).update(webhook_url=r.url, webhook_secret_ref="AGENT_E2E_WEBHOOK_SECRET")
        yield r


def _events(requests) -> list[dict]:
    events = []
    for request in requests:
        event = client_webhooks.verify(request.headers, request.body, SECRET)
        assert standardwebhooks.Webhook(SECRET).verify(request.body, request.headers) == event
        events.append({**event, "id": request.headers["webhook-id"]})
    return events


def test_a_reviewers_approval_reaches_the_agent_signed_and_retried_after_a_500(stack, agent, reviewer, receiver):
    http = HttpAgent(stack.url)
    task = http.running_task()
    held = http.refund(task, order_id="ord-hook-1", amount=120)
    assert held["decision"]["outcome"] == "awaiting_approval"

    decide(stack, pending_approval(held["call_id"]).approval_id, "approve", reason="receipt attached")
    http.final(held["call_id"], task[0])
    wait_until(lambda: not WebhookEvent.objects.filter(status=WebhookStatus.PENDING).exists()
               and WebhookEvent.objects.count() == 2, timeout=60, what="both webhooks delivered")

    events = _events(receiver.received)
    ids = [e["id"] for e in events]
    # The first request got the 500; its retry carried the same message ID, then a 200.
    assert ids.count(ids[0]) == 2 and len(set(ids)) == 2
    first = WebhookEvent.objects.get(webhook_id=ids[0])
    assert [d.status_code for d in WebhookDelivery.objects.filter(event=first).order_by("number")] == [500, 200]
    assert all(e.status == WebhookStatus.DELIVERED for e in WebhookEvent.objects.all())
    [decided] = {e["id"]: e for e in events if e["type"] == "call.decided"}.values()
    [final] = {e["id"]: e for e in events if e["type"] == "call.final"}.values()
    assert decided["data"]["call_id"] == final["data"]["call_id"] == held["call_id"]
    assert decided["data"]["decision"]["outcome"] == "approved"
    assert decided["data"]["decision"]["reason"] == "receipt attached"
    assert decided["data"]["final"] is False and decided["data"]["status"] == "authorized"
    assert final["data"]["status"] == "confirmed" and final["data"]["final"] is True
    assert final["data"]["receipt"]


def test_the_decision_webhook_resumes_the_interrupted_langgraph_thread(stack, agent, reviewer, receiver):
    from langgraph.checkpoint.memory import InMemorySaver

    client = Client(stack.url, AGENT_TOKEN)
    graph, tools = langgraph_refund.build(client, InMemorySaver())
    config = {"configurable": {"thread_id": "refund-thread-webhook"}}
    graph.invoke({"messages": [("user", "Refund both orders.")]}, config)
    [waiting] = approvals_waiting(graph, config)
    [held] = waiting["calls"]

    decide(stack, held["approval_id"], "approve")

    resumed = None
    seen = 0
    while resumed is None:
        requests = receiver.wait_for(seen + 1)
        for request in requests[seen:]:
            resumed = resumed or resume_on_webhook(graph, config, client, headers=request.headers, body=request.body,
                                                   secret=SECRET)
        seen = len(requests)
    assert approvals_waiting(graph, config) == []
    messages = graph.get_state(config).values["messages"]
    assert [m.status for m in messages if isinstance(m, ToolMessage)] == ["success", "success"]
    # A retried delivery of the same event finds the thread no longer waiting: nothing happens.
    last = receiver.received[-1]
    assert resume_on_webhook(graph, config, client, headers=last.headers, body=last.body, secret=SECRET) is None
    judged(tools.tasks["refund-thread-webhook"].task_id)
