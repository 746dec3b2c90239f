"""The LangGraph example against a real server: the agent process is killed (SIGKILL) after it
proposed a refund and before LangGraph saved the step; restarted from its SQLite checkpointer
with the same thread ID, it re-proposes the same call, gets the same operation, then interrupts
for the second refund's approval and resumes once a reviewer approves. One effect per refund.
In process: a rejected call resumes the graph with an error ToolMessage carrying the reason."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from countersign import Client
from countersign.langgraph import approvals_waiting, resume_when_decided
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from ledger.models import Operation
from runs.models import Task
from sandbox import client as sandbox
from tests.clients.conftest import decide, judged
from tests.clients.langgraph_agent import langgraph_refund
from tests.conftest import AGENT_TOKEN

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

AGENT = Path(__file__).with_name("langgraph_agent.py")
THREAD = "refund-thread-1"


def start_agent(stack, db: Path, *, hold: bool = False) -> subprocess.Popen:
    command = [sys.executable, str(AGENT), "--url", stack.url, "--token", AGENT_TOKEN, "--thread", THREAD,
               "--db", str(db)] + (["--hold"] if hold else [])
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def next_event(agent: subprocess.Popen, name: str) -> dict:
    for line in agent.stdout:
        event = json.loads(line)
        if event["event"] == name:
            return event
    raise AssertionError(f"the agent exited ({agent.wait()}) before {name}: {agent.stderr.read()}")


def checkpoint(stack, db: Path):
    graph, _ = langgraph_refund.build(Client(stack.url, AGENT_TOKEN),
                                      SqliteSaver(sqlite3.connect(db, check_same_thread=False)))
    return graph.get_state({"configurable": {"thread_id": THREAD}})


def effects(stack, operation: Operation) -> list[dict]:
    return sandbox.effects(stack.payments.base_url, key=operation.idempotency_key)


def test_an_agent_killed_after_proposing_restarts_from_its_checkpoint_with_one_effect(stack, agent, reviewer,
                                                                                     tmp_path):
    db = tmp_path / "checkpoints.sqlite"
    first = start_agent(stack, db, hold=True)
    proposed = next_event(first, "proposed")
    next_event(first, "holding")
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    died_at = checkpoint(stack, db)
    assert died_at.next == ("tools",)
    assert not any(isinstance(message, ToolMessage) for message in died_at.values["messages"])

    second = start_agent(stack, db)
    again = next_event(second, "proposed")
    assert again["call_id"] == proposed["call_id"] and again["operation_id"] == proposed["operation_id"]
    waiting = next_event(second, "waiting")
    assert waiting["tier"] == 3 and waiting["approval_id"] in waiting["approval_url"]
    assert approval_interrupted(stack, db)

    decide(stack, waiting["approval_id"], "approve", reason="customer never got it")
    done = next_event(second, "done")
    assert second.wait() == 0, second.stderr.read()

    tool_results = [message for message in done["messages"] if message["type"] == "tool"]
    assert [message["status"] for message in tool_results] == ["success", "success"]
    operations = list(Operation.objects.filter(task__idempotency_key=THREAD).order_by("created_at"))
    assert [operation.status for operation in operations] == ["confirmed", "confirmed"]
    assert operations[0].operation_id == proposed["operation_id"]
    assert [len(effects(stack, operation)) for operation in operations] == [1, 1]
    assert judged(Task.objects.get(idempotency_key=THREAD).task_id).status == "succeeded"


def approval_interrupted(stack, db: Path) -> bool:
    """The checkpoint holds LangGraph's interrupt with the approval's data."""
    [interrupt] = checkpoint(stack, db).interrupts
    return interrupt.value["kind"] == "countersign.approval" and interrupt.value["calls"][0]["tier"] == 3


def test_a_rejected_call_resumes_the_graph_with_an_error_the_model_reads(stack, agent, reviewer):
    from langgraph.checkpoint.memory import InMemorySaver

    client = Client(stack.url, AGENT_TOKEN)
    graph, tools = langgraph_refund.build(client, InMemorySaver())
    config = {"configurable": {"thread_id": "refund-thread-rejected"}}

    graph.invoke({"messages": [("user", "Refund both orders.")]}, config)
    [waiting] = approvals_waiting(graph, config)
    [held] = waiting["calls"]
    assert held["tool"] == "payments.refund" and held["arguments"]["order_id"] == "ord-2"
    decide(stack, held["approval_id"], "reject", reason="ord-2 was delivered")
    resume_when_decided(graph, config, client)

    messages = graph.get_state(config).values["messages"]
    first, second = [message for message in messages if isinstance(message, ToolMessage)]
    assert first.status == "success" and second.status == "error"
    assert second.content == "rejected by user:reviewer: ord-2 was delivered"
    assert Operation.objects.get(pk=held["operation_id"]).status == "rejected"
    judged(tools.tasks["refund-thread-rejected"].task_id)


def test_a_restart_after_finish_whose_checkpoint_was_lost_ends_the_thread(stack, agent, reviewer):
    """The finish node told Countersign and died before LangGraph saved that step: the restarted
    process runs the node again, the task is already finished (it takes no lease), and the
    thread ends instead of failing."""
    from langgraph.checkpoint.memory import InMemorySaver

    saver = InMemorySaver()
    client = Client(stack.url, AGENT_TOKEN)
    graph, tools = langgraph_refund.build(client, saver)
    config = {"configurable": {"thread_id": "refund-thread-finished"}}
    graph.invoke({"messages": [("user", "Refund both orders.")]}, config)
    [waiting] = approvals_waiting(graph, config)
    decide(stack, waiting["calls"][0]["approval_id"], "approve", reason="ok")
    resume_when_decided(graph, config, client)
    task_id = tools.tasks["refund-thread-finished"].task_id
    assert judged(task_id).status == "succeeded"
    before_finish = next(s for s in graph.get_state_history(config) if s.next == ("finish",))

    restarted, _ = langgraph_refund.build(Client(stack.url, AGENT_TOKEN), saver)  # a new process's node
    restarted.invoke(None, before_finish.config)

    assert restarted.get_state(config).next == ()
    assert Task.objects.filter(idempotency_key="refund-thread-finished").count() == 1
