"""An OpenAI Agents SDK refund agent whose tool calls go through Countersign.

The model is scripted (no LLM): it refunds 30 EUR on ord-1 (the gate runs it at once), then
80 EUR on ord-2 (held for a reviewer: the SDK interrupts the run, the paused `RunState` is saved
to a file), then answers with what the tools returned; the task is handed to its verifier.
Once a reviewer decided in Countersign's inbox, the decision is recorded on the run state
(approve, or reject with the reviewer's reason) and the run resumes — in this process, or, with
`--stop-when-held`, in the next one started with the same command:

    python examples/openai_agents_refund.py --url http://127.0.0.1:8000 --token demo-agent-token \\
        --key refund-demo-1 --state var/openai-agents-refund.json

Each line it prints is a JSON event (held, done)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents import Agent, Model, ModelResponse, Runner, RunState, Usage, set_tracing_disabled
from countersign import AsyncClient
from countersign.openai_agents import CountersignTools
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

# The model's tool calls, as the JSON text a model sends: `30`, not `30.0`.
SCRIPT = [
    ("call-refund-1", "payments_refund",
     '{"order_id": "ord-1", "amount": 30, "currency": "EUR", "reason": "damaged in transit"}'),
    ("call-refund-2", "payments_refund",
     '{"order_id": "ord-2", "amount": 80, "currency": "EUR", "reason": "never delivered"}'),
]
CONTRACT = {"task_type": "refund", "goal": "Refund ord-1 and ord-2",
            "inputs": {"orders": ["ord-1", "ord-2"]}, "constraints": {"max_amount": 200}}


class ScriptedModel(Model):
    """The next tool call of the script per turn, then a final answer quoting the tools' outputs.
    What it says depends only on the conversation it is given, so a resumed run continues it."""

    def __init__(self, script: list[tuple[str, str, str]] = SCRIPT) -> None:
        self.script = script

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, **kwargs: Any) -> ModelResponse:
        outputs = [item["output"] for item in input if isinstance(item, dict) and item.get("type") == "function_call_output"]
        if len(outputs) < len(self.script):
            call_id, name, arguments = self.script[len(outputs)]
            item = ResponseFunctionToolCall(type="function_call", id=f"fc-{call_id}", call_id=call_id, name=name,
                                            arguments=arguments, status="completed")
        else:
            text = "Done. " + " | ".join(str(output) for output in outputs)
            item = ResponseOutputMessage(id="msg-final", type="message", role="assistant", status="completed",
                                         content=[ResponseOutputText(type="output_text", text=text, annotations=[])])
        return ModelResponse(output=[item], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("the scripted model does not stream")


def build_agent(tools: CountersignTools, script: list[tuple[str, str, str]] = SCRIPT) -> Agent:
    return Agent(name="refunds", instructions="Refund the orders the customer names.", model=ScriptedModel(script),
                 tools=tools.function_tools())


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def held_calls(tools: CountersignTools, state: RunState) -> list[dict[str, Any]]:
    """The Countersign calls the paused run waits for, with their approval pages."""
    held = []
    for item in state.get_interruptions():
        tool = tools.tools.get(item.tool_name or "")
        if tool is not None:
            answer = await tools.task.wait(tools.call_id(tool["name"], item.call_id), timeout=0)
            held.append({"call_id": answer["call_id"], "operation_id": answer["operation_id"],
                         "approval_id": (answer.get("approval") or {}).get("approval_id"), "approval_url": answer["decision"]["url"],
                         "tier": answer.get("risk_tier")})
    return held


async def run(url: str, token: str, key: str, state_file: Path, *, stop_when_held: bool = False,
              script: list[tuple[str, str, str]] = SCRIPT,
              on_held: Callable[[list[dict[str, Any]]], Any] | None = None) -> dict[str, Any]:
    set_tracing_disabled(True)  # no OpenAI account here: the spans would go nowhere
    async with AsyncClient(url, token) as client:
        task = await client.start_task(key=key, **CONTRACT)
        tools = await CountersignTools.load(client, task, only=["payments.refund"])
        agent = build_agent(tools, script)
        if state_file.exists():  # a run paused by an earlier process: resume it
            state = await RunState.from_string(agent, state_file.read_text())
        else:
            result = await Runner.run(agent, "Refund ord-1 (30 EUR) and ord-2 (80 EUR).")
            state = result.to_state() if result.interruptions else None
        while state is not None:
            state_file.write_text(state.to_string())
            held = await held_calls(tools, state)
            emit("held", calls=held)
            if on_held is not None:
                on_held(held)
            if stop_when_held:
                await task.close()
                return {"held": held}
            await tools.decide(state)
            result = await Runner.run(agent, state)
            state = result.to_state() if result.interruptions else None
        outputs = [item["output"] for item in result.to_input_list()
                   if isinstance(item, dict) and item.get("type") == "function_call_output"]
        await task.finish(evidence={"refunds": [str(output) for output in outputs]})
        state_file.unlink(missing_ok=True)
        done = {"task_id": task.task_id, "final_output": result.final_output}
        emit("done", **done)
        return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", default="demo-agent-token")
    parser.add_argument("--key", required=True, help="the task's idempotency key: the same key continues the task")
    parser.add_argument("--state", default="openai-agents-refund.json", help="where the paused RunState is kept")
    parser.add_argument("--stop-when-held", action="store_true",
                        help="save the paused run and exit; run again to resume once decided")
    args = parser.parse_args(argv)
    asyncio.run(run(args.url, args.token, args.key, Path(args.state), stop_when_held=args.stop_when_held))


if __name__ == "__main__":
    sys.exit(main())
