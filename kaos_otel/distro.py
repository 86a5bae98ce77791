"""``opentelemetry-instrument`` support: the kaos-otel distro configures the process's providers.

With ``kaos-otel`` installed, ``opentelemetry-instrument python app.py`` (or
``OTEL_PYTHON_DISTRO=kaos``) sets up the export pipeline of :class:`~kaos_otel.KaosOtelManager`
from the ``OTEL_*`` variables, then the ``opentelemetry_instrumentor`` entry points (Mem0, httpx...)
are loaded on top of it. Its meter provider exports every meter's metrics (the app's, other
instrumentations'), as the plain SDK's would: ``export_other_metrics=True``.

The manager's handler bridges Python logging (with the content policy: content loggers only with
capture on). ``opentelemetry-instrumentation-logging``, which ``opentelemetry-bootstrap`` installs,
would add a second handler on the root logger by default and export every record twice: the distro
turns that off (``OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION=false``) unless the environment sets it. Its
trace-context fields for log formats (``OTEL_PYTHON_LOG_CORRELATION``) are unaffected.

kaos-otel also ships a configurator (``opentelemetry_configurator = kaos``), and the distro makes
it the one ``opentelemetry-instrument`` runs (``OTEL_PYTHON_CONFIGURATOR=kaos`` unless set): with
``opentelemetry-distro`` installed as well, its configurator would otherwise build a second set
of providers the API refuses, with a warning per signal. (With two distros installed,
``OTEL_PYTHON_DISTRO=kaos`` picks this one.)
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]

from kaos_otel._manager import configure


def _configure_process() -> None:
    """The process-wide manager, exporting every meter's metrics (the app's too)."""
    configure(export_other_metrics=True)


class KaosDistro(BaseDistro):  # type: ignore[misc]
    """Distro entry point (``opentelemetry_distro = kaos``)."""

    def _configure(self, **kwargs: Any) -> None:
        os.environ.setdefault("OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION", "false")  # see the module docstring
        os.environ.setdefault("OTEL_PYTHON_CONFIGURATOR", "kaos")
        _configure_process()


class KaosConfigurator:
    """Configurator entry point (``opentelemetry_configurator = kaos``): the distro's setup."""

    def configure(self, **kwargs: Any) -> None:
        """Set up the process-wide manager (once: the distro may have done it already)."""
        _configure_process()
