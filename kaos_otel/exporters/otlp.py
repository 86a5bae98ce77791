"""OTLP exporters over the configured protocol (``grpc`` or ``http/protobuf``)."""

from __future__ import annotations

from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from kaos_otel._config import Protocol, TelemetrySettings


def _grpc_insecure(endpoint: str) -> bool:
    return endpoint.startswith("http://")


def otlp_span_exporter(settings: TelemetrySettings) -> SpanExporter:
    """The span exporter for ``settings.endpoints['traces']``."""
    endpoint = settings.endpoints["traces"]
    headers = dict(settings.headers)
    if settings.protocol is Protocol.HTTP_PROTOBUF:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

        return HttpSpanExporter(endpoint=endpoint, headers=headers, timeout=settings.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

    return GrpcSpanExporter(
        endpoint=endpoint,
        headers=headers,
        timeout=settings.export_timeout_s,
        insecure=_grpc_insecure(endpoint),
    )


def otlp_metric_exporter(settings: TelemetrySettings) -> MetricExporter:
    """The metric exporter for ``settings.endpoints['metrics']``."""
    endpoint = settings.endpoints["metrics"]
    headers = dict(settings.headers)
    if settings.protocol is Protocol.HTTP_PROTOBUF:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )

        return HttpMetricExporter(endpoint=endpoint, headers=headers, timeout=settings.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcMetricExporter,
    )

    return GrpcMetricExporter(
        endpoint=endpoint,
        headers=headers,
        timeout=settings.export_timeout_s,
        insecure=_grpc_insecure(endpoint),
    )


def otlp_log_exporter(settings: TelemetrySettings) -> LogRecordExporter:
    """The log exporter for ``settings.endpoints['logs']``."""
    endpoint = settings.endpoints["logs"]
    headers = dict(settings.headers)
    if settings.protocol is Protocol.HTTP_PROTOBUF:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter

        return HttpLogExporter(endpoint=endpoint, headers=headers, timeout=settings.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter

    return GrpcLogExporter(
        endpoint=endpoint,
        headers=headers,
        timeout=settings.export_timeout_s,
        insecure=_grpc_insecure(endpoint),
    )
