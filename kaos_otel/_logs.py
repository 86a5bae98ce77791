"""Python logging bridged to OTLP logs, and trace ids in console log lines."""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry._logs import LoggerProvider, LogRecord, SeverityNumber
from opentelemetry.util.types import AnyValue

from kaos_otel._content import ContentPolicy, remember, to_log_value
from kaos_otel._internal_log import ForkSafeLock, internal_error, log_once

CONTENT_LOGGERS: tuple[str, ...] = ("mem0", "mcp")
"""Loggers whose records contain user content: mem0 logs memory text, mcp tool arguments, tool
names and tool error text (INFO and DEBUG)."""

INTERNAL_LOGGERS: tuple[str, ...] = ("opentelemetry", "grpc", "kaos_otel.exporters")
"""Loggers never exported over OTLP: exporting the exporter's own complaints would loop."""

CONSOLE_FORMAT = (
    "%(asctime)s %(levelname)s [trace_id=%(otelTraceID)s span_id=%(otelSpanID)s] %(name)s: %(message)s"
)

_STANDARD_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "otelTraceID",
    "otelSpanID",
    "otelServiceName",  # opentelemetry-instrumentation-logging's correlation fields
    "otelTraceSampled",
}
"""``logging.LogRecord`` fields that are not user ``extra=`` values."""


_STRUCTURED_MESSAGES = (Mapping, list, tuple, bytes, bool, int, float)
"""Messages exported as they are when logged with no arguments (other objects become their text)."""

_SEVERITY_TEXT = {"WARNING": "WARN", "CRITICAL": "FATAL"}
_emitting: ContextVar[bool] = ContextVar("kaos_otel_log_emitting", default=False)


def _matches(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def severity_number(levelno: int) -> SeverityNumber:
    """The OpenTelemetry severity of a Python logging level (the data model's mapping)."""
    if levelno < logging.DEBUG:
        return SeverityNumber.TRACE
    if levelno < logging.INFO:
        return SeverityNumber.DEBUG
    if levelno < logging.WARNING:
        return SeverityNumber.INFO
    if levelno < logging.ERROR:
        return SeverityNumber.WARN
    if levelno < logging.CRITICAL:
        return SeverityNumber.ERROR
    return SeverityNumber.FATAL


class KaosLoggingHandler(logging.Handler):
    """Python ``logging`` records to an OpenTelemetry logger provider, under the content policy.

    Records from content loggers are dropped unless content capture is on; exception messages
    are left out unless content capture is on (type and stack frames are kept). A record logged
    while this handler emits (an exporter complaining about the record), or while instrumentation
    is suppressed (an exporter added to the provider exporting, its HTTP client logging; the
    app's own ``suppress_instrumentation()`` blocks too, as for every instrumentation; read
    through ``opentelemetry-instrumentation`` where it is installed), is not exported.
    ``extra=`` values that are not text or numbers are converted as a structured log value is.

    The bridge leaves Python's own output as it was: a warning or error that no other handler
    sees goes to ``logging.lastResort`` (stderr) too, as it would without the bridge, so an app
    that configured no logging still sees its warnings, and kaos-otel's own.
    """

    def __init__(
        self, logger_provider: LoggerProvider, policy: ContentPolicy, export_level: int = logging.NOTSET
    ) -> None:
        super().__init__()  # every record reaches handle(), which exports those from export_level
        self.export_level = export_level
        """The least level exported (the handler's own level stays unset, so that a warning below
        it still finds Python's last resort when no other handler prints it)."""
        self.logger_provider = logger_provider
        self._policy = policy
        self._instrumentation_suppressed = _suppression_check()
        self._exported_loggers: dict[str, bool] = {}
        """Logger names and whether their records may be exported (a few names log everything)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep records that may be exported."""
        exported = self._exported_loggers.get(record.name)
        if exported is None:
            exported = remember(self._exported_loggers, record.name, self._exports(record.name))
        return exported and bool(super().filter(record))

    def _exports(self, logger_name: str) -> bool:
        if _matches(logger_name, INTERNAL_LOGGERS):
            return False
        return self._policy.capture.enabled or not _matches(logger_name, CONTENT_LOGGERS)

    def handle(self, record: logging.LogRecord) -> bool:
        """Filter and emit ``record``; hand a warning no other handler sees to the last resort."""
        last_resort = logging.lastResort
        if (
            last_resort is not None
            and record.levelno >= last_resort.level
            and _first_of_only_bridges(record) is self
        ):
            last_resort.handle(record)
        if record.levelno < self.export_level:
            return False
        return bool(super().handle(record))

    def emit(self, record: logging.LogRecord) -> None:
        """Translate and emit ``record``; never raises."""
        if _emitting.get() or self._instrumentation_suppressed():
            return
        try:
            body = self._body(record)
        except Exception:
            # the app's own message does not format ("%d" % "x"): not exported; Python reports it
            # ("--- Logging error ---") wherever it prints the record: the app's handlers, or the
            # last resort through :meth:`handle`
            return
        token = _emitting.set(True)
        try:
            logger = self.logger_provider.get_logger(record.name)
            logger.emit(self._translate(record, body))
        except Exception as exc:
            internal_error("log record export", exc)
        finally:
            _emitting.reset(token)

    def _body(self, record: logging.LogRecord) -> AnyValue:
        """The record's message; a value logged as the message with no arguments (structlog's event
        dict, a list, a number) stays a structure or number, as OpenTelemetry's handler keeps it."""
        if self.formatter:
            return self.format(record)
        if not record.args and isinstance(record.msg, _STRUCTURED_MESSAGES):
            return to_log_value(record.msg, self._policy)
        return record.getMessage()

    def _attribute(self, value: object) -> AnyValue:
        """An ``extra=`` value as a log attribute: text capped now (a huge string must not sit whole
        in the queue; it is redacted on the export thread), integers as OTLP carries them (64 bits,
        text beyond), other values converted by :func:`to_log_value`."""
        if isinstance(value, str):
            return self._policy.bound_size(value, self._policy.max_value_length)
        if isinstance(value, bool | float):
            return value
        return to_log_value(value, self._policy)

    def _translate(self, record: logging.LogRecord, body: AnyValue) -> LogRecord:
        attributes: dict[str, AnyValue] = {
            key: self._attribute(value)
            for key, value in vars(record).items()
            if key not in _STANDARD_RECORD_FIELDS
        }
        if record.exc_info and record.exc_info[1] is not None:
            attributes.update(self._policy.exception_attributes(record.exc_info[1]))
        return LogRecord(
            timestamp=int(record.created * 1e9),
            observed_timestamp=time.time_ns(),
            context=otel_context.get_current(),
            severity_text=_SEVERITY_TEXT.get(record.levelname, record.levelname),
            severity_number=severity_number(record.levelno),
            body=body,
            attributes=attributes,
        )


def _suppression_check() -> Callable[[], bool]:
    """Whether instrumentation is suppressed in the current context, as the SDK's batch processors
    mark their exports; read through ``opentelemetry-instrumentation``'s public helper, imported
    here rather than per record (without that package: never)."""
    try:
        from opentelemetry.instrumentation.utils import is_instrumentation_enabled
    except ImportError:
        return lambda: False
    return lambda: not is_instrumentation_enabled()


def bridge_level_from_env() -> int:
    """The bridge's level: ``OTEL_PYTHON_LOG_HANDLER_LEVEL``, as opentelemetry-instrumentation-logging
    reads it for its handler (a level name); records of every level when unset or unknown."""
    name = os.environ.get("OTEL_PYTHON_LOG_HANDLER_LEVEL", "").strip()
    if not name:
        return logging.NOTSET
    level = logging.getLevelName(name.upper())
    if isinstance(level, int):
        return level
    log_once(
        "log-handler-level",
        "kaos-otel: OTEL_PYTHON_LOG_HANDLER_LEVEL=%r is no logging level; records of every level "
        "are exported",
        name,
        level=logging.WARNING,
    )
    return logging.NOTSET


def _first_of_only_bridges(record: logging.LogRecord) -> KaosLoggingHandler | None:
    """The first bridge on ``record``'s way up the logger tree, if bridges are the only handlers
    there (Python would have used its last resort without them); else ``None``."""
    first: KaosLoggingHandler | None = None
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        for handler in logger.handlers:
            if not isinstance(handler, KaosLoggingHandler):
                return None
            first = first or handler
        logger = logger.parent if logger.propagate else None
    return first


_kept_lock = ForkSafeLock()
"""Never held while calling into logging (whose module lock a handler factory in ``dictConfig``
holds while it creates a manager, which takes this one)."""
_kept: list[logging.Handler] = []
"""The bridges kept on the root logger (one per manager that bridges logging)."""
_wrapped: list[tuple[object, str, Callable[..., Any], Callable[..., Any]]] = []
"""While any bridge is kept: (module, name, original, wrapper) of each logging config function."""


def keep_on_root(handler: logging.Handler) -> None:
    """Add ``handler`` to the root logger and keep it there across ``logging.basicConfig``,
    ``dictConfig`` and ``fileConfig``.

    ``basicConfig`` does nothing when the root logger has a handler, and ``dictConfig`` and
    ``fileConfig`` remove the root's handlers: an app configuring logging after the manager got no
    console output, or lost the bridge. As the SDK's and ``opentelemetry-instrumentation-logging``'s
    handlers do, the bridges step aside while one of them runs and come back after, with any bridge
    kept meanwhile (a manager a ``dictConfig`` handler factory makes; not the first bridge of the
    process, which that call's unwrapped function removes). The functions are wrapped once, while
    any bridge is kept; :func:`release_from_root` of the last one puts the originals back (where
    another library wrapped them since, the wrapper stays, as a pass-through).
    """
    import logging.config

    logging.getLogger().addHandler(handler)
    with _kept_lock:
        _kept.append(handler)
        if _wrapped:
            return
        functions = ((logging, "basicConfig"), (logging.config, "dictConfig"), (logging.config, "fileConfig"))
        for module, name in functions:
            original = getattr(module, name)
            wrapper = _stepping_aside(original)
            setattr(module, name, wrapper)
            _wrapped.append((module, name, original, wrapper))


def release_from_root(handler: logging.Handler) -> None:
    """Remove ``handler`` from the root logger; the last one released unwraps the logging config
    functions."""
    with _kept_lock:  # out of _kept first: _stepping_aside then takes it off the root again
        if handler in _kept:
            _kept.remove(handler)
    logging.getLogger().removeHandler(handler)  # logging's lock, never under _kept_lock
    with _kept_lock:
        if _kept:
            return
        for module, name, original, wrapper in _wrapped:
            if getattr(module, name) is wrapper:
                setattr(module, name, original)
        _wrapped.clear()


def release_bridges_to(logger_providers: Collection[object]) -> None:
    """Release every kept :class:`KaosLoggingHandler` sending to one of ``logger_providers``, on
    the root logger or set aside while a logging configuration function runs."""
    with _kept_lock:
        bridges = [
            handler
            for handler in _kept
            if isinstance(handler, KaosLoggingHandler) and handler.logger_provider in logger_providers
        ]
    for handler in bridges:
        release_from_root(handler)


def _stepping_aside(configure: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(configure)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        root = logging.getLogger()
        with _kept_lock:
            before = list(_kept)
            aside = [handler for handler in before if handler in root.handlers]
        for handler in aside:
            root.removeHandler(handler)
        try:
            return configure(*args, **kwargs)
        finally:
            with _kept_lock:  # kept meanwhile: a manager a dictConfig handler factory made
                added = [handler for handler in _kept if handler not in before]
            for handler in aside + added:
                root.addHandler(handler)  # a no-op if it is there already
                with _kept_lock:
                    released = handler not in _kept
                if released:  # meanwhile; release_from_root left _kept first, so this is seen
                    root.removeHandler(handler)

    return wrapper


class TraceContextFilter(logging.Filter):
    """Adds ``otelTraceID`` and ``otelSpanID`` to every record for console formats.

    Ids a record already has are kept: they were stamped where the record was made, by this
    filter on a ``QueueHandler`` or by ``opentelemetry-instrumentation-logging``'s record factory.
    A handler behind a ``QueueListener`` runs on the listener's thread, where no span is current.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Annotate the record with the current span's ids (``0`` outside a span), unless it has them."""
        if getattr(record, "otelSpanID", None) is not None:
            return True
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            record.otelTraceID = trace.format_trace_id(span_context.trace_id)
            record.otelSpanID = trace.format_span_id(span_context.span_id)
        else:
            record.otelTraceID = "0"
            record.otelSpanID = "0"
        return True


@contextmanager
def root_logging_kept() -> Iterator[None]:
    """Undo what the block does to the root logger's level and handlers (an import's basicConfig)."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:  # removed in the block (basicConfig(force=True))
                root.addHandler(handler)


def console_handler(level: int = logging.INFO, fmt: str = CONSOLE_FORMAT) -> logging.Handler:
    """A stderr handler whose lines show the trace and span ids."""
    handler = logging.StreamHandler()
    handler.setLevel(level)
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(logging.Formatter(fmt))
    return handler
