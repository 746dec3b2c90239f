"""Workers SIGKILLed during a call of a tool configured as data (16) and of an MCP server's tool
(17): the ledger must end `unknown`, then settle without a second effect, the effects counted at
the provider itself.

Three moments, by trial index:
- 0, before the request left (the `before_provider_call` seam): nothing was sent;
- 1, mid-call: the request reached the provider, its effect committed, the reply held back
  (the payments sandbox's `fault-timeout-after-commit`, the chaos MCP server's "hang" text) —
  the harness releases the worker from the seam, waits until the provider holds the effect, and
  kills the worker while it still waits for the answer;
- 2, after the answer arrived, before it was recorded (the `after_provider_call` seam).

16 `kill-http-tool`: the tool is `http`, POSTing to the payments sandbox with the operation's key
in `Idempotency-Key`, and asking `GET /refunds/by-key/{key}` to reconcile. After the kill the
sweeper marks the operation `unknown`; the status query finds the effect (confirmed, 1 attempt)
or proves there is none once the old request stopped (retry-safe, attempt 2 with the same key:
confirmed). One effect in every case.

17 `kill-mcp-tool`: the tool is a non-idempotent tool of an MCP server (no `idempotentHint`).
MCP cannot be asked about a key, so `unknown` goes to a person: `manual`, never a blind retry.
The server's effects for the trial's own `ref` are 0 (killed before sending) or 1.
"""

from __future__ import annotations

import random
import uuid

from approvals.defaults import REFUND_SCHEMA
from approvals.models import Tool
from approvals.tools import tool_save
from chaos import mcp_upstream
from chaos.invariants import Expect
from chaos.stack import ChaosStack
from chaos.world import Trial, World, kill, order, propose
from console.lib.procs import wait_until
from console.models import Event
from ledger.models import Attempt, Operation, OperationStatus
from sandbox.client import effects as provider_effects

HTTP_REFUND = "chaos.refund-http"
MCP_NOTE = "chaos.note-mcp"
# Longer than the provider's hold after its effect (the stack's hang_seconds, 3 s): the mid-call
# kill has that long to land while the worker still waits for the answer.
CALL_TIMEOUT_SECONDS = 5.0
MOMENTS = ("before-send", "mid-call", "after-reply")

_POLICY = dict(kind=Tool.Kind.WRITE, queue=Tool.Queue.FAST, timeout_seconds=CALL_TIMEOUT_SECONDS, max_attempts=4,
               total_deadline_seconds=300, backoff_base_seconds=0.5, backoff_cap_seconds=4.0, base_tier=1,
               enabled=True, description="Chaos harness tool.")


def http_refund_tool(payments_url: str) -> dict:
    """payments.refund configured as data against this stack's payments sandbox."""
    return {
        **_POLICY, "adapter": "http", "json_schema": REFUND_SCHEMA, "business_key": "order_id",
        "idempotency": Tool.Idempotency.NATIVE, "retryable_errors": ["rate_limited", "unavailable", "connect"],
        "http_method": "POST", "http_url": f"{payments_url}/refunds", "key_header": "Idempotency-Key",
        "status_query": {
            "url": f"{payments_url}/refunds/by-key/{{key}}", "object": "refund",
            "found": {"status": 200, "field": "state", "equals": "succeeded"},
            "processing": {"status": 200, "field": "state", "equals": "processing"},
            "absent": {"status": 404},
        },
        "receipt_fields": {"remote_id": "id", "amount": "amount", "currency": "currency"},
        "result_fields": ["id", "status"],
    }


def mcp_note_tool(mcp_url: str) -> dict:
    """The chaos MCP server's write tool, as `tools_import mcp` would describe it."""
    return {
        **_POLICY, "adapter": "mcp", "mcp_server": mcp_url, "mcp_tool": mcp_upstream.TOOL,
        "idempotency": Tool.Idempotency.NONE, "retryable_errors": ["connect"],
        "json_schema": {"type": "object", "properties": {"ref": {"type": "string"}, "text": {"type": "string"}},
                        "required": ["ref", "text"], "additionalProperties": False},
    }


def ensure_tool(world: World, name: str, fields: dict) -> None:
    """Create or update the tool (through `tool_save`, as the admin does) and allow it to the
    chaos agent. The stack's providers listen on fresh ports each run: the URLs change."""
    tool = Tool.objects.filter(name=name).first() or Tool(name=name)
    current = {field: getattr(tool, field) for field in fields}
    if tool.pk is None or current != fields:
        for field, value in fields.items():
            setattr(tool, field, value)
        tool_save(tool=tool)
    world.agent.allowed_tools.add(tool)


def _kill_mid_call(stack: ChaosStack, operation_id: str, has_effect, trial: Trial) -> bool:
    """Let the worker go from the seam before the call, wait until the provider holds the
    effect, then kill the worker while it waits for the held-back answer. False (and a note)
    when the worker had recorded the answer before the kill landed (a very slow machine)."""
    seam = "before_provider_call"
    pid = stack.wait_blocked(seam, operation_id)
    stack.release(seam, operation_id)
    wait_until(has_effect, timeout=30, what=f"the provider to commit {operation_id}'s effect", interval=0.02)
    kill(pid)
    if Attempt.objects.filter(operation_id=operation_id, finished_at__isnull=False).exists():
        trial.notes.append(f"{operation_id}: the worker recorded its answer before the kill landed")
        return False
    return True


def _kill_at(stack: ChaosStack, seam: str, operation_id: str) -> bool:
    kill(stack.wait_blocked(seam, operation_id))
    return True


def kill_http_tool(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """16. See the module's docstring."""
    ensure_tool(world, HTTP_REFUND, http_refund_tool(stack.payments.base_url))
    moment = MOMENTS[index % len(MOMENTS)]
    seam = {"before-send": "before_provider_call", "mid-call": "before_provider_call",
            "after-reply": "after_provider_call"}[moment]
    order_id = order("fault-timeout-after-commit" if moment == "mid-call" else "ok")
    p = propose(world, tool=HTTP_REFUND, order_id=order_id, before=lambda op: stack.arm(seam, op))
    trial = Trial()
    if moment == "mid-call":
        key = Operation.objects.values_list("idempotency_key", flat=True).get(pk=p.operation_id)
        in_time = _kill_mid_call(stack, p.operation_id,
                                 lambda: bool(provider_effects(stack.payments.base_url, key=key)), trial)
    else:
        in_time = _kill_at(stack, seam, p.operation_id)
    trial.expectations[p.operation_id] = Expect(
        frozenset({OperationStatus.CONFIRMED}), effects=1, attempts=2 if moment == "before-send" else 1,
        extra=_went_unknown if in_time else None)
    return trial


def kill_mcp_tool(stack: ChaosStack, world: World, rng: random.Random, index: int) -> Trial:
    """17. See the module's docstring."""
    ensure_tool(world, MCP_NOTE, mcp_note_tool(stack.mcp_url))
    moment = MOMENTS[index % len(MOMENTS)]
    seam = "after_provider_call" if moment == "after-reply" else "before_provider_call"
    ref = f"note-{uuid.uuid4().hex[:12]}"
    text = f"{mcp_upstream.HANG_PREFIX} chaos" if moment == "mid-call" else "chaos"
    p = propose(world, tool=MCP_NOTE, order_id=ref, arguments={"ref": ref, "text": text},
                before=lambda op: stack.arm(seam, op))
    refs = {p.operation_id: ref}

    def effects(operation: Operation) -> int:
        return mcp_upstream.effects(stack.mcp_effects_path, refs[operation.operation_id])

    trial = Trial(effects=effects)
    if moment == "mid-call":
        in_time = _kill_mid_call(stack, p.operation_id,
                                 lambda: mcp_upstream.effects(stack.mcp_effects_path, ref) > 0, trial)
    else:
        in_time = _kill_at(stack, seam, p.operation_id)
    # Recorded before the kill landed, the answer stands (confirmed); killed, a person decides.
    statuses = {OperationStatus.MANUAL} if in_time else {OperationStatus.CONFIRMED}
    trial.expectations[p.operation_id] = Expect(
        frozenset(statuses), effects=0 if moment == "before-send" else 1, attempts=1,
        extra=_went_unknown if in_time else None)
    return trial


def _went_unknown(operation: Operation, attempts: list[Attempt]) -> list[str]:
    """The kill left the first attempt without an outcome, and the ledger called it unknown."""
    moves = list(Event.objects.filter(entity=Operation.EVENT_ENTITY, entity_id=operation.operation_id)
                 .values_list("to_status", flat=True))
    if OperationStatus.UNKNOWN not in moves:
        return [f"never went unknown after the kill (moves: {moves})"]
    return []
