"""``opentelemetry-instrument`` support: the kaos-otel distro configures the process's providers.

With ``kaos-otel`` installed, ``opentelemetry-instrument python app.py`` (or
``OTEL_PYTHON_DISTRO=kaos``) sets up the export pipeline of :class:`~kaos_otel.KaosOtelManager`
from the ``OTEL_*`` variables, then the ``opentelemetry_instrumentor`` entry points (Mem0, httpx...)
are loaded on top of it.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]

from kaos_otel._manager import configure


class KaosDistro(BaseDistro):  # type: ignore[misc]
    """Distro entry point (``opentelemetry_distro = kaos``)."""

    def _configure(self, **kwargs: Any) -> None:
        configure()
