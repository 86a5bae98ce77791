"""Exporters and export-path wrappers (OTLP, telemetry health, content cleaning)."""

from kaos_otel.exporters.health import TelemetryHealth
from kaos_otel.exporters.otlp import otlp_log_exporter, otlp_metric_exporter, otlp_span_exporter
from kaos_otel.exporters.pipeline import (
    CountingBatchSpanProcessor,
    CountingLogExporter,
    CountingLogRecordProcessor,
    CountingMetricExporter,
    SanitizingSpanExporter,
)

__all__ = [
    "CountingBatchSpanProcessor",
    "CountingLogExporter",
    "CountingLogRecordProcessor",
    "CountingMetricExporter",
    "SanitizingSpanExporter",
    "TelemetryHealth",
    "otlp_log_exporter",
    "otlp_metric_exporter",
    "otlp_span_exporter",
]
