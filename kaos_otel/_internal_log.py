"""The SDK's own diagnostics: internal errors are logged, rate-limited, masked, and never raised."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

from kaos_otel._secrets import mask_message

_log = logging.getLogger("kaos_otel")


class ForkSafeLock:
    """A lock that a forked child gets free: the thread that held it in the parent is not in the
    child, and would never release it there. Use it with ``with``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        reference = weakref.ref(self)

        def renew_in_child() -> None:
            alive = reference()
            if alive is not None:
                alive._lock = threading.Lock()

        os.register_at_fork(after_in_child=renew_in_child)

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


_lock = ForkSafeLock()
_last_logged: dict[str, float] = {}
_INTERVAL_S = 60.0


def internal_error(where: str, exc: BaseException) -> None:
    """Log a swallowed telemetry error at most once a minute per place."""
    now = time.monotonic()
    with _lock:
        last = _last_logged.get(where)
        if last is not None and now - last < _INTERVAL_S:
            return
        _last_logged[where] = now
    try:
        message = mask_message(
            f"kaos-otel: {where} failed ({type(exc).__name__}: {exc}); telemetry continues"
        )
        _log.warning("%s", message)
    except Exception:  # logging itself failed: nothing more to do
        return


def log_once(key: str, message: str, *args: object, level: int = logging.INFO) -> None:
    """Log a message (INFO unless ``level`` says otherwise) the first time ``key`` is seen in this process."""
    with _lock:
        if key in _last_logged:
            return
        _last_logged[key] = time.monotonic()
    _log.log(level, "%s", mask_message(message % args if args else message))


_EXPORTER_LOGGERS = tuple(
    f"opentelemetry.exporter.otlp.{name}"
    for name in (
        "common.http",
        "proto.http.trace_exporter",
        "proto.http.metric_exporter",
        "proto.http._log_exporter",
        "proto.grpc.exporter",
        "proto.grpc.trace_exporter",
        "proto.grpc.metric_exporter",
        "proto.grpc._log_exporter",
    )
)
"""The OTLP exporters' loggers: their messages quote the endpoint (and errors that quote the URL)."""


class _MaskingFilter(logging.Filter):
    """Masks secrets and URL query values in a record's message before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            record.msg = mask_message(record.getMessage())
            record.args = None
        except Exception:  # a message that cannot be formatted is left to logging's own handling
            pass
        return True


_MASKING_FILTER = _MaskingFilter()


def mask_exporter_diagnostics() -> None:
    """Mask credentials in the OTLP exporters' own warnings (idempotent)."""
    for name in _EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        if _MASKING_FILTER not in logger.filters:
            logger.addFilter(_MASKING_FILTER)


mask_exporter_diagnostics()
