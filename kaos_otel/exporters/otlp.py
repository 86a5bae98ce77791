"""OTLP exporters for each signal, configured by the exporters themselves.

The exporter class follows the signal's protocol; every other setting (endpoint, headers, TLS
and certificates, timeout, compression) is left to the exporter, which reads its
``OTEL_EXPORTER_OTLP[_SIGNAL]_*`` variables, unless the manager was given an explicit override.
Explicit ``headers`` override the variables' headers of the same name and keep the others (the
signal's variable, else ``OTEL_EXPORTER_OTLP_HEADERS``), over gRPC and HTTP alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.environment_variables import OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.util.re import parse_env_headers

from kaos_otel._config import OtlpProtocol, TelemetrySettings
from kaos_otel._content import ContentPolicy
from kaos_otel.exporters.health import TelemetryHealth
from kaos_otel.exporters.pipeline import SanitizingMetricExport, sanitizing_metric_exporter

_Exporter = TypeVar("_Exporter")


def _overrides(settings: TelemetrySettings, signal: str) -> dict[str, Any]:
    """Constructor arguments for the settings that were given explicitly, and only those."""
    options: dict[str, Any] = {}
    if settings.endpoint is not None:
        options["endpoint"] = settings.endpoints[signal]
    if settings.headers is not None:
        options["headers"] = {**_environment_headers(signal), **settings.headers}
    if settings.export_timeout_s is not None:
        options["timeout"] = settings.export_timeout_s
    return options


def _environment_headers(signal: str) -> dict[str, str]:
    """The headers the signal's exporter reads from the environment without explicit ones
    (``OTEL_EXPORTER_OTLP_<SIGNAL>_HEADERS``, else ``OTEL_EXPORTER_OTLP_HEADERS``), parsed by
    the SDK's own parser as the exporters parse them (names lowercased)."""
    env = os.environ
    raw = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_HEADERS") or env.get(OTEL_EXPORTER_OTLP_HEADERS)
    return dict(parse_env_headers(raw or "", liberal=True))


def _built(signal: str, build: Callable[[], _Exporter]) -> _Exporter:
    """``build()``; a timeout variable the exporter cannot read (the SDK raises ``float()``'s
    error, which names no variable) is named in the error. The signal's variable is read first;
    the base one only where that is unset or zero."""
    try:
        return build()
    except ValueError as exc:
        for variable in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT", OTEL_EXPORTER_OTLP_TIMEOUT):
            raw = os.environ.get(variable)
            if raw is None:
                continue
            try:
                if float(raw):
                    break  # read, and readable: the error is another one
            except ValueError:
                raise ValueError(
                    f"kaos-otel: {variable}={raw[:40]!r} is not a number of seconds ({exc})"
                ) from exc
        raise


def _http(settings: TelemetrySettings, signal: str) -> bool:
    return settings.protocols[signal] is OtlpProtocol.HTTP_PROTOBUF


def otlp_span_exporter(settings: TelemetrySettings) -> SpanExporter:
    """The span exporter of ``settings.protocols['traces']``."""
    options = _overrides(settings, "traces")
    if _http(settings, "traces"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

        return _built("traces", lambda: HttpSpanExporter(**options))
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

    return _built("traces", lambda: GrpcSpanExporter(**options))


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
    options = _overrides(settings, "metrics")
    return _built("metrics", lambda: sanitizing_metric_exporter(exporter_class, health, policy, **options))


def otlp_log_exporter(settings: TelemetrySettings) -> LogRecordExporter:
    """The log exporter of ``settings.protocols['logs']``."""
    options = _overrides(settings, "logs")
    if _http(settings, "logs"):
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter

        return _built("logs", lambda: HttpLogExporter(**options))
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter

    return _built("logs", lambda: GrpcLogExporter(**options))
