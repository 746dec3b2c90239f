"""Tools from an OpenAPI 3 document: one `http` tool per operation (`tools_import openapi`).

An operation becomes a tool named `<prefix>.<operationId>` whose arguments are one flat JSON
object: its path and query parameters and its JSON body's properties side by side. GET and HEAD
are reads (base tier L1), the other methods writes (L2). An `Idempotency-Key` header parameter
makes the tool natively idempotent: the operation's key goes there. A GET operation that reads
by that key (a parameter named `key` or `idempotency_key`) becomes the status query of the
writes under the same first path segment, and its 200 answer's enum of states says which read
as found and which as still processing; 404 reads as absent.

Only local references (`#/components/...`) are followed. Operations this cannot express (a
required header or cookie other than the key, a body that is not a JSON object, a name used
twice) are skipped with the reason, never half-imported.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import yaml  # PyYAML, installed with drf-spectacular

from approvals.models import HttpMethod, Tool
from console.lib.urltemplate import NAME
from console.models import RiskTier

METHODS = ("get", "head", "post", "put", "patch", "delete")
READ_METHODS = frozenset({"get", "head"})
KEY_HEADER = "idempotency-key"
KEY_PARAMETER = re.compile(r"(idempotency[_-]?)?key", re.IGNORECASE)
PROCESSING_STATES = frozenset({"processing", "pending", "in_progress", "queued", "running"})
FAILED_STATES = frozenset({"failed", "canceled", "cancelled", "error", "rejected"})
# OpenAPI's own keywords, which JSON Schema validators would ignore or misread.
OPENAPI_ONLY = frozenset({"nullable", "example", "examples", "xml", "discriminator", "externalDocs", "deprecated",
                          "readOnly", "writeOnly"})
RETRYABLE = ["rate_limited", "unavailable", "connect"]
MAX_RECEIPT_FIELDS = 8


class OpenApiError(ValueError):
    pass


@dataclass
class Imported:
    tools: list[dict[str, Any]] = field(default_factory=list)  # Tool field values, by tool
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (operation, why)


def load(text: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except ValueError:
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise OpenApiError(f"The document is neither JSON nor YAML: {exc}") from None
    if not isinstance(document, dict) or not str(document.get("openapi", "")).startswith("3"):
        raise OpenApiError("Not an OpenAPI 3 document (no 'openapi: 3.x').")
    return document


def base_url(document: dict[str, Any], *, document_url: str | None, override: str | None) -> str:
    """The API's base URL: --base-url, else the first server, relative to where the document
    was fetched from."""
    if override:
        base = override
    else:
        servers = document.get("servers") or [{"url": "/"}]
        base = urljoin(document_url or "", str(servers[0].get("url") or "/"))
    if not re.match(r"https?://[^/{}]+", base):
        raise OpenApiError(f"No absolute base URL ({base!r}); give --base-url.")
    return base.rstrip("/")


def tools_from_document(document: dict[str, Any], *, prefix: str, base: str, tier: int | None = None,
                        timeout: float = 10.0) -> Imported:
    resolver = _Resolver(document)
    result = Imported()
    operations = []
    for path, item in (document.get("paths") or {}).items():
        item = resolver.resolve(item)
        for method in METHODS:
            if method in item:
                operations.append((path, method, item, resolver.resolve(item[method])))
    status_queries = [_status_query(path, op, item, resolver, base) for path, method, item, op in operations
                      if method == "get"]
    status_queries = [query for query in status_queries if query is not None]
    for path, method, item, op in operations:
        label = f"{method.upper()} {path}"
        operation_id = op.get("operationId")
        if not isinstance(operation_id, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", operation_id):
            result.skipped.append((label, "no usable operationId"))
            continue
        try:
            result.tools.append(_tool(path, method, item, op, resolver, prefix=prefix, base=base, tier=tier,
                                      timeout=timeout, status_queries=status_queries))
        except OpenApiError as exc:
            result.skipped.append((f"{operation_id} ({label})", str(exc)))
    return result


def _tool(path: str, method: str, item: dict, op: dict, resolver: _Resolver, *, prefix: str, base: str,
          tier: int | None, timeout: float, status_queries: list[_StatusQuery]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    key_header = ""
    query_names: list[str] = []

    def add(name: str, schema: dict[str, Any], is_required: bool) -> None:
        if name in properties:
            raise OpenApiError(f"the argument {name!r} would be given twice")
        properties[name] = schema
        if is_required:
            required.append(name)

    for param in _parameters(item, op, resolver):
        name, where = param.get("name"), param.get("in")
        if where == "header" and str(name).lower() == KEY_HEADER:
            key_header = name
            continue
        if where in ("header", "cookie"):
            if param.get("required"):
                raise OpenApiError(f"the {where} {name!r} is required and agents do not send {where}s")
            continue
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise OpenApiError(f"the parameter name {name!r} cannot be an argument")
        schema = resolver.schema(param.get("schema") or {"type": "string"})
        if param.get("description") and "description" not in schema:
            schema["description"] = param["description"]
        add(name, schema, where == "path" or bool(param.get("required")))
        if where == "query":
            query_names.append(name)

    body = op.get("requestBody")
    if body is not None:
        body = resolver.resolve(body)
        content = body.get("content") or {}
        json_type = next((t for t in content if t == "application/json" or t.endswith("+json")), None)
        if json_type is None:
            if body.get("required"):
                raise OpenApiError("the body is not JSON")
        else:
            schema = resolver.schema(content[json_type].get("schema") or {})
            if schema.get("type") not in (None, "object") or not isinstance(schema.get("properties"), dict):
                raise OpenApiError("the body is not a JSON object with properties")
            body_required = set(schema.get("required") or []) if body.get("required") else set()
            for name, spec in schema["properties"].items():
                add(name, spec, name in body_required)

    is_read = method in READ_METHODS
    url = base + path
    if not is_read and query_names:
        # A body method sends the rest as the body: the query parameters are named in the URL.
        url += "?" + "&".join(f"{name}={{{name}}}" for name in query_names)
    spec: dict[str, Any] = {
        "name": f"{prefix}.{op['operationId']}",
        "description": (op.get("summary") or op.get("description") or "")[:2000],
        "adapter": "http",
        "json_schema": {"type": "object", "properties": properties, "required": required,
                        "additionalProperties": False},
        "kind": Tool.Kind.READ if is_read else Tool.Kind.WRITE,
        "base_tier": tier if tier is not None else (RiskTier.L1 if is_read else RiskTier.L2),
        "idempotency": Tool.Idempotency.NATIVE if key_header else Tool.Idempotency.NONE,
        "key_header": key_header,
        "http_method": HttpMethod(method.upper()),
        "http_url": url,
        "http_headers": {},
        "queue": Tool.Queue.FAST,
        "timeout_seconds": timeout,
        "retryable_errors": list(RETRYABLE),
        "max_attempts": 3 if is_read else 4,
        "receipt_fields": {},
        "result_fields": [],
        "status_query": {},
    }
    success = _success_schema(op, resolver)
    spec["receipt_fields"] = _receipt_fields(success)
    if key_header and not is_read:
        query = _status_query_for(path, status_queries)
        if query is not None:
            spec["status_query"] = query.config(success)
    return spec


def _parameters(item: dict, op: dict, resolver: _Resolver) -> list[dict[str, Any]]:
    """Path-level parameters, overridden by the operation's own (by name and place)."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for param in [*(item.get("parameters") or []), *(op.get("parameters") or [])]:
        param = resolver.resolve(param)
        merged[(str(param.get("name")), str(param.get("in")))] = param
    return list(merged.values())


def _success_schema(op: dict, resolver: _Resolver) -> dict[str, Any]:
    for code, response in sorted((op.get("responses") or {}).items()):
        if str(code).startswith("2"):
            content = (resolver.resolve(response).get("content") or {})
            media = content.get("application/json") or next(iter(content.values()), None)
            if media and media.get("schema"):
                return resolver.schema(media["schema"])
    return {}


def _receipt_fields(schema: dict[str, Any]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for name, spec in (schema.get("properties") or {}).items():
        if isinstance(spec, dict) and spec.get("type") in ("string", "number", "integer", "boolean"):
            fields["remote_id" if name == "id" else name] = name
        if len(fields) >= MAX_RECEIPT_FIELDS:
            break
    return fields


@dataclass
class _StatusQuery:
    path: str
    url: str
    answer: dict[str, Any]  # the 200 answer's schema
    absent: list[int]

    def config(self, success: dict[str, Any]) -> dict[str, Any]:
        properties = self.answer.get("properties") or {}
        found: dict[str, Any] = {"status": 200}
        processing: dict[str, Any] | None = None
        for name, spec in properties.items():
            states = spec.get("enum") if isinstance(spec, dict) else None
            if isinstance(states, list) and PROCESSING_STATES & set(states):
                processing = {"status": 200, "field": name, "equals": [s for s in states if s in PROCESSING_STATES]}
                found = {"status": 200, "field": name,
                         "equals": [s for s in states if s not in PROCESSING_STATES | FAILED_STATES]}
                break
        config: dict[str, Any] = {"url": self.url, "found": found, "absent": {"status": self.absent}}
        if processing:
            config["processing"] = processing
        # The refund inside the answer, when the answer wraps the write's own result.
        wrapped = next((name for name, spec in properties.items() if success and spec == success), None)
        if wrapped:
            config["object"] = wrapped
        return config


def _status_query(path: str, op: dict, item: dict, resolver: _Resolver, base: str) -> _StatusQuery | None:
    for param in _parameters(item, op, resolver):
        name, where = str(param.get("name")), param.get("in")
        if KEY_PARAMETER.fullmatch(name) and where in ("path", "query"):
            url = base + (path.replace("{" + name + "}", "{key}") if where == "path" else f"{path}?{name}={{key}}")
            codes = [int(c) for c in (op.get("responses") or {}) if str(c) in ("404", "410")] or [404]
            return _StatusQuery(path=path, url=url, answer=_success_schema(op, resolver), absent=codes)
    return None


def _status_query_for(path: str, queries: list[_StatusQuery]) -> _StatusQuery | None:
    """The status query under the same first path segment, the longest shared prefix first."""
    segments = path.strip("/").split("/")

    def shared(query: _StatusQuery) -> int:
        count = 0
        for a, b in zip(segments, query.path.strip("/").split("/"), strict=False):
            if a != b:
                break
            count += 1
        return count

    candidates = [(shared(q), q) for q in queries if shared(q) >= 1]
    return max(candidates, key=lambda pair: pair[0])[1] if candidates else None


class _Resolver:
    """Local `$ref`s inlined (a cycle is an error: a flat argument object cannot be recursive)."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def resolve(self, node: Any, seen: tuple[str, ...] = ()) -> Any:
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#/"):
                raise OpenApiError(f"only local references are followed, not {ref!r}")
            if ref in seen:
                raise OpenApiError(f"{ref} refers to itself")
            seen = (*seen, ref)
            target: Any = self.document
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise OpenApiError(f"{ref} does not exist")
                target = target[part]
            node = target
        return node

    def schema(self, node: Any, seen: tuple[str, ...] = ()) -> dict[str, Any]:
        """A JSON Schema with every reference inlined and OpenAPI's own keywords dropped."""
        if isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if ref in seen:
                raise OpenApiError(f"{ref} refers to itself")
            return self.schema(self.resolve(node), (*seen, ref))
        if not isinstance(node, dict):
            return {}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in OPENAPI_ONLY:
                continue
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: self.schema(spec, seen) for name, spec in value.items()}
            elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
                out[key] = self.schema(value, seen)
            elif key in ("allOf", "anyOf", "oneOf", "prefixItems") and isinstance(value, list):
                out[key] = [self.schema(spec, seen) for spec in value]
            else:
                out[key] = copy.deepcopy(value)
        if node.get("nullable") is True and isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]  # OpenAPI 3.0's spelling of a nullable type
        return out
