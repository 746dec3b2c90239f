"""The OpenAI Agents SDK integration (countersign.openai_agents) and its example against a real
server: a held call interrupts the run through the SDK's own human-in-the-loop, and the
reviewer's decision in Countersign becomes `state.approve` or `state.reject` (with the reason
the model then reads); a run paused in one process resumes from its serialized state in another
with one effect per refund; the model's raw arguments are proposed, not the SDK's coerced ones;
an unreachable Countersign stops the run instead of passing for "approval required". And
Countersign's /mcp through the SDK's own MCP client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp
from countersign import AsyncClient, CountersignUnavailable
from countersign.aio import AsyncTask
from countersign.openai_agents import CountersignToolError, CountersignTools

from ledger.models import Operation
from runs.models import Task
from sandbox import client as sandbox
from tests.asgi import REPO, free_port
from tests.clients.conftest import decide, judged
from tests.conftest import AGENT_TOKEN

sys.path.insert(0, str(REPO / "examples"))
import openai_agents_refund as example  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

EXAMPLE = REPO / "examples" / "openai_agents_refund.py"


def effects(stack, operation: Operation) -> list[dict]:
    return sandbox.effects(stack.payments.base_url, key=operation.idempotency_key)


def operations(key: str) -> list[Operation]:
    return list(Operation.objects.filter(task__idempotency_key=key).order_by("created_at"))


def reviewer_decides(stack, verdict: str, reason: str):
    """An on_held callback: a reviewer decides each held call over HTTP, from another thread,
    while the agent waits for the decision."""
    def on_held(held: list[dict]) -> None:
        for call in held:
            threading.Thread(target=decide, args=(stack, call["approval_id"], verdict), kwargs={"reason": reason},
                             daemon=True).start()
    return on_held


def test_an_approved_call_resumes_the_run_and_runs_once(stack, agent, reviewer, tmp_path):
    done = asyncio.run(example.run(stack.url, AGENT_TOKEN, "oa-approve", tmp_path / "state.json",
                                   on_held=reviewer_decides(stack, "approve", "customer never got it")))

    first, second = operations("oa-approve")
    assert [first.status, second.status] == ["confirmed", "confirmed"]
    assert second.arguments["order_id"] == "ord-2" and second.risk_tier == 3
    assert [len(effects(stack, first)), len(effects(stack, second))] == [1, 1]
    assert json.dumps(second.result) in done["final_output"]  # the model read the tool's result
    assert judged(done["task_id"]).status == "succeeded"


def test_a_rejection_reaches_state_reject_with_the_reviewers_reason(stack, agent, reviewer, tmp_path):
    done = asyncio.run(example.run(stack.url, AGENT_TOKEN, "oa-reject", tmp_path / "state.json",
                                   on_held=reviewer_decides(stack, "reject", "ord-2 was delivered")))

    first, second = operations("oa-reject")
    assert [first.status, second.status] == ["confirmed", "rejected"]
    assert effects(stack, second) == []
    assert "rejected by user:reviewer: ord-2 was delivered" in done["final_output"]
    judged(done["task_id"])


def run_example(stack, key: str, state: Path, *extra: str) -> list[dict]:
    finished = subprocess.run([sys.executable, str(EXAMPLE), "--url", stack.url, "--token", AGENT_TOKEN,
                               "--key", key, "--state", str(state), *extra],
                              capture_output=True, text=True, timeout=180)
    assert finished.returncode == 0, finished.stderr
    return [json.loads(line) for line in finished.stdout.splitlines()]


def test_a_run_paused_in_one_process_resumes_from_its_serialized_state_in_another(stack, agent, reviewer,
                                                                                   tmp_path):
    state = tmp_path / "state.json"
    [held] = run_example(stack, "oa-resume", state, "--stop-when-held")
    assert held["event"] == "held" and state.exists()
    [call] = held["calls"]
    assert call["tier"] == 3 and call["approval_id"] in call["approval_url"]
    first_process_task = Task.objects.get(idempotency_key="oa-resume")

    decide(stack, call["approval_id"], "approve", reason="fine")
    events = run_example(stack, "oa-resume", state)

    # The saved state is still paused: the second process learns the decision from Countersign.
    assert [event["event"] for event in events] == ["held", "done"]
    assert events[0]["calls"] == [call]
    first, second = operations("oa-resume")
    assert second.operation_id == call["operation_id"] and second.status == "confirmed"
    assert [len(effects(stack, first)), len(effects(stack, second))] == [1, 1]
    assert json.dumps(second.result) in events[1]["final_output"]
    assert events[1]["task_id"] == first_process_task.task_id and not state.exists()
    judged(first_process_task.task_id)


def test_the_models_raw_arguments_are_proposed_not_the_sdks_coerced_ones(stack, agent, reviewer, tmp_path):
    asyncio.run(example.run(stack.url, AGENT_TOKEN, "oa-raw", tmp_path / "state.json",
                            on_held=reviewer_decides(stack, "approve", "ok")))

    # The schema says "number"; the model sent 30 and 80. A coercing SDK hands the tool 30.0.
    for operation, amount in zip(operations("oa-raw"), (30, 80), strict=True):
        assert type(operation.arguments["amount"]) is int and operation.arguments["amount"] == amount
        [effect] = effects(stack, operation)
        assert json.dumps(effect["payload"]["amount"]) == str(amount)
    judged(Task.objects.get(idempotency_key="oa-raw").task_id)


def test_an_unreachable_countersign_stops_the_run_instead_of_asking_for_approval(stack, agent):
    set_tracing_disabled(True)

    async def scenario():
        async with AsyncClient(stack.url, AGENT_TOKEN) as client:
            task = await client.start_task(key="oa-outage", **example.CONTRACT, renew=False)
            tool_list = await client.tools()
        # The same task, its Countersign now down: nothing listens on the port any more.
        async with AsyncClient(f"http://127.0.0.1:{free_port()}", AGENT_TOKEN, retries=2) as down:
            answer = {"task_id": task.task_id, "status": task.status, "version": task.version,
                      "fencing_token": task.fencing_token}
            tools = CountersignTools(AsyncTask(down, answer, owner="oa-outage", ttl_seconds=300), tool_list)
            agent_ = Agent(name="refunds", model=example.ScriptedModel(example.SCRIPT[1:]),
                           tools=tools.function_tools())
            return await Runner.run(agent_, "Refund ord-2.")

    with pytest.raises(CountersignToolError) as stopped:
        asyncio.run(scenario())
    assert isinstance(stopped.value.error, CountersignUnavailable)
    assert not Operation.objects.filter(task__idempotency_key="oa-outage").exists()


def test_countersigns_mcp_server_through_the_sdks_mcp_client(stack, agent):
    async def scenario():
        server = MCPServerStreamableHttp({"url": f"{stack.url}/mcp", "timeout": 30,
                                          "headers": {"Authorization": f"Bearer {AGENT_TOKEN}"}},
                                         client_session_timeout_seconds=60)
        async with server:
            names = [tool.name for tool in await server.list_tools()]
            answer = await server.call_tool("payments_refund", {"order_id": "ord-mcp", "amount": 30,
                                                                "currency": "EUR", "reason": "broken"})
        return names, answer

    names, answer = asyncio.run(scenario())
    assert {"payments_refund", "countersign_wait"} <= set(names)
    assert not answer.is_error and answer.structured_content["status"] == "confirmed"
    operation = Operation.objects.get(pk=answer.structured_content["operation_id"])
    assert operation.status == "confirmed" and operation.arguments["order_id"] == "ord-mcp"
    assert len(effects(stack, operation)) == 1
