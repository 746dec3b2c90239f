"""The console's own spans carry the task, step, call and operation IDs."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger.decisions import approval_approve, lease_acquire
from ledger.dispatcher import run_dispatch
from ledger.proposals import call_propose
from runs.services import task_create, task_transition

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def exported():
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the global provider can be set once per process
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def test_gate_and_approval_wait_and_dispatch_spans_are_linked(exported, agent, reviewer):
    exported.clear()
    task = task_create(principal=agent, task_type="refund", goal="g")
    token = lease_acquire(task_id=task.task_id, owner="w", ttl_seconds=60).fencing_token
    version = task.version
    for to in ("planning", "running"):
        version = task_transition(task_id=task.task_id, to=to, expected_version=version, fencing_token=token,
                                  actor="agent").version
    proposal = call_propose(principal=agent, task_id=task.task_id, call_id="call-1", step_id="refund",
                            tool_name="payments.refund",
                            arguments={"order_id": "o1", "amount": 120, "currency": "EUR", "reason": "r"},
                            expected_version=version, fencing_token=token)
    approval_approve(approval_id=proposal.approval_id, reviewer=reviewer)
    run_dispatch("op_missing", worker="test")
    spans = {span.name: span for span in exported.get_finished_spans()}
    assert spans["gate"].attributes["countersign.operation_id"] == proposal.operation_id
    assert spans["gate"].attributes["gen_ai.tool.call.id"] == "call-1"
    assert spans["gate"].attributes["countersign.risk_tier"] == 3
    wait = spans["approval.wait"]
    assert wait.attributes["countersign.approval.outcome"] == "approved"
    assert wait.attributes["countersign.task_id"] == task.task_id
    assert wait.end_time >= wait.start_time
    assert spans["dispatch"].attributes["countersign.operation_id"] == "op_missing"


def _stored(**filters) -> list:
    from runs.models import Span

    return list(Span.objects.filter(**filters).order_by("start_time"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_django_and_a_real_celery_worker_export_linked_spans_flushed_on_shutdown(live_server, agent):
    """The product's own processes with OTEL_ENABLED export over OTLP/HTTP to a Countersign
    (pytest-django's live server, in this process) like any agent: a server span per request;
    per task a Celery span with dispatch, provider.call and reconcile under it, carrying the IDs.
    The batch delay is a minute, so spans can arrive only through the flush at shutdown."""
    from runs.models import Span
    from tests.conftest import AGENT_TOKEN
    from tests.stack import FullStack, HttpAgent

    stack = FullStack(worker_queues="fast,slow", env={
        "OTEL_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": live_server.url,
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{AGENT_TOKEN}",
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
    }).start()
    try:
        api = HttpAgent(stack.url)
        task = api.running_task()
        task_id = task[0]
        # The effect commits and the reply is lost: unknown, then the reconciler finds it.
        proposal = api.refund(task, order_id="fault-lost-reply-otel", amount=30)
        assert api.final(proposal["call_id"], task_id)["status"] == "confirmed"
        assert not Span.objects.filter(name="provider.call").exists()  # still in the worker's batch
    finally:
        stack.stop()

    server = [s for s in _stored(kind="server") if s.attributes.get("http.route", "").endswith("calls")]
    assert server, f"no server span; stored: {sorted({s.name for s in _stored()})}"
    op = proposal["operation_id"]
    dispatch = _stored(name="dispatch", operation_id=op)
    provider = _stored(name="provider.call", operation_id=op)
    reconcile = _stored(name="reconcile", operation_id=op)
    assert dispatch and provider and len(reconcile) == 1, sorted({s.name for s in _stored()})
    for span in [*dispatch, *provider, *reconcile]:
        assert (span.task_id, span.step_id, span.call_id, span.operation_id) == (
            task_id, "refund-fault-lost-reply-otel", proposal["call_id"], op), span.name
        parent = Span.objects.get(trace_id=span.trace_id, span_id=span.parent_span_id)
        if span.name == "provider.call":
            assert parent.name == "dispatch"
        else:
            assert (parent.name, parent.kind) == (f"run/ledger.{span.name}_operation", "consumer")
    # The worker's task continues the trace of the request that published it.
    task_span = Span.objects.get(span_id=dispatch[0].parent_span_id, trace_id=dispatch[0].trace_id)
    assert task_span.trace_id == server[0].trace_id


class _NoProviderYet(trace.ProxyTracerProvider):
    """The API's provider before any is set (exporting off): every tracer it gives is a proxy."""


def test_without_a_tracer_provider_a_span_runs_no_opentelemetry_code(monkeypatch):
    # The proxy tracer's no-op span costs a few context managers and a context attach per span,
    # on every proposal and dispatch, when nothing would ever read the span.
    from console.tracing import tracer

    monkeypatch.setattr(trace, "get_tracer_provider", _NoProviderYet)

    def traced(*args, **kwargs):
        raise AssertionError("an OpenTelemetry tracer was asked for a span")

    monkeypatch.setattr(trace.ProxyTracer, "start_as_current_span", traced)
    monkeypatch.setattr(trace.ProxyTracer, "start_span", traced)
    monkeypatch.setattr(trace.NoOpTracer, "start_as_current_span", traced)
    monkeypatch.setattr(trace.NoOpTracer, "start_span", traced)
    with tracer.start_as_current_span("gate", attributes={"countersign.task_id": "t"}) as span:
        span.set_attributes({"countersign.decision": "dispatched"})
        span.set_attribute("countersign.risk_tier", 0)
        assert not span.is_recording()
    started = tracer.start_span("approval.wait", start_time=1, attributes={"countersign.task_id": "t"})
    started.end()
    assert not started.is_recording()


def test_an_exception_in_a_span_without_a_provider_is_raised_as_it_is(monkeypatch):
    from console.tracing import tracer

    monkeypatch.setattr(trace, "get_tracer_provider", _NoProviderYet)
    with pytest.raises(ValueError, match="boom"), tracer.start_as_current_span("dispatch"):
        raise ValueError("boom")


def test_with_a_provider_the_console_spans_are_recorded(exported):
    from console.tracing import tracer

    exported.clear()
    with tracer.start_as_current_span("verify", attributes={"countersign.task_id": "t"}) as span:
        assert span.is_recording()
    assert [s.name for s in exported.get_finished_spans()] == ["verify"]
