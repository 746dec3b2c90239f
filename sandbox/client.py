"""A small client for the sandbox providers' observation and control endpoints.

Used by the tests and the chaos command to count effects, reset state and inject faults. The
business endpoints (refunds, SMTP) are the adapters' business, not this module's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

DEFAULT_TIMEOUT = 5.0


def effects(
    base_url: str, key: str | None = None, *, timeout: float = DEFAULT_TIMEOUT
) -> list[dict[str, Any]]:
    """Every effect the provider committed, oldest first: ``[{"key", "payload", "at", "seq"}]``."""
    params = {"key": key} if key is not None else None
    response = httpx.get(f"{base_url}/effects", params=params, timeout=timeout)
    response.raise_for_status()
    return list(response.json())


def reset(base_url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
    httpx.post(f"{base_url}/_control/reset", timeout=timeout).raise_for_status()


def get_faults(base_url: str, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    response = httpx.get(f"{base_url}/_control/faults", timeout=timeout)
    response.raise_for_status()
    return dict(response.json())


def set_fault(
    base_url: str,
    fault: str | None,
    *,
    count: int | None = None,
    target: str = "writes",
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """Fault the next ``count`` requests (all of them when None) of ``target``: writes, reads, all."""
    body: dict[str, Any] = {"fault": fault, "target": target}
    if count is not None:
        body["count"] = count
    response = httpx.post(f"{base_url}/_control/faults", json=body, timeout=timeout)
    response.raise_for_status()
    return dict(response.json())


def clear_fault(base_url: str, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    return set_fault(base_url, None, timeout=timeout)


def set_latency(
    base_url: str, latency_ms: int, *, timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    response = httpx.post(
        f"{base_url}/_control/faults", json={"latency_ms": latency_ms}, timeout=timeout
    )
    response.raise_for_status()
    return dict(response.json())


def health(base_url: str, *, timeout: float = 1.0) -> dict[str, Any] | None:
    """The provider's health document, or None if it does not answer right now."""
    try:
        response = httpx.get(f"{base_url}/_health", timeout=timeout)
    except httpx.HTTPError:
        return None
    return dict(response.json()) if response.status_code == 200 else None


def wait_for(
    condition: Callable[[], T],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll ``condition`` until it returns something truthy; return it, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_healthy(base_url: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """Wait until the provider answers ``/_health`` (e.g. after a crash restart)."""
    return wait_for(lambda: health(base_url), timeout=timeout, what=f"{base_url}/_health")
