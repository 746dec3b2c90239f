"""Tool adapters. A Tool row names its adapter: a built-in one, whose code talks to its provider
here, or `http` / `mcp`, a tool described by data whose adapter is built from the row itself."""

from __future__ import annotations

from approvals.models import Tool
from approvals.tools import HTTP_ADAPTER, MCP_ADAPTER
from ledger.adapters.base import Adapter
from ledger.adapters.configured import HttpToolAdapter
from ledger.adapters.mail import MailAdapter
from ledger.adapters.noop import NoopAdapter
from ledger.adapters.payments import OrderLookupAdapter, RefundAdapter

ADAPTERS: dict[str, Adapter] = {
    adapter.name: adapter
    for adapter in (RefundAdapter(), OrderLookupAdapter(), MailAdapter(), NoopAdapter())
}


def get_adapter(name: str) -> Adapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise LookupError(f"No adapter named {name!r}; known: {', '.join(sorted(ADAPTERS))}"
                          f" (and {HTTP_ADAPTER!r} and {MCP_ADAPTER!r}, configured per tool)") from None


def adapter_for(tool: Tool) -> Adapter:
    """The adapter that executes this tool: built from its configuration for `http` and `mcp`."""
    if tool.adapter == HTTP_ADAPTER:
        return HttpToolAdapter(tool)
    if tool.adapter == MCP_ADAPTER:
        # Imported here: the MCP SDK takes about a second to import, which every process (a
        # worker, a management command, a test's subprocess) would pay at start-up for tools
        # that most deployments never configure.
        from ledger.adapters.mcp import McpToolAdapter

        return McpToolAdapter(tool)
    return get_adapter(tool.adapter)
