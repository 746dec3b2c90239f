"""A tool described by data (adapter `http`): one adapter instance per Tool row.

The request is built from the tool's configuration (approvals.tools checks it when it is saved);
the answer is classified into the four facts by the same code as every built-in HTTP adapter
(`ledger.adapters.http.send`), so a configured tool's timeout is `unknown` exactly like the
refund's. Credentials are read by name from the environment (or settings) at call time and are
never written into evidence.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from approvals.models import Tool
from approvals.tools import BODY_METHODS, STATUS_STATES, credential
from console.lib import urltemplate
from ledger.adapters.base import ERROR, FOUND, Outcome, QueryAnswer, known_success, not_sent
from ledger.adapters.http import client, send

_MISSING = object()


def pick(body: Any, path: str) -> Any:
    """The value at a dotted path (`refund.id`, `items.0.sku`), or _MISSING."""
    value = body
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def picked_receipt(body: Any, fields: dict[str, str], receipt: dict[str, Any]) -> dict[str, Any]:
    """`receipt` plus, per `receipt_fields`, each name's value found in the answer."""
    for name, path in (fields or {}).items():
        value = pick(body, path)
        if value is not _MISSING:
            receipt[name] = value
    return receipt


def picked_result(body: Any, paths: list[str]) -> dict[str, Any]:
    """The answer kept as the call's result: the `result_fields` found, or the whole answer."""
    if not paths:
        return body if isinstance(body, dict) else {"body": body}
    found = {path: pick(body, path) for path in paths}
    return {path: value for path, value in found.items() if value is not _MISSING}


class HttpToolAdapter:
    name = "http"

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self.can_query = bool((tool.status_query or {}).get("url"))

    # -- the request ---------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        """Static headers and the credential; raises LookupError naming a missing credential."""
        tool = self.tool
        headers = {"Accept": "application/json", **(tool.http_headers or {})}
        if tool.credential_ref:
            secret = credential(tool.credential_ref)
            if secret is None:
                raise LookupError(f"the credential {tool.credential_ref} is not set in the worker's environment")
            if any(ch in secret for ch in "\r\n\0"):
                # Refused here, before anything is sent, and without repeating the value.
                raise ValueError(f"the credential {tool.credential_ref} is not a valid header value")
            headers[tool.credential_header] = f"{tool.credential_scheme} {secret}".strip()
        return headers

    def request(self, arguments: dict[str, Any], *, key: str) -> httpx.Request:
        """The exact request one call sends (also what the preview shows, minus the secret)."""
        tool = self.tool
        template = urltemplate.parse(tool.http_url)
        in_url = set(template.names)
        rest = {k: v for k, v in arguments.items() if k not in in_url}
        headers = self._headers()
        if tool.key_header:
            headers[tool.key_header] = key
        url = template.render(arguments)
        if tool.http_method in BODY_METHODS:
            return httpx.Request(tool.http_method, url, headers=headers, json=rest)
        # No body: what the URL does not name goes into the query, encoded by httpx.
        params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in rest.items() if v is not None}
        return httpx.Request(tool.http_method, url, headers=headers, params=params)

    def execute(self, arguments: dict[str, Any], *, key: str, timeout: float) -> Outcome:
        try:
            request = self.request(arguments, key=key)
        except LookupError as exc:
            return not_sent("credential_missing", transport="none", code="credential", raw={"error": str(exc)})
        except (ValueError, KeyError) as exc:
            return not_sent("request_invalid", transport="none", code="template", raw={"error": str(exc)})

        def on_success(response: httpx.Response, body: Any) -> Outcome:
            return known_success(receipt=self._receipt(body, code=response.status_code), result=self._result(body),
                                 code=str(response.status_code), raw={"status": response.status_code, "body": body})

        request.extensions["timeout"] = httpx.Timeout(timeout).as_dict()
        return send(lambda: client().send(request), on_success=on_success)

    def _receipt(self, body: Any, *, code: int | str, via: str | None = None) -> dict[str, Any]:
        receipt = picked_receipt(body, self.tool.receipt_fields, {"provider": self.tool.name, "http_status": code})
        if via:
            receipt["via"] = via
        return receipt

    def _result(self, body: Any) -> dict[str, Any]:
        return picked_result(body, self.tool.result_fields)

    # -- the status query ----------------------------------------------------------------------

    def query(self, *, key: str, timeout: float) -> QueryAnswer:
        config = self.tool.status_query or {}
        if not config.get("url"):
            return QueryAnswer(ERROR, raw={"error": "this tool has no status query"})
        try:
            url = urltemplate.parse(config["url"]).render({"key": key})
            headers = self._headers()
        except (LookupError, ValueError) as exc:
            return QueryAnswer(ERROR, raw={"error": str(exc)})
        try:
            response = client().get(url, headers=headers, timeout=timeout)
        except httpx.HTTPError as exc:
            return QueryAnswer(ERROR, raw={"error": f"{type(exc).__name__}: {exc}"})
        try:
            body = response.json()
        except ValueError:
            body = response.text[:2000]
        raw = {"status": response.status_code, "body": body}
        for state in STATUS_STATES:
            rule = config.get(state)
            if rule and _matches(rule, response.status_code, body):
                if state != FOUND:
                    return QueryAnswer(state, raw=raw)
                found = pick(body, config["object"]) if config.get("object") else body
                return QueryAnswer(FOUND, raw=raw, receipt=self._receipt(
                    {} if found is _MISSING else found, code="query", via="query"))
        return QueryAnswer(ERROR, raw=raw)

    def preview(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        try:
            url = urltemplate.parse(self.tool.http_url).render(arguments)
        except (ValueError, KeyError):
            return None
        return {"kind": "http", "summary": f"{self.tool.http_method} {url}"}


def _matches(rule: dict[str, Any], status: int, body: Any) -> bool:
    statuses = rule["status"] if isinstance(rule["status"], list) else [rule["status"]]
    if status not in statuses:
        return False
    if "field" not in rule:
        return True
    value = pick(body, rule["field"])
    if "equals" not in rule:
        return value is not _MISSING and value not in (None, False, "")
    wanted = rule["equals"] if isinstance(rule["equals"], list) else [rule["equals"]]
    return value in wanted
