"""OpenTelemetry set-up: one tracer provider per process, flushed on shutdown (Celery's
worker_process_shutdown in each pool process; the ASGI lifespan's shutdown in each server).

Exporting is off unless OTEL_ENABLED is true and an OTLP endpoint is set. Code always uses
`tracer`; until a tracer provider is set, its spans are one shared no-op (`_Tracer`).
"""

from __future__ import annotations

import contextlib
import threading

from opentelemetry import trace

_lock = threading.Lock()
_provider = None


class _Tracer:
    """The console's tracer: OpenTelemetry's once a tracer provider is set (`setup_tracing`, or a
    test's), else a span that is a shared non-recording span, entered as a shared no-op context.

    The API's own stand-in (a proxy tracer handing out no-op spans) enters three context managers
    and attaches the span to the context for every span, and the proposal and its dispatch open
    three each: a few percent of a lifecycle's CPU for spans that nothing reads. Without a
    provider nothing can: no exporter, no sampler, and no remote parent either (the propagators
    that would attach one run only in the instrumentation `setup_tracing` installs with it)."""

    _NO_SPAN = contextlib.nullcontext(trace.INVALID_SPAN)  # stateless: shared by every thread

    def __init__(self, name: str) -> None:
        self._otel = trace.get_tracer(name)

    @staticmethod
    def _off() -> bool:
        # The provider is read each time: one may be set later (a worker's start-up, a test).
        return isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)

    def start_as_current_span(self, name: str, **kwargs):
        if self._off():
            return self._NO_SPAN
        return self._otel.start_as_current_span(name, **kwargs)

    def start_span(self, name: str, **kwargs) -> trace.Span:
        if self._off():
            return trace.INVALID_SPAN
        return self._otel.start_span(name, **kwargs)


tracer = _Tracer("countersign")


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
        import os

        from opentelemetry.instrumentation.django import DjangoInstrumentor

        # Not /v1/traces: a console exporting its own spans to its own ingest would trace every
        # export, which is exported in turn, forever. Nor the probes. The standard variable wins.
        excluded = os.environ.get("OTEL_PYTHON_DJANGO_EXCLUDED_URLS", "v1/traces,healthz,metrics")
        DjangoInstrumentor().instrument(excluded_urls=excluded)


def shutdown_tracing() -> None:
    """Export what the batch processor still holds, then stop it."""
    if _provider is not None:
        _provider.shutdown()


async def asgi_lifespan(scope, receive, send) -> None:
    """The ASGI lifespan protocol: flush spans when the server shuts down (`--lifespan on`).

    The provider's atexit hook is not enough under uvicorn: on SIGTERM it shuts down gracefully,
    then restores the default handler and raises the signal again, so the process dies without
    running atexit and the spans of its last seconds are lost."""
    from asgiref.sync import sync_to_async

    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await sync_to_async(shutdown_tracing, thread_sensitive=False)()  # a blocking HTTP export
            await send({"type": "lifespan.shutdown.complete"})
            return
