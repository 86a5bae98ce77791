"""Exporters, batch processors and export-path wrappers (OTLP, telemetry health, content cleaning)."""

from kaos_otel.exporters.batch import BatchSettings, LogBatchProcessor, SpanBatchProcessor
from kaos_otel.exporters.health import TelemetryHealth
from kaos_otel.exporters.otlp import otlp_log_exporter, otlp_metric_exporter, otlp_span_exporter
from kaos_otel.exporters.pipeline import SanitizingLogExporter, SanitizingSpanExporter, sanitized_exporter

__all__ = [
    "BatchSettings",
    "LogBatchProcessor",
    "SanitizingLogExporter",
    "SanitizingSpanExporter",
    "SpanBatchProcessor",
    "TelemetryHealth",
    "otlp_log_exporter",
    "otlp_metric_exporter",
    "otlp_span_exporter",
    "sanitized_exporter",
]
