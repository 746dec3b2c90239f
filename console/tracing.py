"""OpenTelemetry set-up: one tracer provider per process, flushed on shutdown.

Exporting is off unless OTEL_ENABLED is true and an OTLP endpoint is set; the console's own
spans are still created (and cost next to nothing) so code can always use `tracer`.
"""

from __future__ import annotations

import threading

from opentelemetry import trace

_lock = threading.Lock()
_provider = None

tracer = trace.get_tracer("countersign")


def setup_tracing(*, instrument_celery: bool = False, instrument_django: bool = False) -> None:
    global _provider
    from django.conf import settings

    if not settings.OTEL_ENABLED or not settings.OTEL_EXPORTER_OTLP_ENDPOINT:
        return
    with _lock:
        if _provider is not None:
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": settings.OTEL_SERVICE_NAME}))
        endpoint = settings.OTEL_EXPORTER_OTLP_ENDPOINT.rstrip("/") + "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        trace.set_tracer_provider(provider)
        _provider = provider
    if instrument_celery:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()
    if instrument_django:
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        DjangoInstrumentor().instrument()


def shutdown_tracing() -> None:
    if _provider is not None:
        _provider.shutdown()
