"""OTLP ingest against hostile input: wrong-shaped JSON is a 400 or a rejected span, never a
500; one span cannot store unbounded attributes, values, events or links (truncation is
recorded on the span, as the OpenTelemetry SDK's span limits do); a tenant cannot fill the
database (a span quota)."""

from __future__ import annotations

import gzip
import json

import pytest
from django.test import Client

from runs.models import Span
from tests.conftest import AGENT_TOKEN
from tests.runs.test_otlp import TRACE, otlp_json, post, span_json

pytestmark = pytest.mark.django_db


def kvlist_body(depth: int) -> bytes:
    """A span whose one attribute is a kvlistValue `depth` deep, as text (json.dumps would
    recurse past Python's limit)."""
    value = '{"stringValue": "leaf"}'
    value = '{"kvlistValue": {"values": [{"key": "k", "value": ' * depth + value + "}]}}" * depth
    span = json.dumps({**GOOD, "attributes": []}).replace('"attributes": []', f'"attributes": [{{"key": "deep", "value": {value}}}]')
    return ('{"resourceSpans": [{"scopeSpans": [{"spans": [' + span + "]}]}]}").encode()


GOOD = span_json("1111111111111111")


def post_raw(client, body: bytes):
    return client.post("/v1/traces", data=body, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")
BAD_SHAPES = {
    "resourceSpans holds a string": {"resourceSpans": ["x"]},
    "resourceSpans is an object": {"resourceSpans": {"x": 1}},
    "scopeSpans is not a list": {"resourceSpans": [{"scopeSpans": "x"}]},
    "scopeSpans holds a number": {"resourceSpans": [{"scopeSpans": [3]}]},
    "spans is a string": {"resourceSpans": [{"scopeSpans": [{"spans": "x"}]}]},
    "a span is a list": {"resourceSpans": [{"scopeSpans": [{"spans": [[1]]}]}]},
    "the resource is a string": {"resourceSpans": [{"resource": "x", "scopeSpans": [{"spans": [GOOD]}]}]},
    "resource attributes are an object": {"resourceSpans": [{"resource": {"attributes": {"a": 1}},
                                                             "scopeSpans": [{"spans": [GOOD]}]}]},
    "a resource attribute key is a list": {"resourceSpans": [{
        "resource": {"attributes": [{"key": ["a"], "value": {"stringValue": "x"}}]},
        "scopeSpans": [{"spans": [GOOD]}]}]},
    "a resource int is not a number": {"resourceSpans": [{
        "resource": {"attributes": [{"key": "a", "value": {"intValue": "many"}}]},
        "scopeSpans": [{"spans": [GOOD]}]}]},
    "the payload is a list": [GOOD],
}


@pytest.mark.parametrize("payload", list(BAD_SHAPES.values()), ids=list(BAD_SHAPES))
def test_a_wrong_shaped_request_is_a_400_in_the_error_shape(client, agent, payload):
    response = post(client, payload)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid"
    assert Span.objects.count() == 0


@pytest.mark.parametrize("depth", [250, 5000])
def test_a_kvlist_nested_deeper_than_the_budget_is_a_400(client, agent, depth):
    response = post_raw(client, kvlist_body(depth))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"


def test_a_kvlist_within_the_budget_is_stored(client, agent):
    assert post_raw(client, kvlist_body(10)).status_code == 200
    assert Span.objects.count() == 1


BAD_SPANS = {
    "an attribute key is a list": {**GOOD, "attributes": [{"key": ["a"], "value": {"stringValue": "x"}}]},
    "an attribute value is a string": {**GOOD, "attributes": [{"key": "a", "value": "x"}]},
    "an event attribute key is an object": {**GOOD, "events": [{"name": "e", "timeUnixNano": "1700000000000000000",
                                                                "attributes": [{"key": {}, "value": {}}]}]},
    "the start is 10^25 ns": {**GOOD, "startTimeUnixNano": str(10**25), "endTimeUnixNano": str(10**25 + 1)},
    "the end is 10^25 ns": {**GOOD, "endTimeUnixNano": str(10**25)},
    "an event time is 10^25 ns": {**GOOD, "events": [{"name": "e", "timeUnixNano": str(10**25)}]},
    "an int attribute beyond 64 bits": {**GOOD, "attributes": [{"key": "n", "value": {"intValue": str(2**64)}}]},
    "the status is a string": {**GOOD, "status": "bad"},
    "events is an object": {**GOOD, "events": {"e": 1}},
    "the name is an object": {**GOOD, "name": {"a": 1}},
}


@pytest.mark.parametrize("span", list(BAD_SPANS.values()), ids=list(BAD_SPANS))
def test_a_wrong_shaped_span_is_rejected_and_the_others_stored(client, agent, span):
    response = post(client, otlp_json(span, span_json("2222222222222222")))
    assert response.status_code == 200, response.content
    assert response.json()["partialSuccess"]["rejectedSpans"] == 1
    assert list(Span.objects.values_list("span_id", flat=True)) == ["2222222222222222"]


def test_a_wrong_shaped_protobuf_time_is_rejected_not_a_500(client, agent):
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    request = trace_service_pb2.ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex("5b8efff798038103d269b633813fc60c"), b"\x01" * 8, "far"
    span.start_time_unix_nano, span.end_time_unix_nano = 2**64 - 2, 2**64 - 1
    response = Client().post("/v1/traces", data=request.SerializeToString(), content_type="application/x-protobuf",
                             HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")
    assert response.status_code == 200
    answer = trace_service_pb2.ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert Span.objects.count() == 0


def test_a_protobuf_span_holding_u0000_is_rejected_and_the_others_stored(client, agent):
    """Protobuf strings are UTF-8 and may hold U+0000, which PostgreSQL's text and jsonb refuse
    (a 500 there; SQLite stored it)."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    request = trace_service_pb2.ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for span_id, name, value in ((b"\x01" * 8, "nul in an attribute", "a\x00b"), (b"\x02" * 8, "fine", "ab")):
        span = spans.add()
        span.trace_id, span.span_id, span.name = bytes.fromhex("5b8efff798038103d269b633813fc60c"), span_id, name
        span.start_time_unix_nano, span.end_time_unix_nano = 1_700_000_000_000_000_000, 1_700_000_001_000_000_000
        attribute = span.attributes.add()
        attribute.key, attribute.value.string_value = "note", value
    response = Client().post("/v1/traces", data=request.SerializeToString(), content_type="application/x-protobuf",
                             HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")
    assert response.status_code == 200
    answer = trace_service_pb2.ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert "U+0000" in answer.partial_success.error_message
    assert list(Span.objects.values_list("name", flat=True)) == ["fine"]


# --- per-span limits -------------------------------------------------------------------------

def attribute(key: str, value: str) -> dict:
    return {"key": key, "value": {"stringValue": value}}


def test_a_span_keeps_at_most_the_attribute_limit_and_records_how_many_it_dropped(client, agent, settings):
    settings.OTLP_SPAN_ATTRIBUTE_COUNT_LIMIT = 128
    span = {**GOOD, "attributes": [attribute(f"a{i}", "x") for i in range(100_000)], "droppedAttributesCount": 5}
    assert post(client, otlp_json(span), gzip_it=True).status_code == 200
    stored = Span.objects.get()
    assert len(stored.attributes) == 128 and list(stored.attributes)[:2] == ["a0", "a1"]
    assert stored.dropped_attributes_count == 100_000 - 128 + 5  # ours and the exporter's own


def test_a_long_value_is_truncated_and_counted(client, agent, settings):
    settings.OTLP_ATTRIBUTE_VALUE_LENGTH_LIMIT = 4096
    span = {**GOOD, "status": {"code": 2, "message": "m" * 20_000_000},
            "attributes": [attribute("big", "b" * 10_000), attribute("small", "s"),
                           {"key": "list", "value": {"arrayValue": {"values": [{"stringValue": "l" * 5000}]}}}]}
    body = json.dumps(otlp_json(span)).encode()
    response = client.post("/v1/traces", data=gzip.compress(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}", HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 200
    stored = Span.objects.get()
    assert len(stored.status_message) == 4096
    assert (len(stored.attributes["big"]), stored.attributes["small"]) == (4096, "s")
    assert len(stored.attributes["list"][0]) == 4096
    assert stored.truncated_values_count == 3


def test_events_and_their_attributes_are_limited_and_links_counted(client, agent, settings):
    settings.OTLP_SPAN_EVENT_COUNT_LIMIT = 128
    settings.OTLP_EVENT_ATTRIBUTE_COUNT_LIMIT = 128
    events = [{"name": f"e{i}", "timeUnixNano": "1700000000100000000",
               "attributes": [attribute(f"k{j}", "v") for j in range(200 if i == 0 else 1)]} for i in range(1000)]
    links = [{"traceId": TRACE, "spanId": "3333333333333333"}] * 7
    assert post(client, otlp_json({**GOOD, "events": events, "links": links})).status_code == 200
    stored = Span.objects.get()
    assert len(stored.events) == 128 and stored.events[0]["name"] == "e0"
    assert len(stored.events[0]["attributes"]) == 128
    assert stored.dropped_events_count == 1000 - 128
    assert stored.dropped_attributes_count == 200 - 128  # the event's, counted on its span
    assert stored.dropped_links_count == 7  # links are not stored


def test_a_nested_value_is_limited_in_width_too(client, agent, settings):
    settings.OTLP_SPAN_ATTRIBUTE_COUNT_LIMIT = 128
    wide = {"arrayValue": {"values": [{"intValue": str(i)} for i in range(50_000)]}}
    assert post(client, otlp_json({**GOOD, "attributes": [{"key": "wide", "value": wide}]})).status_code == 200
    stored = Span.objects.get()
    assert len(stored.attributes["wide"]) == 128
    assert stored.truncated_values_count == 1


# --- the tenant's span quota -----------------------------------------------------------------

def spans(first: int, n: int) -> dict:
    return otlp_json(*[span_json(f"{first + i:016x}") for i in range(n)])


def test_spans_over_the_tenants_quota_are_dropped_counted_and_reported(client, agent, outsider_agent, settings):
    from runs.models import TenantSpanUsage
    from tests.conftest import OUTSIDER_TOKEN

    settings.OTLP_TENANT_SPAN_QUOTA = 5
    assert "partialSuccess" not in post(client, spans(0x1000, 3)).json()
    answer = post(client, spans(0x2000, 4)).json()  # 2 fit
    assert answer["partialSuccess"]["rejectedSpans"] == 2
    assert "quota" in answer["partialSuccess"]["errorMessage"]
    assert post(client, spans(0x3000, 1)).json()["partialSuccess"]["rejectedSpans"] == 1
    assert Span.objects.filter(tenant=agent.tenant).count() == 5
    usage = TenantSpanUsage.objects.get(tenant=agent.tenant)
    assert (usage.spans, usage.dropped_over_quota) == (5, 3)
    settings.METRICS_TOKEN = "s3cret"  # the operator sees it
    metrics = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").content.decode()
    assert 'countersign_tenant_spans_dropped_over_quota{tenant="acme"} 3.0' in metrics
    # another tenant has its own quota
    assert "partialSuccess" not in post(client, spans(0x4000, 5), token=OUTSIDER_TOKEN).json()


def test_a_resent_batch_does_not_use_the_quota_twice(client, agent, settings):
    from runs.models import TenantSpanUsage

    settings.OTLP_TENANT_SPAN_QUOTA = 10
    for _ in range(6):
        assert "partialSuccess" not in post(client, spans(0x1000, 2)).json()
    assert TenantSpanUsage.objects.get(tenant=agent.tenant).spans == 2


def test_no_quota_when_it_is_zero(client, agent, settings):
    settings.OTLP_TENANT_SPAN_QUOTA = 0
    assert "partialSuccess" not in post(client, spans(0x1000, 20)).json()
    assert Span.objects.count() == 20
