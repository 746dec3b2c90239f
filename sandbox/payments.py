"""Payments sandbox: refunds with the IETF Idempotency-Key draft's semantics (and Stripe's).

    python -m sandbox.payments --host 127.0.0.1 --port 8001 --db var/payments.sqlite3

- ``POST /refunds`` with ``Idempotency-Key``: missing key 400; same key in flight 409; same key,
  other payload 422; same key, same payload, completed: the first response replayed with
  ``Idempotent-Replayed: true``. Validation errors are 400, no effect, and stored for the key.
- ``GET /refunds/by-key/<key>``, ``GET /refunds/<id>``: queries for reconciliation.
- ``GET /orders/<order_id>``: a deterministic fake order for the read-only lookup tool.
- ``GET /openapi.json``: this API's OpenAPI document (payments_openapi.py).
- Magic fault values are read from ``order_id`` (see faults.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import threading
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import Any

from sandbox import payments_openapi
from sandbox.faults import BEFORE_COMMIT, magic_fault_for_attempt, parse_magic
from sandbox.store import Store, now_iso
from sandbox.supervisor import add_common_arguments, bind, supervise
from sandbox.web import (
    DROP,
    Outcome,
    Reply,
    Request,
    SandboxApp,
    SandboxHTTPServer,
    crash,
    error,
)

SCHEMA = """
-- The first response for each key (Stripe stores known failures too, not 5xx).
CREATE TABLE IF NOT EXISTS responses (
    match_key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    status INTEGER NOT NULL,
    body TEXT NOT NULL,
    at TEXT NOT NULL
);
"""

CURRENCIES = frozenset(
    {"EUR", "USD", "GBP", "CHF", "JPY", "CAD", "AUD", "SEK", "NOK", "DKK", "CNY"}
)
REQUIRED_FIELDS = ("order_id", "amount", "currency", "reason")
ORDER_STATUSES = ("paid", "paid", "paid", "shipped", "delivered", "refunded")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_idempotency_key(header: str | None) -> str | None:
    """The draft makes the header a structured-field string (quoted); Stripe sends it bare."""
    if header is None:
        return None
    key = header.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    return key or None


def validate_refund(body: Any) -> dict[str, str]:
    if not isinstance(body, dict):
        return {"body": "must be a JSON object"}
    problems: dict[str, str] = {}
    for name in REQUIRED_FIELDS:
        if name not in body or body[name] is None:
            problems[name] = "required"
    order_id = body.get("order_id")
    if "order_id" not in problems and (not isinstance(order_id, str) or not order_id):
        problems["order_id"] = "must be a non-empty string"
    if "amount" not in problems:
        amount = body["amount"]
        try:
            if isinstance(amount, bool) or not isinstance(amount, int | float | str):
                raise InvalidOperation
            value = Decimal(str(amount))
            if not value.is_finite() or value <= 0:
                problems["amount"] = "must be greater than 0"
        except InvalidOperation:
            problems["amount"] = "must be a number"
    if "currency" not in problems:
        currency = body["currency"]
        if not isinstance(currency, str) or currency.upper() not in CURRENCIES:
            problems["currency"] = f"unknown currency {currency!r}"
    if "reason" not in problems and not isinstance(body["reason"], str):
        problems["reason"] = "must be a string"
    return problems


def fake_order(order_id: str) -> dict[str, Any]:
    digest = hashlib.sha256(order_id.encode()).digest()
    cents = 500 + int.from_bytes(digest[:4], "big") % 50_000  # 5.00 .. 504.99
    return {
        "order_id": order_id,
        "amount": cents / 100,
        "currency": ("EUR", "USD", "GBP")[digest[4] % 3],
        "status": ORDER_STATUSES[digest[5] % len(ORDER_STATUSES)],
        "customer_email": f"customer-{digest[6:10].hex()}@example.com",
    }


class PaymentsApp(SandboxApp):
    service = "payments"

    def __init__(self, store: Store, *, hang_seconds: float, generation: int = 0) -> None:
        super().__init__(store, hang_seconds=hang_seconds, generation=generation)
        # Requests in flight, by key. In memory on purpose: a crash ends every in-flight
        # request, so nothing must survive it.
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()

    def route(self, req: Request) -> Outcome | None:
        seg, method = req.segments, req.method
        if method == "POST" and seg == ["refunds"]:
            return self.create_refund(req)
        if method == "GET" and len(seg) == 3 and seg[:2] == ["refunds", "by-key"]:
            return self.refund_by_key(seg[2])
        if method == "GET" and len(seg) == 2 and seg[0] == "refunds":
            return self.refund_by_id(seg[1])
        if method == "GET" and len(seg) == 2 and seg[0] == "orders":
            return self.order(seg[1])
        if method == "GET" and seg == ["openapi.json"]:
            return Reply(200, payments_openapi.document(currencies=CURRENCIES))
        return None

    # -- POST /refunds ---------------------------------------------------------------------

    def create_refund(self, req: Request) -> Outcome:
        key = parse_idempotency_key(req.headers.get("Idempotency-Key"))
        if key is None:
            return error(400, "idempotency_key_missing", "the Idempotency-Key header is required")
        try:
            body = json.loads(req.body)
        except ValueError:
            return error(400, "invalid_json", "body is not JSON")
        with self._lock:
            if key in self._in_flight:
                return error(
                    409,
                    "idempotency_key_in_use",
                    "a request with this Idempotency-Key is still being processed",
                )
            self._in_flight.add(key)
        try:
            # Holding the key for the whole request (hangs included) is what makes the 409
            # above true, and what keeps two requests for one key from both committing.
            return self._create_refund_holding_key(key, body)
        finally:
            with self._lock:
                self._in_flight.discard(key)

    def _create_refund_holding_key(self, key: str, body: Any) -> Outcome:
        fingerprint = canonical_json(body)
        stored = self._stored_response(key)
        if stored is not None and stored["fingerprint"] != fingerprint:
            return error(
                422, "idempotency_key_reused", "this Idempotency-Key was used with another payload"
            )

        attempt = self.store.record_attempt(key)
        order_id = body.get("order_id") if isinstance(body, dict) else None
        fault = magic_fault_for_attempt(parse_magic(order_id), attempt)
        fault = fault or self.store.take_service_fault("writes")

        if fault in BEFORE_COMMIT:
            if fault == "429":
                return error(429, "rate_limited", "too many requests", **{"Retry-After": "1"})
            if fault == "5xx-before-commit":
                return error(503, "unavailable", "injected fault before commit")
            self.hang()  # timeout-before-commit: hold the request, then walk away
            return DROP

        if stored is not None:
            reply = Reply(
                stored["status"], json.loads(stored["body"]), {"Idempotent-Replayed": "true"}
            )
            if fault == "opaque":
                with self.store.tx() as conn:
                    self.store.mark_opaque(conn, key)
        else:
            reply = self._commit(key, body, fingerprint, opaque=fault == "opaque")

        if fault == "timeout-after-commit":
            self.hang()
            return reply  # a late reply: the client has usually given up by now
        if fault in ("lost-reply", "opaque"):
            return DROP
        if fault == "5xx-after-commit":
            return error(500, "internal_error", "injected fault after commit")
        if fault == "crash":
            crash(f"fault-crash for key {key!r}")
        return reply

    def _commit(self, key: str, body: Any, fingerprint: str, *, opaque: bool) -> Reply:
        problems = validate_refund(body)
        with self.store.tx() as conn:
            if problems:
                reply = error(400, "invalid_request", "the refund is invalid", problems)
            else:
                refund = {
                    "id": "re_" + secrets.token_hex(12),
                    "object": "refund",
                    "status": "succeeded",
                    "order_id": body["order_id"],
                    "amount": body["amount"],
                    "currency": body["currency"].upper(),
                    "reason": body["reason"],
                    "idempotency_key": key,
                    "created": now_iso(),
                }
                self.store.add_effect(
                    conn, key=key, match_key=key, payload=refund, remote_id=refund["id"]
                )
                reply = Reply(201, refund)
            conn.execute(
                "INSERT INTO responses (match_key, fingerprint, status, body, at) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, fingerprint, reply.status, json.dumps(reply.body), now_iso()),
            )
            if opaque:
                self.store.mark_opaque(conn, key)
        return reply

    def _stored_response(self, key: str) -> dict[str, Any] | None:
        with self.store.read() as conn:
            row = conn.execute("SELECT * FROM responses WHERE match_key = ?", (key,)).fetchone()
        return dict(row) if row is not None else None

    # -- queries ---------------------------------------------------------------------------

    def _opaque(self, key: str) -> bool:
        return "fault-opaque" in key.lower() or self.store.is_opaque(key)

    def refund_by_key(self, key: str) -> Reply:
        if self._opaque(key):
            return error(500, "internal_error", "cannot tell (fault-opaque)")
        effects = self.store.effects(match_key=key)
        if effects:
            return Reply(200, {"found": True, "state": "succeeded", "refund": effects[0].payload})
        with self._lock:
            in_flight = key in self._in_flight
        if in_flight:
            return Reply(200, {"found": True, "state": "processing"})
        stored = self._stored_response(key)
        if stored is not None:
            # A known failure (validation): nothing happened and nothing will for this key.
            return Reply(
                404,
                {
                    "found": False,
                    "state": "failed",
                    "response": {"status": stored["status"], "body": json.loads(stored["body"])},
                },
            )
        return Reply(404, {"found": False})

    def refund_by_id(self, refund_id: str) -> Reply:
        effects = self.store.effects(remote_id=refund_id)
        if not effects:
            return error(404, "not_found", f"no refund {refund_id!r}")
        if self._opaque(effects[0].key):
            return error(500, "internal_error", "cannot tell (fault-opaque)")
        return Reply(200, effects[0].payload)

    def order(self, order_id: str) -> Reply:
        if order_id.startswith("missing-"):
            return error(404, "not_found", f"no order {order_id!r}")
        return Reply(200, fake_order(order_id))


def serve(sock: Any, db: str, hang_seconds: float, verbose: bool, generation: int) -> None:
    app = PaymentsApp(Store(db, SCHEMA), hang_seconds=hang_seconds, generation=generation)
    SandboxHTTPServer(sock, app, verbose=verbose).serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.payments",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_arguments(parser)
    parser.add_argument("--port", type=int, required=True, help="HTTP port (0: any free port)")
    args = parser.parse_args(argv)

    Store(args.db, SCHEMA).init()  # fail here, loudly, rather than in a restart loop
    sock = bind(args.host, args.port)
    return supervise(
        service="payments",
        ports={"http_port": sock.getsockname()[1]},
        serve=partial(serve, sock, args.db, args.hang_seconds, args.verbose),
        parent_pid=args.parent_pid,
    )


if __name__ == "__main__":
    raise SystemExit(main())
