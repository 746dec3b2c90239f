"""A LangGraph refund agent whose tool calls go through Countersign.

The model is scripted (no LLM): it refunds 30 EUR on ord-1 (the gate runs it at once), then
80 EUR on ord-2 (held for a reviewer: the graph interrupts with the approval's link and resumes
once it is decided), then stops; the task is handed to its verifier. The checkpointer is SQLite,
so the same command run again continues the same thread, the same task and the same calls:

    python examples/langgraph_refund.py --url http://127.0.0.1:8000 --token demo-agent-token \\
        --thread refund-demo-1 --db var/langgraph-refund.sqlite

Each line it prints is a JSON event (proposed, waiting, done)."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Callable
from typing import Any

from countersign import Client, TaskFinished
from countersign.langgraph import CountersignToolNode, approvals_waiting, resume_when_decided
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

SCRIPT = [
    {"name": "payments.refund", "id": "call-refund-1",
     "args": {"order_id": "ord-1", "amount": 30, "currency": "EUR", "reason": "damaged in transit"}},
    {"name": "payments.refund", "id": "call-refund-2",
     "args": {"order_id": "ord-2", "amount": 80, "currency": "EUR", "reason": "never delivered"}},
]
CONTRACT = {"task_type": "refund", "goal": "Refund ord-1 and ord-2",
            "inputs": {"orders": ["ord-1", "ord-2"]}, "constraints": {"max_amount": 200}}


def scripted_model(state: MessagesState) -> dict[str, Any]:
    """The next tool call of the script, one per turn, then a final answer."""
    done = sum(isinstance(message, ToolMessage) for message in state["messages"])
    if done < len(SCRIPT):
        return {"messages": [AIMessage(content="", tool_calls=[SCRIPT[done]])]}
    return {"messages": [AIMessage(content="Both refunds are done.")]}


def build(client: Client, checkpointer: Any, *, on_proposed: Callable[[dict], None] | None = None):
    tools = CountersignToolNode(client, CONTRACT, on_proposed=on_proposed)

    def finish(state: MessagesState, config) -> dict[str, Any]:
        try:
            task = tools.task_for(state, config)
        except TaskFinished:
            return {}  # finished before a crash lost this step's checkpoint: nothing is left to do
        results = [message.content for message in state["messages"] if isinstance(message, ToolMessage)]
        task.finish(evidence={"refunds": results})
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("model", scripted_model)
    graph.add_node("tools", tools)
    graph.add_node("finish", finish)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else "finish")
    graph.add_edge("tools", "model")
    graph.add_edge("finish", END)
    return graph.compile(checkpointer=checkpointer), tools


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def run(url: str, token: str, thread: str, db: str, *, on_proposed: Callable[[dict], None] | None = None) -> dict:
    client = Client(url, token)

    def proposed(answer: dict) -> None:
        emit("proposed", call_id=answer["call_id"], operation_id=answer["operation_id"], status=answer["status"])
        if on_proposed is not None:
            on_proposed(answer)

    checkpointer = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    graph, _ = build(client, checkpointer, on_proposed=proposed)
    config = {"configurable": {"thread_id": thread}}
    state = graph.get_state(config)
    if approvals_waiting(graph, config):
        pass  # stopped at an approval: resumed below
    elif state.next:
        graph.invoke(None, config)  # died mid-step: the checkpoint re-runs the step
    elif not state.values:
        graph.invoke({"messages": [HumanMessage(content="Refund ord-1 (30 EUR) and ord-2 (80 EUR).")]}, config)
    while waiting := approvals_waiting(graph, config):
        for call in (c for w in waiting for c in w["calls"]):
            emit("waiting", call_id=call["call_id"], approval_url=call["approval_url"], tier=call["tier"],
                 approval_id=call["approval_id"])
        resume_when_decided(graph, config, client)
    values = graph.get_state(config).values
    emit("done", messages=[{"type": m.type, "content": m.content, "status": getattr(m, "status", None)}
                           for m in values["messages"]])
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", default="demo-agent-token")
    parser.add_argument("--thread", required=True, help="LangGraph's thread ID: also the task's idempotency key")
    parser.add_argument("--db", default="langgraph-refund.sqlite", help="the SQLite checkpointer's file")
    args = parser.parse_args(argv)
    run(args.url, args.token, args.thread, args.db)


if __name__ == "__main__":
    sys.exit(main())
