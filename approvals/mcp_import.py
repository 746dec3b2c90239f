"""Tools of an MCP server as Countersign tools (`tools_import mcp`), and the one way a client
for an MCP server is built (the import lists with it; the ledger's `mcp` adapter calls with it).

One tool per tool the server lists, named `<prefix>.<name>`, read from its annotations as the
MCP specification defines them (hints, not guarantees, from a server the administrator chose):

- `readOnlyHint` true: a read at L1;
- otherwise a write: at L3 when `destructiveHint` is true *or absent* (the specification's
  default for a tool that is not read-only), at L2 when the server says false;
- `idempotentHint` true on a write: native idempotency, i.e. calling it again after an
  `unknown` is harmless; otherwise an `unknown` goes to a person, never a blind retry;
- `inputSchema` as the tool's JSON Schema.
"""

from __future__ import annotations

import re
import shlex
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from approvals.models import Tool
from approvals.openapi import Imported
from approvals.tools import MCP_ADAPTER
from console.models import RiskTier

TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# Errors of an attempt that never reached the tool; anything after the session opened is
# classified by the adapter and is not retried blindly.
RETRYABLE = ["connect"]


class McpImportError(ValueError):
    pass


def is_url(server: str) -> bool:
    return server.startswith(("http://", "https://"))


def mcp_client(server: str, *, timeout: float, credential_ref: str = "", secret: str | None = None,
               credential_header: str = "Authorization", credential_scheme: str = "Bearer") -> Client:
    """A client for a streamable HTTP URL or a stdio command line. The credential is sent as a
    header to a URL, or set as the environment variable `credential_ref` of the command."""
    server = server.strip()
    if is_url(server):
        headers = {}
        if secret is not None:
            if any(ch in secret for ch in "\r\n\0"):
                raise ValueError(f"the credential {credential_ref} is not a valid header value")
            headers[credential_header] = f"{credential_scheme} {secret}".strip()
        transport = _http_transport(server, headers=headers, timeout=timeout)
    else:
        command, *args = shlex.split(server)
        env = {credential_ref: secret} if secret is not None else None
        transport = stdio_client(StdioServerParameters(command=command, args=args, env=env))
    return Client(transport, read_timeout_seconds=timeout, mode="legacy", cache=None)


@asynccontextmanager
async def _http_transport(server: str, *, headers: dict[str, str], timeout: float):
    # The SDK's documented way to set headers is an HTTP client of our own, which it then does
    # not close: closed here, with the session.
    async with (httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(timeout)) as http,
                streamable_http_client(server, http_client=http) as streams):
        yield streams


def list_server_tools(client: Client, *, timeout: float) -> list[Any]:
    """Every tool the server lists, page by page."""

    async def listing() -> list[Any]:
        tools: list[Any] = []
        with anyio.fail_after(timeout * 4):
            async with client:
                cursor = None
                for _page in range(100):
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        return tools

    try:
        return anyio.run(listing)
    except BaseException as caught:  # noqa: BLE001 - reported to the administrator
        exc = caught
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise McpImportError(f"cannot list the server's tools: {type(exc).__name__}: {exc}") from exc


def tools_from_listing(listed: list[Any], *, prefix: str, server: str, tier: int | None = None,
                       timeout: float = 10.0, credential_ref: str = "") -> Imported:
    imported = Imported()
    for tool in listed:
        name = tool.name
        if not TOOL_NAME.fullmatch(name):
            imported.skipped.append((name, "the name is not letters, digits, '.', '_' or '-' (at most 64)"))
            continue
        schema = tool.input_schema or {"type": "object"}
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            imported.skipped.append((name, f"the input schema is not valid JSON Schema: {exc.message}"))
            continue
        hints = tool.annotations
        read_only = bool(hints and hints.read_only_hint)
        destructive = not read_only and (hints is None or hints.destructive_hint is not False)
        idempotent = not read_only and bool(hints and hints.idempotent_hint)
        default_tier = RiskTier.L1 if read_only else (RiskTier.L3 if destructive else RiskTier.L2)
        imported.tools.append({
            "name": f"{prefix}.{name}",
            "description": (tool.description or tool.title or "")[:2000],
            "adapter": MCP_ADAPTER,
            "mcp_server": server,
            "mcp_tool": name,
            "json_schema": schema,
            "kind": Tool.Kind.READ if read_only else Tool.Kind.WRITE,
            "base_tier": tier if tier is not None else default_tier,
            "idempotency": Tool.Idempotency.NATIVE if idempotent else Tool.Idempotency.NONE,
            "queue": Tool.Queue.FAST,
            "timeout_seconds": timeout,
            "retryable_errors": list(RETRYABLE),
            "max_attempts": 3 if read_only else 4,
            "credential_ref": credential_ref,
            "receipt_fields": {},
            "result_fields": [],
        })
    return imported
