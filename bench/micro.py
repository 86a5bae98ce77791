"""Per-span, disabled-path and metric-record costs, each against the raw SDK in the same run."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from bench._harness import Comparison, NullSpanExporter, Runner, interleaved, null_pipeline
from bench.raw_sdk import AgentLoopTelemetry, RawSdkAgentTelemetry, histogram
from kaos_otel import ContentPolicy, KaosOtelManager, Outcome, TelemetryHealth, catalog
from kaos_otel._metrics import METER_NAME, CatalogMeterProvider, KaosMetrics, LabelBounds, metric_views
from kaos_otel.exporters.pipeline import SanitizingSpanExporter

ATTRIBUTES: dict[str, Any] = {"app.route": "/chat", "app.attempt": 1}
"""Two attributes on every measured span (as in the peer figures of the reference notes)."""


@dataclass(frozen=True)
class MicroConfig:
    """How many operations per timed run and how many alternating repetitions."""

    n: int
    reps: int


def span_costs(config: MicroConfig) -> tuple[Comparison, Comparison]:
    """Handle begin/success, context manager, decorator (sync, async) and nesting vs the raw SDK.

    Every variant runs on the same TracerProvider with the same BatchSpanProcessor; the raw
    variants use a tracer of that provider directly.
    """
    pipeline = null_pipeline()
    manager, provider = pipeline.telemetry, pipeline.tracer_provider
    raw = provider.get_tracer("raw-sdk")
    attrs = ATTRIBUTES

    def raw_cm(n: int) -> None:
        for _ in range(n):
            with raw.start_as_current_span("op", attributes=attrs):
                pass

    def kaos_begin_success(n: int) -> None:
        for _ in range(n):
            handle = manager.span_begin("op", attributes=attrs)
            manager.span_success(handle)

    def kaos_cm(n: int) -> None:
        for _ in range(n):
            with manager.span("op", attributes=attrs):
                pass

    @raw.start_as_current_span("op", attributes=attrs)
    def raw_decorated() -> None:
        pass

    @manager.traced("op", attributes=attrs)
    def kaos_decorated() -> None:
        pass

    def raw_dec(n: int) -> None:
        for _ in range(n):
            raw_decorated()

    def kaos_dec(n: int) -> None:
        for _ in range(n):
            kaos_decorated()

    def raw_nested(n: int) -> None:
        for _ in range(n // 4):
            with raw.start_as_current_span("parent", attributes=attrs):
                for _ in range(3):
                    with raw.start_as_current_span("child", attributes=attrs):
                        pass

    def kaos_nested(n: int) -> None:
        for _ in range(n // 4):
            with manager.span("parent", attributes=attrs):
                for _ in range(3):
                    with manager.span("child", attributes=attrs):
                        pass

    sync = interleaved(
        {
            "raw_start_as_current_span": raw_cm,
            "begin_success": kaos_begin_success,
            "context_manager": kaos_cm,
            "raw_decorator": raw_dec,
            "decorator": kaos_dec,
            "raw_nested": raw_nested,
            "nested": kaos_nested,
        },
        baseline="raw_start_as_current_span",
        n=config.n,
        reps=config.reps,
    )

    @raw.start_as_current_span("op", attributes=attrs)
    async def raw_async() -> None:
        pass

    @manager.traced("op", attributes=attrs)
    async def kaos_async() -> None:
        pass

    loop = asyncio.new_event_loop()

    def run_async(fn: Callable[[], Any]) -> Runner:
        async def many(n: int) -> None:
            for _ in range(n):
                await fn()

        return lambda n: loop.run_until_complete(many(n))

    try:
        async_cmp = interleaved(
            {"raw_decorator_async": run_async(raw_async), "decorator_async": run_async(kaos_async)},
            baseline="raw_decorator_async",
            n=config.n,
            reps=config.reps,
        )
    finally:
        loop.close()
        pipeline.shutdown()
    return sync, async_cmp


def logfire_costs(config: MicroConfig) -> Comparison | str:
    """``logfire.span`` vs a raw SDK span on a provider with the same null batch processor.

    Only where the ``bench`` extra (logfire) is installed; otherwise ``"not installed"``.
    """
    if importlib.util.find_spec("logfire") is None:
        return "not installed"
    logfire = importlib.import_module("logfire")
    exporter = NullSpanExporter()
    instance = logfire.configure(
        send_to_logfire=False,
        console=False,
        service_name="bench",
        additional_span_processors=[BatchSpanProcessor(exporter)],
        inspect_arguments=False,
        local=True,
    )
    raw_provider = TracerProvider()
    raw_provider.add_span_processor(BatchSpanProcessor(NullSpanExporter()))
    raw = raw_provider.get_tracer("raw-sdk")
    pipeline = null_pipeline()
    manager = pipeline.telemetry
    attrs = ATTRIBUTES

    def raw_cm(n: int) -> None:
        for _ in range(n):
            with raw.start_as_current_span("op", attributes=attrs):
                pass

    def logfire_span(n: int) -> None:
        for _ in range(n):
            with instance.span("op", **attrs):
                pass

    def kaos_cm(n: int) -> None:
        for _ in range(n):
            with manager.span("op", attributes=attrs):
                pass

    try:
        return interleaved(
            {"raw_start_as_current_span": raw_cm, "logfire_span": logfire_span, "context_manager": kaos_cm},
            baseline="raw_start_as_current_span",
            n=config.n,
            reps=config.reps,
        )
    finally:
        pipeline.shutdown()
        raw_provider.shutdown()


def disabled_costs(config: MicroConfig) -> Comparison:
    """The ``OTEL_SDK_DISABLED=true`` path of each span style vs the API's no-op tracer."""
    manager = KaosOtelManager("bench", global_providers=False, disabled=True)
    assert not manager.enabled
    noop = trace.NoOpTracer()
    attrs = ATTRIBUTES

    def noop_cm(n: int) -> None:
        for _ in range(n):
            with noop.start_as_current_span("op", attributes=attrs):
                pass

    def disabled_begin_success(n: int) -> None:
        for _ in range(n):
            handle = manager.span_begin("op", attributes=attrs)
            manager.span_success(handle)

    def disabled_cm(n: int) -> None:
        for _ in range(n):
            with manager.span("op", attributes=attrs):
                pass

    @noop.start_as_current_span("op", attributes=attrs)
    def noop_decorated() -> None:
        pass

    @manager.traced("op", attributes=attrs)
    def disabled_decorated() -> None:
        pass

    def noop_dec(n: int) -> None:
        for _ in range(n):
            noop_decorated()

    def disabled_dec(n: int) -> None:
        for _ in range(n):
            disabled_decorated()

    def disabled_agent_helpers(n: int) -> None:
        for _ in range(n // 3):
            with manager.invoke_agent("agent") as run:
                with manager.agent_step(run):
                    pass
                with manager.tool_call("agent", "tool"):
                    pass

    return interleaved(
        {
            "noop_start_as_current_span": noop_cm,
            "begin_success": disabled_begin_success,
            "context_manager": disabled_cm,
            "noop_decorator": noop_dec,
            "decorator": disabled_dec,
            "agent_helpers": disabled_agent_helpers,
        },
        baseline="noop_start_as_current_span",
        n=config.n * 4,
        reps=config.reps,
    )


def metric_costs(config: MicroConfig) -> Comparison:
    """One kaos metric record vs the raw SDK counter / histogram record with the same labels.

    Each side records into its own MeterProvider with one in-memory reader: kaos-otel's with the
    catalog Views behind a ``CatalogMeterProvider`` (as the manager builds it), the raw SDK's
    with the SDK defaults, under the same instrument names, label sets and histogram buckets.
    """
    provider = CatalogMeterProvider(
        MeterProvider(metric_readers=[InMemoryMetricReader()], views=metric_views(drop_unlisted=False))
    )
    raw_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    kaos = KaosMetrics(provider.get_meter(METER_NAME), LabelBounds())
    raw_meter = raw_provider.get_meter("raw-sdk")
    tool_calls = catalog.METRICS_BY_NAME[catalog.KAOS_TOOL_CALLS]
    compactions = catalog.METRICS_BY_NAME[catalog.KAOS_MEMORY_COMPACTIONS]
    raw_tool_calls = raw_meter.create_counter(tool_calls.name, unit=tool_calls.unit)
    raw_tool_duration = histogram(raw_meter, catalog.KAOS_TOOL_DURATION)
    raw_compactions = raw_meter.create_counter(compactions.name, unit=compactions.unit)
    raw_lag = histogram(raw_meter, catalog.KAOS_MEMORY_EXTRACTION_LAG)
    success = Outcome.SUCCESS

    def raw_counter(n: int) -> None:
        for _ in range(n):
            raw_compactions.add(1, {catalog.GEN_AI_AGENT_NAME: "agent", catalog.KAOS_OUTCOME: success.value})

    def kaos_counter(n: int) -> None:
        for _ in range(n):
            kaos.record_compaction("agent", success)

    def raw_histogram(n: int) -> None:
        for _ in range(n):
            raw_lag.record(0.25, {catalog.GEN_AI_AGENT_NAME: "agent", catalog.KAOS_OUTCOME: success.value})

    def kaos_histogram(n: int) -> None:
        for _ in range(n):
            kaos.record_extraction_lag("agent", 0.25, success)

    def raw_counter_and_histogram(n: int) -> None:
        for _ in range(n):
            labels = {
                catalog.GEN_AI_AGENT_NAME: "agent",
                catalog.GEN_AI_TOOL_NAME: "search",
                catalog.KAOS_OUTCOME: success.value,
            }
            raw_tool_calls.add(1, labels)
            raw_tool_duration.record(0.012, labels)

    def kaos_tool_call(n: int) -> None:
        for _ in range(n):
            kaos.record_tool_call("agent", "search", success, 0.012)

    try:
        return interleaved(
            {
                "raw_counter": raw_counter,
                "counter": kaos_counter,
                "raw_histogram": raw_histogram,
                "histogram": kaos_histogram,
                "raw_counter_and_histogram": raw_counter_and_histogram,
                "counter_and_histogram": kaos_tool_call,
            },
            baseline="raw_counter",
            n=config.n,
            reps=config.reps,
        )
    finally:
        provider.shutdown()
        raw_provider.shutdown()


def record_request(telemetry: AgentLoopTelemetry, agent: str, model: str, *, window_tokens: int) -> None:
    """The telemetry of one request of :func:`agent_telemetry_costs`, without any I/O."""
    with telemetry.invoke_agent(agent, conversation_id="conv-1", max_steps=5) as run:
        for step in range(1, 4):
            with telemetry.agent_step(run, step):
                with telemetry.model_call(agent, model, server_address="127.0.0.1", server_port=8000) as call:
                    call.record_usage(40 + step, 12, response_model=model, finish_reasons=["tool_calls"])
                if step < 3:
                    with telemetry.tool_call(agent, "add", call_id=f"call_{step}", arguments={"a": 2}):
                        pass
        telemetry.record_window_tokens(agent, window_tokens)


def agent_telemetry_costs(config: MicroConfig) -> Comparison:
    """The telemetry of one agent request through the domain helpers vs the raw SDK doing the same.

    One request: ``invoke_agent``, three steps each with a ``chat`` model call (usage recorded),
    two ``execute_tool`` calls: nine spans and 23 metric points, with the attributes and label
    sets kaos-otel records. The raw variant creates the same spans (same names, kinds,
    attributes, nesting) with ``start_as_current_span`` and records the same points on raw SDK
    instruments with the same label sets, on the same providers; no I/O on either side.
    """
    pipeline = null_pipeline()
    manager, provider = pipeline.telemetry, pipeline.tracer_provider
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    agent, model = "bench-agent", "scripted"
    manager.register_known_names(agent, tools=["add", "lookup"], models=[model])
    raw = RawSdkAgentTelemetry(provider.get_tracer("raw-sdk"), meter_provider.get_meter("raw-sdk"))

    def requests(telemetry: AgentLoopTelemetry) -> Runner:
        def run_requests(n: int) -> None:
            for i in range(n):
                record_request(telemetry, agent, model, window_tokens=160 + i % 7)

        return run_requests

    try:
        return interleaved(
            {"raw_sdk": requests(raw), "kaos": requests(manager)},
            baseline="raw_sdk",
            n=max(10, config.n // 20),
            reps=config.reps,
        )
    finally:
        pipeline.shutdown()
        meter_provider.shutdown()


class EncodingSpanExporter(SpanExporter):
    """Encodes each batch into an OTLP request, as the OTLP exporters do before sending it."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        encode_spans(spans).SerializeToString()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


def export_costs(config: MicroConfig, attributes: Mapping[str, Any]) -> Comparison:
    """Export-thread CPU per span: kaos-otel's sanitising exporter then the OTLP encoding, vs the
    OTLP encoding alone (the raw SDK's export), on the same batch of 512 ended spans."""
    provider = TracerProvider()
    tracer = provider.get_tracer("export")
    batch: list[ReadableSpan] = []
    for _ in range(512):
        span = tracer.start_span("throughput", attributes=attributes)
        span.end()
        assert isinstance(span, ReadableSpan)
        batch.append(span)
    encoding = EncodingSpanExporter()
    sanitizing = SanitizingSpanExporter(EncodingSpanExporter(), ContentPolicy(), TelemetryHealth())

    def runner(exporter: SpanExporter) -> Runner:
        def export(n: int) -> None:
            for _ in range(n):
                exporter.export(batch)

        return export

    comparison = interleaved(
        {"raw_sdk": runner(encoding), "kaos": runner(sanitizing)}, baseline="raw_sdk", n=4, reps=config.reps
    )
    comparison.per_op_us = {
        name: [us / len(batch) for us in values] for name, values in comparison.per_op_us.items()
    }
    return comparison
