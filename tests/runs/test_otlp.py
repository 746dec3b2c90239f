"""OTLP/HTTP trace ingest: protobuf and JSON, gzip, bearer auth, linking to Countersign records."""

from __future__ import annotations

import gzip
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from runs.models import Span
from runs.services import task_create
from tests.conftest import AGENT_TOKEN

TRACE = "5b8efff798038103d269b633813fc60c"


def otlp_json(*spans: dict, resource: dict | None = None) -> dict:
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": k, "value": {"stringValue": v}} for k, v in (resource or {}).items()]},
        "scopeSpans": [{"scope": {"name": "agent"}, "spans": list(spans)}],
    }]}


def span_json(span_id: str, *, name: str = "tool call", parent: str = "", attributes: dict | None = None,
              start: int = 1_700_000_000_000_000_000, end: int = 1_700_000_000_250_000_000) -> dict:
    attrs = []
    for key, value in (attributes or {}).items():
        kind = "intValue" if isinstance(value, int) else "stringValue"
        attrs.append({"key": key, "value": {kind: str(value) if kind == "intValue" else value}})
    return {"traceId": TRACE, "spanId": span_id, "parentSpanId": parent, "name": name, "kind": 3,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end), "attributes": attrs,
            "status": {"code": 2, "message": "boom"} if name == "failing" else {}}


def post(client, payload, *, token=AGENT_TOKEN, gzip_it=False, content_type="application/json"):
    body = json.dumps(payload).encode()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if gzip_it:
        body = gzip.compress(body)
        headers["HTTP_CONTENT_ENCODING"] = "gzip"
    return client.post("/v1/traces", data=body, content_type=content_type, **headers)


@pytest.mark.django_db
def test_it_stores_json_spans_linked_to_the_task_and_gen_ai_fields(client, agent):
    task = task_create(principal=agent, task_type="refund", goal="g")
    payload = otlp_json(
        span_json("051581bf3cb55c13", name="chat", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "demo-model",
            "gen_ai.response.model": "demo-model-2026-01", "gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": 30}),
        span_json("051581bf3cb55c14", name="failing", parent="051581bf3cb55c13",
                  attributes={"gen_ai.tool.name": "payments.refund", "gen_ai.tool.call.id": "call-1",
                              "countersign.step_id": "refund"}),
        resource={"service.name": "demo-agent", "countersign.task_id": task.task_id},
    )
    response = post(client, payload, gzip_it=True)
    assert response.status_code == 200, response.content
    assert response.json() == {}
    chat = Span.objects.get(span_id="051581bf3cb55c13")
    assert chat.task_id == task.task_id and chat.service_name == "demo-agent"
    assert (chat.gen_ai_model, chat.gen_ai_response_model, chat.input_tokens, chat.output_tokens) == (
        "demo-model", "demo-model-2026-01", 120, 30)
    assert chat.duration_ms == pytest.approx(250.0)
    tool = Span.objects.get(span_id="051581bf3cb55c14")
    assert (tool.parent_span_id, tool.call_id, tool.step_id, tool.status_code) == (
        "051581bf3cb55c13", "call-1", "refund", "error")


@pytest.mark.django_db
def test_a_resent_batch_is_stored_once(client, agent):
    payload = otlp_json(span_json("1111111111111111"))
    assert post(client, payload).status_code == 200
    assert post(client, payload).status_code == 200
    assert Span.objects.count() == 1


@pytest.mark.django_db
def test_it_never_links_a_span_to_another_tenants_task(client, agent, outsider_agent):
    foreign = task_create(principal=outsider_agent, task_type="refund", goal="g")
    payload = otlp_json(span_json("2222222222222222", attributes={"countersign.task_id": foreign.task_id}))
    assert post(client, payload).status_code == 200
    span = Span.objects.get()
    assert span.task_id is None and span.tenant_id == agent.tenant_id


@pytest.mark.django_db
def test_a_span_naming_an_operation_gets_its_task_step_and_call(client, agent, outsider_agent):
    from tests.factories import make_operation

    mine = make_operation(agent, step_id="refund", call_id="call-7")
    theirs = make_operation(outsider_agent, step_id="refund", call_id="call-8")
    payload = otlp_json(span_json("2222222222222221", name="dispatch",
                                  attributes={"countersign.operation_id": mine.operation_id}),
                        span_json("2222222222222222", name="dispatch",
                                  attributes={"countersign.operation_id": theirs.operation_id}))
    assert post(client, payload).status_code == 200
    linked = Span.objects.get(span_id="2222222222222221")
    assert (linked.task_id, linked.step_id, linked.call_id) == (mine.task_id, "refund", "call-7")
    foreign = Span.objects.get(span_id="2222222222222222")
    assert (foreign.task_id, foreign.step_id, foreign.call_id) == (None, "", "")


@pytest.mark.django_db
def test_a_tool_span_naming_only_its_call_gets_the_calls_operation(client, agent, outsider_agent):
    from tests.factories import make_operation

    mine = make_operation(agent, step_id="refund", call_id="call-9")
    theirs = make_operation(outsider_agent, step_id="refund", call_id="call-9")
    payload = otlp_json(
        span_json("2222222222222231", attributes={"countersign.task_id": mine.task_id, "gen_ai.tool.call.id": "call-9"}),
        # The same call ID under another tenant's task: neither the task nor its operation is linked.
        span_json("2222222222222232", attributes={"countersign.task_id": theirs.task_id,
                                                  "gen_ai.tool.call.id": "call-9"}),
    )
    assert post(client, payload).status_code == 200
    linked = Span.objects.get(span_id="2222222222222231")
    assert (linked.task_id, linked.step_id, linked.operation_id) == (mine.task_id, "refund", mine.operation_id)
    foreign = Span.objects.get(span_id="2222222222222232")
    assert (foreign.task_id, foreign.operation_id, foreign.call_id) == (None, "", "call-9")


@pytest.mark.django_db
def test_out_of_range_token_counts_are_stored_as_unknown_not_a_failed_batch(client, agent):
    payload = otlp_json(
        span_json("4444444444444441", attributes={"gen_ai.usage.input_tokens": -5, "gen_ai.usage.output_tokens": 7}),
        span_json("4444444444444442", attributes={"gen_ai.usage.input_tokens": 2**40,
                                                  "gen_ai.usage.output_tokens": "many"}),
    )
    assert post(client, payload).status_code == 200
    assert sorted(Span.objects.values_list("span_id", "input_tokens", "output_tokens")) == [
        ("4444444444444441", None, 7), ("4444444444444442", None, None)]


@pytest.mark.django_db
def test_non_finite_doubles_are_stored_by_name_not_a_failed_batch(client, agent):
    # Python's json reads a bare NaN; proto3's JSON mapping spells them as strings. Either way
    # the batch is stored (PostgreSQL's jsonb refuses NaN as a number).
    span = span_json("6666666666666666")
    span["attributes"] = [{"key": "score", "value": {"doubleValue": "NaN"}},
                          {"key": "limit", "value": {"doubleValue": float("inf")}},
                          {"key": "floor", "value": {"doubleValue": "-Infinity"}},
                          {"key": "ratio", "value": {"doubleValue": 0.5}}]
    assert post(client, otlp_json(span)).status_code == 200
    assert Span.objects.get().attributes == {"score": "NaN", "limit": "Infinity", "floor": "-Infinity",
                                             "ratio": 0.5}


@pytest.mark.django_db
def test_non_finite_doubles_over_protobuf_are_stored_by_name(client, agent):
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    request = trace_service_pb2.ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex(TRACE), bytes.fromhex("7777777777777777"), "x"
    span.start_time_unix_nano, span.end_time_unix_nano = 1_700_000_000_000_000_000, 1_700_000_000_100_000_000
    for key, value in (("score", float("nan")), ("limit", float("-inf"))):
        attribute = span.attributes.add()
        attribute.key, attribute.value.double_value = key, value
    response = client.post("/v1/traces", data=request.SerializeToString(), content_type="application/x-protobuf",
                           HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}")
    assert response.status_code == 200
    assert Span.objects.get().attributes == {"score": "NaN", "limit": "-Infinity"}


@pytest.mark.django_db
def test_span_times_keep_the_microsecond(client, agent):
    payload = otlp_json(span_json("5555555555555555", start=1_700_000_000_123_456_789, end=1_700_000_001_000_000_400))
    assert post(client, payload).status_code == 200
    span = Span.objects.get()
    assert span.start_time.isoformat() == "2023-11-14T22:13:20.123457+00:00"
    assert span.end_time.isoformat() == "2023-11-14T22:13:21+00:00"
    assert span.duration_ms == pytest.approx(876.543611)


@pytest.mark.postgres
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the single-statement insert is PostgreSQL's")
@pytest.mark.django_db
def test_on_postgresql_a_batch_is_six_statements_and_one_insert_whatever_its_size(client, agent):
    """The principal, the tenant's quota, its tasks, the calls named, then one INSERT for all
    the spans (committed on its own: no BEGIN/COMMIT round trips) and the tenant's usage."""
    from runs.models import TenantSpanUsage

    TenantSpanUsage.objects.create(tenant=agent.tenant)  # the tenant's first batch creates it
    task = task_create(principal=agent, task_type="refund", goal="g")
    payload = otlp_json(*[span_json(f"{0x1000 + n:016x}", attributes={"gen_ai.tool.call.id": f"call-{n}"})
                          for n in range(100)], resource={"countersign.task_id": task.task_id})
    with CaptureQueriesContext(connection) as queries:
        assert post(client, payload).status_code == 200
    statements = [q["sql"].split(None, 1)[0].upper() for q in queries.captured_queries]
    assert statements == ["SELECT", "SELECT", "SELECT", "SELECT", "INSERT", "UPDATE"], statements
    assert Span.objects.filter(task=task).count() == 100
    assert TenantSpanUsage.objects.get(tenant=agent.tenant).spans == 100


@pytest.mark.django_db
def test_invalid_spans_are_reported_as_a_partial_success(client, agent):
    payload = otlp_json(span_json("3333333333333333"), {**span_json("zz"), "spanId": "zz"})
    response = post(client, payload)
    assert response.status_code == 200
    assert response.json()["partialSuccess"]["rejectedSpans"] == 1
    assert Span.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("token", "content_type", "status", "code"),
    [
        ("wrong-token", "application/json", 401, "unauthenticated"),
        (AGENT_TOKEN, "text/plain", 415, "unsupported_media_type"),
    ],
)
def test_it_refuses_bad_requests_with_one_error_shape(client, agent, token, content_type, status, code):
    response = post(client, otlp_json(), token=token, content_type=content_type)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


@pytest.mark.django_db
def test_a_body_that_is_not_gzip_is_a_400(client, agent):
    response = client.post("/v1/traces", data=b"not gzip", content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {AGENT_TOKEN}", HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 400
    assert "gzip" in response.json()["error"]["message"]


@pytest.mark.django_db(transaction=True)
def test_a_real_opentelemetry_exporter_delivers_linked_spans(live_server, agent, outsider_agent):
    task = task_create(principal=agent, task_type="refund", goal="g")
    exporter = OTLPSpanExporter(endpoint=f"{live_server.url}/v1/traces",
                                headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
                                compression=Compression.Gzip)
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-agent",
                                                        "countersign.task_id": task.task_id}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test-agent")
    with tracer.start_as_current_span("invoke_agent") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        with tracer.start_as_current_span("execute_tool payments.refund") as child:
            child.set_attribute("gen_ai.tool.call.id", "call-9")
            child.set_attribute("countersign.operation_id", "op_abc")
    provider.shutdown()
    spans = {s.name: s for s in Span.objects.filter(task_id=task.task_id)}
    assert set(spans) == {"invoke_agent", "execute_tool payments.refund"}
    tool = spans["execute_tool payments.refund"]
    assert tool.parent_span_id == spans["invoke_agent"].span_id
    assert (tool.operation_id, tool.call_id, tool.service_name) == ("op_abc", "call-9", "sdk-agent")
    # The other tenant's token cannot read or write this tenant's trace: its spans stay its own.
    assert not Span.objects.filter(tenant=outsider_agent.tenant).exists()
