"""Countersign as an MCP server: the SDK's own MCP client against /mcp on the product as it runs
(uvicorn, a real Celery worker, the payments sandbox). What an agent whose framework speaks MCP
sees: its allowed tools, a read answered with its result, a refund held for a person, approved
by a reviewer and waited for with countersign_wait, exactly one effect at the provider."""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import asynccontextmanager

import httpx
import httpx2
import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from approvals.models import Tool
from console.celery import app as celery_app
from console.models import Role
from ledger.decisions import approval_approve, approval_reject
from ledger.models import Attempt, Call, Operation
from runs.models import Task
from sandbox.client import effects
from tests.conftest import AGENT_TOKEN, OUTSIDER_TOKEN, make_user
from tests.stack import FullStack

ACCEPT = "application/json, text/event-stream"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def stack():
    stack = FullStack().start()
    yield stack
    stack.stop()


@pytest.fixture
def publishes_to_the_stack(stack):
    """The reviewer approves from the test process, whose approval enqueues the dispatch on
    commit: publish it to the stack's broker (the session's default is memory://, which no
    worker reads)."""
    broker = os.environ.get("CELERY_BROKER_URL", "")
    saved = celery_app.conf.broker_url, celery_app.conf.broker_transport_options
    if broker.startswith("redis"):
        celery_app.conf.broker_url, celery_app.conf.broker_transport_options = broker, {}
    else:
        folders = stack.var / "broker"
        celery_app.conf.broker_url = "filesystem://"
        celery_app.conf.broker_transport_options = {
            "data_folder_in": str(folders / "queue"), "data_folder_out": str(folders / "queue"),
            "processed_folder": str(folders / "processed"), "control_folder": str(folders / "control"),
            "store_processed": False}
    _forget_connections()
    yield
    celery_app.conf.broker_url, celery_app.conf.broker_transport_options = saved
    _forget_connections()


def _forget_connections() -> None:
    # What Celery itself does after a fork (Celery._after_fork): the next publish connects anew.
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


def in_a_thread(decide):
    """A decision taken by a reviewer from the test's event loop: in a worker thread, whose
    database connection is closed after (the test database is dropped at the end)."""
    def run(**kwargs):
        try:
            return decide(**kwargs)
        finally:
            connection.close()

    return sync_to_async(run, thread_sensitive=False)


@asynccontextmanager
async def mcp_session(url: str, token: str):
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(90)) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def tool_names(url: str, token: str) -> list[str]:
    async with mcp_session(url, token) as session:
        return [tool.name for tool in (await session.list_tools()).tools]


def refund(order_id: str, amount: float) -> dict:
    return {"order_id": order_id, "amount": amount, "currency": "EUR", "reason": "broken"}


def test_it_lists_exactly_the_tools_the_agent_may_call(stack, agent, policy):
    tools = asyncio.run(_listed(stack.url))
    assert sorted(tools) == ["countersign_wait", "mail_send", "orders_lookup", "payments_refund"]
    assert "L1" in tools["payments_refund"].description
    assert tools["payments_refund"].input_schema == Tool.objects.get(name="payments.refund").json_schema

    agent.allowed_tools.remove(policy["mail.send"])
    Tool.objects.filter(name="orders.lookup").update(enabled=False)
    assert sorted(asyncio.run(tool_names(stack.url, AGENT_TOKEN))) == ["countersign_wait", "payments_refund"]


async def _listed(url: str) -> dict:
    async with mcp_session(url, AGENT_TOKEN) as session:
        return {tool.name: tool for tool in (await session.list_tools()).tools}


def test_another_tenants_agent_sees_its_own_tools_only(stack, agent, outsider_agent, policy):
    outsider_agent.allowed_tools.set([policy["orders.lookup"]])
    assert sorted(asyncio.run(tool_names(stack.url, OUTSIDER_TOKEN))) == ["countersign_wait", "orders_lookup"]
    assert "mail_send" in asyncio.run(tool_names(stack.url, AGENT_TOKEN))


def test_no_token_or_an_unknown_one_is_401(stack, agent):
    for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic eDp5"}):
        response = httpx.post(f"{stack.url}/mcp", headers={**headers, "Accept": "application/json, text/event-stream"},
                              json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] == "unauthenticated"
        assert response.headers["WWW-Authenticate"] == "Bearer"


def test_its_requests_count_against_the_agents_rate_limit(stack, agent):
    agent.api_rate_per_minute = 1
    agent.save(update_fields=["api_rate_per_minute"])
    initialize = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "limit", "version": "1"}}}
    headers = {"Authorization": f"Bearer {AGENT_TOKEN}", "Accept": ACCEPT}
    assert httpx.post(f"{stack.url}/mcp", headers=headers, json=initialize).status_code == 200
    over = httpx.post(f"{stack.url}/mcp", headers=headers, json=initialize)
    assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limited"
    assert int(over.headers["Retry-After"]) >= 1


def test_the_read_tool_answers_with_its_result_in_the_sessions_task(stack, agent):
    result = asyncio.run(_lookup(stack.url))
    assert not result.is_error
    body = result.structured_content
    assert body["status"] == "confirmed" and body["final"] is True
    assert body["result"]["order_id"] == "ord-42"
    assert json.loads(result.content[0].text)["result"] == body["result"]
    task = Task.objects.get(pk=body["task_id"])
    assert task.actor == agent and task.idempotency_key.startswith("mcp:") and task.status == "running"
    assert Operation.objects.get(pk=body["operation_id"]).tool.name == "orders.lookup"
    # Run by the server that answered the agent, not handed to a worker through the broker.
    assert Attempt.objects.get(operation_id=body["operation_id"]).worker.startswith("server:")


def test_parallel_first_calls_of_a_session_share_its_one_task(stack, agent):
    results = asyncio.run(_parallel_lookups(stack.url))
    assert [r.is_error for r in results] == [False] * 3
    assert len({r.structured_content["task_id"] for r in results}) == 1
    assert len({r.structured_content["call_id"] for r in results}) == 3
    assert Task.objects.filter(actor=agent).count() == 1


async def _parallel_lookups(url: str):
    async with mcp_session(url, AGENT_TOKEN) as session:
        return await asyncio.gather(*(session.call_tool("orders_lookup", {"order_id": f"ord-{n}"})
                                      for n in range(3)))


async def _lookup(url: str):
    async with mcp_session(url, AGENT_TOKEN) as session:
        return await session.call_tool("orders_lookup", {"order_id": "ord-42"})


def test_a_refund_over_l1_waits_for_approval_then_countersign_wait_returns_the_receipt(
        stack, publishes_to_the_stack, agent, tenant):
    reviewer = make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)
    first, final = asyncio.run(_refund_approved_while_waiting(stack.url, reviewer))

    assert not first.is_error
    awaiting = first.structured_content
    assert awaiting["awaiting_approval"] is True
    assert awaiting["approval_url"] == f"{stack.url}/approvals/{awaiting['approval_id']}/"
    assert "countersign_wait" in first.content[0].text

    assert not final.is_error, final.content[0].text
    body = final.structured_content
    assert body["status"] == "confirmed" and body["decision"]["outcome"] == "approved"
    assert body["receipt"]["amount"] == 120
    assert len(effects(stack.payments.base_url, key=body["operation_id"])) == 1
    assert len(effects(stack.payments.base_url)) == 1


async def _refund_approved_while_waiting(url: str, reviewer):
    async with mcp_session(url, AGENT_TOKEN) as session:
        first = await session.call_tool("payments_refund", refund("ord-kettle-1", 120))
        call = first.structured_content
        await in_a_thread(approval_approve)(approval_id=call["approval_id"], reviewer=reviewer, reason="ok")
        final = await session.call_tool("countersign_wait", {"call_id": call["call_id"], "timeout_seconds": 45})
        for _ in range(3):  # still in flight after 45 s: wait again, a bounded number of times
            if not final.structured_content.get("pending"):
                break
            final = await session.call_tool("countersign_wait", {"call_id": call["call_id"], "timeout_seconds": 45})
        return first, final


def test_a_rejected_call_is_an_error_with_the_reviewers_reason(stack, publishes_to_the_stack, agent, tenant):
    reviewer = make_user("reviewer", tenant, Role.REVIEWER, max_tier=3)
    result = asyncio.run(_refund_rejected(stack.url, reviewer))
    assert result.is_error
    assert "not this order" in result.content[0].text
    assert result.structured_content["decision"]["outcome"] == "rejected"
    assert effects(stack.payments.base_url, key=result.structured_content["operation_id"]) == []


async def _refund_rejected(url: str, reviewer):
    async with mcp_session(url, AGENT_TOKEN) as session:
        first = await session.call_tool("payments_refund", refund("ord-kettle-2", 120))
        call = first.structured_content
        await in_a_thread(approval_reject)(approval_id=call["approval_id"], reviewer=reviewer,
                                             reason="not this order")
        return await session.call_tool("countersign_wait", {"call_id": call["call_id"], "timeout_seconds": 45})


def test_a_refused_call_is_an_error_with_the_gates_reason(stack, agent):
    result = asyncio.run(_call(stack.url, "payments_refund", {"order_id": "ord-1", "amount": "a lot"}))
    assert result.is_error
    assert result.structured_content["error"]["code"] == "invalid"


async def _call(url: str, name: str, arguments: dict):
    async with mcp_session(url, AGENT_TOKEN) as session:
        return await session.call_tool(name, arguments)


# --- a client's retry of the same request ----------------------------------------------------


def rpc_answer(response: httpx.Response) -> dict:
    """The JSON-RPC answer in a streamable HTTP response (JSON or one SSE event)."""
    assert response.status_code == 200, response.text
    if response.headers["content-type"].startswith("application/json"):
        return response.json()
    data = [line[len("data:"):].strip() for line in response.text.splitlines() if line.startswith("data:")]
    return json.loads(next(d for d in data if d))


def raw_session(url: str, token: str) -> tuple[httpx.Client, dict[str, str]]:
    """An MCP session opened by hand: the client and the headers of its later requests."""
    http = httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {token}", "Accept": ACCEPT})
    opened = http.post("/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
    version = rpc_answer(opened)["result"]["protocolVersion"]
    headers = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": version}
    assert http.post("/mcp", headers=headers,
                     json={"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
    return http, headers


def test_another_agents_token_cannot_use_a_session(stack, agent, outsider_agent):
    _, headers = raw_session(stack.url, AGENT_TOKEN)
    response = httpx.post(f"{stack.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                          headers={**headers, "Authorization": f"Bearer {OUTSIDER_TOKEN}", "Accept": ACCEPT})
    assert response.status_code == 404


def test_a_retried_request_is_the_same_call_and_one_effect(stack, agent):
    http, headers = raw_session(stack.url, AGENT_TOKEN)

    request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "payments_refund", "arguments": refund("ord-retry-1", 30)}}
    first = rpc_answer(http.post("/mcp", headers=headers, json=request))["result"]
    again = rpc_answer(http.post("/mcp", headers=headers, json=request))["result"]

    assert first["structuredContent"]["status"] == "confirmed"
    assert again["structuredContent"]["operation_id"] == first["structuredContent"]["operation_id"]
    assert again["structuredContent"]["call_id"] == first["structuredContent"]["call_id"] == "mcp-7"
    task_id = first["structuredContent"]["task_id"]
    assert Call.objects.filter(task_id=task_id).count() == 1
    assert Operation.objects.filter(task_id=task_id).count() == 1
    assert len(effects(stack.payments.base_url, key=first["structuredContent"]["operation_id"])) == 1

    # Another request (another id) with the same arguments is another call: the model asked twice.
    other = rpc_answer(http.post("/mcp", headers=headers, json={**request, "id": 8}))["result"]
    assert other["structuredContent"]["call_id"] == "mcp-8"
    assert Call.objects.filter(task_id=task_id).count() == 2
