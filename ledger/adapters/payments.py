"""payments.refund and orders.lookup against the payments provider (HTTP, Idempotency-Key)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote

import httpx
from django.conf import settings

from ledger.adapters.base import (
    ABSENT,
    ERROR,
    FOUND,
    PROCESSING,
    Outcome,
    QueryAnswer,
    known_success,
)
from ledger.adapters.http import client, send


def _base_url() -> str:
    return settings.SANDBOX_PAYMENTS_URL.rstrip("/")


class RefundAdapter:
    name = "payments.refund"
    can_query = True

    def execute(self, arguments: dict[str, Any], *, key: str, timeout: float) -> Outcome:
        def on_success(response: httpx.Response, body: Any) -> Outcome:
            return known_success(
                receipt={"remote_id": body.get("id"), "amount": body.get("amount"),
                         "currency": body.get("currency"), "order_id": body.get("order_id"),
                         "provider": "payments", "replayed": response.headers.get("Idempotent-Replayed") == "true"},
                result=body, code=str(response.status_code), raw={"status": response.status_code, "body": body},
            )

        return send(
            lambda: client().post(f"{_base_url()}/refunds", json=arguments, headers={"Idempotency-Key": key},
                               timeout=timeout),
            on_success=on_success,
        )

    def query(self, *, key: str, timeout: float) -> QueryAnswer:
        try:
            response = client().get(f"{_base_url()}/refunds/by-key/{quote(key, safe='')}", timeout=timeout)
        except httpx.HTTPError as exc:
            return QueryAnswer(ERROR, raw={"error": f"{type(exc).__name__}: {exc}"})
        body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        raw = {"status": response.status_code, "body": body}
        if response.status_code == 404:
            return QueryAnswer(ABSENT, raw=raw)
        if response.status_code != 200:
            return QueryAnswer(ERROR, raw=raw)
        if body.get("state") == "processing":
            return QueryAnswer(PROCESSING, raw=raw)
        refund = body.get("refund") or {}
        if body.get("state") == "succeeded":
            return QueryAnswer(FOUND, raw=raw, receipt={
                "remote_id": refund.get("id"), "amount": refund.get("amount"), "currency": refund.get("currency"),
                "order_id": refund.get("order_id"), "provider": "payments", "via": "query"})
        # A stored failure (e.g. validation) for this key: no effect.
        return QueryAnswer(ABSENT, raw=raw)

    def differences(self, arguments: dict[str, Any], receipt: dict[str, Any]) -> dict[str, dict]:
        """The refund found against the one approved: order, currency, and amount (as numbers,
        so 25 and 25.0 agree)."""
        found: dict[str, dict] = {}
        for field in ("order_id", "currency"):
            if receipt.get(field) != arguments.get(field):
                found[field] = {"intent": arguments.get(field), "found": receipt.get(field)}
        try:
            same_amount = Decimal(str(receipt.get("amount"))) == Decimal(str(arguments.get("amount")))
        except InvalidOperation:
            same_amount = False
        if not same_amount:
            found["amount"] = {"intent": arguments.get("amount"), "found": receipt.get("amount")}
        return found

    def preview(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        return {"kind": "refund", "summary": f"Refund {arguments.get('amount')} {arguments.get('currency')} "
                                             f"on order {arguments.get('order_id')}"}


class OrderLookupAdapter:
    """Read-only: no side effect, so any outcome may simply be retried."""

    name = "orders.lookup"
    can_query = False

    def execute(self, arguments: dict[str, Any], *, key: str, timeout: float) -> Outcome:
        def on_success(response: httpx.Response, body: Any) -> Outcome:
            return known_success(receipt={"order_id": body.get("order_id"), "read": True}, result=body,
                                 code=str(response.status_code), raw={"status": response.status_code})

        order_id = quote(str(arguments["order_id"]), safe="")
        return send(lambda: client().get(f"{_base_url()}/orders/{order_id}", timeout=timeout), on_success=on_success)

    def query(self, *, key: str, timeout: float) -> QueryAnswer:
        return QueryAnswer(ABSENT, raw={"note": "reads have no effect to find"})

    def preview(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        return None
