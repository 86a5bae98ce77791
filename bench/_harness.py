"""Measurement helpers: interleaved timing, percentiles, a null exporter and machine facts."""

from __future__ import annotations

import gc
import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from kaos_otel import AgentTelemetry, ContentPolicy, TelemetrySettings, default_redactor
from kaos_otel._metrics import METER_NAME, CatalogMeterProvider, KaosMetrics, LabelBounds, metric_views
from kaos_otel.exporters import TelemetryHealth

Runner = Callable[[int], object]
"""Runs the measured operation ``n`` times."""


class NullSpanExporter(SpanExporter):
    """Accepts every batch and keeps nothing: the export path costs (almost) nothing."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Count the spans and succeed."""
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Nothing is buffered."""
        return True


@dataclass
class Comparison:
    """Per-operation times (us) of several variants, measured in alternation, and their ratios."""

    baseline: str
    per_op_us: dict[str, list[float]] = field(default_factory=dict)

    def median_us(self, name: str) -> float:
        """Median per-operation time of one variant, in microseconds."""
        return statistics.median(self.per_op_us[name])

    def ratio(self, name: str, baseline: str | None = None) -> float:
        """Median over repetitions of (variant / baseline), each pair from the same repetition."""
        base = self.per_op_us[baseline or self.baseline]
        return statistics.median(v / b for v, b in zip(self.per_op_us[name], base, strict=True))

    def summary(self) -> dict[str, float]:
        """Median microseconds per variant."""
        return {name: round(self.median_us(name), 3) for name in self.per_op_us}


def interleaved(
    variants: Mapping[str, Runner], *, baseline: str, n: int, reps: int, warmup: int = 1
) -> Comparison:
    """Time each variant ``n`` operations at a time, alternating variants within each repetition.

    The order rotates every repetition so that no variant always runs first or after a given
    other one; a ``gc.collect()`` precedes every timed run so garbage from one variant is not
    collected on another's clock. Ratios pair runs of the same repetition.

    The clock is the calling thread's CPU time (``time.thread_time``): unlike wall time it does
    not count the moments the thread is descheduled in favour of other processes, which on a
    shared machine is most of the noise. The export thread's work is not on it either, as it is
    not on the request's latency.
    """
    names = list(variants)
    result = Comparison(baseline, {name: [] for name in names})
    for _ in range(warmup):
        for name in names:
            variants[name](max(1, n // 4))
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            start = time.thread_time_ns()
            variants[name](n)
            elapsed = time.thread_time_ns() - start
            result.per_op_us[name].append(elapsed / n / 1000)
    return result


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


PACKAGES = (
    "kaos-otel",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-grpc",
    "grpcio",
    "httpx",
    "mem0ai",
    "logfire",
)


def machine_facts() -> dict[str, Any]:
    """Cores, CPU model, OS, Python and package versions, and the date of the run."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count() or 0,
        "cpu_model": _cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "load_average_at_start": [round(x, 2) for x in load],
        "packages": {name: _version(name) for name in PACKAGES},
    }


@dataclass
class NullPipeline:
    """kaos-otel telemetry set up the way ``KaosOtelManager`` sets it up, exporting nowhere.

    Same sampler, span limits, metric Views and telemetry-health counter as the manager; the
    span exporter is a :class:`NullSpanExporter` behind the SDK's ``BatchSpanProcessor``, and
    an in-memory reader collects the metrics (so metric points are aggregated, as with the
    manager's periodic OTLP reader; a manager without an endpoint has no reader at all, which
    would make every metric record free). Raw-SDK baselines take a tracer from
    ``tracer_provider``: the same provider and processor.
    """

    telemetry: AgentTelemetry
    tracer_provider: TracerProvider
    meter_provider: CatalogMeterProvider
    exporter: NullSpanExporter

    def shutdown(self) -> None:
        """Shut both providers down."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def null_pipeline(service: str = "bench") -> NullPipeline:
    """A :class:`NullPipeline` with the default settings (no content capture)."""
    settings = TelemetrySettings.from_env(service_name=service)
    limit = settings.attribute_value_length_limit
    resource = Resource.create({SERVICE_NAME: service})
    tracer_provider = TracerProvider(
        resource=resource, span_limits=SpanLimits(max_attribute_length=limit), shutdown_on_exit=False
    )
    exporter = NullSpanExporter()
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    meter_provider = CatalogMeterProvider(
        MeterProvider(
            metric_readers=[InMemoryMetricReader()],
            resource=resource,
            views=metric_views(drop_unlisted=False),
            shutdown_on_exit=False,
        )
    )
    metrics = KaosMetrics(meter_provider.get_meter(METER_NAME), LabelBounds(), TelemetryHealth())
    policy = ContentPolicy(settings.capture_content, default_redactor, limit)
    telemetry = AgentTelemetry(tracer_provider.get_tracer(METER_NAME), metrics, policy)
    return NullPipeline(telemetry, tracer_provider, meter_provider, exporter)
