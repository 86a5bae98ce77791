"""OpenTelemetry instrumentation for Mem0 (``mem0ai``), the long-term memory engine.

Every call of ``Memory`` and ``AsyncMemory`` ``add``, ``search``, ``get``, ``get_all``,
``update``, ``delete``, ``delete_all``, ``history`` and ``reset`` becomes one
``gen_ai.memory.client`` span (``create_memory``, ``search_memory``, ``get_memory``,
``list_memory``, ``update_memory``, ``delete_memory``, ``memory_history``,
``delete_memory_store``), a child of the caller's current span, and is counted and timed by
``kaos.memory.operations`` and ``kaos.memory.operation.duration`` with ``kaos.memory.tier`` =
``long_term``. Instances created before and after ``instrument()`` are covered alike.

Usage::

    from kaos_otel import KaosOtelManager
    from kaos_otel.instrumentation.mem0 import Mem0Instrumentor

    otel = KaosOtelManager("my-agent")
    Mem0Instrumentor().instrument(telemetry=otel)

``opentelemetry-instrument`` enables it too (entry point ``mem0``), on the global providers.

``instrument()`` accepts:

- ``telemetry``: a :class:`~kaos_otel.KaosOtelManager` (or any
  :class:`~kaos_otel.AgentTelemetry`) to record through; its content policy applies.
- ``tracer_provider`` / ``meter_provider``: used when no ``telemetry`` is given (default: the
  global providers).
- ``capture_content``: ``True``/``False`` or a ``ContentCapture`` value; without ``telemetry``
  it defaults to ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``.
- ``child_spans``: ``True`` adds CLIENT child spans for the embedder (``embeddings {model}``),
  the LLM (``chat {model}``) and vector-store calls (``{operation} {collection}``). Off by default.

Span attributes: ``gen_ai.operation.name``, ``gen_ai.memory.store.id`` (the collection),
``gen_ai.memory.record.id``, ``gen_ai.memory.record.count`` (results returned or records
written), ``kaos.memory.scope`` (``session`` for a ``run_id``, else ``agent`` for an
``agent_id``, else ``user`` for a ``user_id``, else ``store``; read from the arguments and from
``filters``), ``kaos.memory.tier``, ``kaos.memory.provider`` = ``mem0``, ``kaos.memory.infer``
(``add``), ``kaos.outcome`` and, on failure, ``error.type``. The ids go on spans as ``user.id``,
``gen_ai.agent.id`` and ``session.id``, never on metrics. The query text
(``gen_ai.memory.query.text``) and records with their text and metadata
(``gen_ai.memory.records``) are recorded only with content capture on. A failing mem0 call
ends its span as an error and the original exception propagates unchanged.

``instrument()`` does not import mem0: until the application imports it, the wrapping waits
for that import, so an app that never uses mem0 (under ``opentelemetry-instrument`` too) never
loads it. Set ``MEM0_TELEMETRY=False`` in the environment before mem0 is imported, or mem0
starts its own PostHog telemetry; :mod:`kaos_otel.instrumentation.mem0.offline` has a
configuration that needs no network at all.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Collection
from typing import Any

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.instrumentation.utils import unwrap
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from kaos_otel._config import TelemetrySettings
from kaos_otel._content import policy_from_env
from kaos_otel._internal_log import internal_error
from kaos_otel._metrics import MEM0_METER_NAME
from kaos_otel._telemetry import AgentTelemetry
from kaos_otel.instrumentation.mem0._wrappers import METHODS, Mem0Tracing
from kaos_otel.instrumentation.mem0.package import _instruments

__all__ = ["Mem0Instrumentor"]

_log = logging.getLogger(__name__)
_MEM0_MAIN = "mem0.memory.main"
_hook_lock = threading.Lock()
_hook_registered = False


def _memory_classes() -> tuple[type[Any], type[Any]]:
    """mem0's ``Memory`` and ``AsyncMemory`` (imported late, after ``MEM0_TELEMETRY`` is set)."""
    from mem0.memory.main import AsyncMemory, Memory

    return Memory, AsyncMemory


def _telemetry_from_providers(kwargs: dict[str, Any]) -> AgentTelemetry:
    """Telemetry on the given (default: global) providers, content capture from the environment."""
    return AgentTelemetry.from_providers(
        kwargs.get("tracer_provider"),
        kwargs.get("meter_provider"),
        policy=policy_from_env(kwargs.get("capture_content")),
        enabled=not TelemetrySettings.from_env().disabled,
        scope=MEM0_METER_NAME,
    )


def _on_mem0_import(module: object) -> None:
    """Wrap mem0 now that the application imported it, if an ``instrument()`` is waiting for it;
    never raising into that import."""
    try:
        Mem0Instrumentor()._wrap_waiting()
    except Exception as exc:
        internal_error("instrumenting mem0 at its import", exc)


_BASE_INSTRUMENTOR_ARGUMENTS = frozenset({"skip_dep_check", "raise_exception_on_conflict"})
"""What ``BaseInstrumentor.instrument`` reads itself (``opentelemetry-instrument`` passes the second)."""


class Mem0Instrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Traces and measures Mem0 memory operations; ``uninstrument()`` restores mem0 as it was."""

    _tracing: Mem0Tracing | None = None
    _wrapped: tuple[type[Any], ...] = ()
    """The classes whose methods are wrapped now (none while waiting for mem0's import)."""
    _state_lock = threading.Lock()
    """Wrapping (on the importing thread, from the hook) and ``uninstrument()`` take turns."""

    def instrumentation_dependencies(self) -> Collection[str]:
        """The mem0ai versions supported."""
        return _instruments

    def instrument(
        self,
        *,
        telemetry: AgentTelemetry | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        capture_content: bool | str | None = None,
        child_spans: bool = False,
        **kwargs: Any,
    ) -> None:
        """Trace and measure Mem0 (the arguments are described in this module's docstring);
        ``BaseInstrumentor``'s own keywords (``skip_dep_check``) pass through."""
        unknown = sorted(set(kwargs) - _BASE_INSTRUMENTOR_ARGUMENTS)
        if unknown:
            _log.warning("Mem0Instrumentor.instrument(): unknown arguments ignored: %s", ", ".join(unknown))
        if telemetry is not None and capture_content is not None:
            _log.warning(
                "Mem0Instrumentor.instrument(): capture_content is ignored with telemetry=: the "
                "content policy of the telemetry given applies (create its manager with "
                "capture_content instead)"
            )
        super().instrument(
            telemetry=telemetry,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            capture_content=capture_content,
            child_spans=child_spans,
            **kwargs,
        )

    def _instrument(self, **kwargs: Any) -> None:
        telemetry = kwargs.get("telemetry")
        if not isinstance(telemetry, AgentTelemetry):
            telemetry = _telemetry_from_providers(kwargs)
        self._tracing = Mem0Tracing(telemetry, child_spans=bool(kwargs.get("child_spans", False)))
        if _MEM0_MAIN not in sys.modules:
            _wait_for_mem0_import()
        # Checked again after the hook is in place: an import that had already found mem0 when
        # it was registered runs no hook.
        if _MEM0_MAIN in sys.modules:
            self._wrap_waiting()

    def _wrap_waiting(self) -> None:
        """Wrap every covered method, or none (with a warning) if mem0 lacks one."""
        if self._tracing is None:
            return
        # Outside the lock: this import may wait for another thread's import of mem0, whose
        # hook calls this method too.
        classes = _memory_classes()
        with self._state_lock:
            tracing = self._tracing
            if tracing is None or self._wrapped:
                return
            try:
                originals = [
                    (cls, method, getattr(cls, method.name)) for cls in classes for method in METHODS
                ]
            except AttributeError as exc:
                _log.warning("mem0 not instrumented: this mem0 version lacks %s", exc)
                return
            for cls, method, original in originals:
                wrapt.wrap_function_wrapper(cls, method.name, tracing.wrapper(method, original))
            self._wrapped = classes

    def _uninstrument(self, **kwargs: Any) -> None:
        with self._state_lock:
            for cls in self._wrapped:
                for method in METHODS:
                    unwrap(cls, method.name)
            self._wrapped = ()
            tracing, self._tracing = self._tracing, None
        if tracing is not None:
            tracing.close()


def _wait_for_mem0_import() -> None:
    """Have :func:`_on_mem0_import` run when mem0 is imported (registered once per process)."""
    global _hook_registered
    with _hook_lock:
        if not _hook_registered:
            wrapt.register_post_import_hook(_on_mem0_import, _MEM0_MAIN)
            _hook_registered = True
