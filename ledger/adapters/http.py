"""Classifying an HTTP exchange into the four facts (shared by the HTTP adapters)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import httpx

from ledger.adapters.base import Outcome, known_failure, not_sent, unknown

_clients: dict[int, httpx.Client] = {}
_clients_lock = threading.Lock()


def client() -> httpx.Client:
    """The process's HTTP client for providers, shared by its threads.

    Building a client costs tens of milliseconds (its TLS context), many times a local
    provider's answer, so every call would pay it. One per process: a forked child must not
    share its parent's sockets. Each request passes its own timeout. A pooled connection the
    provider closed meanwhile can fail a request after it was written: that is classified
    `unknown` like any reset, and reconciliation settles it; idle connections expire after a
    few seconds to keep that rare."""
    pid = os.getpid()
    shared = _clients.get(pid)
    if shared is None:
        with _clients_lock:
            shared = _clients.get(pid)
            if shared is None:
                shared = _clients[pid] = httpx.Client(limits=httpx.Limits(keepalive_expiry=4.0))
    return shared


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:2000]


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("Retry-After")
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


def send(request: Callable[[], httpx.Response], *, on_success: Callable[[httpx.Response, Any], Outcome]) -> Outcome:
    """Run `request` and classify. Only a failure to connect proves no byte left; a timeout or
    reset after the request was sent is unknown, never failed."""
    try:
        response = request()
    except httpx.ConnectError as exc:
        return not_sent("connect", transport="connect_error", code=type(exc).__name__, raw={"error": str(exc)})
    except httpx.ConnectTimeout as exc:
        return not_sent("connect", transport="connect_timeout", code="ConnectTimeout", raw={"error": str(exc)})
    except httpx.TimeoutException as exc:
        return unknown("timeout", transport="timeout", code=type(exc).__name__, raw={"error": str(exc)})
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        return unknown("reset", transport="reset", code=type(exc).__name__, raw={"error": str(exc)})
    body = _body(response)
    raw = {"status": response.status_code, "body": body}
    status = response.status_code
    if 200 <= status < 300:
        return on_success(response, body)
    if status == 429:
        return not_sent("rate_limited", transport="ok", code="429", retry_after=_retry_after(response),
                        raw=raw, provider_status="429")
    if status == 503:
        # The provider refused before doing anything (503 is its promise: try again later).
        return not_sent("unavailable", transport="ok", code="503", retry_after=_retry_after(response),
                        raw=raw, provider_status="503")
    if status == 409:
        # Same key still in flight at the provider: the effect may yet happen.
        return unknown("in_flight", transport="ok", code="409", raw=raw, provider_status="409")
    if status == 422:
        return known_failure("key_conflict", code="422", raw=raw, data_status="conflict")
    if status in (401, 403):
        return known_failure("auth", code=str(status), raw=raw)
    if 400 <= status < 500:
        return known_failure("validation", code=str(status), raw=raw)
    # 500, 502, 504…: the provider may have committed before failing.
    return unknown("server_error", transport="ok", code=str(status), raw=raw, provider_status=str(status))
