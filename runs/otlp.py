"""OTLP/HTTP trace ingest (`POST /v1/traces`): protobuf or JSON, optionally gzip, authenticated
by an agent's bearer token. Spans are committed before the answer, so "accepted" means
"queryable" (unlike receivers that answer at once and write later)."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2

from console.api import error_body, principal_for_authorization
from console.lib import jsonlimits
from console.lib.errors import InvalidInput, RateLimited
from console.ratelimit import rate_limit_hit
from runs.spans import spans_ingest, spans_within_quota

MAX_BODY_BYTES = 32 * 1024 * 1024
PROTOBUF = "application/x-protobuf"
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS = {0: "unset", 1: "ok", 2: "error"}


@dataclass
class ParsedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status_code: str
    status_message: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    # What the exporter's SDK already left out, then what our limits leave out (apply_limits).
    dropped_attributes_count: int = 0
    dropped_events_count: int = 0
    dropped_links_count: int = 0  # links are not stored: every link is counted here
    truncated_values_count: int = 0


@dataclass
class ParseResult:
    spans: list[ParsedSpan]
    rejected: int = 0
    errors: list[str] = field(default_factory=list)


def _valid_id(value: str, length: int) -> bool:
    return len(value) == length and all(c in "0123456789abcdef" for c in value) and set(value) != {"0"}


# --- protobuf ---------------------------------------------------------------------------------

def _double(value: float) -> float | str:
    """A double as stored: JSON (and PostgreSQL's jsonb) has no NaN or infinities, so those keep
    the spelling proto3's JSON mapping gives them ("NaN", "Infinity", "-Infinity")."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _pb_value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "double_value":
        return _double(value.double_value)
    if kind == "array_value":
        return [_pb_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _pb_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def _pb_attributes(attributes) -> dict[str, Any]:
    return {kv.key: _pb_value(kv.value) for kv in attributes}


def parse_protobuf(body: bytes) -> ParseResult:
    request = trace_service_pb2.ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise InvalidInput(f"Not an OTLP ExportTraceServiceRequest: {exc}") from exc
    result = ParseResult(spans=[])
    for resource_spans in request.resource_spans:
        resource = _pb_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                _append(result, ParsedSpan(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(), name=span.name, kind=KINDS.get(span.kind, ""),
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    status_code=STATUS.get(span.status.code, "unset"), status_message=span.status.message,
                    attributes=_pb_attributes(span.attributes), resource=resource,
                    events=[{"name": e.name, "time_ns": e.time_unix_nano, "attributes": _pb_attributes(e.attributes)}
                            for e in span.events],
                    dropped_attributes_count=span.dropped_attributes_count,
                    dropped_events_count=span.dropped_events_count,
                    dropped_links_count=span.dropped_links_count + len(span.links),
                ))
    return result


# --- JSON (OTLP/JSON: lowerCamelCase, ids in hex, 64-bit integers as strings) ----------------
# Anything an agent sends may have any shape: a container of the wrong type is a 400 for the
# whole request (nothing in it can be read), a span of the wrong shape is rejected on its own
# (partial success). Nothing here may raise anything but InvalidInput or, inside a span,
# _BadSpan.

INT64 = (-(2**63), 2**63 - 1)


class _BadSpan(ValueError):
    pass


def _list_of_objects(value: Any, where: str, *, error: type[Exception] = InvalidInput) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise error(f"{where} must be a list of objects.")
    return value


def _object(value: Any, where: str, *, error: type[Exception] = InvalidInput) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise error(f"{where} must be an object.")
    return value


def _json_int(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise _BadSpan(f"{where} must be an integer")
    try:
        number = int(raw)
    except ValueError:
        raise _BadSpan(f"{where} must be an integer") from None
    if not INT64[0] <= number <= INT64[1]:
        raise _BadSpan(f"{where} is outside 64 bits")
    return number


def _json_value(value: Any) -> Any:
    if not isinstance(value, dict):
        raise _BadSpan("an attribute value must be an AnyValue object")
    if not value:
        return None
    key, raw = next(iter(value.items()))
    if key == "intValue":
        return _json_int(raw, "intValue")
    if key == "doubleValue":
        try:
            return _double(float(raw))
        except (TypeError, ValueError):
            raise _BadSpan("doubleValue must be a number") from None
    if key == "arrayValue":
        return [_json_value(v) for v in _list_of_objects(_object(raw, "arrayValue", error=_BadSpan).get("values"),
                                                         "arrayValue.values", error=_BadSpan)]
    if key == "kvlistValue":
        return _json_attributes(_object(raw, "kvlistValue", error=_BadSpan).get("values"))
    if key in ("stringValue", "bytesValue") and not isinstance(raw, str):
        raise _BadSpan(f"{key} must be a string")
    if key == "boolValue" and not isinstance(raw, bool):
        raise _BadSpan("boolValue must be true or false")
    return raw


def _json_attributes(attributes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in _list_of_objects(attributes, "attributes", error=_BadSpan):
        key = kv.get("key")
        if not isinstance(key, str):
            raise _BadSpan("an attribute key must be a string")
        out[key] = _json_value(kv.get("value", {}))
    return out


def _json_kind(raw: Any) -> str:
    if isinstance(raw, str) and raw.startswith("SPAN_KIND_"):
        return raw.removeprefix("SPAN_KIND_").lower()[:16]
    try:
        return KINDS.get(int(raw or 0), "")
    except (TypeError, ValueError):
        return ""


def _json_status(raw: Any) -> str:
    if isinstance(raw, str) and raw.startswith("STATUS_CODE_"):
        code = raw.removeprefix("STATUS_CODE_").lower()
        return code if code in STATUS.values() else "unset"
    try:
        return STATUS.get(int(raw or 0), "unset")
    except (TypeError, ValueError):
        return "unset"


def _json_text(raw: Any, where: str) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise _BadSpan(f"{where} must be a string")
    return raw


def _json_count(raw: Any) -> int:
    """A uint32 count the exporter reports (0 when absent)."""
    number = _json_int(raw or 0, "a dropped count")
    if not 0 <= number < 2**32:
        raise _BadSpan("a dropped count must be a uint32")
    return number


def _json_span(span: dict[str, Any], resource: dict[str, Any]) -> ParsedSpan:
    status = _object(span.get("status"), "status", error=_BadSpan)
    return ParsedSpan(
        trace_id=_json_text(span.get("traceId"), "traceId").lower(),
        span_id=_json_text(span.get("spanId"), "spanId").lower(),
        parent_span_id=_json_text(span.get("parentSpanId"), "parentSpanId").lower(),
        name=_json_text(span.get("name"), "name"), kind=_json_kind(span.get("kind")),
        start_ns=_json_int(span.get("startTimeUnixNano", 0), "startTimeUnixNano"),
        end_ns=_json_int(span.get("endTimeUnixNano", 0), "endTimeUnixNano"),
        status_code=_json_status(status.get("code")),
        status_message=_json_text(status.get("message"), "status.message"),
        attributes=_json_attributes(span.get("attributes")), resource=resource,
        events=[{"name": _json_text(e.get("name"), "event name"),
                 "time_ns": _json_int(e.get("timeUnixNano", 0), "event timeUnixNano"),
                 "attributes": _json_attributes(e.get("attributes"))}
                for e in _list_of_objects(span.get("events"), "events", error=_BadSpan)],
        dropped_attributes_count=_json_count(span.get("droppedAttributesCount")),
        dropped_events_count=_json_count(span.get("droppedEventsCount")),
        dropped_links_count=_json_count(span.get("droppedLinksCount"))
        + len(_list_of_objects(span.get("links"), "links", error=_BadSpan)),
    )


def parse_json(payload: Any) -> ParseResult:
    if not isinstance(payload, dict):
        raise InvalidInput("Expected an OTLP/JSON object with resourceSpans.")
    result = ParseResult(spans=[])
    for i, resource_spans in enumerate(_list_of_objects(payload.get("resourceSpans"), "resourceSpans")):
        where = f"resourceSpans[{i}]"
        try:
            resource = _json_attributes(_object(resource_spans.get("resource"), f"{where}.resource").get("attributes"))
        except _BadSpan as exc:
            raise InvalidInput(f"{where}.resource: {exc}.") from exc
        for j, scope_spans in enumerate(_list_of_objects(resource_spans.get("scopeSpans"), f"{where}.scopeSpans")):
            for span in _list_of_objects(scope_spans.get("spans"), f"{where}.scopeSpans[{j}].spans"):
                try:
                    parsed = _json_span(span, resource)
                except _BadSpan as exc:
                    result.rejected += 1
                    result.errors.append(f"span: {exc}")
                    continue
                _append(result, parsed)
    return result


# --- per-span limits --------------------------------------------------------------------------

class _Limiter:
    """The OpenTelemetry SDK's span limits, applied on the way in: attributes beyond the count
    are dropped (the first ones kept, in the order sent), strings cut to the length limit, lists
    and maps inside a value cut to the attribute count; events beyond theirs dropped. What was
    left out is counted on the span."""

    def __init__(self) -> None:
        self.length = settings.OTLP_ATTRIBUTE_VALUE_LENGTH_LIMIT
        self.width = settings.OTLP_SPAN_ATTRIBUTE_COUNT_LIMIT
        self.truncated = 0
        self.dropped_attributes = 0

    def text(self, value: str) -> str:
        if len(value) > self.length:
            self.truncated += 1
            return value[:self.length]
        return value

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            if len(value) > self.width:
                self.truncated += 1
                value = value[:self.width]
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            if len(value) > self.width:
                self.truncated += 1
                value = dict(list(value.items())[:self.width])
            return {self.text(k): self.value(v) for k, v in value.items()}
        return value

    def attributes(self, attributes: dict[str, Any], count: int) -> dict[str, Any]:
        kept = list(attributes.items())[:count]
        self.dropped_attributes += len(attributes) - len(kept)
        return {self.text(key): self.value(value) for key, value in kept}


def apply_limits(span: ParsedSpan) -> ParsedSpan:
    limiter = _Limiter()
    span.attributes = limiter.attributes(span.attributes, settings.OTLP_SPAN_ATTRIBUTE_COUNT_LIMIT)
    span.resource = limiter.attributes(span.resource, settings.OTLP_SPAN_ATTRIBUTE_COUNT_LIMIT)
    span.status_message = limiter.text(span.status_message)
    kept = span.events[:settings.OTLP_SPAN_EVENT_COUNT_LIMIT]
    span.dropped_events_count += len(span.events) - len(kept)
    span.events = [{**event, "name": limiter.text(event["name"]),
                    "attributes": limiter.attributes(event["attributes"], settings.OTLP_EVENT_ATTRIBUTE_COUNT_LIMIT)}
                   for event in kept]
    span.dropped_attributes_count += limiter.dropped_attributes
    span.truncated_values_count += limiter.truncated
    return span


def _append(result: ParseResult, span: ParsedSpan) -> None:
    problem = None
    if not _valid_id(span.trace_id, 32):
        problem = "invalid traceId"
    elif not _valid_id(span.span_id, 16):
        problem = "invalid spanId"
    elif span.parent_span_id and not _valid_id(span.parent_span_id, 16):
        problem = "invalid parentSpanId"
    elif not 0 < span.start_ns <= span.end_ns <= INT64[1]:
        problem = "invalid start/end time (nanoseconds since 1970, at most 2^63 - 1)"
    elif any(not 0 <= event["time_ns"] <= INT64[1] for event in span.events):
        problem = "invalid event time"
    else:
        try:
            jsonlimits.check_storable([span.name, span.status_message, span.attributes, span.resource, span.events])
        except jsonlimits.Unstorable as exc:
            problem = str(exc)
    if problem:
        result.rejected += 1
        result.errors.append(f"{span.name[:100] or 'span'}: {problem}")
    else:
        result.spans.append(apply_limits(span))


# --- the endpoint -----------------------------------------------------------------------------

def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status)


def _body(request: HttpRequest) -> bytes:
    body = request.body
    encoding = request.headers.get("Content-Encoding", "").lower()
    if encoding == "gzip":
        try:
            decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
            body = decompressor.decompress(body, MAX_BODY_BYTES + 1)
        except zlib.error as exc:
            raise InvalidInput(f"Body is not valid gzip: {exc}") from exc
    elif encoding not in ("", "identity"):
        raise InvalidInput(f"Unsupported Content-Encoding {encoding!r}; use gzip or none.")
    if len(body) > MAX_BODY_BYTES:
        raise InvalidInput(f"Body larger than {MAX_BODY_BYTES} bytes.")
    return body


@csrf_exempt
@require_POST
def otlp_traces(request: HttpRequest) -> HttpResponse:
    principal = principal_for_authorization(request.headers.get("Authorization", ""))
    if principal is None:
        response = _error(401, "unauthenticated", "Use 'Authorization: Bearer <agent token>'.")
        response["WWW-Authenticate"] = "Bearer"
        return response
    try:
        rate_limit_hit(principal)
    except RateLimited as exc:
        response = JsonResponse(error_body(exc.code, exc.message, exc.details), status=exc.status)
        response["Retry-After"] = str(exc.retry_after)
        return response
    content_type = request.content_type or ""
    try:
        body = _body(request)
        if content_type == PROTOBUF:
            parsed = parse_protobuf(body)
        elif content_type == "application/json":
            try:
                parsed = parse_json(jsonlimits.loads(body or b"{}", constants=True))
            except jsonlimits.TooDeep as exc:
                raise InvalidInput(str(exc)) from exc
            except ValueError as exc:
                raise InvalidInput(f"Body is not JSON: {exc}") from exc
        else:
            return _error(415, "unsupported_media_type", "Send application/x-protobuf or application/json.")
    except InvalidInput as exc:
        return _error(400, exc.code, exc.message)
    kept, over_quota = spans_within_quota(principal=principal, spans=parsed.spans)
    if over_quota:
        parsed.rejected += over_quota
        parsed.errors.insert(0, f"{over_quota} spans dropped: the tenant's span quota "
                                f"({settings.OTLP_TENANT_SPAN_QUOTA} spans) is used up")
    spans_ingest(principal=principal, spans=kept)
    if content_type == PROTOBUF:
        answer = trace_service_pb2.ExportTraceServiceResponse()
        if parsed.rejected:
            answer.partial_success.rejected_spans = parsed.rejected
            answer.partial_success.error_message = "; ".join(parsed.errors[:10])
        return HttpResponse(answer.SerializeToString(), content_type=PROTOBUF)
    payload: dict[str, Any] = {}
    if parsed.rejected:
        payload["partialSuccess"] = {"rejectedSpans": parsed.rejected, "errorMessage": "; ".join(parsed.errors[:10])}
    return JsonResponse(payload)

