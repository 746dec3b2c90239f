"""A tool of an MCP server (adapter `mcp`): one adapter instance per Tool row.

Each call opens a session with the server (streamable HTTP for a URL, a subprocess speaking stdio
for a command line), sends one `tools/call` and classifies what came back into the four facts:

- no session (refused, the command does not start, the handshake fails): `not sent`, since no
  `tools/call` left;
- a result with `isError`: a known failure (the tool ran and said no);
- a JSON-RPC error that rejects the request before the tool runs (invalid request, unknown
  method, invalid params): a known failure;
- a timeout, a dropped session, any other error once `tools/call` was sent: `unknown`.

MCP has no idempotency key. The operation's key is sent in the request's `_meta`
(`countersign/idempotency_key`) for servers that can use it, but nothing relies on it: an
`unknown` write goes to a person unless the tool is idempotent (`idempotency` native, from the
server's `idempotentHint`), in which case calling it again is what the server itself declares
harmless. The credential is read by name at call time: sent as a header to a URL, or set as the
environment variable of that name for a command.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
)

from approvals.mcp_import import mcp_client
from approvals.models import Tool
from approvals.tools import credential
from ledger.adapters.base import (
    ABSENT,
    ERROR,
    Outcome,
    QueryAnswer,
    known_failure,
    known_success,
    not_sent,
    unknown,
)
from ledger.adapters.configured import picked_receipt, picked_result

KEY_META = "countersign/idempotency_key"
# JSON-RPC errors that say the request was refused as such, before any tool code ran.
REJECTED = frozenset({INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS})
# Beyond the call's own timeout: the handshake and closing the session (DELETE, or stopping a
# subprocess). Less than the default DISPATCH_GRACE_SECONDS.
CLOSE_GRACE_SECONDS = 5.0


class _NotConnected(Exception):
    """The session could not be opened: no `tools/call` was sent."""


def connect(tool: Tool, *, timeout: float) -> Client:
    """A client for the tool's server, its credential attached; raises LookupError naming a
    missing credential."""
    secret = None
    if tool.credential_ref:
        secret = credential(tool.credential_ref)
        if secret is None:
            raise LookupError(f"the credential {tool.credential_ref} is not set in the worker's environment")
    return mcp_client(tool.mcp_server, timeout=timeout, credential_ref=tool.credential_ref, secret=secret,
                      credential_header=tool.credential_header, credential_scheme=tool.credential_scheme)


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def structured(result: Any) -> Any:
    """The tool's answer as data: its structured content, else its one text block read as JSON,
    else the text blocks."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [block.text for block in result.content if getattr(block, "type", "") == "text"]
    if len(texts) == 1:
        try:
            return json.loads(texts[0])
        except ValueError:
            return {"text": texts[0]}
    return {"content": [block.model_dump(mode="json") for block in result.content]}


class McpToolAdapter:
    name = "mcp"

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        # Only a tool the server declares idempotent may be called again after an `unknown`.
        self.can_query = tool.idempotency == Tool.Idempotency.NATIVE

    def execute(self, arguments: dict[str, Any], *, key: str, timeout: float) -> Outcome:
        try:
            client = connect(self.tool, timeout=timeout)
        except LookupError as exc:
            return not_sent("credential_missing", transport="none", code="credential", raw={"error": str(exc)})
        except ValueError as exc:
            return not_sent("request_invalid", transport="none", code="server", raw={"error": str(exc)})
        state: dict[str, Any] = {"sent": False, "result": None}
        try:
            anyio.run(self._call, client, arguments, key, timeout, state)
        except BaseException as caught:  # noqa: BLE001 - every failure is classified below
            exc = _leaf(caught)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            if state["result"] is None:
                return self._failure(exc, sent=state["sent"])
            # The answer arrived; only closing the session failed. The answer stands.
        result = state["result"]
        body = structured(result)
        if result.is_error:
            return known_failure("tool_error", code="isError", raw={"mcp_tool": self.tool.mcp_tool, "result": body})
        receipt = picked_receipt(body, self.tool.receipt_fields, {"provider": self.tool.name, "mcp_tool": self.tool.mcp_tool})
        return known_success(receipt=receipt, result=picked_result(body, self.tool.result_fields), code="ok",
                             raw={"mcp_tool": self.tool.mcp_tool, "result": body})

    async def _call(self, client: Client, arguments: dict[str, Any], key: str, timeout: float,
                    state: dict[str, Any]) -> None:
        # The whole exchange (handshake, call, closing) ends within timeout + CLOSE_GRACE_SECONDS,
        # inside the dispatch deadline (claim + timeout + DISPATCH_GRACE_SECONDS): a server that
        # neither answers nor lets go cannot hold the worker past the point where the sweeper
        # declares the dispatch lost. Past it, a call that was sent is unknown, like a timeout.
        with anyio.fail_after(timeout + CLOSE_GRACE_SECONDS):
            try:
                async with client:
                    state["sent"] = True
                    state["result"] = await client.call_tool(
                        self.tool.mcp_tool, arguments, read_timeout_seconds=timeout, meta={KEY_META: key})
            except Exception as exc:
                if not state["sent"]:
                    raise _NotConnected(f"{type(_leaf(exc)).__name__}: {_leaf(exc)}") from exc
                raise

    def _failure(self, exc: BaseException, *, sent: bool) -> Outcome:
        raw = {"mcp_tool": self.tool.mcp_tool, "error": f"{type(exc).__name__}: {exc}"}
        if isinstance(exc, _NotConnected) or not sent:
            return not_sent("connect", transport="connect_error", code="session", raw=raw)
        if isinstance(exc, MCPError):
            if exc.code in REJECTED:
                return known_failure("validation", code=str(exc.code), raw=raw)
            if exc.code == REQUEST_TIMEOUT:
                return unknown("timeout", transport="timeout", code="timeout", raw=raw)
            if exc.code == CONNECTION_CLOSED:
                return unknown("reset", transport="reset", code="connection_closed", raw=raw)
            return unknown("server_error", transport="ok", code=str(exc.code), raw=raw)
        if isinstance(exc, TimeoutError):
            return unknown("timeout", transport="timeout", code=type(exc).__name__, raw=raw)
        return unknown("reset", transport="reset", code=type(exc).__name__, raw=raw)

    def query(self, *, key: str, timeout: float) -> QueryAnswer:
        # MCP cannot be asked about a key. A tool its server declares idempotent may simply be
        # called again: to the reconciler that reads as "nothing to find, safe to send".
        if self.can_query:
            return QueryAnswer(ABSENT, raw={"idempotent_hint": True,
                                            "why": "the server declares the tool idempotent; calling again is harmless"})
        return QueryAnswer(ERROR, raw={"error": "an MCP server cannot be asked about a key"})

    def preview(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        return {"kind": "mcp", "summary": f"tools/call {self.tool.mcp_tool} at {self.tool.mcp_server.split()[0]}"}
