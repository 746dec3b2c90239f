"""Tools as configuration: the check of a tool's configuration, and every save of a tool.

A tool whose adapter is `http` is described by data (method, URL template, headers, where the
operation's key goes, the status query, the receipt and result fields); the ledger's configured
adapter (`ledger.adapters.configured`) executes it. The configuration is checked here, where it
is saved — by the admin form, the OpenAPI import, anything — so a template naming an argument the
schema lacks is refused when typed, not found at the first call.

`tool_save` is the one place a tool is written: a change of the schema or of the request's shape
bumps `schema_version`, so approvals given under the old one are re-checked by the dispatcher
(an approval binds the exact call a reviewer saw; another URL or body is another call).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from approvals.models import HttpMethod, Tool
from console.lib import urltemplate
from console.lib.errors import InvalidInput
from console.models import AgentPrincipal, Tenant

HTTP_ADAPTER = "http"
MCP_ADAPTER = "mcp"

# What makes the call the call: a change to any of these is a new schema version.
REQUEST_SHAPE_FIELDS = ("adapter", "json_schema", "http_method", "http_url", "http_headers", "key_header",
                        "mcp_server", "mcp_tool")

# Methods whose request carries the arguments the URL does not name as a JSON body; the others
# put them in the query.
BODY_METHODS = frozenset({HttpMethod.POST, HttpMethod.PUT, HttpMethod.PATCH})

STATUS_STATES = ("found", "processing", "absent")
SCALAR_TYPES = frozenset({"string", "number", "integer", "boolean"})
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
REFERENCE_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,99}")
PATH = re.compile(r"[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*")
# Set by Countersign or the HTTP client; a static header must not override them.
RESERVED_HEADERS = frozenset({"host", "content-length", "content-type", "transfer-encoding", "connection"})


def tool_config_errors(tool: Tool) -> dict[str, list[str]]:
    """Every problem of the tool's configuration, by field name (empty: it may be saved)."""
    errors: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    schema = tool.json_schema
    properties: dict[str, Any] = {}
    if not isinstance(schema, dict):
        add("json_schema", "The schema must be a JSON object.")
    else:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            add("json_schema", f"Not a valid JSON Schema: {exc.message}")
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}

    if tool.adapter != MCP_ADAPTER and (tool.mcp_server or tool.mcp_tool):
        add("mcp_server", f"Only a tool whose adapter is {MCP_ADAPTER!r} names an MCP server.")
    if tool.adapter == MCP_ADAPTER:
        _check_mcp(tool, add)
    if tool.adapter != HTTP_ADAPTER:
        if tool.http_url or tool.http_method:
            add("http_url", f"Only a tool whose adapter is {HTTP_ADAPTER!r} is sent by a URL template.")
        return errors

    if not tool.http_method:
        add("http_method", "An HTTP tool needs a method.")
    try:
        template = urltemplate.parse(tool.http_url or "")
    except urltemplate.TemplateError as exc:
        add("http_url", str(exc))
    else:
        for name in template.names:
            if name not in properties:
                add("http_url", f"The URL names the argument {name!r}, which the schema lacks.")
            elif _schema_type(properties[name]) not in SCALAR_TYPES:
                add("http_url", f"The argument {name!r} is not a string, number or boolean; it cannot go into a URL.")
        required = set(schema.get("required") or []) if isinstance(schema, dict) else set()
        for name in template.path_names:
            if name in properties and name not in required:
                add("http_url", f"The path needs {name!r}; the schema must require it.")

    _check_headers(tool.http_headers, "http_headers", add)
    if tool.key_header and not HEADER_NAME.fullmatch(tool.key_header):
        add("key_header", "Not a header name.")
    if tool.idempotency == Tool.Idempotency.NATIVE and not tool.key_header:
        add("key_header", "Native idempotency needs the header that carries the key.")
    _check_credential(tool, add)
    _check_status_query(tool.status_query, add)
    _check_picks(tool, add)
    return errors


def _check_credential(tool: Tool, add) -> None:
    if tool.credential_ref:
        if not REFERENCE_NAME.fullmatch(tool.credential_ref):
            add("credential_ref", "Name an environment variable or setting (A-Z, 0-9, _), never the secret itself.")
        if not tool.credential_header or not HEADER_NAME.fullmatch(tool.credential_header):
            add("credential_header", "Not a header name.")
        if any(ch in (tool.credential_scheme or "") for ch in "\r\n"):
            add("credential_scheme", "No line breaks.")


def _check_picks(tool: Tool, add) -> None:
    receipt = tool.receipt_fields
    if not isinstance(receipt, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and PATH.fullmatch(v) for k, v in receipt.items()):
        add("receipt_fields", 'Write {"name": "dotted.path", …}.')
    result = tool.result_fields
    if not isinstance(result, list) or not all(isinstance(p, str) and PATH.fullmatch(p) for p in result):
        add("result_fields", 'Write ["dotted.path", …].')


def _check_mcp(tool: Tool, add) -> None:
    """An MCP tool: a server (URL or command line) and a tool name; the credential goes as a
    header to a URL, or as an environment variable of that name to a command."""
    server = (tool.mcp_server or "").strip()
    if not server:
        add("mcp_server", "An MCP tool needs its server: a streamable HTTP URL or a stdio command line.")
    elif server.startswith(("http://", "https://")):
        if any(ch.isspace() for ch in server):
            add("mcp_server", "A URL without spaces.")
    else:
        try:
            if not shlex.split(server):
                add("mcp_server", "An empty command line.")
        except ValueError as exc:
            add("mcp_server", f"Not a command line: {exc}.")
    if not tool.mcp_tool or any(ch.isspace() for ch in tool.mcp_tool):
        add("mcp_tool", "The tool's name at the MCP server (no spaces).")
    if tool.http_url or tool.http_method or tool.key_header or tool.status_query:
        add("mcp_server", "An MCP tool has no URL template, method, key header or status query.")
    _check_credential(tool, add)
    _check_picks(tool, add)


def credential(name: str) -> str | None:
    """The value of a credential reference: the environment variable, else the setting, of
    that name (read at call time, never stored)."""
    value = os.environ.get(name)
    if value is None:
        value = getattr(settings, name, None)
    return value if isinstance(value, str) and value else None


def _schema_type(spec: Any) -> str | None:
    if not isinstance(spec, dict):
        return None
    typ = spec.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), None)
    if typ is None and "enum" in spec and all(isinstance(v, str | int | float | bool) for v in spec["enum"]):
        return "string"
    return typ


def _check_headers(headers: Any, field: str, add) -> None:
    if not isinstance(headers, dict):
        add(field, 'Write {"Header-Name": "value", …}.')
        return
    for name, value in headers.items():
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            add(field, f"{name!r} is not a header name.")
        elif name.lower() in RESERVED_HEADERS:
            add(field, f"{name} is set by Countersign, not by configuration.")
        if not isinstance(value, str) or any(ch in value for ch in "\r\n\0"):
            add(field, f"The value of {name!r} must be a string on one line.")


def _check_status_query(query: Any, add) -> None:
    if query in ({}, None):
        return
    if not isinstance(query, dict):
        add("status_query", "Write a JSON object (or leave it empty).")
        return
    unknown = set(query) - {"url", "object", *STATUS_STATES}
    if unknown:
        add("status_query", f"Unknown keys: {', '.join(sorted(unknown))}.")
    try:
        template = urltemplate.parse(str(query.get("url") or ""))
    except urltemplate.TemplateError as exc:
        add("status_query", f"url: {exc}")
    else:
        if template.names != ["key"]:
            add("status_query", "url: name the operation's key, {key}, and nothing else.")
    if "found" not in query or "absent" not in query:
        add("status_query", "Say how the answer reads as found and as absent (processing is optional).")
    for state in STATUS_STATES:
        if state in query:
            problem = _rule_problem(query[state])
            if problem:
                add("status_query", f"{state}: {problem}")
    if "object" in query and not (isinstance(query["object"], str) and PATH.fullmatch(query["object"])):
        add("status_query", "object: a dotted path into the answer.")


def _rule_problem(rule: Any) -> str | None:
    if not isinstance(rule, dict) or "status" not in rule:
        return 'write {"status": 200} with optional "field" and "equals".'
    statuses = rule["status"] if isinstance(rule["status"], list) else [rule["status"]]
    if not statuses or not all(isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599 for s in statuses):
        return "status: an HTTP status code or a list of them."
    if set(rule) - {"status", "field", "equals"}:
        return "only status, field and equals."
    if "field" in rule and not (isinstance(rule["field"], str) and PATH.fullmatch(rule["field"])):
        return "field: a dotted path into the answer."
    if "equals" in rule and "field" not in rule:
        return "equals needs a field."
    return None


def request_shape(tool: Tool) -> tuple[Any, ...]:
    return tuple(getattr(tool, name) for name in REQUEST_SHAPE_FIELDS)


def tool_save(*, tool: Tool) -> Tool:
    """Validate and save; a new schema or request shape gets the next schema version."""
    errors = tool_config_errors(tool)
    if errors:
        raise InvalidInput(f"The configuration of {tool.name} is invalid.", details=errors)
    with transaction.atomic():
        if tool.pk is not None:
            # NO KEY: a proposal of this tool that holds the configuration generation (which this
            # save changes, so it waits for it) checks its operation's foreign key to the tool
            # at commit, a KEY SHARE lock; a plain FOR UPDATE here would block it: a deadlock.
            stored = Tool.objects.select_for_update(no_key=True).filter(pk=tool.pk).first()
            if stored is not None:
                tool.schema_version = stored.schema_version
                if request_shape(stored) != request_shape(tool):
                    tool.schema_version += 1
        tool.save()
    return tool


def tools_enable(*, tools: Iterable[Tool], tenant: Tenant) -> list[AgentPrincipal]:
    """Enable the tools and allow them to every agent of the tenant; returns those agents."""
    tools = list(tools)
    agents = list(AgentPrincipal.objects.filter(tenant=tenant).order_by("pk"))
    with transaction.atomic():
        Tool.objects.filter(pk__in=[t.pk for t in tools]).update(enabled=True)
        for agent in agents:
            agent.allowed_tools.add(*tools)
    for tool in tools:
        tool.enabled = True
    return agents


BUILT_IN = "built-in"


def upstream_of(tool: Tool) -> str:
    """Where a call of this tool goes, in words a reviewer can check: the host of an HTTP tool,
    the URL or command line of an MCP tool's server, "built-in" for an adapter compiled into
    Countersign. Credentials never appear: a URL's user info and query are left out (the
    configuration keeps secrets by reference, but a pasted URL might still carry one)."""
    if tool.adapter == HTTP_ADAPTER:
        return _host_of(tool.http_url)
    if tool.adapter == MCP_ADAPTER:
        server = (tool.mcp_server or "").strip()
        if server.startswith(("http://", "https://")):
            parts = urlsplit(server)
            return f"{parts.scheme}://{_host_of(server)}{parts.path}"
        return server
    return BUILT_IN


def _host_of(url: str) -> str:
    """host[:port] of a URL (a template's placeholders never stand in the host)."""
    try:
        parts = urlsplit(url or "")
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return ""
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}" if port else host
