"""Countersign as an MCP server: `/mcp`, streamable HTTP, for agents whose framework speaks MCP.

The same contract as the HTTP API (docs/agents.md), through the same service functions:

- Authentication is the agent's bearer token (`console.api.principal_for_authorization`); no
  token or an unknown one is a 401 before the MCP layer sees the request, and each request
  counts against the token's and the tenant's rate limit (429) as the API's do. A session is bound
  to the agent that opened it: another token presenting its ID gets 404.
- `tools/list` is `GET /api/v1/tools` (enabled tools allowed for this agent) with `.` in names
  turned into `_` (function-calling models allow `[a-zA-Z0-9_-]`), the base tier in the
  description, plus `countersign_wait`.
- One MCP session is one task: started on the first `tools/call` by `ledger.starts.task_start`
  with the Idempotency-Key `mcp:<session ID>` and a lease owned by the session, so it is found
  again, never doubled, if two first calls race.
- `tools/call` is `ledger.proposals.call_propose` with call ID and step ID derived from the
  JSON-RPC request id (`_call_id`). MCP requires request ids to be unique within a session,
  and a client that retries a request (a broken connection, a resumed stream) resends it with
  its id: so a retry is a repeat of the same call, answered from the ledger, and one request is
  at most one operation. A hash of tool, arguments and a counter would need a counter the
  server can recompute on a retry, which it cannot, and two identical requests that the model
  meant as two calls would become one.
- The answer waits (bounded) on the same doorbell as `GET /calls/{id}?wait=`
  (`ledger.longpoll.wait_for_change`): a call the gate runs is answered with its result, a call held
  for a person with "awaiting approval" (call ID, approval page) after a short wait;
  `countersign_wait` waits for it again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from rest_framework.renderers import JSONRenderer
from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from approvals.models import Tool
from console.api import error_body, principal_for_authorization
from console.lib.errors import Conflict, DomainError, RateLimited
from console.models import AgentPrincipal
from console.ratelimit import rate_limit_hit
from ledger import request_dispatch
from ledger.answers import answer_json
from ledger.longpoll import db_hop, wait_for_change
from ledger.proposals import MAX_CALL_ID, Proposal, call_propose
from ledger.selectors import WAIT_ENDS, Outcome, call_detail, call_for_principal, call_status
from ledger.starts import task_start

PATH = "/mcp"
WAIT_TOOL = "countersign_wait"
# A call the gate runs is answered with its result if it has one within this long; a call held
# for a person is answered "awaiting approval" after APPROVAL_WAIT_SECONDS (a quick reviewer's
# answer still comes back in the same tool result). countersign_wait waits at most
# MAX_WAIT_SECONDS per call: MCP clients time requests out (the SDK's default is 60 s).
RESULT_WAIT_SECONDS = 20.0
APPROVAL_WAIT_SECONDS = 5.0
MAX_WAIT_SECONDS = 50.0
LEASE_TTL_SECONDS = 3600
SESSION_MEMORY = 10_000

PRINCIPAL_KEY = "countersign.principal"
SESSION_HEADER = "mcp-session-id"


def mcp_name(tool_name: str) -> str:
    return tool_name.replace(".", "_")


def _call_id(request_id: int | str) -> str:
    call_id = f"mcp-{request_id}"
    if len(call_id) <= MAX_CALL_ID and call_id.isprintable():
        return call_id
    return "mcp-" + hashlib.sha256(str(request_id).encode()).hexdigest()[:40]


# --- the session's task ----------------------------------------------------------------------


@dataclass(frozen=True)
class _SessionTask:
    task_id: str
    version: int
    fencing_token: int


def _start_task(principal: AgentPrincipal, session_id: str) -> _SessionTask:
    key = f"mcp:{session_id}"
    start = task_start(
        principal=principal, idempotency_key=key,
        contract={"task_type": "mcp", "goal": f"MCP session {session_id}", "inputs": {"mcp_session_id": session_id}},
        lease={"owner": key, "ttl_seconds": LEASE_TTL_SECONDS},
    )
    return _SessionTask(task_id=start.task.task_id, version=start.task.version,
                        fencing_token=start.lease.fencing_token)


class _Sessions:
    """The task of each MCP session this process serves (sessions live in one process: the
    SDK's session manager keeps them in memory). A parallel first call of a session waits for
    the start under the session's lock instead of taking the lease again, which would give the
    other call a stale fencing token."""

    def __init__(self) -> None:
        self.tasks: OrderedDict[str, _SessionTask] = OrderedDict()
        self.locks: dict[str, asyncio.Lock] = {}

    async def task(self, principal: AgentPrincipal, session_id: str, *, stale: _SessionTask | None = None) -> _SessionTask:
        lock = self.locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            known = self.tasks.get(session_id)
            if known is not None and known != stale:
                return known
            # The key finds the same task; the same owner re-takes its lease (a new token).
            task = await db_hop(_start_task)(principal, session_id)
            self.tasks[session_id] = task
            self.tasks.move_to_end(session_id)
            while len(self.tasks) > SESSION_MEMORY:
                old, _ = self.tasks.popitem(last=False)
                self.locks.pop(old, None)
            return task

    def known(self, session_id: str) -> _SessionTask | None:
        return self.tasks.get(session_id)


# --- reading and waiting ---------------------------------------------------------------------


def _call_state(principal: AgentPrincipal, call_id: str, task_id: str) -> tuple[int, str, str | None]:
    """The call, its status and its operation, read with it (one query: no detail is built to wait)."""
    call = call_for_principal(principal=principal, call_id=call_id, task_id=task_id)
    return call.pk, call_status(call), call.operation_id


def _call_body(principal: AgentPrincipal, call_id: str, task_id: str, base_url: str) -> dict[str, Any]:
    call = call_for_principal(principal=principal, call_id=call_id, task_id=task_id)
    return answer_json(call_detail(call), base_url=base_url)


async def _wait(principal: AgentPrincipal, call_id: str, task_id: str, seconds: float) -> None:
    """Until the call is final (or waits for a person: `manual`) or `seconds` have passed, woken
    by committed events: one read of the call, then one watch that only those statuses answer
    (the statuses on the way, such as `dispatched`, wake nothing)."""
    if seconds <= 0:
        return
    call_pk, status, operation_id = await db_hop(_call_state)(principal, call_id, task_id)
    if status in WAIT_ENDS:
        return
    await wait_for_change(call_pk, status, seconds, until=WAIT_ENDS, operation_id=operation_id)


def _propose_and_dispatch(**proposal: Any) -> Proposal:
    """The proposal; a call the gate runs at once is then dispatched in this thread, as the
    agent waits for it (`ledger.request_dispatch`). One thread holds the slot until the dispatch
    ends, whatever happens to the agent's request meanwhile."""
    with request_dispatch.slot() as free:
        answer = call_propose(**proposal, dispatch_here=free)
        if answer.dispatch_here:
            request_dispatch.dispatch(answer.operation_id, answer.claim)
    return answer


def _result(body: dict[str, Any]) -> types.CallToolResult:
    """A final call: its result (confirmed) or an error with the reason; a call still waiting
    for a person: "awaiting approval"; one still running: "pending"."""
    decision = body.get("decision") or {}
    if body.get("final"):
        if body["status"] == "confirmed":
            text = json.dumps({"call_id": body["call_id"], "result": body.get("result"),
                               "receipt": body.get("receipt")})
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                        structured_content=body, is_error=False)
        reason = decision.get("reason") or "; ".join(body.get("reasons") or []) or body.get("last_error") or ""
        text = f"Call {body['call_id']} {decision.get('outcome') or body['status']} ({body['status']})"
        text += f": {reason}" if reason else "."
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structured_content=body, is_error=True)
    if decision.get("outcome") == Outcome.AWAITING_APPROVAL:
        summary = {"awaiting_approval": True, "call_id": body["call_id"], "approval_url": decision.get("url"),
                   "approval_id": (body.get("approval") or {}).get("approval_id"),
                   "expires_at": decision.get("expires_at"), "risk_tier": body.get("risk_tier"),
                   "reasons": body.get("reasons") or [], "call": body}
        text = (f"Call {body['call_id']} is awaiting a person's approval ({decision.get('url')}). "
                f"Call {WAIT_TOOL} with this call_id to wait for the decision and the result.")
    else:
        summary = {"pending": True, "call_id": body["call_id"], "status": body["status"], "call": body}
        text = (f"Call {body['call_id']} is {body['status']}; its outcome is not known yet. "
                f"Call {WAIT_TOOL} with this call_id to wait for it.")
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=summary, is_error=False)


def _error(exc: DomainError) -> types.CallToolResult:
    body = error_body(exc.code, exc.message, exc.details)
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"{exc.code}: {exc.message}")],
                                structured_content=json.loads(JSONRenderer().render(body)), is_error=True)


def _text_error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


# --- the MCP handlers ------------------------------------------------------------------------

WAIT_SCHEMA = {
    "type": "object",
    "properties": {
        "call_id": {"type": "string", "description": "The call_id of an awaiting or pending result."},
        "timeout_seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_SECONDS,
                            "description": f"How long to wait for the decision and the result (at most "
                                           f"{MAX_WAIT_SECONDS:g} s)."},
    },
    "required": ["call_id"],
    "additionalProperties": False,
}


def _allowed_tools(principal: AgentPrincipal) -> dict[str, Tool]:
    # The query of GET /api/v1/tools (approvals.api.ToolListApi).
    tools: dict[str, Tool] = {}
    for tool in Tool.objects.filter(enabled=True, agents=principal).order_by("name"):
        tools.setdefault(mcp_name(tool.name), tool)  # `a.b` and `a_b` both: the first by name
    return tools


def _describe(tool: Tool) -> str:
    tier = (f"Countersign risk tier L{tool.base_tier} before escalation rules on the arguments; a call "
            f"above the tier the policy runs at once waits for a person's approval (then use {WAIT_TOOL}).")
    return f"{tool.description} {tier}".strip()


async def _no_discover(ctx, params) -> types.DiscoverResult:
    raise MCPError(types.METHOD_NOT_FOUND, "server/discover: this server speaks the initialize handshake only")


class McpServer:
    """The MCP handlers and the ASGI app mounted at /mcp (`console.asgi`)."""

    def __init__(self) -> None:
        self.sessions = _Sessions()
        self.server = Server("countersign", on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        # A session is a task here, so only the initialize handshake (which opens one) will do.
        # Answering `server/discover` would let a client choose the sessionless protocol, whose
        # tool calls could belong to no task; refused, every client falls back to the handshake.
        self.server.add_request_handler("server/discover", types.RequestParams, _no_discover)
        self.manager = StreamableHTTPSessionManager(app=self.server)

    # -- handlers

    @staticmethod
    def _facts(ctx) -> tuple[AgentPrincipal, str | None, str]:
        request = ctx.request
        return request.scope[PRINCIPAL_KEY], request.headers.get(SESSION_HEADER), str(request.base_url)

    async def _list_tools(self, ctx, params) -> types.ListToolsResult:
        principal, _, _ = self._facts(ctx)
        tools = await db_hop(_allowed_tools)(principal)
        listed = [types.Tool(name=name, description=_describe(tool), input_schema=tool.json_schema)
                  for name, tool in tools.items()]
        listed.append(types.Tool(
            name=WAIT_TOOL, input_schema=WAIT_SCHEMA,
            description="Wait for the decision on a call that awaits approval (or is still running), "
                        "and get its result."))
        return types.ListToolsResult(tools=listed)

    async def _call_tool(self, ctx, params) -> types.CallToolResult:
        principal, session_id, base_url = self._facts(ctx)
        if session_id is None:
            return _text_error("Countersign's MCP tools need a session (initialize first).")
        arguments = dict(params.arguments or {})
        if params.name == WAIT_TOOL:
            return await self._wait_tool(principal, session_id, base_url, arguments)
        tools = await db_hop(_allowed_tools)(principal)
        tool = tools.get(params.name)
        if tool is None:
            return _text_error(f"No tool {params.name!r} for this agent.")
        call_id = _call_id(ctx.request_id)
        try:
            task = await self.sessions.task(principal, session_id)
            try:
                proposal = await self._propose(principal, task, call_id, tool.name, arguments)
            except Conflict:
                # The lease lapsed or was taken: take it again (same owner) and propose once more.
                # A call already recorded is answered from the ledger before any token check.
                task = await self.sessions.task(principal, session_id, stale=task)
                proposal = await self._propose(principal, task, call_id, tool.name, arguments)
            wait = (APPROVAL_WAIT_SECONDS if proposal.outcome.outcome == Outcome.AWAITING_APPROVAL
                    else RESULT_WAIT_SECONDS)
            await _wait(principal, call_id, task.task_id, wait)
            return _result(await db_hop(_call_body)(principal, call_id, task.task_id, base_url))
        except DomainError as exc:
            return _error(exc)

    @staticmethod
    async def _propose(principal: AgentPrincipal, task: _SessionTask, call_id: str, tool_name: str,
                       arguments: dict[str, Any]):
        return await db_hop(_propose_and_dispatch)(
            principal=principal, task_id=task.task_id, call_id=call_id, step_id=call_id, tool_name=tool_name,
            arguments=arguments, expected_version=task.version, fencing_token=task.fencing_token)

    async def _wait_tool(self, principal: AgentPrincipal, session_id: str, base_url: str,
                         arguments: dict[str, Any]) -> types.CallToolResult:
        call_id = arguments.get("call_id")
        timeout = arguments.get("timeout_seconds", 30)
        if not isinstance(call_id, str) or not call_id:
            return _text_error("call_id: a string, the call_id of an earlier result.")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout:
            return _text_error(f"timeout_seconds: a number of seconds from 0 to {MAX_WAIT_SECONDS:g}.")
        task = self.sessions.known(session_id)
        if task is None:
            task = await self.sessions.task(principal, session_id)
        try:
            await _wait(principal, call_id, task.task_id, min(float(timeout), MAX_WAIT_SECONDS))
            return _result(await db_hop(_call_body)(principal, call_id, task.task_id, base_url))
        except DomainError as exc:
            return _error(exc)

    # -- ASGI

    async def __call__(self, scope, receive, send) -> None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        domain, _ = split_domain_port(host)
        if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
            # Django checks ALLOWED_HOSTS for its own views; this app is not one of them.
            await JSONResponse(error_body("bad_request", "Invalid Host header."), status_code=400)(
                scope, receive, send)
            return
        header = headers.get("authorization", "")
        principal = await db_hop(principal_for_authorization)(header) if header else None
        if principal is None:
            message = ("Authentication credentials were not provided." if not header else
                       "Use 'Authorization: Bearer <token>' with a known, active agent token.")
            await JSONResponse(error_body("unauthenticated", message), status_code=401,
                               headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        try:
            # Counted like the HTTP API's requests (console/ratelimit.py): one per HTTP request.
            await db_hop(rate_limit_hit)(principal)
        except RateLimited as exc:
            await JSONResponse(error_body(exc.code, exc.message, exc.details), status_code=exc.status,
                               headers={"Retry-After": str(exc.retry_after)})(scope, receive, send)
            return
        # The SDK binds a session to the credential that opened it (another agent's token
        # presenting its ID is answered 404): the agent is the credential.
        user = AuthenticatedUser(AccessToken(token=f"agent:{principal.pk}", client_id=f"agent:{principal.pk}",
                                             scopes=[]))
        await self.manager.handle_request({**scope, PRINCIPAL_KEY: principal, "user": user}, receive, send)

    def lifespan(self, inner):
        """The ASGI lifespan `inner`, with the session manager running for as long as it does
        (its task group holds the sessions)."""
        async def lifespan(scope, receive, send) -> None:
            async with self.manager.run():
                await inner(scope, receive, send)

        return lifespan


def is_mcp_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")

