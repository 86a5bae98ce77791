"""OTLP exporters for each signal, configured by the exporters themselves.

The exporter class follows the signal's protocol; every other setting (endpoint, headers, TLS
and certificates, timeout, compression) is left to the exporter, which reads its
``OTEL_EXPORTER_OTLP[_SIGNAL]_*`` variables, unless the manager was given an explicit override.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from kaos_otel._config import OtlpProtocol, TelemetrySettings
from kaos_otel._content import ContentPolicy
from kaos_otel.exporters.health import TelemetryHealth
from kaos_otel.exporters.pipeline import SanitizingMetricExport, sanitizing_metric_exporter


def _overrides(settings: TelemetrySettings, signal: str) -> dict[str, Any]:
    """Constructor arguments for the settings that were given explicitly, and only those."""
    options: dict[str, Any] = {}
    if settings.endpoint is not None:
        options["endpoint"] = settings.endpoints[signal]
    if settings.headers is not None:
        options["headers"] = dict(settings.headers)
    if settings.export_timeout_s is not None:
        options["timeout"] = settings.export_timeout_s
    return options


def _http(settings: TelemetrySettings, signal: str) -> bool:
    return settings.protocols[signal] is OtlpProtocol.HTTP_PROTOBUF


def otlp_span_exporter(settings: TelemetrySettings) -> SpanExporter:
    """The span exporter of ``settings.protocols['traces']``."""
    options = _overrides(settings, "traces")
    if _http(settings, "traces"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

        return HttpSpanExporter(**options)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

    return GrpcSpanExporter(**options)


def otlp_metric_exporter(
    settings: TelemetrySettings, health: TelemetryHealth, policy: ContentPolicy
) -> SanitizingMetricExport:
    """The metric exporter of ``settings.protocols['metrics']``, cleaning label values and
    counting failed data points."""
    exporter_class: type[MetricExporter]
    if _http(settings, "metrics"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter

        exporter_class = HttpExporter
    else:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter

        exporter_class = GrpcExporter
    return sanitizing_metric_exporter(exporter_class, health, policy, **_overrides(settings, "metrics"))


def otlp_log_exporter(settings: TelemetrySettings) -> LogRecordExporter:
    """The log exporter of ``settings.protocols['logs']``."""
    options = _overrides(settings, "logs")
    if _http(settings, "logs"):
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter

        return HttpLogExporter(**options)
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter

    return GrpcLogExporter(**options)
