"""The payments sandbox's own OpenAPI 3.1 document, served at ``GET /openapi.json``.

It describes the routes of sandbox/payments.py as they behave, so a client generated (or a tool
imported) from it talks to the real server: ``createRefund`` declares its ``Idempotency-Key``
header, ``getRefundByKey`` reads by that key (found, processing, or 404 absent).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def document(*, currencies: Iterable[str]) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "Payments sandbox", "version": "1.0.0",
                 "description": "Refunds with Idempotency-Key semantics, and read-only orders."},
        # Relative: the server is wherever this document was fetched from.
        "servers": [{"url": "/"}],
        "paths": {
            "/refunds": {
                "post": {
                    "operationId": "createRefund",
                    "summary": "Refund (part of) an order.",
                    "parameters": [{
                        "name": "Idempotency-Key", "in": "header", "required": True,
                        "description": "Replays the first answer for the same key and payload; 422 for another "
                                       "payload; 409 while the first request is in flight.",
                        "schema": {"type": "string", "maxLength": 255},
                    }],
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/RefundRequest"}}}},
                    "responses": {
                        "201": _json({"$ref": "#/components/schemas/Refund"}, "The refund."),
                        "400": _json(ERROR, "Invalid; nothing happened."),
                        "409": _json(ERROR, "A request with this key is in flight."),
                        "422": _json(ERROR, "This key was used with another payload."),
                    },
                },
            },
            "/refunds/by-key/{key}": {
                "get": {
                    "operationId": "getRefundByKey",
                    "summary": "What happened to the refund requested with this Idempotency-Key.",
                    "parameters": [{"name": "key", "in": "path", "required": True,
                                    "description": "The Idempotency-Key of the request.",
                                    "schema": {"type": "string"}}],
                    "responses": {
                        "200": _json({
                            "type": "object",
                            "properties": {
                                "found": {"type": "boolean"},
                                "state": {"type": "string", "enum": ["succeeded", "processing"]},
                                "refund": {"$ref": "#/components/schemas/Refund"},
                            },
                            "required": ["found", "state"],
                        }, "A refund with this key exists, or its request is still being processed."),
                        "404": _json({"type": "object"}, "No refund with this key, and none in flight."),
                    },
                },
            },
            "/refunds/{refund_id}": {
                "get": {
                    "operationId": "getRefund",
                    "summary": "One refund by its id.",
                    "parameters": [{"name": "refund_id", "in": "path", "required": True,
                                    "schema": {"type": "string"}}],
                    "responses": {"200": _json({"$ref": "#/components/schemas/Refund"}, "The refund."),
                                  "404": _json(ERROR, "No such refund.")},
                },
            },
            "/orders/{order_id}": {
                "get": {
                    "operationId": "getOrder",
                    "summary": "One order (a deterministic fake).",
                    "parameters": [{"name": "order_id", "in": "path", "required": True,
                                    "schema": {"type": "string", "minLength": 1, "maxLength": 100}}],
                    "responses": {"200": _json({"$ref": "#/components/schemas/Order"}, "The order."),
                                  "404": _json(ERROR, "No such order.")},
                },
            },
        },
        "components": {"schemas": {
            "RefundRequest": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string", "minLength": 1, "maxLength": 100},
                    "amount": {"type": "number", "exclusiveMinimum": 0},
                    "currency": {"type": "string", "enum": sorted(currencies)},
                    "reason": {"type": "string", "maxLength": 500},
                },
                "required": ["order_id", "amount", "currency", "reason"],
            },
            "Refund": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "object": {"type": "string", "const": "refund"},
                    "status": {"type": "string"},
                    "order_id": {"type": "string"},
                    "amount": {"type": "number"},
                    "currency": {"type": "string"},
                    "reason": {"type": "string"},
                    "idempotency_key": {"type": "string"},
                    "created": {"type": "string", "format": "date-time"},
                },
            },
            "Order": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "amount": {"type": "number"},
                    "currency": {"type": "string"},
                    "status": {"type": "string"},
                    "customer_email": {"type": "string"},
                },
            },
            "Error": {
                "type": "object",
                "properties": {"error": {"type": "object", "properties": {
                    "code": {"type": "string"}, "message": {"type": "string"}, "details": {"type": "object"}}}},
            },
        }},
    }
