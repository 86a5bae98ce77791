"""``opentelemetry-instrument`` support: the kaos-otel distro configures the process's providers.

With ``kaos-otel`` installed, ``opentelemetry-instrument python app.py`` (or
``OTEL_PYTHON_DISTRO=kaos``) sets up the export pipeline of :class:`~kaos_otel.KaosOtelManager`
from the ``OTEL_*`` variables, then the ``opentelemetry_instrumentor`` entry points (Mem0, httpx...)
are loaded on top of it. Its meter provider exports every meter's metrics (the app's, other
instrumentations'), as the plain SDK's would: ``export_other_metrics=True``.

The manager's handler bridges Python logging (with the content policy: content loggers only with
capture on). ``opentelemetry-instrumentation-logging``, which ``opentelemetry-bootstrap`` installs,
would add a second handler on the root logger and export every record twice, the second copy past
the content policy: the distro loads it without its handler (``enable_log_auto_instrumentation=False``,
whatever ``OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION`` says; set to ``true``, one warning says why it is
not followed), and sets that variable to ``false`` unless the environment sets it, for an app
that calls ``LoggingInstrumentor().instrument()`` itself. Its trace-context fields for log formats
(``OTEL_PYTHON_LOG_CORRELATION``) are unaffected.

The distro configures the process from the ``OTEL_*`` variables; a declarative configuration
file (``OTEL_CONFIG_FILE``, which the SDK's own configurator follows) is not read, and one warning
says so. The distro configures the process itself; kaos-otel ships no configurator entry point (with
``OTEL_PYTHON_CONFIGURATOR`` unset, whichever configurator comes first runs, and when another
distro is chosen that must stay its own). Once chosen, the distro sets
``OTEL_PYTHON_CONFIGURATOR=kaos`` (a name no configurator has) unless the environment sets it:
``opentelemetry-distro``'s configurator, installed as well, would otherwise build a second set of
providers the API refuses but that still work (its logging handler exports every record a second
time, past the content-safety layer). ``opentelemetry-instrument`` says which configurator it
skipped. Once the configurators are loaded, the distro removes the ``OTEL_PYTHON_CONFIGURATOR`` it
set (an ``opentelemetry_pre_instrument`` entry point), so that a child process run under another
distro (an MCP server over stdio, say) loads its own configurator. ``OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION``
stays for the app's own code, and passes to child processes: a child under another distro that
should bridge logging sets it to ``true``. A setup that fails (an ``OTEL_*`` value an exporter
refuses) leaves both variables as it found them. Which distro is chosen, with both installed, depends on
the install's layout: set ``OTEL_PYTHON_DISTRO=kaos``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]

from kaos_otel._internal_log import log_once
from kaos_otel._manager import configure

_LOGGING_INSTRUMENTOR = "opentelemetry.instrumentation.logging:LoggingInstrumentor"
_NOT_FOLLOWED = {
    "OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION": "kaos-otel's handler already exports Python logging (under "
    "the content policy); a second handler would export every record twice",
    "OTEL_PYTHON_LOG_CODE_ATTRIBUTES": "kaos-otel's handler records no code.* attributes",
}
"""opentelemetry-instrumentation-logging's variables for its handler, which kaos-otel's replaces,
and why each set to ``true`` is not followed."""


_NO_CONFIGURATOR = "kaos"
"""``OTEL_PYTHON_CONFIGURATOR`` while ``opentelemetry-instrument`` sets up: a name no configurator has."""

_configurator_set = False
"""Whether the distro set ``OTEL_PYTHON_CONFIGURATOR`` (the environment did not)."""


def restore_environment() -> None:
    """``opentelemetry_pre_instrument`` entry point: remove the ``OTEL_PYTHON_CONFIGURATOR`` the
    distro set, now that the configurators are loaded (called under any distro: nothing to do
    unless kaos-otel's set it)."""
    global _configurator_set
    if _configurator_set and os.environ.get("OTEL_PYTHON_CONFIGURATOR") == _NO_CONFIGURATOR:
        del os.environ["OTEL_PYTHON_CONFIGURATOR"]
    _configurator_set = False


class KaosDistro(BaseDistro):  # type: ignore[misc]
    """Distro entry point (``opentelemetry_distro = kaos``)."""

    def _configure(self, **kwargs: Any) -> None:
        global _configurator_set
        log_variable_set = "OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION" not in os.environ
        if log_variable_set:  # see the module docstring
            os.environ["OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION"] = "false"
        if "OTEL_PYTHON_CONFIGURATOR" not in os.environ:  # no other configurator runs after it
            os.environ["OTEL_PYTHON_CONFIGURATOR"] = _NO_CONFIGURATOR
            _configurator_set = True
        if os.environ.get("OTEL_CONFIG_FILE", "").strip():  # the SDK's configurator would follow it
            log_once(
                "distro-OTEL_CONFIG_FILE",
                "kaos-otel: OTEL_CONFIG_FILE=%s is not followed: the kaos-otel distro configures "
                "from the OTEL_* variables (unset it, or set OTEL_PYTHON_DISTRO to another distro)",
                os.environ["OTEL_CONFIG_FILE"],
                level=logging.WARNING,
            )
        try:
            configure(export_other_metrics=True)  # the process's telemetry: the app's metrics too
        except BaseException:  # opentelemetry-instrument stops here: no pre_instrument hook runs
            restore_environment()
            if log_variable_set and os.environ.get("OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION") == "false":
                del os.environ["OTEL_PYTHON_LOG_AUTO_INSTRUMENTATION"]
            raise

    def load_instrumentor(self, entry_point: Any, **kwargs: Any) -> None:
        """Load an ``opentelemetry_instrumentor`` entry point; the logging one without its handler."""
        if entry_point.value == _LOGGING_INSTRUMENTOR:
            kwargs["enable_log_auto_instrumentation"] = False  # see the module docstring
            for name, why in _NOT_FOLLOWED.items():
                if os.environ.get(name, "").strip().lower() == "true":
                    log_once(
                        f"distro-{name}",
                        "kaos-otel: %s=true is not followed: %s",
                        name,
                        why,
                        level=logging.WARNING,
                    )
        super().load_instrumentor(entry_point, **kwargs)
