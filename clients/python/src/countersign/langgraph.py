"""LangGraph integration: a tool node whose every tool call goes through Countersign.

The task is started (or found again) under the graph's thread ID, so a process restarted from
its checkpointer continues the same task. Each call is proposed under a call ID derived from the
task and its step (by default the model's tool-call ID, which the checkpointer keeps), so the
node re-run after a crash or an interrupt gets the existing operation back, never a second one.

A call held for a person interrupts the graph (`interrupt()`) with the approval's data; resuming
re-runs the node, which re-proposes the same calls and waits for them to be final.
`resume_when_decided()` waits for the decisions and resumes; `resume_on_webhook()` resumes when
Countersign's decision webhook says the call was decided."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, interrupt

from countersign import _core
from countersign.client import Client, Task
from countersign.errors import CallError, NotFinal, OutcomeUnknown
from countersign.otel import link_span
from countersign.webhooks import verify

INTERRUPT_KIND = "countersign.approval"


def thread_id_of(config: RunnableConfig) -> str:
    thread_id = (config.get("configurable") or {}).get("thread_id")
    if not thread_id:
        raise ValueError("Countersign's tool node needs a thread_id in the config (and a checkpointer).")
    return str(thread_id)


class CountersignToolNode:
    """Runs the last AI message's tool calls through Countersign and answers with ToolMessages.

    `contract(state)` returns the task contract (`task_type`, `goal`, `inputs`, `constraints`…)
    registered under the thread ID. `step_id(tool_call)` names the step of a call (default: the
    tool-call ID). `interrupt_on_approval=False` waits inside the node instead of interrupting.
    A rejection, refusal, expiry, cancellation or provider failure becomes an error ToolMessage
    the model can read; an unknown outcome and an unreachable server raise."""

    def __init__(self, client: Client, contract: Callable[[Any], dict[str, Any]] | dict[str, Any], *,
                 step_id: Callable[[dict[str, Any]], str] | None = None, interrupt_on_approval: bool = True,
                 ttl_seconds: int = 300, on_proposed: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.client = client
        self.contract = contract if callable(contract) else (lambda state, c=contract: c)
        self.step_id = step_id or (lambda tool_call: str(tool_call["id"]))
        self.interrupt_on_approval = interrupt_on_approval
        self.ttl_seconds = ttl_seconds
        self.on_proposed = on_proposed
        self.tasks: dict[str, Task] = {}

    def task_for(self, state: Any, config: RunnableConfig) -> Task:
        thread_id = thread_id_of(config)
        task = self.tasks.get(thread_id)
        if task is None:
            task = self.client.start_task(key=thread_id, ttl_seconds=self.ttl_seconds, **self.contract(state))
            self.tasks[thread_id] = task
        return task

    def __call__(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        messages = state["messages"] if isinstance(state, dict) else state.messages
        tool_calls = list(getattr(messages[-1], "tool_calls", None) or [])
        task = self.task_for(state, config)
        proposed = []
        for tool_call in tool_calls:  # parallel calls of one step: all propose under one version
            step = self.step_id(tool_call)
            answer = task.propose(tool_call["name"], tool_call["args"], step_id=step)
            link_span(task_id=task.task_id, step_id=step, call_id=answer["call_id"],
                      operation_id=answer.get("operation_id"), tool=tool_call["name"])
            if self.on_proposed is not None:
                self.on_proposed(answer)
            proposed.append((tool_call, answer))
        held = [pending(task, tool_call, answer) for tool_call, answer in proposed
                if not answer["final"] and answer["decision"]["outcome"] == "awaiting_approval"]
        if held and self.interrupt_on_approval:
            # On resume the node runs again from the top: the proposals above are answered from
            # the ledger, and interrupt() returns the resume value instead of stopping.
            interrupt({"kind": INTERRUPT_KIND, "task_id": task.task_id, "calls": held})
        return {"messages": [self.tool_message(task, tool_call, answer) for tool_call, answer in proposed]}

    def tool_message(self, task: Task, tool_call: dict[str, Any], answer: dict[str, Any]) -> ToolMessage:
        # A proposal answered final (a refusal, a repeat of a call that ended) needs no poll.
        final = answer if _core.answers_for_itself(answer) else task.wait(answer["call_id"])
        if _core.is_open(final):
            raise NotFinal(final)
        try:
            result = _core.outcome(final)
        except OutcomeUnknown:
            raise
        except CallError as error:
            return ToolMessage(content=str(error), tool_call_id=tool_call["id"], name=tool_call["name"],
                               status="error", artifact=final)
        return ToolMessage(content=json.dumps(result), tool_call_id=tool_call["id"], name=tool_call["name"],
                           artifact=final)


def pending(task: Task, tool_call: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    decision = answer["decision"]
    return {"call_id": answer["call_id"], "tool": tool_call["name"], "arguments": tool_call["args"],
            "operation_id": answer.get("operation_id"), "approval_id": answer.get("approval_id"),
            "approval_url": decision.get("url"), "tier": answer.get("risk_tier"),
            "approvals_needed": decision.get("approvals_needed"), "expires_at": decision.get("expires_at")}


def approvals_waiting(graph: Any, config: RunnableConfig) -> list[dict[str, Any]]:
    """The Countersign interrupts the thread is stopped at (empty when it is not)."""
    return [intr.value for intr in graph.get_state(config).interrupts
            if isinstance(intr.value, dict) and intr.value.get("kind") == INTERRUPT_KIND]


def resume_when_decided(graph: Any, config: RunnableConfig, client: Client, *,
                        timeout: float | None = None) -> Any:
    """Waits until every call the thread's interrupts hold is decided (long-polling the server),
    then resumes the thread. Returns what `graph.invoke` returns."""
    waiting = _waiting_interrupts(graph, config)
    if not waiting:
        raise ValueError("The thread waits for no Countersign approval.")
    resume = {}
    for intr_id, value in waiting:
        answers = [wait_for_decision(client, value["task_id"], call["call_id"], timeout=timeout)
                   for call in value["calls"]]
        resume[intr_id] = _decided(value, answers)
    return graph.invoke(Command(resume=resume), config)


def resume_on_webhook(graph: Any, config: RunnableConfig, client: Client, *, headers: Mapping[str, str],
                      body: bytes | str, secret: str) -> Any | None:
    """For a decision webhook's receiver: verifies the request (`countersign.webhooks.verify`,
    raising WebhookVerificationError), and when it is the `call.decided` of a call this thread
    is interrupted for, and every other call the interrupt holds is decided too (asked once,
    without waiting), resumes the thread and returns what `graph.invoke` returns. Otherwise
    returns None: another thread's call, an event already handled (a retried delivery: the
    thread no longer waits), or a call of the interrupt still waiting — its own webhook will
    come. `config` names the thread: keep the task ID → thread ID of the interrupts you see
    (`approvals_waiting(...)[i]["task_id"]`)."""
    event = verify(headers, body, secret)
    data = event.get("data") or {}
    if event.get("type") != "call.decided" or data.get("decision", {}).get("outcome") == "awaiting_approval":
        return None
    waiting = [(intr_id, value) for intr_id, value in _waiting_interrupts(graph, config)
               if value["task_id"] == data.get("task_id")
               and any(call["call_id"] == data.get("call_id") for call in value["calls"])]
    if not waiting:
        return None
    resume = {}
    for intr_id, value in waiting:
        answers = [data if call["call_id"] == data["call_id"] else
                   client.request("GET", _core.call_path(call["call_id"]), params={"task_id": value["task_id"], "wait": 0})
                   for call in value["calls"]]
        if any(not a["final"] and a["decision"]["outcome"] == "awaiting_approval" for a in answers):
            return None
        resume[intr_id] = _decided(value, answers)
    return graph.invoke(Command(resume=resume), config)


def _waiting_interrupts(graph: Any, config: RunnableConfig) -> list[tuple[str, dict[str, Any]]]:
    return [(intr.id, intr.value) for intr in graph.get_state(config).interrupts
            if isinstance(intr.value, dict) and intr.value.get("kind") == INTERRUPT_KIND]


def _decided(value: dict[str, Any], answers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"decided": [{"call_id": call["call_id"], "outcome": answer["decision"]["outcome"]}
                        for call, answer in zip(value["calls"], answers, strict=True)]}


def wait_for_decision(client: Client, task_id: str, call_id: str, *, timeout: float | None = None) -> dict[str, Any]:
    """Long-polls the call until it is no longer awaiting approval."""
    until = _core.deadline(timeout)
    answer = client.request("GET", _core.call_path(call_id), params={"task_id": task_id, "wait": 0})
    while (params := _core.next_decision_poll(task_id, answer, until)) is not None:
        answer = client.request("GET", _core.call_path(call_id), params=params)
    return answer
