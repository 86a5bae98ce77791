"""Configuration parity: given the same ``OTEL_*`` environment, a kaos-otel manager and a plain SDK
setup export to the same place with the same settings.

Each case sets one group of variables the SDK or the OTLP exporters honour, then builds both a
:class:`~kaos_otel.KaosOtelManager` and the plain SDK (``TracerProvider`` + ``BatchSpanProcessor``,
``MeterProvider`` + ``PeriodicExportingMetricReader``, ``LoggerProvider`` +
``BatchLogRecordProcessor``, each with the OTLP exporter its protocol names), records spans, a
counter and log records on each (on the manager through Python ``logging``, which it bridges), and
compares what real receivers got: which server and URL path, the request headers and compression,
the resource, span names, log bodies and the attributes of spans, events, links and log records
(limits), each metric's kind, temporality and exemplar count, how many spans or log records per
request (batch sizes), and whether anything arrived (sampler, ``OTEL_SDK_DISABLED``). Over HTTPS
and gRPC over TLS (a test CA and certificates made here), the certificate and client certificate
variables decide alike what is delivered and what the server refuses. With
``OTEL_METRIC_EXPORT_INTERVAL`` both export metrics on their own, without a flush.
"""

from __future__ import annotations

import datetime
import gzip
import ipaddress
import logging
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from kaos_otel import BatchSettings, KaosOtelManager, catalog
from kaos_otel.receiver import OtlpReceiver

OBSERVED_HEADERS = ("x-tenant", "x-signal", "content-encoding", "content-type")
LONG_VALUE = "v" * 40
SPANS = 5
LOGS = 5
LOGGER = "parity"
LINKED = SpanContext(trace_id=0x5CE0E9A5, span_id=0x5CE0, is_remote=True, trace_flags=TraceFlags(0))


Attributes = tuple[tuple[str, Any], ...]


class ExportedSpan(NamedTuple):
    """One exported span, reduced to what a setting can change."""

    name: str
    attributes: Attributes
    events: tuple[tuple[str, Attributes], ...]
    """Name and attributes of each event."""
    links: tuple[Attributes, ...]
    """Attributes of each link."""


@dataclass(frozen=True, order=True)
class Metric:
    """One exported metric, reduced to what a setting can change."""

    name: str
    kind: str
    """The OTLP data field set: ``sum``, ``histogram``, ``exponential_histogram``..."""
    temporality: int
    """``AggregationTemporality`` of a sum or histogram (0 for a gauge)."""
    exemplars: int


@dataclass
class Request:
    """One OTLP/HTTP request as the server saw it, reduced to what a setting can change."""

    path: str
    headers: dict[str, str]
    spans: list[ExportedSpan] = field(default_factory=list)
    resource: tuple[tuple[str, Any], ...] = ()
    metrics: tuple[Metric, ...] = ()
    logs: list[tuple[str, tuple[tuple[str, Any], ...]]] = field(default_factory=list)


class Recorder(Protocol):
    """A recording OTLP endpoint (HTTP or gRPC)."""

    requests: list[Request]
    lock: threading.Lock

    @property
    def endpoint(self) -> str: ...


class RecordingServer(ThreadingHTTPServer):
    """An OTLP/HTTP endpoint that records every request (path, headers, decoded payload).

    Given a TLS context it serves HTTPS and counts the connections whose handshake failed
    (a client that does not trust the server's certificate).
    """

    daemon_threads = True

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[Request] = []
        self.failed_handshakes = 0
        self.lock = threading.Lock()
        self.scheme = "http"
        if tls is not None:
            # the handshake runs on the connection's own thread, at its first read
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
            self.scheme = "https"

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Count a refused TLS handshake; anything else is a bug of the test and shows."""
        if isinstance(sys.exc_info()[1], ssl.SSLError):
            with self.lock:
                self.failed_handshakes += 1
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: RecordingServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding", "") == "gzip":
            body = gzip.decompress(body)
        headers = {name: self.headers.get(name, "") for name in OBSERVED_HEADERS}
        request = _decode(self.path, headers, body)
        with self.server.lock:
            self.server.requests.append(request)
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def _decode(path: str, headers: dict[str, str], body: bytes) -> Request:
    """One export request (an OTLP/HTTP path, or ``grpc/<signal>``) reduced to what is compared."""
    request = Request(path, headers)
    if path.endswith("traces"):
        traces = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        for resource_spans in traces.resource_spans:
            request.resource = _kv(resource_spans.resource.attributes)
            for scope in resource_spans.scope_spans:
                request.spans += [
                    ExportedSpan(
                        span.name,
                        _kv(span.attributes),
                        tuple((event.name, _kv(event.attributes)) for event in span.events),
                        tuple(_kv(link.attributes) for link in span.links),
                    )
                    for span in scope.spans
                ]
    elif path.endswith("metrics"):
        metrics = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
        for resource_metrics in metrics.resource_metrics:
            request.resource = _kv(resource_metrics.resource.attributes)
        request.metrics = tuple(
            sorted(
                _metric(metric)
                for resource_metrics in metrics.resource_metrics
                for scope in resource_metrics.scope_metrics
                for metric in scope.metrics
                if metric.name != "kaos.telemetry.dropped"  # the manager's own health metric
            )
        )
    elif path.endswith("logs"):
        logs = logs_service_pb2.ExportLogsServiceRequest.FromString(body)
        for resource_logs in logs.resource_logs:
            request.resource = _kv(resource_logs.resource.attributes)
            request.logs += [
                (record.body.string_value, _kv(record.attributes))
                for scope in resource_logs.scope_logs
                if scope.scope.name == LOGGER  # not the manager's own log lines, if any
                for record in scope.log_records
            ]
    return request


def _metric(metric: Any) -> Metric:
    kind = metric.WhichOneof("data")
    data = getattr(metric, kind)
    return Metric(
        metric.name,
        kind,
        getattr(data, "aggregation_temporality", 0),
        sum(len(point.exemplars) for point in data.data_points),
    )


def _kv(attributes: Any) -> Attributes:
    pairs = []
    for kv in attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        pairs.append((kv.key, getattr(value, kind) if kind else None))
    # the SDK's own attributes differ by instance (service.instance.id) and are compared elsewhere
    return tuple(sorted(pair for pair in pairs if pair[0] != "service.instance.id"))


@contextmanager
def serving(tls: ssl.SSLContext | None = None) -> Iterator[tuple[RecordingServer, RecordingServer]]:
    """Two recording servers: one for the kaos-otel manager, one for the plain SDK."""
    pair = (RecordingServer(tls), RecordingServer(tls))
    for server in pair:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield pair
    finally:
        for server in pair:
            server.shutdown()
            server.server_close()


@pytest.fixture
def servers() -> Iterator[tuple[RecordingServer, RecordingServer]]:
    with serving() as pair:
        yield pair


Env = Callable[[str], Mapping[str, str]]
"""A case: the environment, given the endpoint of the server that setup should reach."""

HTTP = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
CASES: dict[str, Env] = {
    "endpoint": lambda url: {**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": url},
    "endpoint with a path": lambda url: {**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": url + "/prefix"},
    "per-signal endpoint": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url + "/custom/traces",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": url + "/custom/metrics",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": url + "/custom/logs",
    },
    "per-signal endpoint over the base": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url + "/v1/traces",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": url + "/v1/metrics",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": url + "/v1/logs",
    },
    "per-signal protocol": lambda url: {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
    },
    "headers": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=t%201",
    },
    "per-signal headers": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=base",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-signal=traces",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-signal=metrics",
        "OTEL_EXPORTER_OTLP_LOGS_HEADERS": "x-signal=logs",
    },
    "compression": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
    },
    "per-signal compression": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
    },
    "per-signal logs compression": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION": "gzip",
    },
    "timeout": lambda url: {**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_TIMEOUT": "2500"},
    "per-signal timeout": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2500",
    },
    "sampler always_off": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_TRACES_SAMPLER": "always_off",
    },
    "sampler ratio 0": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0",
    },
    "unknown sampler": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_TRACES_SAMPLER": "no_such_sampler",
    },
    "resource and service name": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_SERVICE_NAME": "parity",
        "OTEL_RESOURCE_ATTRIBUTES": "team=agents,region=eu%201",
    },
    "attribute value limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "7",
    },
    "span attribute value limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "9",
    },
    "log record attribute value limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT": "11",
    },
    "span and log record attribute value limits": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "9",
        "OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT": "11",
    },
    "empty span attribute value limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "",
        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "7",
    },
    "attribute count limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "1",
    },
    "span event count limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_SPAN_EVENT_COUNT_LIMIT": "0",
    },
    "event attribute count limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT": "1",
    },
    "span link count limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_SPAN_LINK_COUNT_LIMIT": "0",
    },
    "link attribute count limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": "1",
    },
    "general attribute count limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_ATTRIBUTE_COUNT_LIMIT": "1",
    },
    "batch size": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2",
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
    },
    "log batch size": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE": "2",
        "OTEL_BLRP_SCHEDULE_DELAY": "60000",
    },
    "metric temporality preference": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta",
    },
    "exemplar filter": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_METRICS_EXEMPLAR_FILTER": "always_off",
    },
    "sdk disabled": lambda url: {**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SDK_DISABLED": "true"},
    "sdk disabled is only true": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_SDK_DISABLED": "1",
    },
}


@dataclass
class PlainSdk:
    """What an application without kaos-otel builds from the environment: each signal's provider,
    its batch processor or periodic reader, and the OTLP exporter its protocol names."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    logger_provider: LoggerProvider

    @classmethod
    def from_environment(cls) -> PlainSdk:
        def http(signal: str) -> bool:
            protocol = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
            return (protocol or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")) == "http/protobuf"

        tracer_provider = TracerProvider(resource=Resource.create(), shutdown_on_exit=False)
        tracer_provider.add_span_processor(
            BatchSpanProcessor(HttpSpanExporter() if http("TRACES") else GrpcSpanExporter())
        )
        meter_provider = MeterProvider(
            metric_readers=[
                PeriodicExportingMetricReader(
                    HttpMetricExporter() if http("METRICS") else GrpcMetricExporter()
                )
            ],
            resource=Resource.create(),
            shutdown_on_exit=False,
        )
        logger_provider = LoggerProvider(resource=Resource.create(), shutdown_on_exit=False)
        logger_provider.add_log_record_processor(
            BatchLogRecordProcessor(HttpLogExporter() if http("LOGS") else GrpcLogExporter())
        )
        return cls(tracer_provider, meter_provider, logger_provider)

    def record(self) -> None:
        _record(self.tracer_provider, self.meter_provider)
        for index in range(LOGS):
            self.logger_provider.get_logger(LOGGER).emit(
                LogRecord(
                    severity_number=SeverityNumber.WARN,
                    body="parity log",
                    attributes={"long": LONG_VALUE, "index": index},
                )
            )

    def flush(self) -> None:
        self.tracer_provider.force_flush(10_000)
        self.meter_provider.force_flush(10_000)
        self.logger_provider.force_flush(10_000)

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        self.logger_provider.shutdown()


def _record(tracer_provider: Any, meter_provider: Any) -> None:
    """Spans, each with an event and a link and counting a request inside it (so the default
    exemplar filter keeps one)."""
    tracer = tracer_provider.get_tracer("kaos_otel")
    requests = meter_provider.get_meter("kaos_otel").create_counter("kaos.requests")
    for index in range(SPANS):
        attributes: dict[str, AttributeValue] = {"long": LONG_VALUE, "index": index}
        link = Link(LINKED, attributes)
        with tracer.start_as_current_span("parity", attributes=attributes, links=[link]) as span:
            span.add_event("parity event", attributes)
            requests.add(1, {"kaos.outcome": "success"})


def _record_on_manager(manager: KaosOtelManager) -> None:
    """The same telemetry as :meth:`PlainSdk.record`, the log records through Python ``logging``
    (which the manager bridges)."""
    _record(manager.tracer_provider, manager.meter_provider)
    for index in range(LOGS):
        logging.getLogger(LOGGER).warning("parity log", extra={"long": LONG_VALUE, "index": index})


def _received(server: Recorder) -> list[Request]:
    with server.lock:
        # a metric export holding nothing but the manager's own health metric (with delta
        # temporality, the one at shutdown) has no counterpart in the plain SDK
        requests = [r for r in server.requests if r.metrics or not r.path.endswith("metrics")]
    return sorted(requests, key=lambda r: (r.path, len(r.spans), r.metrics, len(r.logs)))


@contextmanager
def both_setups(
    environ: Env, ours: str, theirs: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[KaosOtelManager, PlainSdk]]:
    """The manager, then the plain SDK, each built from the environment naming its own endpoint
    (``ours``, ``theirs``); both shut down at the end."""
    for name, value in environ(ours).items():
        monkeypatch.setenv(name, value)
    manager = KaosOtelManager(global_providers=False)
    for name, value in environ(theirs).items():
        monkeypatch.setenv(name, value)
    plain = PlainSdk.from_environment()
    try:
        yield manager, plain
    finally:
        manager.shutdown(5)
        plain.shutdown()


def _export_both(
    environ: Env, ours: Recorder, theirs: Recorder, monkeypatch: pytest.MonkeyPatch
) -> KaosOtelManager:
    """Record the same telemetry on both setups and flush; returns the (shut down) manager."""
    with both_setups(environ, ours.endpoint, theirs.endpoint, monkeypatch) as (manager, plain):
        if manager.enabled:
            _record_on_manager(manager)
            manager.force_flush(10)
        plain.record()
        plain.flush()
    return manager


@pytest.mark.parametrize("case", sorted(CASES))
def test_manager_and_plain_sdk_export_alike(
    case: str, servers: tuple[RecordingServer, RecordingServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = servers
    _export_both(CASES[case], ours, theirs, monkeypatch)
    plain = _received(theirs)
    assert _received(ours) == plain
    if case in ("sdk disabled", "sampler always_off", "sampler ratio 0"):
        assert not any(request.spans for request in plain), plain
    else:
        assert sum(len(request.spans) for request in plain) == SPANS, plain
        spans = [span for request in plain for span in request.spans]
        event_attributes = [attributes for span in spans for _, attributes in span.events]
        link_attributes = [attributes for span in spans for attributes in span.links]
        for found, count_case, attribute_case in (
            (event_attributes, "span event count limit", "event attribute count limit"),
            (link_attributes, "span link count limit", "link attribute count limit"),
        ):
            assert len(found) == (0 if case == count_case else SPANS), found
            attribute_count = 1 if case in (attribute_case, "general attribute count limit") else 2
            assert all(len(attributes) == attribute_count for attributes in found), found
    assert sum(len(request.logs) for request in plain) == (0 if case == "sdk disabled" else LOGS), plain
    # each export of the request counter (the flush's, then shutdown's): its temporality, and an
    # exemplar from a sampled span unless the filter is off or no span was sampled
    counted = [metric for request in plain for metric in request.metrics if metric.name == "kaos.requests"]
    if case != "sdk disabled":
        delta = case == "metric temporality preference"
        temporality = AggregationTemporality.DELTA if delta else AggregationTemporality.CUMULATIVE
        assert {(metric.kind, metric.temporality) for metric in counted} == {("sum", temporality)}, counted
        no_sampled_span = case in ("exemplar filter", "sampler always_off", "sampler ratio 0")
        assert max(metric.exemplars for metric in counted) == (0 if no_sampled_span else 1), counted


@dataclass(frozen=True)
class Tls:
    """PEM files of a test CA, a server certificate for 127.0.0.1 and a client certificate it
    signed, and of a second CA that signed neither."""

    ca: Path
    server_certificate: Path
    server_key: Path
    client_certificate: Path
    client_key: Path
    other_ca: Path

    def server_context(self, *, client_certificates: bool = False) -> ssl.SSLContext:
        """The HTTPS server's context; ``client_certificates``: require one signed by the CA."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_certificate, self.server_key)
        if client_certificates:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.ca)
        return context


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None = None,
    *,
    server: bool = False,
) -> x509.Certificate:
    """A certificate for ``key``: a self-signed CA without ``issuer``, else a leaf it signs."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, written as PEM files."""
    directory = tmp_path_factory.mktemp("tls")

    def write(name: str, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
        certificate_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
        certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return certificate_path, key_path

    ca_key, other_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("kaos-otel test CA", ca_key)
    issuer = (ca.subject, ca_key)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_path, _ = write("ca", ca, ca_key)
    other_ca_path, _ = write("other-ca", _certificate("another CA", other_key), other_key)
    server_paths = write("server", _certificate("127.0.0.1", server_key, issuer, server=True), server_key)
    client_paths = write("client", _certificate("kaos-otel client", client_key, issuer), client_key)
    return Tls(ca_path, *server_paths, *client_paths, other_ca_path)


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


TlsEnv = Callable[[Tls], Mapping[str, str]]
FAIL_FAST = {"OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
"""Cases where some signal cannot be delivered: its exporter gives up after a second."""
ALL_SIGNALS = ("logs", "metrics", "traces")
TLS_CASES: dict[str, tuple[TlsEnv, tuple[str, ...]]] = {
    "certificate": (lambda tls: {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls.ca)}, ALL_SIGNALS),
    "per-signal certificate": (
        lambda tls: {
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(tls.ca),
            "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": str(tls.ca),
            "OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE": str(tls.ca),
        },
        ALL_SIGNALS,
    ),
    "per-signal certificate over the base": (
        lambda tls: {
            **FAIL_FAST,
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls.other_ca),
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(tls.ca),
        },
        ("traces",),
    ),
    "no certificate": (lambda tls: FAIL_FAST, ()),
    "certificate of another CA": (
        lambda tls: {**FAIL_FAST, "OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls.other_ca)},
        (),
    ),
    "client certificate": (
        lambda tls: {
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls.ca),
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(tls.client_certificate),
            "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(tls.client_key),
        },
        ALL_SIGNALS,
    ),
    "client certificate missing": (
        lambda tls: {**FAIL_FAST, "OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls.ca)},
        (),
    ),
}


@pytest.mark.parametrize("case", sorted(TLS_CASES))
def test_https_endpoint_and_certificates(case: str, tls: Tls, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over HTTPS the certificate variables decide, for both setups alike, what is delivered; what
    is not is refused at the TLS handshake, and the manager does not raise into the caller."""
    tls_environ, delivered = TLS_CASES[case]
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        # requests lets these beat a session's own CA file, the one the SDK sets from
        # OTEL_EXPORTER_OTLP_*CERTIFICATE (psf/requests#4726): with them, neither setup trusts the CA
        monkeypatch.delenv(name, raising=False)
    context = tls.server_context(client_certificates=case.startswith("client certificate"))
    with serving(context) as (ours, theirs):
        manager = _export_both(
            lambda url: {**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": url, **tls_environ(tls)},
            ours,
            theirs,
            monkeypatch,
        )
        plain = _received(theirs)
        assert _received(ours) == plain
        assert sorted({request.path.rsplit("/", 1)[-1] for request in plain}) == list(delivered), plain
        if "traces" in delivered:
            assert sum(len(request.spans) for request in plain) == SPANS, plain
        if len(delivered) < len(ALL_SIGNALS):  # both setups tried, and the server refused the handshake
            assert _wait_until(lambda: ours.failed_handshakes > 0 and theirs.failed_handshakes > 0, 10)
            assert manager.health.dropped() > 0


GRPC_SIGNALS: dict[type[Any], tuple[str, Callable[[], Any]]] = {
    trace_service_pb2.ExportTraceServiceRequest: ("traces", trace_service_pb2.ExportTraceServiceResponse),
    metrics_service_pb2.ExportMetricsServiceRequest: (
        "metrics",
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
    logs_service_pb2.ExportLogsServiceRequest: ("logs", logs_service_pb2.ExportLogsServiceResponse),
}
"""Each OTLP/gRPC request type: its signal and its response."""


class GrpcRecordingServer(
    trace_service_pb2_grpc.TraceServiceServicer,
    metrics_service_pb2_grpc.MetricsServiceServicer,
    logs_service_pb2_grpc.LogsServiceServicer,
):
    """An OTLP/gRPC endpoint over TLS (the test CA's server certificate) recording every request."""

    def __init__(self, tls: Tls) -> None:
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        credentials = grpc.ssl_server_credentials(
            [(tls.server_key.read_bytes(), tls.server_certificate.read_bytes())]
        )
        self.endpoint = f"https://127.0.0.1:{self._server.add_secure_port('127.0.0.1:0', credentials)}"
        self._server.start()

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        signal, response = GRPC_SIGNALS[type(request)]
        metadata = dict(context.invocation_metadata())
        headers = {name: str(metadata.get(name, "")) for name in OBSERVED_HEADERS}
        with self.lock:
            self.requests.append(_decode(f"grpc/{signal}", headers, request.SerializeToString()))
        return response()

    def stop(self) -> None:
        self._server.stop(grace=None).wait()


GRPC_TLS_CASES: dict[str, tuple[TlsEnv, tuple[str, ...]]] = {
    "certificate": (lambda tls: {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls.ca)}, ALL_SIGNALS),
    "per-signal certificate": (
        lambda tls: {
            f"OTEL_EXPORTER_OTLP_{signal.upper()}_CERTIFICATE": str(tls.ca) for signal in ALL_SIGNALS
        },
        ALL_SIGNALS,
    ),
    "no certificate": (lambda tls: FAIL_FAST, ()),
}


@pytest.mark.parametrize("case", sorted(GRPC_TLS_CASES))
def test_grpc_over_tls_and_certificates(case: str, tls: Tls, monkeypatch: pytest.MonkeyPatch) -> None:
    """OTLP/gRPC to an ``https`` endpoint: the certificate variables decide alike for both setups."""
    tls_environ, delivered = GRPC_TLS_CASES[case]
    ours, theirs = GrpcRecordingServer(tls), GrpcRecordingServer(tls)
    try:
        manager = _export_both(
            lambda url: {
                "OTEL_EXPORTER_OTLP_ENDPOINT": url,
                "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=t1",
                **tls_environ(tls),
            },
            ours,
            theirs,
            monkeypatch,
        )
    finally:
        ours.stop()
        theirs.stop()
    plain = _received(theirs)
    assert _received(ours) == plain
    assert sorted({request.path.rsplit("/", 1)[-1] for request in plain}) == list(delivered), plain
    if delivered:
        assert sum(len(request.spans) for request in plain) == SPANS, plain
        assert {request.headers["x-tenant"] for request in plain} == {"t1"}, plain
    else:
        assert manager.health.dropped() > 0


def test_metric_export_interval(
    servers: tuple[RecordingServer, RecordingServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OTEL_METRIC_EXPORT_INTERVAL``: both setups export metrics on their own, without a flush,
    on that interval (the default, 60 s, is longer than the wait)."""
    ours, theirs = servers

    def environ(url: str) -> Mapping[str, str]:
        return {**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_METRIC_EXPORT_INTERVAL": "100"}

    def exports(server: RecordingServer) -> list[Request]:
        return [
            request
            for request in _received(server)
            if any(metric.name == "kaos.requests" for metric in request.metrics)
        ]

    with both_setups(environ, ours.endpoint, theirs.endpoint, monkeypatch) as (manager, plain):
        _record_on_manager(manager)
        plain.record()
        assert _wait_until(lambda: len(exports(ours)) >= 2 and len(exports(theirs)) >= 2, 30)
        assert exports(ours)[0] == exports(theirs)[0]


def test_catalog_histograms_keep_their_buckets_whatever_the_default_aggregation(
    servers: tuple[RecordingServer, RecordingServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION``, the one deliberate difference:
    the plain SDK's histogram becomes exponential, the manager's catalog histograms keep their
    explicit buckets (SigNoz drops exponential histograms)."""
    ours, theirs = servers
    name = catalog.KAOS_REQUEST_DURATION

    def environ(url: str) -> Mapping[str, str]:
        return {
            **HTTP,
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "base2_exponential_bucket_histogram",
        }

    def kinds(server: RecordingServer) -> set[str]:
        metrics = [metric for request in _received(server) for metric in request.metrics]
        return {metric.kind for metric in metrics if metric.name == name}

    with both_setups(environ, ours.endpoint, theirs.endpoint, monkeypatch) as (manager, plain):
        for provider in (manager.meter_provider, plain.meter_provider):
            histogram = provider.get_meter("kaos_otel").create_histogram(
                name, unit=catalog.METRICS_BY_NAME[name].unit
            )
            histogram.record(0.2, {catalog.KAOS_OUTCOME: "success"})
        manager.force_flush(10)
        plain.flush()
    assert kinds(theirs) == {"exponential_histogram"}
    assert kinds(ours) == {"histogram"}


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE"])
def test_grpc_insecure_and_endpoint_without_scheme(
    variable: str, otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``host:port`` with the insecure flag reaches a plaintext gRPC receiver, as with the plain SDK."""
    address = otlp_receiver.grpc_endpoint.removeprefix("http://")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", address)
    monkeypatch.setenv(variable, "true")
    manager = KaosOtelManager("insecure", global_providers=False, bridge_logging=False)
    plain = PlainSdk.from_environment()
    try:
        with manager.span("kaos"):
            pass
        plain.tracer_provider.get_tracer("plain").start_span("plain").end()
        assert manager.force_flush(10)
        assert plain.tracer_provider.force_flush(10_000)
        assert otlp_receiver.wait_for(lambda r: {s.name for s in r.spans()} == {"kaos", "plain"}, 10)
    finally:
        manager.shutdown(5)
        plain.shutdown()


@pytest.mark.usefixtures("unsaid_notices")
def test_batch_settings_the_sdk_would_refuse_are_replaced_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the SDK's batch processors raise ValueError for each of these; telemetry must not, and says so
    environ = {
        "OTEL_BSP_SCHEDULE_DELAY": "0",
        "OTEL_BSP_MAX_QUEUE_SIZE": "100",
        "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE": "many",
    }
    with caplog.at_level(logging.WARNING, logger="kaos_otel"):
        spans = BatchSettings.for_spans(environ)
        logs = BatchSettings.for_logs(environ)
    assert (spans.max_queue_size, spans.max_export_batch_size, spans.schedule_delay_ms) == (100, 100, 5000)
    # kaos-otel's log batch (128: a batch of capped records stays under a receiver's 4 MiB)
    assert (logs.max_queue_size, logs.max_export_batch_size, logs.schedule_delay_ms) == (2048, 128, 1000)
    warnings = "\n".join(record.getMessage() for record in caplog.records)
    assert "OTEL_BSP_SCHEDULE_DELAY='0' is not a positive integer; the default 5000 is used" in warnings
    assert "OTEL_BSP_MAX_EXPORT_BATCH_SIZE (512) is larger than OTEL_BSP_MAX_QUEUE_SIZE (100)" in warnings
    assert "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE='many' is not a positive integer" in warnings


@pytest.mark.parametrize(
    "override",
    [
        {"disabled": "false"},
        {"console": "false"},
        {"disabled": 0},
        {"endpoint": b"http://127.0.0.1:4318"},
        {"service_name": 7},
    ],
)
def test_a_switch_or_text_of_another_type_is_refused_by_name(override: dict[str, object]) -> None:
    # disabled="false" read as truthy turned telemetry off; console="false" turned stdout on
    (name,) = override
    with pytest.raises(TypeError, match=f"kaos-otel: {name} must be"):
        KaosOtelManager(global_providers=False, **override)  # type: ignore[arg-type]
    on = KaosOtelManager("switches", global_providers=False, disabled=False, console=False)
    try:
        assert on.enabled and not on.settings.console
    finally:
        on.shutdown(5)


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_service_name_keeps_the_environments(blank: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # KaosOtelManager(os.environ.get("AGENT_NAME", "")) exported as unknown_service:python
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    manager = KaosOtelManager(blank, global_providers=False)
    try:
        resource = manager.pipeline.tracer_provider.resource  # type: ignore[attr-defined]
        assert resource.attributes["service.name"] == "from-env"
    finally:
        manager.shutdown(5)


EXPLICIT_HEADERS = {"x-tenant": "explicit"}
EXPLICIT_HEADERS_CASES: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "base headers": (
        {"OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=env,x-signal=base"},
        {signal: "base" for signal in ALL_SIGNALS},
    ),
    "per-signal headers": (
        {
            "OTEL_EXPORTER_OTLP_HEADERS": "x-signal=base",
            **{
                f"OTEL_EXPORTER_OTLP_{signal.upper()}_HEADERS": f"X-Tenant=env, x-signal={signal}"
                for signal in ALL_SIGNALS
            },
        },
        {signal: signal for signal in ALL_SIGNALS},
    ),
}
"""The variables' headers, and the ``x-signal`` each signal sends with them."""


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("case", sorted(EXPLICIT_HEADERS_CASES))
def test_explicit_headers_override_those_of_the_same_name_and_keep_the_others_over_both_protocols(
    case: str, protocol: str, tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``headers=`` replaces the variables' header of the same name and keeps the others (the
    signal's variable, else the base), over gRPC as over HTTP (a manager given ``headers=`` lost
    the variables' authorization header over gRPC only)."""
    environ, signal_headers = EXPLICIT_HEADERS_CASES[case]
    server: GrpcRecordingServer | RecordingServer
    if protocol == "grpc":
        server = GrpcRecordingServer(tls)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(tls.ca))
    else:
        server = RecordingServer()
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    for name, value in {**environ, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}.items():
        monkeypatch.setenv(name, value)
    manager = KaosOtelManager(endpoint=server.endpoint, headers=EXPLICIT_HEADERS, global_providers=False)
    try:
        _record_on_manager(manager)
        assert manager.force_flush(10)
    finally:
        manager.shutdown(5)
        if isinstance(server, GrpcRecordingServer):
            server.stop()
        else:
            server.shutdown()
            server.server_close()
    received = {
        (request.path.rsplit("/", 1)[-1], request.headers["x-tenant"], request.headers["x-signal"])
        for request in server.requests
    }
    assert received == {(signal, "explicit", signal_headers[signal]) for signal in ALL_SIGNALS}, received


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"])
def test_a_timeout_the_sdk_cannot_read_is_named_in_the_error(
    variable: str, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timeout variable that is not a number: where the plain SDK's exporter raises (gRPC), the
    manager's error names the variable (it said only ``could not convert string to float``);
    where the SDK reads it as its default, with a warning, so does the manager."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv(variable, "5s")
    try:
        (HttpMetricExporter if protocol == "http/protobuf" else GrpcMetricExporter)().shutdown()
    except ValueError:
        with pytest.raises(ValueError, match=f"kaos-otel: {variable}='5s' is not a number of seconds"):
            KaosOtelManager(global_providers=False, bridge_logging=False)
    else:
        KaosOtelManager(global_providers=False, bridge_logging=False).shutdown(5)
