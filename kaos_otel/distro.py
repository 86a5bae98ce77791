"""``opentelemetry-instrument`` support: the kaos-otel distro configures the process's providers.

With ``kaos-otel`` installed, ``opentelemetry-instrument python app.py`` (or
``OTEL_PYTHON_DISTRO=kaos``) sets up the export pipeline of :class:`~kaos_otel.KaosOtelManager`
from the ``OTEL_*`` variables, then the ``opentelemetry_instrumentor`` entry points (Mem0, httpx...)
are loaded on top of it.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]

from kaos_otel._manager import KaosOtelManager

_lock = threading.Lock()
_default: KaosOtelManager | None = None


def configure(**settings: Any) -> KaosOtelManager:
    """Create the process-wide default manager once (later calls return it unchanged)."""
    global _default
    with _lock:
        if _default is None:
            _default = KaosOtelManager(**settings)
        return _default


class KaosDistro(BaseDistro):  # type: ignore[misc]
    """Distro entry point (``opentelemetry_distro = kaos``)."""

    def _configure(self, **kwargs: Any) -> None:
        configure()
