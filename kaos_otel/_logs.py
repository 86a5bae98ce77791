"""Python logging bridged to OTLP logs, and trace ids in console log lines."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from opentelemetry import trace
from opentelemetry._logs import LoggerProvider
from opentelemetry.instrumentation.logging.handler import LoggingHandler

from kaos_otel._content import ContentPolicy

CONTENT_LOGGERS: tuple[str, ...] = ("mem0",)
"""Loggers whose records contain user content (mem0 logs memory text at INFO/DEBUG)."""

INTERNAL_LOGGERS: tuple[str, ...] = ("opentelemetry", "grpc", "kaos_otel.exporters")
"""Loggers never exported over OTLP: exporting the exporter's own complaints would loop."""

CONSOLE_FORMAT = (
    "%(asctime)s %(levelname)s [trace_id=%(otelTraceID)s span_id=%(otelSpanID)s] %(name)s: %(message)s"
)


def _matches(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


class KaosLoggingHandler(LoggingHandler):
    """OTLP logging handler that applies the content policy.

    Records from content loggers are dropped unless content capture is on; exception messages
    are left out unless content capture is on (type and stack frames are kept).
    """

    def __init__(
        self, logger_provider: LoggerProvider, policy: ContentPolicy, level: int = logging.NOTSET
    ) -> None:
        super().__init__(level=level, logger_provider=logger_provider)
        self._policy = policy

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep records that may be exported."""
        if _matches(record.name, INTERNAL_LOGGERS):
            return False
        if not self._policy.capture.enabled and _matches(record.name, CONTENT_LOGGERS):
            return False
        return bool(super().filter(record))

    def _get_attributes(self, record: logging.LogRecord) -> tuple[dict[str, Any], str | None]:
        attributes, event_name = super()._get_attributes(record)
        if record.exc_info and record.exc_info[1] is not None:
            exception = self._policy.exception_attributes(record.exc_info[1])
            exception.pop("exception.escaped", None)
            attributes.update(exception)
        return attributes, event_name


class TraceContextFilter(logging.Filter):
    """Adds ``otelTraceID`` and ``otelSpanID`` to every record for console formats."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Annotate the record with the current span's ids (``0`` outside a span)."""
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            record.otelTraceID = trace.format_trace_id(span_context.trace_id)
            record.otelSpanID = trace.format_span_id(span_context.span_id)
        else:
            record.otelTraceID = "0"
            record.otelSpanID = "0"
        return True


def console_handler(level: int = logging.INFO, fmt: str = CONSOLE_FORMAT) -> logging.Handler:
    """A stderr handler whose lines show the trace and span ids."""
    handler = logging.StreamHandler()
    handler.setLevel(level)
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(logging.Formatter(fmt))
    return handler
