"""Export-path wrappers: clean every exported string, and count what is lost.

They sit between the SDK's batch processors and the real exporters, so their work runs on the
export thread, never on the request's thread, and they never raise into the SDK.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar, overload

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk._logs import ReadableLogRecord, ReadWriteLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import Link, SpanContext, Status, TraceState
from opentelemetry.util.types import AttributeValue

from kaos_otel._content import ContentPolicy, policy_from_env, safe_str
from kaos_otel._internal_log import internal_error
from kaos_otel.exporters.health import Signal, TelemetryHealth

_export_thread = threading.local()


@contextmanager
def exporting() -> Iterator[None]:
    """Mark the calling thread as exporting: what it logs meanwhile (an exporter's own HTTP
    client, say) is not fed back into the log pipeline."""
    previous = getattr(_export_thread, "active", False)
    _export_thread.active = True
    try:
        yield
    finally:
        _export_thread.active = previous


def on_export_thread() -> bool:
    """Whether the calling thread is exporting (see :func:`exporting`)."""
    return bool(getattr(_export_thread, "active", False))


def in_forked_children(method: Callable[[], object]) -> None:
    """Call ``method`` (bound) in every child this process forks, first thing, while its object
    lives (the hook holds it weakly: a discarded queue or exporter is freed)."""
    reference = weakref.WeakMethod(method)

    def call_if_alive() -> None:
        alive = reference()
        if alive is not None:
            alive()

    os.register_at_fork(after_in_child=call_if_alive)


class _InFlight:
    """Items inside an export call that has not returned yet, and whether they were given up on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._abandoned = False
        in_forked_children(self._start_afresh)

    def _start_afresh(self) -> None:
        """In a forked child, before its threads run: the parent's calls are the parent's, and
        its lock may have been held by a thread the child does not have."""
        self._lock, self._count = threading.Lock(), 0

    def start(self, count: int) -> None:
        with self._lock:
            if not self._abandoned:
                self._count += count

    def finish(self, count: int) -> bool:
        """The call returned; ``False`` if :meth:`abandon` already counted its items as lost."""
        with self._lock:
            if self._abandoned:
                return False
            self._count -= count
            return True

    @property
    def count(self) -> int:
        """Items inside calls that have not returned (this process's)."""
        return self._count

    def abandon(self) -> int:
        """Give up on the calls in progress (and any later one); returns how many items they held."""
        with self._lock:
            self._abandoned = True
            count, self._count = self._count, 0
            return count


MAX_REQUEST_BYTES = 3 * 2**20
"""Estimated encoded size above which a batch is sent as several export requests.

gRPC servers, the OpenTelemetry Collector included, reject a request over 4 MiB by default, and
with it every span of the batch: 512 spans whose values are each capped at 8 KiB already weigh
more than that.
"""


PROBE_REQUEST_SPANS = 64
"""Spans in the first export request of a batch when the previous request failed.

With the collector down that request fails too, and the rest of the batch is neither cleaned nor
sent: a small probe keeps the work wasted on a batch that cannot leave (pure Python, holding the
GIL a request thread may be waiting for) small. Requests slower by 10 to 20 ms were the ones that
coincided with such work.
"""
MAX_REQUEST_SPANS = 256
"""Spans per export request while the collector takes them. Fewer, larger requests cost the
export thread less per span: a 512-span batch sent as eight requests of 64 held pipeline
throughput at about 0.75x the raw SDK's (which sends one), and with a probe of 64 before every
batch, not only after a failure, at about 0.85x. The GIL is released between requests."""


class HashedOnceResource(Resource):
    """A :class:`Resource` whose hash is computed once, when it is made.

    The SDK's recomputes its hash on every call (a JSON dump of all its attributes), and the OTLP
    encoders hash the resource of every span, log record and metric they group: about 9 us per
    exported span on the export thread. A resource never changes once made. The manager's
    providers are given one; :class:`SanitizingSpanExporter` gives its copies one as well.
    """

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def redacted_resource(resource: Resource, policy: ContentPolicy) -> HashedOnceResource:
    """``resource`` with its secrets masked (sizes kept: the SDK caps no resource value), hashed once."""
    return HashedOnceResource(Resource(policy.redact_resource(resource.attributes), resource.schema_url))


class ResourceCleaner:
    """A resource as exported: secrets masked, hashed once. The records of a provider share one
    resource, so the last one seen is remembered."""

    def __init__(self, policy: ContentPolicy) -> None:
        self._policy = policy
        self._last: tuple[Resource, Resource] | None = None

    def __call__(self, resource: Resource) -> Resource:
        last = self._last
        if last is not None and last[0] is resource:
            return last[1]
        # the manager's was redacted when it was built; a host provider's is redacted here
        cleaned = (
            resource
            if isinstance(resource, HashedOnceResource)
            else redacted_resource(resource, self._policy)
        )
        self._last = (resource, cleaned)
        return cleaned


class _RequestFailed(Exception):
    """An export request failed: the rest of the batch is not sent."""


class SanitizingSpanExporter(SpanExporter):
    """Redacts and caps every span attribute, event attribute and status message, then exports.

    A batch is cleaned and sent in slices of at most ``max_request_spans`` spans, except that after
    a failed request the next batch starts with a probe of at most ``probe_request_spans``. A slice
    whose estimated encoded size exceeds ``max_request_bytes`` is split further, so that a few large
    spans do not get a whole batch rejected by the collector.
    """

    def __init__(
        self,
        inner: SpanExporter,
        policy: ContentPolicy,
        health: TelemetryHealth,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        max_request_spans: int = MAX_REQUEST_SPANS,
        probe_request_spans: int = PROBE_REQUEST_SPANS,
    ) -> None:
        self._inner = inner
        self._policy = policy
        self._health = health
        self._max_request_bytes = max_request_bytes
        self._max_request_spans = max(1, max_request_spans)
        self._probe_request_spans = max(1, min(probe_request_spans, self._max_request_spans))
        self._last_request_failed = False
        self._in_flight = _InFlight()
        self._cleaned_resource = ResourceCleaner(policy)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export cleaned copies; a failure is counted, never raised.

        After a request fails, the rest of the batch is not sent (the collector is unreachable
        or refusing): it is counted as lost with the failed request.
        """
        self._in_flight.start(len(spans))
        pending = len(spans)
        try:
            for start, end in self._slices(len(spans)):
                if start:
                    time.sleep(0)  # let a waiting request thread have the GIL between slices
                cleaned = self._clean_slice(spans[start:end])
                if (left_out := end - start - len(cleaned)) and self._in_flight.finish(left_out):
                    self._health.record_drop("traces", "export_failed", left_out)
                pending -= left_out
                for request in _split_by_size(cleaned, self._max_request_bytes):
                    if self._inner.export(request) is not SpanExportResult.SUCCESS:
                        raise _RequestFailed
                    self._last_request_failed = False
                    self._in_flight.finish(len(request))
                    pending -= len(request)
        except _RequestFailed:
            self._last_request_failed = True
        except Exception as exc:
            self._last_request_failed = True
            internal_error("span export", exc)
        if self._in_flight.finish(pending) and pending:
            self._health.record_drop("traces", "export_failed", pending)
        return SpanExportResult.FAILURE if pending else SpanExportResult.SUCCESS

    def _slices(self, count: int) -> Iterator[tuple[int, int]]:
        """``(start, end)`` of each slice of a batch of ``count`` spans."""
        start = 0
        step = self._probe_request_spans if self._last_request_failed else self._max_request_spans
        while start < count:
            yield start, min(start + step, count)
            start, step = start + step, self._max_request_spans

    @property
    def in_flight(self) -> int:
        """Spans inside an export call that has not returned."""
        return self._in_flight.count

    def abandon(self) -> int:
        """Spans in an export still running, now counted by the caller; later results are not counted."""
        return self._in_flight.abandon()

    def _clean_slice(self, spans: Sequence[ReadableSpan]) -> list[tuple[ReadableSpan, int]]:
        """Cleaned copies of ``spans``: one that cannot be cleaned is left out (and counted by the
        caller), not the rest of the batch with it."""
        cleaned: list[tuple[ReadableSpan, int]] = []
        for span in spans:
            try:
                cleaned.append(self._clean(span))
            except Exception as exc:
                internal_error("cleaning a span for export", exc)
        return cleaned

    def _clean(self, span: ReadableSpan) -> tuple[ReadableSpan, int]:
        """A cleaned copy of ``span`` and an upper estimate of its encoded size in bytes.

        The copy's attributes are plain dicts, which the OTLP encoder also reads faster than the
        SDK's locked attribute mappings.
        """
        policy = self._policy
        status = span.status
        if status.description:
            status = Status(status.status_code, policy.clean_text(status.description))
        name = policy.clean_text(safe_str(span.name))  # the API takes any object as a name
        attributes = policy.clean_attributes(span.attributes)
        size = _SPAN_OVERHEAD_BYTES + len(name) + _attributes_size(attributes)
        events: list[Event] = []
        for event in span.events:
            event_name = policy.clean_text(safe_str(event.name))
            event_attributes = policy.clean_attributes(event.attributes)
            size += 24 + len(event_name) + _attributes_size(event_attributes)
            events.append(
                Event(event_name, _with_dropped(event_attributes, event.dropped_attributes), event.timestamp)
            )
        links: list[Link] = []
        for link in span.links:
            link_attributes = policy.clean_attributes(link.attributes)
            size += 48 + _attributes_size(link_attributes)
            links.append(
                Link(
                    self._clean_context(link.context), _with_dropped(link_attributes, link.dropped_attributes)
                )
            )
        context = span.context
        cleaned = ReadableSpan(
            name=name,
            context=self._clean_context(context) if context is not None else None,
            parent=span.parent,
            resource=self._cleaned_resource(span.resource),
            attributes=_with_dropped(attributes, span.dropped_attributes),
            # the SDK drops events or links only from a full list, so an empty one has no count to
            # read; and the shared empty tuple: an empty list would live as long as the copy
            events=_list_with_dropped(events, span.dropped_events) if events else (),
            links=_list_with_dropped(links, span.dropped_links) if links else (),
            kind=span.kind,
            status=status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )
        return cleaned, size

    def _clean_context(self, context: SpanContext) -> SpanContext:
        """``context`` with its ``tracestate`` values cleaned: they came from the caller."""
        trace_state = context.trace_state
        if not trace_state:
            return context
        cleaned = [(key, self._policy.clean_text(value)) for key, value in trace_state.items()]
        if all(value == trace_state[key] for key, value in cleaned):
            return context
        return SpanContext(
            context.trace_id, context.span_id, context.is_remote, context.trace_flags, TraceState(cleaned)
        )

    def shutdown(self) -> None:
        """Shut the wrapped exporter down."""
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the wrapped exporter."""
        return self._inner.force_flush(timeout_millis)


class SanitizingLogExporter(LogRecordExporter):
    """Redacts and caps every log body, attribute, event name and resource, exports, and counts
    failures.

    A batch whose estimated encoded size exceeds ``max_request_bytes`` goes out as several
    requests; after a request fails, the rest of the batch is not sent and is counted as lost.
    """

    def __init__(
        self,
        inner: LogRecordExporter,
        policy: ContentPolicy,
        health: TelemetryHealth,
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        self._inner = inner
        self._policy = policy
        self._health = health
        self._max_request_bytes = max_request_bytes
        self._in_flight = _InFlight()
        self._cleaned_resource = ResourceCleaner(policy)

    def export(self, batch: Sequence[ReadWriteLogRecord]) -> LogRecordExportResult:  # type: ignore[override]
        """Export cleaned records; a failure is counted, never raised."""
        self._in_flight.start(len(batch))
        pending = len(batch)
        try:
            cleaned = [self._cleaned(log_record) for log_record in batch]  # type: ignore[arg-type]
            sized = [(log_record, _log_record_size(log_record)) for log_record in cleaned]
            for request in _split_by_size(sized, self._max_request_bytes):
                if self._inner.export(request) is not LogRecordExportResult.SUCCESS:
                    break
                self._in_flight.finish(len(request))
                pending -= len(request)
        except Exception as exc:
            internal_error("log export", exc)
        if self._in_flight.finish(pending) and pending:
            self._health.record_drop("logs", "export_failed", pending)
        return LogRecordExportResult.FAILURE if pending else LogRecordExportResult.SUCCESS

    def _cleaned(self, log_record: ReadableLogRecord) -> ReadableLogRecord:
        """A log record with its body (text, or the strings of a structured body), attributes and
        event name redacted and capped in place, and its resource redacted (the record's, or a
        readable copy with the redacted resource: an SDK processor's records are frozen)."""
        policy = self._policy
        record = log_record.log_record
        record.body = policy.clean_body(record.body)
        if record.attributes:
            dropped = log_record.dropped_attributes
            record.attributes = _with_dropped(
                policy.clean_attributes(record.attributes), dropped, extended=True
            )
        event_name = getattr(record, "event_name", None)
        if isinstance(event_name, str) and event_name:
            record.event_name = policy.clean_text(event_name)
        resource = log_record.resource
        cleaned = resource if resource is None else self._cleaned_resource(resource)
        if cleaned is resource:
            return log_record
        return ReadableLogRecord(record, cleaned, log_record.instrumentation_scope, log_record.limits)

    @property
    def in_flight(self) -> int:
        """Records inside an export call that has not returned."""
        return self._in_flight.count

    def abandon(self) -> int:
        """Records in an export still running, now counted by the caller; later results are not counted."""
        return self._in_flight.abandon()

    def shutdown(self) -> None:
        """Shut the wrapped exporter down."""
        self._inner.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the wrapped exporter."""
        return self._inner.force_flush(timeout_millis)


class SanitizingMetricExport(MetricExporter):
    """Mixed into a metric exporter class: cleans every label value (the host's own meters' too,
    with ``export_other_metrics`` or under the distro; kaos-otel's are bounded already) and the
    resource, and counts the data points of failed exports, and of an export a shutdown gave up on.

    A subclass rather than a wrapper, so that the exporter keeps the temporality and aggregation
    it read from ``OTEL_EXPORTER_OTLP_METRICS_*`` without anyone reading them back.
    """

    health: TelemetryHealth
    policy: ContentPolicy
    cleaned_resource: ResourceCleaner
    in_flight: _InFlight

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> MetricExportResult:
        """Export cleaned data; a failure is counted, never raised."""
        points = _count_points(metrics_data)
        self.in_flight.start(points)
        try:
            with exporting():  # on the SDK reader's thread or a flushing one
                cleaned = _cleaned_metrics(metrics_data, self.policy, self.cleaned_resource)
                result: MetricExportResult = super().export(  # type: ignore[safe-super]
                    cleaned, timeout_millis=timeout_millis, **kwargs
                )
        except Exception as exc:
            internal_error("metric export", exc)
            result = MetricExportResult.FAILURE
        if self.in_flight.finish(points) and result is not MetricExportResult.SUCCESS:
            self.health.record_drop("metrics", "export_failed", points)
        return result

    def abandon(self) -> int:
        """After a missed shutdown deadline: count the data points of an export still running as
        lost (its result is then not counted again); returns how many."""
        held = self.in_flight.abandon()
        self.health.record_drop("metrics", "shutdown", held)
        return held


def sanitizing_metric_exporter(
    exporter_class: type[MetricExporter], health: TelemetryHealth, policy: ContentPolicy, **options: Any
) -> SanitizingMetricExport:
    """An ``exporter_class`` built with ``options`` that cleans what it exports and counts what
    it fails to export."""
    sanitizing = type(f"Sanitizing{exporter_class.__name__}", (SanitizingMetricExport, exporter_class), {})
    exporter = sanitizing(**options)
    exporter.health = health
    exporter.policy = policy
    exporter.cleaned_resource = ResourceCleaner(policy)
    exporter.in_flight = _InFlight()
    assert isinstance(exporter, SanitizingMetricExport)
    return exporter


def _cleaned_metrics(data: MetricsData, policy: ContentPolicy, resources: ResourceCleaner) -> MetricsData:
    """``data`` with the attributes of every data point and exemplar, and the resource, cleaned."""
    return MetricsData(
        [
            ResourceMetrics(
                resources(resource_metrics.resource),
                [
                    ScopeMetrics(
                        scope_metrics.scope,
                        [
                            replace(metric, data=_cleaned_data(metric.data, policy))
                            for metric in scope_metrics.metrics
                        ],
                        scope_metrics.schema_url,
                    )
                    for scope_metrics in resource_metrics.scope_metrics
                ],
                resource_metrics.schema_url,
            )
            for resource_metrics in data.resource_metrics
        ]
    )


def _cleaned_data(data: Any, policy: ContentPolicy) -> Any:
    """A sum, gauge or histogram with the attributes of its points and their exemplars cleaned."""
    points = [
        replace(
            point,
            attributes=policy.clean_attributes(point.attributes),
            exemplars=[
                replace(exemplar, filtered_attributes=policy.clean_attributes(exemplar.filtered_attributes))
                if exemplar.filtered_attributes
                else exemplar
                for exemplar in point.exemplars
            ],
        )
        for point in data.data_points
    ]
    return replace(data, data_points=points)


def _count_points(metrics_data: MetricsData) -> int:
    return sum(
        len(metric.data.data_points)
        for resource_metrics in metrics_data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    )


_SPAN_OVERHEAD_BYTES = 96
"""Ids, timestamps, kind, status and field tags of one encoded span (an overestimate)."""


_LOG_RECORD_OVERHEAD_BYTES = 64
"""Timestamps, ids, severity and field tags of one encoded log record (an overestimate)."""


def _log_record_size(log_record: ReadableLogRecord) -> int:
    """Estimated encoded size of a cleaned log record: its body and attributes, nested values too."""
    record = log_record.log_record
    return _LOG_RECORD_OVERHEAD_BYTES + _value_size(record.body) + _value_size(record.attributes)


def _value_size(value: object) -> int:
    """Strings (keys too) and bytes counted in full, 8 bytes for any other value and per item."""
    if isinstance(value, str):
        return _text_size(value)
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, Mapping):
        return sum(8 + _text_size(str(key)) + _value_size(item) for key, item in value.items())
    if isinstance(value, tuple | list):
        return sum(8 + _value_size(item) for item in value)
    return 8


_Item = TypeVar("_Item")


def _split_by_size(items: list[tuple[_Item, int]], limit: int) -> Iterator[list[_Item]]:
    """Consecutive runs of ``(item, estimated size)`` whose total size stays within ``limit``."""
    request: list[_Item] = []
    size = 0
    for item, item_size in items:
        if request and size + item_size > limit:
            yield request
            request, size = [], 0
        request.append(item)
        size += item_size
    if request:
        yield request


def _with_dropped(
    attributes: dict[str, AttributeValue], dropped: int, *, extended: bool = False
) -> Mapping[str, AttributeValue]:
    """Cleaned ``attributes``, carrying the count of those the SDK's limits dropped when it
    dropped any (the encoders read it from the SDK's own bounded mapping)."""
    if not dropped:
        return attributes
    bounded = BoundedAttributes(attributes=attributes, extended_attributes=extended)
    bounded.dropped = dropped
    return bounded


def _list_with_dropped(items: list[_Item], dropped: int) -> Sequence[_Item]:
    """Cleaned events or links, carrying the count of those the SDK's limits dropped when it
    dropped any."""
    if not dropped:
        return items
    bounded = BoundedList.from_seq(None, items)
    bounded.dropped = dropped
    return bounded


def _attributes_size(attributes: Mapping[str, AttributeValue] | None) -> int:
    """Keys and string values counted in full; 16 bytes per attribute for tags, numbers, flags."""
    if not attributes:
        return 0
    size = 16 * len(attributes) + sum(map(len, attributes))  # the keys
    for value in attributes.values():
        if type(value) is str:  # most values: no call per value
            size += len(value) if value.isascii() else 4 * len(value)
        elif isinstance(value, str):
            size += _text_size(value)
        elif isinstance(value, tuple | list):  # the SDK stores sequences as tuples
            size += sum(8 + (_text_size(item) if isinstance(item, str) else 0) for item in value)
        elif isinstance(value, bytes):
            size += len(value)
    return size


def _text_size(text: str) -> int:
    """UTF-8 size of ``text``, overestimated as 4 bytes a character unless it is ASCII."""
    return len(text) if text.isascii() else 4 * len(text)


_HOST_LAYER_SIGNALS: set[Signal] = set()
"""The signals whose exporters this process wrapped with :func:`sanitized_exporter` (a host adding
the content-safety layer to providers of its own)."""


def host_layer_added(signal: Signal) -> bool:
    """Whether an exporter of ``signal`` was wrapped with :func:`sanitized_exporter` in this process."""
    return signal in _HOST_LAYER_SIGNALS


@overload
def sanitized_exporter(
    exporter: SpanExporter, policy: ContentPolicy | None = None, health: TelemetryHealth | None = None
) -> SpanExporter: ...


@overload
def sanitized_exporter(
    exporter: LogRecordExporter, policy: ContentPolicy | None = None, health: TelemetryHealth | None = None
) -> LogRecordExporter: ...


def sanitized_exporter(
    exporter: SpanExporter | LogRecordExporter,
    policy: ContentPolicy | None = None,
    health: TelemetryHealth | None = None,
) -> SpanExporter | LogRecordExporter:
    """The content-safety layer for providers a host application builds itself.

    Wrap each span and log exporter before handing it to the batch processor::

        BatchSpanProcessor(sanitized_exporter(OTLPSpanExporter()))
        BatchLogRecordProcessor(sanitized_exporter(OTLPLogExporter()))

    Every exported string then passes the same redaction and size cap as with
    :class:`~kaos_otel.KaosOtelManager`'s own pipeline (without ``policy``, the cap the
    environment's attribute value length limits set). Wrap an exporter added to a manager's
    providers the same way, with ``policy=otel.content_policy``. Metric label values of kaos-otel's
    instruments are checked where they are recorded, whoever owns the meter provider.
    """
    policy = policy or policy_from_env()
    health = health or TelemetryHealth()
    if isinstance(exporter, SpanExporter):
        _HOST_LAYER_SIGNALS.add("traces")
        return SanitizingSpanExporter(exporter, policy, health)
    _HOST_LAYER_SIGNALS.add("logs")
    return SanitizingLogExporter(exporter, policy, health)
