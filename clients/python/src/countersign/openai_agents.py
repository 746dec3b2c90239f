"""OpenAI Agents SDK integration: Countersign's tools as the SDK's function tools.

`CountersignTools.load(client, task)` binds the tools the agent may call (`GET /api/v1/tools`)
to `FunctionTool`s with their JSON schemas. Every call runs through Countersign:

- `needs_approval` asks the gate's dry run. A call it would hold is proposed there and then, so
  a reviewer has it in the inbox while the SDK interrupts the run; a call it would run at once
  is not proposed before the SDK decides to invoke the tool (proposing it starts its effect).
- `decide(state)` waits for each held call's decision and maps it onto the SDK's own
  human-in-the-loop: approved → `state.approve`, rejected / expired / cancelled →
  `state.reject` with the reviewer's reason as the message the model reads.
- Invoking the tool proposes under a call ID derived from the task and the SDK's tool-call ID
  (a repeat is answered from the ledger, so a run resumed from its serialized `RunState` in
  another process gets the same operation), waits until the call is final and returns its
  result.

The arguments proposed are the model's, parsed from the JSON it sent, never the SDK's coerced
ones (a float field turns `30` into `30.0`). An error Countersign cannot answer past — the server
is unreachable, the lease was taken, the outcome is unknown — stops the run with
`CountersignToolError`: the SDK takes any other exception inside `needs_approval` for "approval
required", which would make an outage look like a call waiting for a person."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunState
from agents.exceptions import UserError
from agents.tool_context import ToolContext

from countersign import _core
from countersign.aio import AsyncClient, AsyncTask
from countersign.errors import ApiError, CallError, CountersignError, NotFinal, OutcomeUnknown


class CountersignToolError(UserError):
    """Countersign could not answer for a call (`error`: CountersignUnavailable, LeaseLost,
    OutcomeUnknown, ApiError). A UserError because the SDK re-raises those from `needs_approval`
    and from a tool instead of reading them as "approval required" or a message for the model."""

    def __init__(self, error: CountersignError) -> None:
        super().__init__(f"Countersign: {error}")
        self.error = error


def sdk_name(tool: str) -> str:
    """Function names the models accept: `payments.refund` → `payments_refund` (as on /mcp)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", tool)


def model_arguments(raw: str | dict[str, Any] | None) -> dict[str, Any]:
    """The arguments exactly as the model sent them (a JSON object)."""
    arguments = json.loads(raw or "{}") if not isinstance(raw, dict) else raw
    if not isinstance(arguments, dict):
        raise ValueError("the arguments are not a JSON object")
    return arguments


class CountersignTools:
    """The tools of one Countersign task, bound to the SDK. Build it again in a resumed process
    with the same task (`start_task` under the same key) and the same tool list."""

    def __init__(self, task: AsyncTask, tools: Iterable[dict[str, Any]]) -> None:
        self.task = task
        self.tools = {sdk_name(tool["name"]): tool for tool in tools}

    @classmethod
    async def load(cls, client: AsyncClient, task: AsyncTask, *, only: Iterable[str] | None = None) -> CountersignTools:
        """The tools this agent may call (all, or the Countersign names in `only`)."""
        wanted = None if only is None else set(only)
        return cls(task, [tool for tool in await client.tools() if wanted is None or tool["name"] in wanted])

    def function_tools(self) -> list[FunctionTool]:
        return [self.function_tool(name) for name in self.tools]

    def function_tool(self, name: str) -> FunctionTool:
        tool = self.tools[name]

        async def needs_approval(context: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
            return await self.needs_approval(tool["name"], params, call_id)

        async def invoke(context: ToolContext[Any], raw_arguments: str) -> str:
            return await self.invoke(tool["name"], context.tool_call_id, raw_arguments)

        return FunctionTool(name=name, description=tool.get("description") or tool["name"],
                            params_json_schema=tool["input_schema"], on_invoke_tool=invoke,
                            strict_json_schema=False, needs_approval=needs_approval)

    def call_id(self, tool: str, sdk_call_id: str) -> str:
        """Countersign's call ID of the SDK's tool call: stable across processes and resumes."""
        return self.task.call_id(tool, sdk_call_id)

    async def needs_approval(self, tool: str, arguments: dict[str, Any], sdk_call_id: str) -> bool:
        try:
            verdict = await self.task.check(tool, arguments)
            if verdict["outcome"] != "awaiting_approval":
                return False  # run at once or refused: invoking the tool proposes it and says which
            answer = await self.task.propose(tool, arguments, step_id=sdk_call_id)
        except ApiError as error:
            if error.status == 400:
                return False  # invalid arguments: invoking the tool tells the model what to fix
            raise CountersignToolError(error) from error
        except CountersignError as error:
            raise CountersignToolError(error) from error
        return _core.awaiting_approval(answer)

    async def invoke(self, tool: str, sdk_call_id: str, raw_arguments: str) -> str:
        """Proposes (a repeat answers from the ledger), waits until final, returns the result as
        JSON; a rejection, refusal, expiry, cancellation or failure is text the model reads."""
        try:
            arguments = model_arguments(raw_arguments)
        except ValueError as error:
            return f"invalid arguments: {error}"
        try:
            answer = await self.task.call_answer(tool, arguments, step_id=sdk_call_id)
            if _core.is_open(answer):
                raise NotFinal(answer)
            return json.dumps(_core.outcome(answer))
        except (OutcomeUnknown, NotFinal) as error:
            raise CountersignToolError(error) from error
        except CallError as error:
            return str(error)
        except ApiError as error:
            if error.status == 400:
                return f"invalid arguments: {error.message} {json.dumps(error.details)}"
            raise CountersignToolError(error) from error
        except CountersignError as error:
            raise CountersignToolError(error) from error

    async def decide(self, state: RunState, *, timeout: float | None = None) -> RunState:
        """Waits until a person decided each of the run's held Countersign calls and records the
        decisions on `state` (approve, or reject with the reviewer's reason). Interruptions of
        other tools are left for the caller. Resume with `Runner.run(agent, state)`."""
        for item in state.get_interruptions():
            tool = self.tools.get(item.tool_name or "")
            if tool is None or item.call_id is None:
                continue
            try:
                answer = await self.task.wait_decided(self.call_id(tool["name"], item.call_id), timeout=timeout)
            except CountersignError as error:
                raise CountersignToolError(error) from error
            outcome = answer["decision"]["outcome"]
            if outcome in {"approved", "dispatched"}:
                state.approve(item)
            else:
                state.reject(item, rejection_message=decision_message(answer))
        return state


def decision_message(answer: dict[str, Any]) -> str:
    """What the model reads for a call that will not run: the client's error text, which
    carries the reviewer's reason ("rejected by user:ann: not ours")."""
    try:
        _core.outcome(answer)
    except CallError as error:
        return str(error)
    return f"not run ({answer['decision']['outcome']})"
