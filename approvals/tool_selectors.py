"""Reads for the tool page: a tool's configuration as a person may see it, the tier rules that
gate it, and its recent operations.

Tools are shared configuration (the admin writes them for every tenant); what the page shows
of their use — which agents are allowed the tool, which operations called it — is limited to
the viewer's own tenants. A credential is shown by its reference (the name of the environment
variable the worker reads), never by value; a static header's value is shown only for headers
that never carry one (content negotiation), the others by name alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from approvals.models import PolicyTier, Stop, Tool
from approvals.stops import active_stop
from approvals.tools import BUILT_IN, HTTP_ADAPTER, MCP_ADAPTER, upstream_of
from console.models import AgentPrincipal, Tenant
from ledger.models import Operation

RECENT_OPERATIONS = 20
# Static headers whose value is shown; any other header's value might be a secret someone
# pasted in spite of the help text, so only its name is.
SHOWN_HEADER_VALUES = frozenset({"accept", "accept-language", "accept-encoding", "user-agent", "x-api-version"})
HIDDEN = "(value not shown)"


@dataclass(frozen=True)
class Row:
    label: str
    value: str
    block: bool = False  # pre-formatted (JSON)
    muted: bool = False  # an explanation, not a configured value


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def adapter_label(tool: Tool) -> str:
    if tool.adapter == HTTP_ADAPTER:
        return "http (configured as data)"
    if tool.adapter == MCP_ADAPTER:
        return "mcp (a tool of an MCP server)"
    return f"{tool.adapter} ({BUILT_IN})"


def header_rows(headers: Any) -> list[Row]:
    if not isinstance(headers, dict):
        return []
    return [Row(f"Header {name}", str(value) if name.lower() in SHOWN_HEADER_VALUES else HIDDEN,
                muted=name.lower() not in SHOWN_HEADER_VALUES)
            for name, value in sorted(headers.items())]


def _key_placement(tool: Tool) -> Row:
    key = (f"the business key {tool.idempotency_key_template}" if tool.idempotency_key_template
           else "the operation ID")
    if tool.adapter == HTTP_ADAPTER:
        where = f"header {tool.key_header}" if tool.key_header else "not sent (no key header)"
        return Row("Idempotency key", f"{where}; value: {key}")
    if tool.adapter == MCP_ADAPTER:
        return Row("Idempotency key", f"not sent to the MCP server (MCP has no key); {key} names the operation")
    return Row("Idempotency key", f"{key}, sent the adapter's way")


def _credential(tool: Tool) -> Row:
    if not tool.credential_ref:
        return Row("Credential", "none", muted=True)
    if tool.adapter == MCP_ADAPTER and not upstream_of(tool).startswith(("http://", "https://")):
        return Row("Credential", f"environment variable {tool.credential_ref} of the command")
    scheme = f"{tool.credential_scheme} " if tool.credential_scheme else ""
    return Row("Credential", f"header {tool.credential_header}: {scheme}${tool.credential_ref} (by reference)")


def configuration(tool: Tool) -> list[Row]:
    """The tool's configuration, row by row, secrets left out."""
    rows = [
        Row("Adapter", adapter_label(tool)),
        Row("Upstream", upstream_of(tool)),
        Row("Kind", tool.get_kind_display()),
        Row("Idempotency", tool.get_idempotency_display()),
        _key_placement(tool),
    ]
    if tool.business_key:
        rows.append(Row("Business key", f"argument {tool.business_key} (one operation on it at a time)"))
    if tool.adapter == HTTP_ADAPTER:
        rows += [Row("Method", tool.http_method), Row("URL template", tool.http_url),
                 *header_rows(tool.http_headers), _credential(tool),
                 Row("Status query", _json(tool.status_query), block=True) if tool.status_query
                 else Row("Status query", "none: the provider cannot be asked by key", muted=True)]
    elif tool.adapter == MCP_ADAPTER:
        rows += [Row("MCP server", upstream_of(tool)), Row("MCP tool", tool.mcp_tool), _credential(tool)]
    if tool.adapter in (HTTP_ADAPTER, MCP_ADAPTER):
        rows += [
            Row("Receipt fields", _json(tool.receipt_fields), block=True) if tool.receipt_fields
            else Row("Receipt fields", "none", muted=True),
            Row("Result fields", ", ".join(tool.result_fields)) if tool.result_fields
            else Row("Result fields", "the whole answer", muted=True),
        ]
    rows += [
        Row("Timeout", f"{tool.timeout_seconds:g} s"),
        Row("Retryable classes", ", ".join(tool.retryable_errors) if tool.retryable_errors else "none"),
        Row("Attempts", f"at most {tool.max_attempts}, within {tool.total_deadline_seconds} s; backoff "
                        f"{tool.backoff_base_seconds:g} s up to {tool.backoff_cap_seconds:g} s"),
        Row("Queue", tool.queue),
        Row("Schema version", str(tool.schema_version)),
    ]
    return rows


@dataclass(frozen=True)
class TenantUse:
    tenant: Tenant
    agents: list[str]
    stop: Stop | None  # a stop in force over the tool (or the whole tenant) there


def tenant_uses(tool: Tool, tenant_ids: set[int]) -> list[TenantUse]:
    """For each of the viewer's tenants: the agents allowed this tool, and the stop in force
    over it there, if any."""
    agents: dict[int, list[str]] = {}
    for tenant_id, name in (AgentPrincipal.objects.filter(tenant_id__in=tenant_ids, allowed_tools=tool)
                            .order_by("name").values_list("tenant_id", "name")):
        agents.setdefault(tenant_id, []).append(name)
    return [TenantUse(tenant, agents.get(tenant.pk, []), active_stop(tenant_id=tenant.pk, tool_id=tool.pk))
            for tenant in Tenant.objects.filter(pk__in=tenant_ids).order_by("name")]


def tier_rules(tool: Tool) -> dict[str, Any]:
    tiers = {tier.level: tier for tier in PolicyTier.objects.all()}
    rules = list(tool.escalation_rules.order_by("tier", "pk"))
    return {
        "base_tier": tool.base_tier,
        "base_policy": tiers.get(tool.base_tier),
        "escalations": [(rule, tiers.get(rule.tier)) for rule in rules],
    }


def recent_operations(tool: Tool, tenant_ids: set[int]) -> list[Operation]:
    return list(Operation.objects.filter(tool=tool, tenant_id__in=tenant_ids)
                .select_related("tenant").order_by("-created_at", "-operation_id")[:RECENT_OPERATIONS])


def tool_page(tool: Tool, tenant_ids: set[int]) -> dict[str, Any]:
    return {
        "tool": tool,
        "configuration": configuration(tool),
        "schema": _json(tool.json_schema),
        "tenant_uses": tenant_uses(tool, tenant_ids),
        "operations": recent_operations(tool, tenant_ids),
        **tier_rules(tool),
    }
