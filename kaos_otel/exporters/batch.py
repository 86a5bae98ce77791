"""Batch processors for spans and log records, on the SDK's public processor interfaces only.

The request's thread only appends to a bounded queue; one export thread per processor takes
batches off it. Everything lost is counted in :class:`~kaos_otel.exporters.health.TelemetryHealth`:
items pushed out of a full queue (the oldest go first, as in the SDK), items arriving after
shutdown, and items still held when a shutdown missed its deadline. Failed exports are counted
by the exporter wrappers in :mod:`kaos_otel.exporters.pipeline`.

The settings come from the SDK's own variables (``OTEL_BSP_*``, ``OTEL_BLRP_*``) with the SDK's
defaults. A value the SDK would refuse with an exception (not a number, zero or negative, a batch
larger than the queue) or that would stop its export thread (a schedule delay longer than any
wait) is replaced by the safe reading, with one warning that says which.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Generic, TypeVar

from opentelemetry.context import Context
from opentelemetry.sdk._logs import LogRecordProcessor, ReadWriteLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.environment_variables import (
    OTEL_BLRP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BLRP_MAX_QUEUE_SIZE,
    OTEL_BLRP_SCHEDULE_DELAY,
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_SCHEDULE_DELAY,
)
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from kaos_otel._content import ContentPolicy
from kaos_otel._internal_log import internal_error, log_once
from kaos_otel.exporters.health import Signal, TelemetryHealth
from kaos_otel.exporters.pipeline import exporting, in_forked_children, on_export_thread

T = TypeVar("T")
E = TypeVar("E")

LOG_EXPORT_BATCH_SIZE = 128
"""Log records per export batch unless ``OTEL_BLRP_MAX_EXPORT_BATCH_SIZE`` says otherwise (a
value that is no positive integer included): at the capped sizes (8 KiB body plus capped exception
attributes) a batch is one request well under the 4 MiB a gRPC receiver or collector accepts;
records with large ``extra=`` attributes are split into several requests by size."""
LONGEST_TIMEOUT_S = 30 * 86_400.0
"""The longest wait kaos-otel makes (``math.inf``, no deadline, means this): every platform's locks
accept it, where a longer one raises ``OverflowError``."""


def longest_wait_ms(variable: str, wait_ms: float) -> float:
    """``wait_ms`` (read from ``variable``), or the longest wait, said once, when it is longer than
    a wait can be: a thread waiting that long would stop at once with ``OverflowError``."""
    if wait_ms <= LONGEST_TIMEOUT_S * 1000:
        return wait_ms
    log_once(
        f"wait-too-long {variable}",
        "kaos-otel: %s (%d ms) is longer than a wait can be; %d ms (30 days) is used",
        variable, wait_ms, LONGEST_TIMEOUT_S * 1000,
        level=logging.WARNING,
    )  # fmt: skip
    return LONGEST_TIMEOUT_S * 1000


def _instrumentation_suppressor() -> Callable[[], AbstractContextManager[object]]:
    """What keeps instrumentations (requests, urllib3, grpc...) from tracing the exporter's own calls.

    Instrumentations depend on ``opentelemetry-instrumentation``, whose public
    ``suppress_instrumentation`` they all honour; without that package there is nothing to suppress.
    Imported on the thread that builds the queue, never on an export thread: a process forked
    while an export thread was importing would find the module's import lock held for ever, and
    the child's export thread would wait on it.
    """
    try:
        from opentelemetry.instrumentation.utils import suppress_instrumentation
    except ImportError:
        return nullcontext
    return suppress_instrumentation


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """Queue size, batch size and schedule delay of one batch processor."""

    max_queue_size: int = 2048
    max_export_batch_size: int = 512
    schedule_delay_ms: int = 5000

    @classmethod
    def for_spans(cls, environ: Mapping[str, str] | None = None, **overrides: int | None) -> BatchSettings:
        """``OTEL_BSP_*`` (SDK defaults: queue 2048, batch 512, delay 5000 ms), then overrides."""
        return cls._read(
            os.environ if environ is None else environ,
            (OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE, OTEL_BSP_SCHEDULE_DELAY),
            (2048, 512, 5000),
            overrides,
        )

    @classmethod
    def for_logs(cls, environ: Mapping[str, str] | None = None, **overrides: int | None) -> BatchSettings:
        """``OTEL_BLRP_*`` (SDK defaults: queue 2048, delay 1000 ms; batch :data:`LOG_EXPORT_BATCH_SIZE`,
        not the SDK's 512), then overrides."""
        return cls._read(
            os.environ if environ is None else environ,
            (OTEL_BLRP_MAX_QUEUE_SIZE, OTEL_BLRP_MAX_EXPORT_BATCH_SIZE, OTEL_BLRP_SCHEDULE_DELAY),
            (2048, LOG_EXPORT_BATCH_SIZE, 1000),
            overrides,
        )

    @classmethod
    def _read(
        cls,
        environ: Mapping[str, str],
        names: tuple[str, str, str],
        defaults: tuple[int, int, int],
        overrides: Mapping[str, int | None],
    ) -> BatchSettings:
        queue, batch, delay = (
            _positive_int(environ, name, default) for name, default in zip(names, defaults, strict=True)
        )
        queue = overrides.get("max_queue_size") or queue
        batch = overrides.get("max_export_batch_size") or batch
        delay = overrides.get("schedule_delay_ms") or delay
        delay = int(longest_wait_ms(names[2], delay))
        if batch > queue:  # the SDK refuses this combination; a smaller batch is the safe reading
            if not any(overrides.get(key) for key in ("max_queue_size", "max_export_batch_size")):
                log_once(  # both sizes from the environment: say which variables disagree
                    f"batch-larger-than-queue {names[1]}",
                    "kaos-otel: %s (%d) is larger than %s (%d); batches of %d are exported",
                    names[1], batch, names[0], queue, queue,
                    level=logging.WARNING,
                )  # fmt: skip
            batch = queue
        return cls(max_queue_size=queue, max_export_batch_size=batch, schedule_delay_ms=delay)


def _positive_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value > 0:
        return value
    log_once(
        f"invalid {name}",
        "kaos-otel: %s=%r is not a positive integer; the default %d is used",
        name, raw, default,
        level=logging.WARNING,
    )  # fmt: skip
    return default


class BatchQueue(Generic[T]):
    """A bounded queue drained by one daemon export thread.

    Batches leave as in the SDK's batch processors: when the queue holds a full batch, only full
    batches are exported; what is left waits for the schedule delay, a flush or the shutdown,
    which export everything queued.
    """

    def __init__(
        self,
        signal: Signal,
        export: Callable[[Sequence[T]], object],
        health: TelemetryHealth,
        settings: BatchSettings,
    ) -> None:
        self._signal: Signal = signal
        self._export = export
        self._health = health
        self._settings = settings
        self._delay_s = settings.schedule_delay_ms / 1000
        self._queue: deque[T] = deque()
        self._closed = False
        self._abandoned = False
        self._suppress_instrumentation = _instrumentation_suppressor()
        self._start_thread()
        in_forked_children(self._start_thread)

    @property
    def settings(self) -> BatchSettings:
        """The queue and batch sizes and the schedule delay in use."""
        return self._settings

    @property
    def signal(self) -> Signal:
        """What this queue holds."""
        return self._signal

    def __len__(self) -> int:
        return len(self._queue)

    def _start_thread(self) -> None:
        """Start the export thread, with a queue and locks of its own: in a forked child the
        parent's items are the parent's, and a lock a parent's thread held would stay held."""
        self._queue = deque()
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()
        self._flush_requests: list[threading.Event] = []
        name = f"kaos-otel-{self._signal}-export"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: T) -> None:
        """Queue ``item``; a full queue drops (and counts) its oldest item."""
        if self._closed:
            self._health.record_drop(self._signal, "shutdown")
            return
        queue = self._queue
        if len(queue) >= self._settings.max_queue_size:
            try:
                queue.popleft()
            except IndexError:  # the export thread took the whole queue meanwhile
                pass
            else:
                self._health.record_drop(self._signal, "queue_full")
                log_once(
                    f"{self._signal}-queue-full",
                    "kaos-otel: the %s queue is full (collector slow or down); the oldest items are "
                    "dropped and counted in kaos.telemetry.dropped",
                    self._signal,
                )
        queue.append(item)
        if len(queue) >= self._settings.max_export_batch_size and not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        with exporting(), self._suppress_instrumentation():
            while True:
                woken = self._wake.wait(self._delay_s)
                self._wake.clear()
                with self._flush_lock:
                    flushes, self._flush_requests = self._flush_requests, []
                # read once: a shutdown after this read wakes the next round, which drains it all
                closing = self._closed
                self._drain(full_batches_only=woken and not flushes and not closing)
                for finished in flushes:
                    finished.set()
                if closing:
                    return

    def _batches(self, *, full_batches_only: bool) -> Iterator[list[T]]:
        queue = self._queue
        size = self._settings.max_export_batch_size
        least = size if full_batches_only else 1
        while len(queue) >= least and not self._abandoned:
            batch: list[T] = []
            try:
                while len(batch) < size:
                    batch.append(queue.popleft())
            except IndexError:
                pass
            yield batch

    def _drain(self, *, full_batches_only: bool) -> None:
        for batch in self._batches(full_batches_only=full_batches_only):
            try:
                self._export(batch)
            except Exception as exc:  # the exporter wrappers count failures; this is a last resort
                internal_error(f"{self._signal} export", exc)

    def force_flush(self, timeout_s: float) -> bool:
        """Export everything queued now; ``False`` if that took longer than ``timeout_s``."""
        if self._closed or not self._thread.is_alive():
            return not self._queue
        finished = threading.Event()
        with self._flush_lock:
            self._flush_requests.append(finished)
        self._wake.set()
        return finished.wait(timeout_s)

    def shutdown(self, timeout_s: float) -> bool:
        """Stop accepting items, export what is queued; ``False`` if that missed ``timeout_s``."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        # an item put() let in just before it saw the queue closed, after the last drain: lost
        left = len(self._queue)
        self._queue.clear()
        self._health.record_drop(self._signal, "shutdown", left)
        return True

    def abandon(self, exporter: object) -> int:
        """After a missed deadline: count every item still held as lost, export no more; returns
        how many.

        That is the queue plus the batch ``exporter`` is still sending, if it tells
        (``abandon()``, as the wrappers of :mod:`kaos_otel.exporters.pipeline` do).
        """
        self._closed = True
        self._abandoned = True
        held = len(self._queue)
        self._queue.clear()
        abandon_export = getattr(exporter, "abandon", None)
        if callable(abandon_export):
            held += int(abandon_export())
        self._health.record_drop(self._signal, "shutdown", held)
        return held


class _QueuedProcessor(Generic[T, E]):
    """What the span and log processors share: one :class:`BatchQueue` and what it tells."""

    _queue: BatchQueue[T]
    _exporter: E

    @property
    def settings(self) -> BatchSettings:
        """The queue and batch sizes and the schedule delay in use."""
        return self._queue.settings

    @property
    def queued(self) -> int:
        """Items waiting for export."""
        return len(self._queue)

    @property
    def pending(self) -> int:
        """Items waiting for export or inside an export call (when the exporter tells, as the
        wrappers of :mod:`kaos_otel.exporters.pipeline` do with ``in_flight``)."""
        return len(self._queue) + int(getattr(self._exporter, "in_flight", 0))

    @property
    def signal(self) -> Signal:
        """What this processor exports."""
        return self._queue.signal

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export every queued item."""
        return self._queue.force_flush(timeout_millis / 1000)


class SpanBatchProcessor(_QueuedProcessor[ReadableSpan, SpanExporter], SpanProcessor):
    """Queues sampled spans as they end and exports them in batches off the request's thread."""

    def __init__(self, exporter: SpanExporter, health: TelemetryHealth, settings: BatchSettings) -> None:
        self._exporter = exporter
        self._queue: BatchQueue[ReadableSpan] = BatchQueue("traces", exporter.export, health, settings)

    @property
    def exporter(self) -> SpanExporter:
        """Where batches go."""
        return self._exporter

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do when a span starts."""

    def on_end(self, span: ReadableSpan) -> None:
        """Queue the span if it is sampled."""
        context = span.context
        if context is not None and context.trace_flags.sampled:
            self._queue.put(span)

    def shutdown(self, timeout_millis: int = 30000) -> None:
        """Export what is queued, then shut the exporter down."""
        if self._queue.shutdown(timeout_millis / 1000):
            self._exporter.shutdown()

    def abandon(self) -> int:
        """After a missed shutdown deadline: count every span still held as lost; returns how many."""
        return self._queue.abandon(self._exporter)


class LogBatchProcessor(_QueuedProcessor[ReadWriteLogRecord, LogRecordExporter], LogRecordProcessor):
    """Caps each log record's text body (the queue's memory stays bounded) and exports the records
    in batches off the request's thread; the exporter cleans them
    (:class:`~kaos_otel.exporters.pipeline.SanitizingLogExporter`)."""

    def __init__(
        self,
        exporter: LogRecordExporter,
        policy: ContentPolicy,
        health: TelemetryHealth,
        settings: BatchSettings,
    ) -> None:
        self._exporter = exporter
        self._policy = policy
        self._queue: BatchQueue[ReadWriteLogRecord] = BatchQueue(
            "logs",
            exporter.export,  # type: ignore[arg-type]
            health,
            settings,
        )

    @property
    def exporter(self) -> LogRecordExporter:
        """Where batches go."""
        return self._exporter

    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        """Cap a text body's size (so the queue's memory stays bounded), then queue the record.

        Redaction runs later, on the export thread
        (:class:`~kaos_otel.exporters.pipeline.SanitizingLogExporter`).
        """
        if on_export_thread():
            # Logged by the exporter itself (urllib3 logging the export request, say): exporting
            # it would feed the pipeline from itself, endlessly at DEBUG level.
            return
        record = log_record.log_record
        if isinstance(record.body, str):
            record.body = self._policy.bound_size(record.body)
        self._queue.put(log_record)

    def shutdown(self) -> None:
        """Export what is queued, then shut the exporter down."""
        if self._queue.shutdown(30.0):
            self._exporter.shutdown()  # type: ignore[no-untyped-call]

    def abandon(self) -> int:
        """After a missed shutdown deadline: count every record still held as lost; returns how many."""
        return self._queue.abandon(self._exporter)
