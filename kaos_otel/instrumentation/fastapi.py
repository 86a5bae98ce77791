"""FastAPI (and any Starlette app) in one call: server spans, one per request, flushed on shutdown.

``instrument_app(app, otel)`` before the app starts serving:

- wraps the app in :class:`~kaos_otel.instrumentation.asgi.TraceContextMiddleware` (W3C trace
  context under the trust policy, the agent's spans as children of the SERVER span, streaming
  kept in context), outside Starlette's error handling, so the span carries the status an
  unhandled exception is answered with;
- turns FastAPI's native telemetry off on that app (FastAPI 0.16x adds its own server span), so
  each request has exactly one SERVER span whatever FastAPI version is installed;
- flushes telemetry when the app's lifespan ends. ``uvicorn app:app`` and gunicorn's uvicorn
  workers end the lifespan on SIGTERM (Docker, Kubernetes and systemd stop processes that way)
  before the process dies, so the last requests' spans, logs and metrics are exported.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from kaos_otel.instrumentation.asgi import FASTAPI_NATIVE_TELEMETRY_OFF, ASGIApp, TraceContextMiddleware

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from kaos_otel._config import TrustPolicy
    from kaos_otel._manager import KaosOtelManager

__all__ = ["instrument_app"]

_log = logging.getLogger("kaos_otel")
_MARK = "kaos_otel_instrumented"
DEFAULT_FLUSH_TIMEOUT_S = 5.0
_OTEL_FASTAPI_INSTRUMENTED = (
    "kaos-otel: OpenTelemetry's FastAPI instrumentation is on for this app too, so every request "
    "gets its spans as well (one for the request, one per ASGI receive and send) next to "
    "kaos-otel's server span. Fix: OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=fastapi under "
    "opentelemetry-instrument, or do not call FastAPIInstrumentor.instrument_app on it (its "
    "http.server.* metrics go with it)"
)


def instrument_app(
    app: Starlette,
    otel: KaosOtelManager,
    *,
    trust: TrustPolicy | str | None = None,
    baggage_allowlist: Iterable[str] | None = None,
    excluded_paths: Iterable[str] = ("/health", "/ready"),
    flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
) -> None:
    """Instrument a FastAPI or Starlette ``app`` with ``otel``; call it once, before serving.

    ``trust``, ``baggage_allowlist`` and ``excluded_paths`` go to the middleware (defaults from
    ``otel``'s settings). At lifespan end ``otel.force_flush(flush_timeout_s)`` runs (a warning says
    what it left behind if it misses the deadline); the process can go on (tests, reloads) and
    ``otel`` still shuts down at exit. A second call on the same app
    is ignored with a warning.
    """
    if getattr(app.state, _MARK, False):
        _log.warning("kaos-otel: instrument_app was already called on this app; the second call is ignored")
        return
    if app.middleware_stack is not None:
        raise RuntimeError(
            "kaos-otel: instrument_app must be called before the app's middleware stack is built (by "
            "its first request or lifespan, or by another instrumentation rebuilding it)"
        )
    if getattr(app, "_is_instrumented_by_opentelemetry", False):  # FastAPIInstrumentor's mark
        _log.warning(_OTEL_FASTAPI_INSTRUMENTED)
    setattr(app.state, _MARK, True)
    _native_telemetry_off(app)
    build_stack = app.build_middleware_stack

    def build_stack_inside_server_spans() -> ASGIApp:
        # outside Starlette's ServerErrorMiddleware: the server span sees the status an unhandled
        # exception is answered with (500, or what an app's exception handler sends)
        return TraceContextMiddleware(
            build_stack(),
            otel=otel,
            trust=trust,
            baggage_allowlist=baggage_allowlist,
            excluded_paths=excluded_paths,
        )

    setattr(app, "build_middleware_stack", build_stack_inside_server_spans)  # noqa: B010
    app.router.lifespan_context = _flushing(app.router.lifespan_context, otel, flush_timeout_s)


def _native_telemetry_off(app: Starlette) -> None:
    """Switch FastAPI's own tracing, metrics and logs off (FastAPI 0.16x keeps them in ``_telemetry``).

    Older FastAPI and plain Starlette have none. Should a future FastAPI keep them elsewhere, the
    middleware still notices the second span at the first request and logs the fix at WARNING.
    """
    config = getattr(app, "_telemetry", None)
    if isinstance(config, dict):
        config.update(FASTAPI_NATIVE_TELEMETRY_OFF)


def _flushing(
    lifespan: Callable[[Any], AbstractAsyncContextManager[Any]],
    otel: KaosOtelManager,
    timeout_s: float,
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """``lifespan`` followed by a telemetry flush (on a worker thread, with a deadline)."""

    @asynccontextmanager
    async def lifespan_then_flush(app: Any) -> AsyncIterator[Any]:
        try:
            async with lifespan(app) as state:
                yield state
        finally:
            if not await anyio.to_thread.run_sync(otel.force_flush, timeout_s):
                _warn_unexported(otel, timeout_s)

    return lifespan_then_flush


def _warn_unexported(otel: KaosOtelManager, timeout_s: float) -> None:
    """Say what the shutdown flush left behind: a server stopping its worker by a signal next
    (uvicorn re-raises SIGTERM) skips the exit handlers that would count and report it."""
    held = {signal: otel.pipeline.pending(signal) for signal in ("traces", "logs")}
    counted = ", ".join(f"{count} {signal}" for signal, count in held.items() if count)
    _log.warning(
        "kaos-otel: the app's shutdown flush missed its %.1f s deadline (collector slow or down); "
        "not exported yet: %s, lost if the process is stopped now",
        timeout_s,
        f"{counted} and any metric points" if counted else "metric points",
    )
