"""KaosOtelManager: the domain API of :class:`AgentTelemetry` on an :class:`ExportPipeline` it owns."""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry._logs import LoggerProvider

from kaos_otel._config import TelemetrySettings
from kaos_otel._content import ContentPolicy, Redactor, default_redactor
from kaos_otel._internal_log import ForkSafeLock, log_once
from kaos_otel._metrics import LabelBounds
from kaos_otel._pipeline import DEFAULT_SHUTDOWN_TIMEOUT_S, ExportPipeline
from kaos_otel._telemetry import AgentTelemetry, telemetry_parts
from kaos_otel.exporters import TelemetryHealth
from kaos_otel.exporters.health import Signal


class KaosOtelManager(AgentTelemetry):
    """Telemetry for one service: spans in three styles, agent-domain helpers, metrics and logs.

    Configured by the standard ``OTEL_*`` environment variables, read by the OpenTelemetry SDK
    itself; keyword arguments are explicit overrides. If the host application already installed
    global providers they are used as they are; otherwise this manager installs its own
    (``global_providers=False`` keeps them private). Python logging is bridged from the root
    logger when log records are exported, by a private manager too (``bridge_logging=False`` keeps
    the app's records out of it). The meter provider it builds exports kaos-otel's metrics only;
    ``export_other_metrics=True`` exports every other meter's (the app's, other
    instrumentations') as a plain SDK provider would, with their own labels. The providers and
    the export pipeline belong to :attr:`pipeline`; the domain API is :class:`AgentTelemetry`'s.
    """

    def __init__(
        self,
        service_name: str | None = None,
        *,
        endpoint: str | None = None,
        protocol: str | None = None,
        headers: Mapping[str, str] | None = None,
        resource_attributes: Mapping[str, str] | None = None,
        disabled: bool | None = None,
        capture_content: bool | str | None = None,
        console: bool | None = None,
        metric_export_interval_ms: int | None = None,
        span_schedule_delay_ms: int | None = None,
        span_max_queue_size: int | None = None,
        export_timeout_s: float | None = None,
        trust: str | None = None,
        redactor: Redactor = default_redactor,
        global_providers: bool = True,
        bridge_logging: bool = True,
        export_other_metrics: bool = False,
    ) -> None:
        if not callable(redactor):
            raise TypeError(
                f"kaos-otel: redactor must be a function from str to str, not {type(redactor).__name__}"
            )
        self._made_in = os.getpid()
        self.settings = TelemetrySettings.from_env(
            service_name=service_name,
            endpoint=endpoint,
            protocol=protocol,
            headers=headers,
            resource_attributes=resource_attributes,
            disabled=disabled,
            capture_content=capture_content,
            console=console,
            metric_export_interval_ms=metric_export_interval_ms,
            span_schedule_delay_ms=span_schedule_delay_ms,
            span_max_queue_size=span_max_queue_size,
            export_timeout_s=export_timeout_s,
            trust=trust,
        )
        policy = ContentPolicy(
            self.settings.capture_content, redactor, self.settings.attribute_value_length_limit
        )
        self.pipeline = ExportPipeline(
            self.settings,
            policy,
            global_providers=global_providers,
            bridge_logging=bridge_logging,
            export_other_metrics=export_other_metrics,
        )
        parts = telemetry_parts(
            self.pipeline.tracer_provider,
            self.pipeline.meter_provider,
            policy,
            self.pipeline.health,
            LabelBounds(redactor=redactor),
            logger_provider=self.pipeline.logger_provider,
            enabled=not self.settings.disabled,
        )
        super().__init__(
            parts.tracer, parts.metrics, parts.policy, enabled=parts.enabled, events=parts.events
        )
        if parts.enabled:
            _RUNNING[self] = None  # one dict operation: atomic, no lock (none to inherit locked in a fork)
            from multiprocessing import parent_process
            from multiprocessing.util import register_after_fork

            register_after_fork(self, _stop_at_child_exit)  # in the children forked from here
            if parent_process() is not None:  # made in a child itself (a Pool initializer)
                _stop_at_child_exit(self)

    @property
    def tracer_provider(self) -> trace.TracerProvider:
        """The tracer provider spans go to (the host's if it installed one)."""
        return self.pipeline.tracer_provider

    @property
    def meter_provider(self) -> metrics.MeterProvider:
        """The meter provider metrics go to: a :class:`CatalogMeterProvider` this manager built,
        or the host's if it installed one."""
        return self.pipeline.meter_provider

    @property
    def logger_provider(self) -> LoggerProvider:
        """The logger provider log records go to (the host's if it installed one)."""
        return self.pipeline.logger_provider

    @property
    def health(self) -> TelemetryHealth:
        """What the export pipeline lost, and why."""
        return self.pipeline.health

    def queued(self, signal: Signal = "traces") -> int:
        """Items of ``signal`` waiting in this manager's export queue (0 without one)."""
        return self.pipeline.queued(signal)

    def force_flush(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> bool:
        """Export everything buffered; returns within ``timeout`` seconds even if the collector hangs."""
        return self.pipeline.force_flush(timeout)

    def shutdown(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> bool:
        """Flush and stop the pipeline with a hard deadline; safe to call twice (also runs at exit,
        within one deadline shared by every manager still running)."""
        _RUNNING.pop(self, None)
        return self.pipeline.shutdown(timeout)


_RUNNING: dict[KaosOtelManager, None] = {}
"""Managers not shut down yet, in creation order: :func:`_shut_down_at_exit` stops them."""


def _shut_down_at_exit() -> None:
    """Shut down the managers still running, the newest first, within one deadline for them all:
    a process with several (a test suite's, or an app's next to the distro's) leaves in
    :data:`DEFAULT_SHUTDOWN_TIMEOUT_S`, not in that many times as many, when the collector is down;
    a manager the deadline leaves no time stops at once and counts what it could not send. One
    after the other, not side by side: managers sharing providers flush them before the last one
    stops them. In a child of a plain ``os.fork()`` leaving through ``atexit``, managers inherited
    from the parent only flush their spans and log records (see :func:`_stop_running_managers`)."""
    _stop_running_managers(DEFAULT_SHUTDOWN_TIMEOUT_S)


atexit.register(_shut_down_at_exit)


CHILD_EXIT_FLUSH_S = 2.0
"""How long a forked ``multiprocessing`` child's exit waits for its spans and log records to leave."""


_child_exit_registered_in: int | None = None
"""The process whose multiprocessing exit finalizers run :func:`_stop_managers_at_child_exit`."""


def _stop_at_child_exit(_manager: KaosOtelManager) -> None:
    """In a ``multiprocessing`` child (a ``Process``, a ``Pool`` or ``ProcessPoolExecutor``
    worker): a forked one leaves with ``os._exit``, past ``atexit``, so the managers running in it
    are stopped by multiprocessing's own exit finalizers instead; registered once per child."""
    global _child_exit_registered_in
    if _child_exit_registered_in != os.getpid():
        from multiprocessing.util import Finalize

        _child_exit_registered_in = os.getpid()
        Finalize(None, _stop_managers_at_child_exit, exitpriority=0)


def _stop_managers_at_child_exit() -> None:
    """As a ``multiprocessing`` child ends, stop the managers running in it within one
    :data:`CHILD_EXIT_FLUSH_S` deadline for them all (a child with nothing queued or being sent
    leaves at once)."""
    _stop_running_managers(CHILD_EXIT_FLUSH_S)


_IMPORTED_IN = os.getpid()
"""The process that imported kaos-otel: any other running this code is a fork of it, holding its state."""


def _stop_running_managers(timeout_s: float) -> None:
    """Stop the managers running in this process, the newest first, within ``timeout_s`` for them
    all. In a forked child, a manager inherited from the parent, or made in the child on providers
    it does not own (the parent's global ones), only flushes its spans and log records: the child
    holds the parent's metric totals too, which are the parent's to export (a backend would count
    them twice). The others are shut down, metrics included."""
    forked = os.getpid() != _IMPORTED_IN
    deadline = time.monotonic() + timeout_s
    for manager in reversed(list(_RUNNING)):
        remaining = max(0.0, deadline - time.monotonic())
        if not forked or (manager._made_in == os.getpid() and manager.pipeline.owns_meter_provider):
            manager.shutdown(remaining)
        else:
            _RUNNING.pop(manager, None)
            manager.pipeline.flush_queues(remaining)


_default_lock = ForkSafeLock()
"""Free in a forked child, though another thread of the parent was creating the default manager."""
_default: KaosOtelManager | None = None
_default_settings: dict[str, Any] = {}
_ARGUMENT_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(KaosOtelManager.__init__).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}
"""A manager's arguments as left out: a later ``configure()`` giving one of them asks for what applies."""
_MANAGER_ARGUMENTS = frozenset({"redactor", "global_providers", "bridge_logging", "export_other_metrics"})
"""The arguments :class:`TelemetrySettings` does not hold (the others it reads)."""
_defaults_made = 0


def _not_applied(applied: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """The names of ``given`` whose effect differs from that of ``applied`` (the default manager's
    arguments, defaults included): ``disabled=False`` where telemetry is on is what applies, as is
    ``capture_content=True`` where ``"SPAN_AND_EVENT"`` was given. An argument no manager takes, or
    one it refuses, differs."""
    settings = {key: value for key, value in applied.items() if key not in _MANAGER_ARGUMENTS}

    def same_effect(key: str) -> bool:
        if key not in settings:
            return False
        try:  # both as the environment reads now
            ours = TelemetrySettings.from_env(**{**settings, key: given[key]})
            return ours == TelemetrySettings.from_env(**settings)
        except (TypeError, ValueError):  # refused: certainly not what applies
            return False

    return sorted(key for key in given if applied.get(key, object()) != given[key] and not same_effect(key))


def configure(**settings: Any) -> KaosOtelManager:
    """The process-wide default manager, created by the first call.

    A later call with no arguments, or with arguments that change nothing it applies (the same
    ones, an argument's default value, ``disabled=False`` where telemetry is on), returns it. A
    later call with other arguments cannot apply them (the global providers exist once per
    process): it logs a warning naming them and returns the existing manager. Once that manager
    was shut down, a call creates a new one (which says that the shut-down global providers
    cannot be replaced).
    """
    global _default, _default_settings, _defaults_made
    with _default_lock:
        if _default is None or _default.pipeline.shut_down:
            _default = KaosOtelManager(**settings)
            _default_settings = {**_ARGUMENT_DEFAULTS, **settings}  # what it applies, defaults included
            _defaults_made += 1
        else:
            ignored = _not_applied(_default_settings, settings)
            if ignored:  # the same arguments, or some of them, are what is already applied
                log_once(  # once per set of names: a call per request must not log per request
                    f"configure-not-applied {_defaults_made} {ignored}",  # per default manager
                    "kaos-otel: kaos_otel.configure() was already called; these arguments are not "
                    "applied: %s",
                    ", ".join(ignored),
                    level=logging.WARNING,
                )
        return _default
