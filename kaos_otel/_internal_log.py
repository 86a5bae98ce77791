"""The SDK's own diagnostics: internal errors are logged, rate-limited, masked, and never raised."""

from __future__ import annotations

import logging
import threading
import time

from kaos_otel._secrets import mask_message

_log = logging.getLogger("kaos_otel")
_lock = threading.Lock()
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
