"""OTLP exporters over the configured protocol (``grpc`` or ``http/protobuf``)."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from kaos_otel._config import Protocol, TelemetrySettings


def _options(settings: TelemetrySettings, signal: str) -> dict[str, Any]:
    """Constructor arguments shared by every OTLP exporter of ``signal``."""
    endpoint = settings.endpoints[signal]
    options: dict[str, Any] = {
        "endpoint": endpoint,
        "headers": dict(settings.headers),
        "timeout": settings.export_timeout_s,
    }
    if settings.protocol is Protocol.GRPC:
        options["insecure"] = endpoint.startswith("http://")
    return options


def otlp_span_exporter(settings: TelemetrySettings) -> SpanExporter:
    """The span exporter for ``settings.endpoints['traces']``."""
    options = _options(settings, "traces")
    if settings.protocol is Protocol.HTTP_PROTOBUF:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

        return HttpSpanExporter(**options)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

    return GrpcSpanExporter(**options)


def otlp_metric_exporter(settings: TelemetrySettings) -> MetricExporter:
    """The metric exporter for ``settings.endpoints['metrics']``."""
    options = _options(settings, "metrics")
    if settings.protocol is Protocol.HTTP_PROTOBUF:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )

        return HttpMetricExporter(**options)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcMetricExporter,
    )

    return GrpcMetricExporter(**options)


def otlp_log_exporter(settings: TelemetrySettings) -> LogRecordExporter:
    """The log exporter for ``settings.endpoints['logs']``."""
    options = _options(settings, "logs")
    if settings.protocol is Protocol.HTTP_PROTOBUF:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter

        return HttpLogExporter(**options)
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter

    return GrpcLogExporter(**options)
