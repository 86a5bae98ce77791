"""instrument_app next to OpenTelemetry's own FastAPI instrumentation (opentelemetry-instrument,
Logfire): it says so when that one came first, and one server span is exported either way."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kaos_otel import KaosOtelManager
from kaos_otel.instrumentation.fastapi import instrument_app
from kaos_otel.receiver import OtlpReceiver

MakeOtel = Callable[..., KaosOtelManager]


@pytest.fixture
def otel_spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """The tracer provider OpenTelemetry's instrumentation is given, and what it records."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ask")
    async def ask() -> dict[str, str]:
        return {"answer": "ok"}

    return app


def test_an_app_opentelemetry_instrumented_first_is_said_with_the_fix(
    make_otel: MakeOtel,
    otel_spans: tuple[TracerProvider, InMemorySpanExporter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _app()
    FastAPIInstrumentor.instrument_app(app, tracer_provider=otel_spans[0])
    try:
        with caplog.at_level(logging.WARNING, "kaos_otel"):
            instrument_app(app, make_otel())
        said = [r.getMessage() for r in caplog.records if "FastAPI instrumentation is on" in r.getMessage()]
        assert len(said) == 1 and "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=fastapi" in said[0]
    finally:
        FastAPIInstrumentor.uninstrument_app(app)


def test_opentelemetry_instrumenting_after_instrument_app_leaves_one_server_span(
    make_otel: MakeOtel, otel_spans: tuple[TracerProvider, InMemorySpanExporter], otlp_receiver: OtlpReceiver
) -> None:
    provider, exporter = otel_spans
    otel = make_otel()
    app = _app()
    instrument_app(app, otel)
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)  # finds kaos-otel's, steps aside
    try:
        with TestClient(app) as client:
            assert client.get("/ask").status_code == 200
    finally:  # it patched Starlette's BackgroundTask for the whole process
        FastAPIInstrumentor.uninstrument_app(app)
    assert exporter.get_finished_spans() == ()
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: any(s.kind == "SERVER" for s in r.spans()), 10)
    assert [(s.name, s.scope_name) for s in otlp_receiver.spans() if s.kind == "SERVER"] == [
        ("GET /ask", "kaos_otel")
    ]
