"""The benchmarks' raw-SDK baselines record what kaos-otel records, and the reports count it right.

A baseline that records less than kaos-otel (an attribute, a label, other histogram buckets) makes
kaos-otel look slower than the SDK doing the same work; these tests compare what both record, on
real providers, real Mem0 and the real scripted model process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from mem0_support import ScriptedModelServer, make_memory
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import micro
from bench._servers import ServerProcess
from bench.agent import SPANS_PER_REQUEST, SimulatedAgent
from bench.raw_sdk import AgentLoopTelemetry, RawSdkAgentTelemetry, RawSdkMemoryTelemetry
from bench.report import _agent_section
from kaos_otel import AgentTelemetry, ContentPolicy, catalog
from kaos_otel._metrics import CatalogMeterProvider, metric_views
from kaos_otel.instrumentation.mem0 import Mem0Instrumentor

AGENT, MODEL = "bench-agent", "scripted"
Recorded = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]


class Providers:
    """A tracer provider into memory and a meter provider with an in-memory reader."""

    def __init__(self, *, kaos: bool) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        sdk = MeterProvider(
            metric_readers=[self.reader], views=metric_views(drop_unlisted=False) if kaos else ()
        )
        self.meter_provider = CatalogMeterProvider(sdk) if kaos else sdk

    def recorded(self, ignore: frozenset[str] = frozenset()) -> Recorded:
        """Spans (name, kind, parent's name, attributes) and metric points (name, labels, buckets,
        count or value), sorted; the attributes named in ``ignore`` by presence only."""
        finished = self.spans.get_finished_spans()
        names = {span.context.span_id: span.name for span in finished}
        spans = sorted(
            (
                span.name,
                span.kind.name,
                names.get(span.parent.span_id) if span.parent else None,
                sorted((k, "<id>" if k in ignore else repr(v)) for k, v in (span.attributes or {}).items()),
            )
            for span in finished
        )
        points: list[tuple[Any, ...]] = []
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        bounds = getattr(point, "explicit_bounds", None)
                        amount = point.count if hasattr(point, "count") else point.value
                        labels = sorted((point.attributes or {}).items())
                        points.append((metric.name, labels, None if bounds is None else list(bounds), amount))
        return spans, sorted(points, key=repr)


def _kaos_telemetry(providers: Providers) -> AgentTelemetry:
    telemetry = AgentTelemetry.from_providers(
        providers.tracer_provider, providers.meter_provider, policy=ContentPolicy()
    )
    telemetry.register_known_names(AGENT, tools=["add", "lookup"], models=[MODEL])
    return telemetry


def _raw_telemetry(providers: Providers) -> RawSdkAgentTelemetry:
    return RawSdkAgentTelemetry(
        providers.tracer_provider.get_tracer("raw-sdk"), providers.meter_provider.get_meter("raw-sdk")
    )


def _both(run: Callable[[AgentLoopTelemetry], None]) -> tuple[Recorded, Recorded]:
    kaos, raw = Providers(kaos=True), Providers(kaos=False)
    run(_kaos_telemetry(kaos))
    run(_raw_telemetry(raw))
    return kaos.recorded(), raw.recorded()


def test_the_raw_sdk_request_telemetry_records_what_the_domain_helpers_record() -> None:
    """``micro.agent_telemetry_costs``'s request: the same spans, points, labels and buckets."""

    def request(telemetry: AgentLoopTelemetry) -> None:
        micro.record_request(telemetry, AGENT, MODEL, window_tokens=160)

    (kaos_spans, kaos_points), (raw_spans, raw_points) = _both(request)
    assert len(kaos_spans) == 9 and sum(point[3] for point in kaos_points) == 23
    assert raw_spans == kaos_spans
    origin = (catalog.KAOS_REQUEST_ORIGIN, "user")
    assert [p[:3] for p in raw_points] == [p[:3] for p in kaos_points]
    assert [p[3] for p in raw_points] == [p[3] for p in kaos_points]
    assert any(origin in point[1] for point in raw_points)


def test_the_in_process_loop_records_as_many_spans_as_its_description_says() -> None:
    """``agent.agent_overhead``'s loop against the scripted model process: kaos-otel and the raw SDK
    record the same, and the report counts the spans one request makes."""
    with ServerProcess("model", "--latency", "0") as model:

        def request(telemetry: AgentLoopTelemetry) -> None:
            async def handle() -> None:
                async with httpx.AsyncClient(timeout=30) as client:
                    await SimulatedAgent(telemetry, client, model.port).handle("What is 2 + 3?", "conv-1")

            asyncio.run(handle())

        (kaos_spans, kaos_points), (raw_spans, raw_points) = _both(request)
    assert len(kaos_spans) == SPANS_PER_REQUEST == 9
    assert raw_spans == kaos_spans
    assert [p[:3] for p in raw_points] == [p[:3] for p in kaos_points]
    stats = {"n": 1, "p50_ms": 1.0, "p90_ms": 1.0, "p99_ms": 1.0, "mean_ms": 1.0, "cpu_ms": 1.0}
    in_process = {
        "on": stats,
        "off": stats,
        "raw_sdk": stats,
        "model_latency_ms": 25.0,
        "spans_per_request": SPANS_PER_REQUEST,
        "ratio": 1.0,
        "raw_sdk_ratio": 1.0,
        "cpu_added_ms": 0.0,
        "raw_sdk_cpu_added_ms": 0.0,
    }
    text = _agent_section(None, in_process, None, None)
    assert f"{len(kaos_spans)} spans and the catalog metrics per request" in text


def test_the_raw_sdk_memory_telemetry_records_what_the_mem0_instrumentor_records(tmp_path: Path) -> None:
    """``mem0_bench.mem0_overhead``'s operation (add, search, delete) on one offline ``Memory``: the
    instrumentor's spans and points, and the raw-SDK floor's around the original methods."""
    kaos, raw_providers = Providers(kaos=True), Providers(kaos=False)
    raw = RawSdkMemoryTelemetry(
        raw_providers.tracer_provider.get_tracer("raw-sdk"), raw_providers.meter_provider.get_meter("raw-sdk")
    )
    instrumentor = Mem0Instrumentor()
    with ScriptedModelServer() as server:
        memory = make_memory("sync", server, tmp_path)
        instrumentor.instrument(
            telemetry=AgentTelemetry.from_providers(
                kaos.tracer_provider, kaos.meter_provider, policy=ContentPolicy()
            )
        )
        try:
            memory_class = type(memory)
            wrapped = (memory_class.add, memory_class.search, memory_class.delete)
            operations = ("create_memory", "search_memory", "delete_memory")
            originals = [method.__wrapped__ for method in wrapped]
            traced = [raw.traced(name, method) for name, method in zip(operations, originals, strict=True)]
            for add, search, delete in (wrapped, traced):
                added = add(memory, "The user likes colour 3", user_id="user-1", infer=False)
                search(memory, "Which colour does the user like?", filters={"user_id": "user-1"}, top_k=3)
                for record in added["results"]:
                    delete(memory, record["id"])
        finally:
            instrumentor.uninstrument()
    ignore = frozenset({catalog.GEN_AI_MEMORY_RECORD_ID})
    kaos_spans, kaos_points = kaos.recorded(ignore)
    raw_spans, raw_points = raw_providers.recorded(ignore)
    assert len(kaos_spans) == 3
    assert raw_spans == kaos_spans
    assert [p[:3] for p in raw_points] == [p[:3] for p in kaos_points]
