"""The providers and the export pipeline of one manager: built, flushed and shut down in one place."""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import _logs, metrics, trace
from opentelemetry._logs import NoOpLoggerProvider, get_logger_provider, set_logger_provider
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogExporter
from opentelemetry.sdk.environment_variables import (
    OTEL_METRIC_EXPORT_INTERVAL,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from kaos_otel._config import OtlpProtocol, TelemetrySettings
from kaos_otel._content import ContentPolicy, sdk_value_limit
from kaos_otel._internal_log import ForkSafeLock, internal_error, log_once
from kaos_otel._logs import KaosLoggingHandler, bridge_level_from_env, keep_on_root, release_bridges_to
from kaos_otel._metrics import CatalogMeterProvider, metric_views
from kaos_otel.exporters import (
    BatchSettings,
    LogBatchProcessor,
    SanitizingLogExporter,
    SanitizingSpanExporter,
    SpanBatchProcessor,
    TelemetryHealth,
    otlp_log_exporter,
    otlp_metric_exporter,
    otlp_span_exporter,
)
from kaos_otel.exporters.batch import LONGEST_TIMEOUT_S, longest_wait_ms
from kaos_otel.exporters.health import Signal
from kaos_otel.exporters.pipeline import host_layer_added, redacted_resource, sanitizing_metric_exporter

_log = logging.getLogger("kaos_otel")

DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0


def build_resource(settings: TelemetrySettings, policy: ContentPolicy) -> Resource:
    """``Resource.create`` (which reads ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``),
    with the explicit overrides on top, cleaned once: it goes out with every batch of every signal."""
    attributes = dict(settings.resource_attributes or {})
    if settings.service_name is not None:
        attributes[SERVICE_NAME] = settings.service_name
    return redacted_resource(Resource.create(attributes), policy)


def span_limits(settings: TelemetrySettings) -> SpanLimits:
    """The SDK's limits as it reads them; when no variable sets a value limit, one just past
    kaos-otel's cap (the export layer then cuts at the cap, masking a secret the cut goes through)."""
    if settings.attribute_limit_from_environment:
        return SpanLimits()
    return SpanLimits(max_attribute_length=sdk_value_limit(settings.attribute_value_length_limit))


def run_with_deadline(actions: Sequence[Callable[[], object]], timeout_s: float, what: str) -> bool:
    """Run each action on its own daemon thread, all at once, and wait at most ``timeout_s`` in total.

    Returns ``False`` if any did not finish in time or returned ``False`` (a flush that gave up).
    Running them side by side means a hung trace export cannot use up the time the logs and
    metrics needed to flush.
    """
    deadline = time.monotonic() + max(0.0, timeout_s)
    events: list[threading.Event] = []
    failed: list[int] = []
    for index, action in enumerate(actions):
        finished = threading.Event()

        def target(
            action: Callable[[], object] = action, finished: threading.Event = finished, index: int = index
        ) -> None:
            try:
                if action() is False:
                    failed.append(index)
            except Exception as exc:
                internal_error(what, exc)
                failed.append(index)
            finally:
                finished.set()

        threading.Thread(target=target, name=f"kaos-otel-{what}-{index}", daemon=True).start()
        events.append(finished)
    in_time = all(event.wait(max(0.0, deadline - time.monotonic())) for event in events)
    return in_time and not failed


_USERS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""How many pipelines not yet shut down use each provider (a meter provider by its SDK provider).
Shared global providers are shut down, and their logging bridge removed, by the last of them,
whichever built them: the first manager's shutdown must not silence a second one."""
_LossAccount = tuple[TelemetryHealth, list[Callable[[], int]]]
"""Where a pipeline counts its losses, and what gives up on (and counts) the items its batch
processors and metric exporters still hold when a shutdown misses its deadline."""
_BUILT: weakref.WeakKeyDictionary[Any, _LossAccount] = weakref.WeakKeyDictionary()
"""Providers a pipeline built (the host's are never shut down by kaos-otel), with the loss
account of that pipeline: the manager that stops them may be another one."""
_USERS_LOCK = ForkSafeLock()
"""Guards the counts, and marks the providers a shutdown stops in the same step as its count
reaches 0. Held for dictionary updates only: never across imports, exporters or logging."""


_SHUT_DOWN_PROVIDERS: weakref.WeakSet[Any] = weakref.WeakSet()
"""Providers a pipeline shut down. The global ones stay installed (OpenTelemetry's API cannot
replace them), so a later manager must not adopt them: it would export nothing."""
_EXPORT_OVERRIDES = (
    "endpoint",
    "headers",
    "export_timeout_s",
    "metric_export_interval_ms",
    "span_schedule_delay_ms",
    "span_max_queue_size",
)
"""The export settings a manager may be given in code (:class:`TelemetrySettings` fields)."""
_EXPORT_SETTINGS: weakref.WeakKeyDictionary[Any, tuple[object, ...]] = weakref.WeakKeyDictionary()
"""The export settings each provider a pipeline built exports with (see ``_export_settings``): a
manager that finds them already installed says so only when its own would differ."""


def _shut_down_earlier(provider: object, kind: str) -> bool:
    """Whether the global ``provider`` was shut down by an earlier manager (said once, as a warning)."""
    if provider not in _SHUT_DOWN_PROVIDERS:
        return False
    log_once(
        f"global {kind} provider shut down",
        "kaos-otel: the global %s provider was shut down by an earlier manager and cannot be "
        "replaced; this manager exports through a %s provider of its own, which other "
        "instrumentations using the global one do not reach",
        kind, kind,
        level=logging.WARNING,
    )  # fmt: skip
    return True


def _install(
    set_provider: Callable[[Any], None], get_provider: Callable[[], object], provider: object
) -> bool:
    """Install ``provider`` globally; ``False`` if another was installed first (the API keeps it)."""
    set_provider(provider)
    return get_provider() is provider


def _set_up_by(providers: Sequence[Any]) -> tuple[str, bool]:
    """Who set up the global ``providers`` a pipeline found, for a notice, and whether it was
    kaos-otel (an earlier manager, or the distro's)."""
    kaos = [p for p in map(_sdk_provider, providers) if p in _BUILT]
    named = [p for p in kaos if isinstance(p, TracerProvider | LoggerProvider)]  # they hold a resource
    if named:
        service = named[0].resource.attributes.get(SERVICE_NAME)
        return f"by an earlier kaos-otel manager, service.name={service!r}", True
    if kaos:
        return "by an earlier kaos-otel manager", True
    return "by opentelemetry-instrument or the application", False


_FLUSHING: weakref.WeakKeyDictionary[Any, threading.Event] = weakref.WeakKeyDictionary()
"""The flush of each provider (an SDK provider) still running, set when it ends. A flush the
collector holds up can outlast its deadline (the SDK's metric reader exports under a lock, past
the timeout it is given): a later flush waits for it rather than queue another thread behind it."""
_FLUSHING_LOCK = ForkSafeLock()
os.register_at_fork(after_in_child=_FLUSHING.clear)  # the parent's flush threads are not the child's


def _flush_one(provider: Any, deadline: float) -> bool:
    """Flush ``provider`` by ``deadline`` (``time.monotonic()``), one flush of it at a time: a flush
    already running is waited for, then this one runs (what was queued meanwhile leaves too)."""
    key = _sdk_provider(provider)
    while True:
        with _FLUSHING_LOCK:
            running = _FLUSHING.get(key)
            if running is None:
                finished = _FLUSHING[key] = threading.Event()
                break
        if not running.wait(max(0.0, deadline - time.monotonic())):
            return False
    try:
        return bool(provider.force_flush(int(max(0.0, deadline - time.monotonic()) * 1000)))
    finally:
        with _FLUSHING_LOCK:
            if _FLUSHING.get(key) is finished:
                del _FLUSHING[key]
        finished.set()


def _flush(providers: Sequence[Any], timeout: float) -> bool:
    """Flush ``providers`` within ``timeout`` seconds, even if the collector hangs; a flush the
    collector holds up leaves one thread behind per provider, however often this is called."""
    flushable = [p for p in providers if callable(getattr(p, "force_flush", None))]
    if not flushable:
        return True
    deadline = time.monotonic() + timeout
    return run_with_deadline(
        [functools.partial(_flush_one, provider, deadline) for provider in flushable], timeout, "force_flush"
    )


def _bounded(timeout: float) -> float:
    """``timeout`` as seconds every wait accepts: 0 for a negative or NaN one, at most
    :data:`LONGEST_TIMEOUT_S` (a longer wait raises ``OverflowError``)."""
    return max(0.0, min(timeout, LONGEST_TIMEOUT_S))


def _longest_interval_from_env() -> float | None:
    """The longest wait (said once) when ``OTEL_METRIC_EXPORT_INTERVAL`` is longer than any wait,
    else ``None`` (the reader reads the variable): the reader's thread would stop at its first
    wait with ``OverflowError``, and no metric would be exported, not even at shutdown."""
    raw = os.environ.get(OTEL_METRIC_EXPORT_INTERVAL, "")
    try:
        interval_ms = float(raw)
    except ValueError:
        return None  # the reader says so, and uses its default
    if not LONGEST_TIMEOUT_S * 1000 < interval_ms < math.inf:  # inf: the reader exports on flushes only
        return None
    return longest_wait_ms(OTEL_METRIC_EXPORT_INTERVAL, interval_ms)


def _sdk_provider(provider: Any) -> Any:
    """The SDK provider behind a :class:`CatalogMeterProvider`; any other provider as it is."""
    return provider.provider if isinstance(provider, CatalogMeterProvider) else provider


def _bridges_logging(handler: logging.Handler, provider: object) -> bool:
    """Whether ``handler`` already sends records to ``provider`` (ours on it, or OpenTelemetry's
    own handler when ``provider`` is the global one it sends to)."""
    if isinstance(handler, KaosLoggingHandler):
        return handler.logger_provider is provider
    return type(handler).__module__.startswith("opentelemetry.") and provider is get_logger_provider()


class ExportPipeline:
    """Tracer, meter and logger providers, their batch processors and exporters, and the loss counts.

    Providers the host application installed globally are used as they are (flushed, never shut
    down); otherwise this pipeline builds its own and, with ``global_providers``, installs them.
    A disabled pipeline (``OTEL_SDK_DISABLED``) has no providers at all.
    """

    def __init__(
        self,
        settings: TelemetrySettings,
        policy: ContentPolicy,
        *,
        global_providers: bool = True,
        bridge_logging: bool = True,
        export_other_metrics: bool = False,
    ) -> None:
        self.settings = settings
        self.health = TelemetryHealth()
        self._in_use: list[Any] = []
        self._owned: list[Any] = []
        self._batches: list[SpanBatchProcessor | LogBatchProcessor] = []
        self._abandons: list[Callable[[], int]] = []
        self._shutdown_done = False
        self._shutdown_finished = threading.Event()
        self._shutdown_result = True
        self._lock = threading.Lock()
        self.tracer_provider: trace.TracerProvider = trace.NoOpTracerProvider()
        self.meter_provider: metrics.MeterProvider = metrics.NoOpMeterProvider()
        self.logger_provider: _logs.LoggerProvider = NoOpLoggerProvider()
        if settings.disabled:
            return
        resource = build_resource(settings, policy)
        installs: list[Callable[[], bool]] = []
        try:
            self.tracer_provider = self._tracer_provider(resource, policy, global_providers, installs)
            self.meter_provider = self._meter_provider(
                resource, policy, global_providers, export_other_metrics, installs
            )
            self.logger_provider = self._logger_provider(resource, policy, global_providers, installs)
        except BaseException:  # nothing is installed yet: a corrected retry starts afresh
            run_with_deadline(
                [provider.shutdown for provider in self._owned], DEFAULT_SHUTDOWN_TIMEOUT_S, "shutdown"
            )
            raise
        if not all([install() for install in installs]):  # every one, then: did another win?
            log_once(
                "installed-meanwhile",
                "kaos-otel: global providers were installed by another manager or the application "
                "while this manager was being created; it exports through providers of its own, which "
                "other instrumentations do not reach. Create managers one at a time (configure() does)",
                level=logging.WARNING,
            )
        self._in_use = [self.tracer_provider, self.meter_provider, self.logger_provider]
        with _USERS_LOCK:
            _BUILT.update((provider, (self.health, self._abandons)) for provider in self._owned)
            built_by = next(filter(None, map(_BUILT.get, map(_sdk_provider, self._in_use))), None)
            if not self._owned and built_by is not None:  # adopted: its losses count there
                self.health = built_by[0]
            stopped_meanwhile = False
            for provider in map(_sdk_provider, self._in_use):
                stopped_meanwhile |= provider in _SHUT_DOWN_PROVIDERS
                _USERS[provider] = _USERS.get(provider, 0) + 1
        if stopped_meanwhile:  # another manager's shutdown stopped them while this one adopted them
            log_once(
                "adopted-while-stopping",
                "kaos-otel: another manager shut the global providers down while this manager was being "
                "created; it exports nothing. Create it after that shutdown has returned",
                level=logging.WARNING,
            )
        for signal, provider in self._providers_by_signal().items():
            if self._built(provider):
                _EXPORT_SETTINGS[provider] = self._export_settings(signal)
        self._warn_resource_not_applied(resource)
        self._warn_export_not_applied()
        self._warn_not_sanitized()
        self._warn_unexported()
        if bridge_logging and self._logs_leave_the_process():
            self._bridge_logging(policy)

    def _warn_resource_not_applied(self, resource: Resource) -> None:
        """Say once when resource attributes passed in code cannot reach the host's providers,
        which keep the resource they were made with (``opentelemetry-instrument``, an app's own)."""
        requested = dict(self.settings.resource_attributes or {})
        if self.settings.service_name is not None:
            requested[SERVICE_NAME] = self.settings.service_name
        adopted = [
            provider
            for provider in (self.tracer_provider, self.logger_provider)
            if provider not in self._owned and isinstance(provider, TracerProvider | LoggerProvider)
        ]
        differing = sorted(
            {
                key
                for provider in adopted
                for key in requested
                if provider.resource.attributes.get(key) != resource.attributes.get(key)
            }
        )
        if not differing:
            return
        by, by_kaos = _set_up_by(adopted)
        log_once(
            "resource-not-applied",
            "kaos-otel: the global providers were set up before this manager (%s) and keep their "
            "resource: %s given here not applied; %s",
            by, ", ".join(differing),
            "a process has one service name: set OTEL_SERVICE_NAME, share that manager "
            "(kaos_otel.configure()) and tell agents apart by their invoke_agent() names, or pass "
            "global_providers=False to export as another service"
            if by_kaos
            else "set OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES instead",
            level=logging.WARNING,
        )  # fmt: skip

    def _providers_by_signal(self) -> dict[str, Any]:
        """The provider each signal goes to (built here or found installed)."""
        return {"traces": self.tracer_provider, "metrics": self.meter_provider, "logs": self.logger_provider}

    @property
    def owns_meter_provider(self) -> bool:
        """Whether the meter provider in use was built by this pipeline (not found installed, as a
        forked child finds its parent's, totals included)."""
        return self._built(self.meter_provider)

    def _built(self, provider: Any) -> bool:
        """Whether this pipeline built ``provider`` (rather than finding the host's)."""
        return _sdk_provider(provider) in self._owned

    def _export_settings(self, signal: str) -> tuple[object, ...]:
        """Where and how ``signal`` is exported by providers built with this pipeline's settings."""
        settings = self.settings
        given = (getattr(settings, name) for name in _EXPORT_OVERRIDES)
        return (settings.endpoints.get(signal), settings.protocols.get(signal), *given)

    def _warn_export_not_applied(self) -> None:
        """Say once when export settings passed in code cannot reach the providers found installed
        (``opentelemetry-instrument``'s, the app's, another manager's with other settings), which
        export as they were set up: an endpoint given here would otherwise go unused in silence."""
        given = [name for name in _EXPORT_OVERRIDES if getattr(self.settings, name) is not None]
        adopted = {
            signal: provider
            for signal, provider in self._providers_by_signal().items()
            if not self._built(provider) and _EXPORT_SETTINGS.get(provider) != self._export_settings(signal)
        }
        if given and adopted:
            by, by_kaos = _set_up_by(list(adopted.values()))
            log_once(
                "export-not-applied",
                "kaos-otel: the global providers of %s were set up before this manager (%s) and "
                "export as they were set up: %s given here not applied to them; %s",
                ", ".join(adopted), by, ", ".join(given),
                "give them to that manager (or kaos_otel.configure()), or pass global_providers=False "
                "to export through providers of this manager's own"
                if by_kaos
                else "set the OTEL_EXPORTER_OTLP_*, OTEL_BSP_* and OTEL_METRIC_EXPORT_INTERVAL variables "
                "instead",
                level=logging.WARNING,
            )  # fmt: skip

    def _warn_not_sanitized(self) -> None:
        """Say once when spans or logs go to providers kaos-otel did not build and no exporter of
        the process was wrapped with :func:`~kaos_otel.sanitized_exporter`: their exporters then
        neither mask secrets nor cap sizes, and "private by default" would be off in silence."""
        signals: dict[Signal, Any] = {"traces": self.tracer_provider, "logs": self.logger_provider}
        adopted = {
            signal: provider
            for signal, provider in signals.items()
            if not self._built(provider)
            and isinstance(provider, TracerProvider | LoggerProvider)
            and not host_layer_added(signal)
        }
        if not adopted:
            return
        by, by_kaos = _set_up_by(list(adopted.values()))
        if by_kaos:
            return
        log_once(
            "not-sanitized",
            "kaos-otel: the global providers of %s were set up before kaos-otel (%s); their "
            "exporters do not mask secrets nor cap sizes. Wrap each exporter with "
            "kaos_otel.sanitized_exporter(...), or run under opentelemetry-instrument with "
            "OTEL_PYTHON_DISTRO=kaos",
            ", ".join(adopted),
            by,
            level=logging.WARNING,
        )

    def _logs_leave_the_process(self) -> bool:
        """Whether log records given to the logger provider go anywhere: the host's provider, or
        ours with an exporter. A bridge to nowhere would also silence Python's own last-resort
        output of warnings and errors to stderr (a handler on the root logger turns it off)."""
        if self.logger_provider not in self._owned:
            return True
        return "logs" in self.settings.endpoints or self.settings.to_console("logs")

    def _warn_unexported(self) -> None:
        """Say once which signals the providers this pipeline built export nowhere: no endpoint,
        no console, and not turned off on purpose (the host's providers are the host's)."""
        settings = self.settings
        built = (("traces", TracerProvider), ("metrics", MeterProvider), ("logs", LoggerProvider))
        signals = [
            signal
            for signal, kind in built
            if any(isinstance(provider, kind) for provider in self._owned)
            and signal not in settings.endpoints
            and not settings.to_console(signal)
            and not settings.chosen_off(signal)  # OTEL_<SIGNAL>_EXPORTER=none is a choice
        ]
        if not signals:
            return
        listed = signals[0] if len(signals) == 1 else f"{', '.join(signals[:-1])} and {signals[-1]}"
        http = {signal: settings.protocols.get(signal) is OtlpProtocol.HTTP_PROTOBUF for signal in signals}
        if len(set(http.values())) == 1:  # `kaos-otel receive`: gRPC on 4317, HTTP on 4318
            endpoints = f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{4318 if http[signals[0]] else 4317}"
        else:  # one endpoint cannot serve both protocols
            endpoints = " ".join(
                f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT="
                + (f"http://127.0.0.1:4318/v1/{signal}" if http[signal] else "http://127.0.0.1:4317")
                for signal in signals
            )
        log_once(  # WARNING: shown even where logging was never configured
            "no-endpoint",
            f"kaos-otel: no OTLP endpoint set (OTEL_EXPORTER_OTLP_ENDPOINT); {listed} are not exported. "
            f"To see them locally, run `kaos-otel receive` and set {endpoints} "
            "(OTEL_<SIGNAL>_EXPORTER=none turns a signal off without this notice)",
            level=logging.WARNING,
        )

    # --- providers ------------------------------------------------------------------------------
    def _tracer_provider(
        self,
        resource: Resource,
        policy: ContentPolicy,
        global_providers: bool,
        installs: list[Callable[[], bool]],
    ) -> trace.TracerProvider:
        current = trace.get_tracer_provider()
        if global_providers and not isinstance(current, trace.ProxyTracerProvider):
            if not _shut_down_earlier(current, "tracer"):
                return current
            global_providers = False
        settings = self.settings
        # The sampler (OTEL_TRACES_SAMPLER[_ARG]) is the SDK's own reading of the environment.
        provider = TracerProvider(
            resource=resource, span_limits=span_limits(settings), shutdown_on_exit=False
        )
        if "traces" in settings.endpoints:  # each signal may have its own endpoint, or none
            exporter = SanitizingSpanExporter(otlp_span_exporter(settings), policy, self.health)
            processor = SpanBatchProcessor(
                exporter,
                self.health,
                BatchSettings.for_spans(
                    schedule_delay_ms=settings.span_schedule_delay_ms,
                    max_queue_size=settings.span_max_queue_size,
                ),
            )
            self._batches.append(processor)
            self._abandons.append(processor.abandon)
            provider.add_span_processor(processor)
        if settings.to_console("traces"):
            provider.add_span_processor(
                BatchSpanProcessor(SanitizingSpanExporter(ConsoleSpanExporter(), policy, self.health))
            )
        self._owned.append(provider)
        if global_providers:
            installs.append(
                functools.partial(_install, trace.set_tracer_provider, trace.get_tracer_provider, provider)
            )
        return provider

    def _meter_provider(
        self,
        resource: Resource,
        policy: ContentPolicy,
        global_providers: bool,
        export_other_metrics: bool,
        installs: list[Callable[[], bool]],
    ) -> metrics.MeterProvider:
        current = metrics.get_meter_provider()
        if global_providers and isinstance(
            current, MeterProvider | CatalogMeterProvider | metrics.NoOpMeterProvider
        ):
            if not _shut_down_earlier(_sdk_provider(current), "meter"):
                if (
                    export_other_metrics
                    and isinstance(current, CatalogMeterProvider)
                    and not current.other_meters
                ):
                    log_once(
                        "other-metrics-not-applied",
                        "kaos-otel: export_other_metrics=True not applied: the global meter provider "
                        "was set up before this manager, by a manager without it",
                        level=logging.WARNING,
                    )
                return current
            global_providers = False
        settings = self.settings
        readers: list[MetricReader] = []
        try:
            exporters = []
            if "metrics" in settings.endpoints:
                exporters.append(otlp_metric_exporter(settings, self.health, policy))
            if settings.to_console("metrics"):
                exporters.append(sanitizing_metric_exporter(ConsoleMetricExporter, self.health, policy))
            interval_ms = settings.metric_export_interval_ms or _longest_interval_from_env()
            for exporter in exporters:
                # OTEL_METRIC_EXPORT_INTERVAL / _TIMEOUT are read by the reader unless overridden.
                readers.append(PeriodicExportingMetricReader(exporter, export_interval_millis=interval_ms))
                self._abandons.append(exporter.abandon)
            sdk_provider = MeterProvider(
                metric_readers=readers,
                resource=resource,
                views=metric_views(drop_unlisted=False),
                shutdown_on_exit=False,
            )
        except BaseException:  # a reader's thread runs from its creation: stopped with the rest
            run_with_deadline([reader.shutdown for reader in readers], DEFAULT_SHUTDOWN_TIMEOUT_S, "shutdown")
            raise
        self._owned.append(sdk_provider)
        provider = CatalogMeterProvider(sdk_provider, other_meters=export_other_metrics)
        if global_providers:
            installs.append(
                functools.partial(_install, metrics.set_meter_provider, metrics.get_meter_provider, provider)
            )
        return provider

    def _logger_provider(
        self,
        resource: Resource,
        policy: ContentPolicy,
        global_providers: bool,
        installs: list[Callable[[], bool]],
    ) -> _logs.LoggerProvider:
        current = get_logger_provider()
        if global_providers and isinstance(current, LoggerProvider | NoOpLoggerProvider):
            if not _shut_down_earlier(current, "logger"):
                return current
            global_providers = False
        settings = self.settings
        provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        if "logs" in settings.endpoints:
            processor = LogBatchProcessor(
                SanitizingLogExporter(otlp_log_exporter(settings), policy, self.health),
                policy,
                self.health,
                BatchSettings.for_logs(),
            )
            self._batches.append(processor)
            self._abandons.append(processor.abandon)
            provider.add_log_record_processor(processor)
        if settings.to_console("logs"):
            provider.add_log_record_processor(
                BatchLogRecordProcessor(SanitizingLogExporter(ConsoleLogExporter(), policy, self.health))
            )
        self._owned.append(provider)
        if global_providers:
            installs.append(functools.partial(_install, set_logger_provider, get_logger_provider, provider))
        return provider

    def _bridge_logging(self, policy: ContentPolicy) -> None:
        """Send Python logging records to the OTLP log pipeline, with the active span's ids."""
        root = logging.getLogger()
        if any(_bridges_logging(handler, self.logger_provider) for handler in root.handlers):
            # Another manager on the same (global) providers, or the host's own OTel logging
            # handler, already bridges them: a second handler would export every record twice.
            return
        keep_on_root(KaosLoggingHandler(self.logger_provider, policy, export_level=bridge_level_from_env()))

    @property
    def shut_down(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._shutdown_done

    def queued(self, signal: Signal = "traces") -> int:
        """Items of ``signal`` waiting in this manager's export queue (0 without one)."""
        return sum(batch.queued for batch in self._batches if batch.signal == signal)

    def pending(self, signal: Signal = "traces") -> int:
        """Items of ``signal`` not exported yet: queued, or inside an export call."""
        return sum(batch.pending for batch in self._batches if batch.signal == signal)

    # --- lifecycle ------------------------------------------------------------------------------
    def flush_queues(self, timeout: float) -> None:
        """Export what this pipeline's span and log queues hold, within ``timeout`` seconds in all.

        For a forked child at its exit: metrics are left alone (the child holds its parent's totals
        too, which the parent exports), and a child with nothing queued or being sent returns at
        once. What did not leave in time is counted as lost and said in a warning: the loss metric
        cannot leave a process that is ending.
        """
        deadline = time.monotonic() + timeout
        lost: Counter[str] = Counter()
        for batch in self._batches:
            remaining = deadline - time.monotonic()
            if batch.pending and not (remaining > 0 and batch.force_flush(int(remaining * 1000))):
                lost[batch.signal] += batch.abandon()
        if lost:
            _log.warning(
                "kaos-otel: telemetry never exported as this process ends (collector slow or down): %s",
                ", ".join(f"{count} {signal}" for signal, count in sorted(lost.items())),
            )

    def force_flush(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> bool:
        """Export everything buffered, on the providers in use (the host's too); returns within
        ``timeout`` seconds even if the collector hangs.

        After (or during) :meth:`shutdown`, it waits for the shutdown, whose result it returns,
        and flushes only the providers still running (another manager's, the host's): a stopped
        exporter would refuse (and the loss account count again) the metric totals it already sent.
        """
        timeout = _bounded(timeout)
        if not self._shutdown_done:
            return _flush(self._in_use, timeout)
        deadline = time.monotonic() + timeout
        if not self._shutdown_finished.wait(timeout):
            return False
        running = [p for p in self._in_use if _sdk_provider(p) not in _SHUT_DOWN_PROVIDERS]
        return _flush(running, max(0.0, deadline - time.monotonic())) and self._shutdown_result

    def shutdown(self, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> bool:
        """Flush and stop the providers kaos-otel built, with a hard deadline; safe to call twice.

        Providers another manager still uses are only flushed, and the result says whether that
        finished: the last manager using them stops them (and removes their logging bridge).
        Providers the host installed are left running: they are the host's to flush and stop.
        A call during or after another one waits for it (within its own ``timeout``) and returns
        its result: what that shutdown could not export is not exported by the second call either.
        """
        timeout = _bounded(timeout)
        with self._lock:
            stopping_already = self._shutdown_done
            self._shutdown_done = True
        if stopping_already:
            return self._shutdown_finished.wait(timeout) and self._shutdown_result
        try:
            self._shutdown_result = self._stop(timeout)
        finally:
            self._shutdown_finished.set()
        return self._shutdown_result

    def _stop(self, timeout: float) -> bool:
        in_use = [_sdk_provider(provider) for provider in self._in_use]
        with _USERS_LOCK:
            for provider in in_use:
                _USERS[provider] -= 1
            unused = [provider for provider in in_use if _USERS[provider] == 0]
            stopping = [provider for provider in unused if provider in _BUILT]
            _SHUT_DOWN_PROVIDERS.update(stopping)
        release_bridges_to(unused)
        deadline = time.monotonic() + timeout
        # Providers kaos-otel built that another manager keeps running: export ours now. The
        # host's are the host's to flush and stop.
        flushed = _flush([p for p in in_use if p in _BUILT and p not in unused], timeout)
        if not stopping:
            return flushed
        timeout = max(0.0, deadline - time.monotonic())
        stops = [
            functools.partial(provider.shutdown, timeout_millis=timeout * 1000)
            if isinstance(provider, MeterProvider)
            else provider.shutdown
            for provider in stopping
        ]
        # the loss accounts of the pipelines that built them: this manager may only have adopted them
        accounts = {id(account[0]): account for account in map(_BUILT.get, stopping) if account is not None}
        finished = run_with_deadline(stops, timeout, "shutdown")
        if not finished:
            # What the pipelines still hold will not be exported in time: count it as lost now,
            # while someone can still read the count (the process may be about to exit).
            for _, abandons in accounts.values():
                for abandon in abandons:
                    abandon()
        self._report_loss([health for health, _ in accounts.values()])
        return finished and flushed

    def _report_loss(self, accounts: Sequence[TelemetryHealth]) -> None:
        """Say, once the providers are stopped, what their exporters never exported: the loss
        metric itself cannot leave a process whose collector was down."""
        lost: Counter[tuple[str, str]] = Counter()
        for health in accounts:
            lost.update(health.snapshot())
        if not any(lost.values()):
            return
        _log.warning(  # once: shutdown runs once per pipeline
            "kaos-otel: telemetry never exported (kaos.telemetry.dropped): %s",
            ", ".join(
                f"{count} {signal} ({reason})" for (signal, reason), count in sorted(lost.items()) if count
            ),
        )
