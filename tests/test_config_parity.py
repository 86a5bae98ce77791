"""Configuration parity: given the same ``OTEL_*`` environment, a kaos-otel manager and a plain SDK
setup export to the same place with the same settings.

Each case sets one group of variables the SDK or the OTLP exporters honour, then builds both a
:class:`~kaos_otel.KaosOtelManager` and the plain SDK (``TracerProvider`` + ``BatchSpanProcessor``
+ the OTLP exporter the protocol names, ``MeterProvider`` + ``PeriodicExportingMetricReader``),
records one span and one counter on each, and compares what real receivers got: which server and
URL path, the request headers and compression, the resource, span names and attribute values
(limits), how many spans per request (batch size), and whether anything arrived (sampler,
``OTEL_SDK_DISABLED``).
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from kaos_otel import KaosOtelManager
from kaos_otel.receiver import OtlpReceiver

OBSERVED_HEADERS = ("x-tenant", "x-signal", "content-encoding", "content-type")
LONG_VALUE = "v" * 40
SPANS = 5


@dataclass
class Request:
    """One OTLP/HTTP request as the server saw it, reduced to what a setting can change."""

    path: str
    headers: dict[str, str]
    spans: list[tuple[str, tuple[tuple[str, Any], ...]]] = field(default_factory=list)
    resource: tuple[tuple[str, Any], ...] = ()
    metric_names: tuple[str, ...] = ()


class RecordingServer(ThreadingHTTPServer):
    """An OTLP/HTTP endpoint that records every request (path, headers, decoded payload)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[Request] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: RecordingServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding", "") == "gzip":
            body = gzip.decompress(body)
        headers = {name: self.headers.get(name, "") for name in OBSERVED_HEADERS}
        request = Request(self.path, headers)
        if self.path.endswith("traces"):
            traces = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            for resource_spans in traces.resource_spans:
                request.resource = _kv(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    request.spans += [(span.name, _kv(span.attributes)) for span in scope.spans]
        elif self.path.endswith("metrics"):
            metrics = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
            request.metric_names = tuple(
                sorted(
                    metric.name
                    for resource_metrics in metrics.resource_metrics
                    for scope in resource_metrics.scope_metrics
                    for metric in scope.metrics
                    if metric.name != "kaos.telemetry.dropped"  # the manager's own health metric
                )
            )
        with self.server.lock:
            self.server.requests.append(request)
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def _kv(attributes: Any) -> tuple[tuple[str, Any], ...]:
    pairs = []
    for kv in attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        pairs.append((kv.key, getattr(value, kind) if kind else None))
    # the SDK's own attributes differ by instance (service.instance.id) and are compared elsewhere
    return tuple(sorted(pair for pair in pairs if pair[0] != "service.instance.id"))


@pytest.fixture
def servers() -> Iterator[tuple[RecordingServer, RecordingServer]]:
    """Two recording servers: one for the kaos-otel manager, one for the plain SDK."""
    pair = (RecordingServer(), RecordingServer())
    for server in pair:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield pair
    for server in pair:
        server.shutdown()
        server.server_close()


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
    },
    "per-signal endpoint over the base": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url + "/v1/traces",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": url + "/v1/metrics",
    },
    "per-signal protocol": lambda url: {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
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
    "attribute count limit": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "1",
    },
    "batch size": lambda url: {
        **HTTP,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2",
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
    },
    "sdk disabled": lambda url: {**HTTP, "OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SDK_DISABLED": "true"},
}


def _plain_sdk() -> tuple[TracerProvider, MeterProvider]:
    """What an application without kaos-otel would build from the same environment."""
    import os

    def protocol(signal: str) -> str:
        return os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
        )

    span_exporter = HttpSpanExporter() if protocol("TRACES") == "http/protobuf" else GrpcSpanExporter()
    metric_exporter = HttpMetricExporter() if protocol("METRICS") == "http/protobuf" else GrpcMetricExporter()
    tracer_provider = TracerProvider(resource=Resource.create(), shutdown_on_exit=False)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    meter_provider = MeterProvider(
        metric_readers=[PeriodicExportingMetricReader(metric_exporter)],
        resource=Resource.create(),
        shutdown_on_exit=False,
    )
    return tracer_provider, meter_provider


def _record(tracer_provider: Any, meter_provider: Any) -> None:
    tracer = tracer_provider.get_tracer("kaos_otel")
    for index in range(SPANS):
        with tracer.start_as_current_span("parity", attributes={"long": LONG_VALUE, "index": index}):
            pass
    meter_provider.get_meter("kaos_otel").create_counter("kaos.requests").add(1, {"kaos.outcome": "success"})


def _received(server: RecordingServer) -> list[Request]:
    with server.lock:
        requests = list(server.requests)
    return sorted(requests, key=lambda r: (r.path, len(r.spans), r.metric_names))


@pytest.mark.parametrize("case", sorted(CASES))
def test_manager_and_plain_sdk_export_alike(
    case: str, servers: tuple[RecordingServer, RecordingServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = servers
    for name, value in CASES[case](ours.endpoint).items():
        monkeypatch.setenv(name, value)
    manager = KaosOtelManager(global_providers=False, bridge_logging=False)
    for name, value in CASES[case](theirs.endpoint).items():
        monkeypatch.setenv(name, value)
    tracer_provider, meter_provider = _plain_sdk()
    try:
        if manager.enabled:
            _record(manager.tracer_provider, manager.meter_provider)
            manager.force_flush(10)
        _record(tracer_provider, meter_provider)
        tracer_provider.force_flush(10_000)
        meter_provider.force_flush(10_000)
    finally:
        manager.shutdown(5)
        tracer_provider.shutdown()
        meter_provider.shutdown()
    plain = _received(theirs)
    assert _received(ours) == plain
    if case in ("sdk disabled", "sampler always_off", "sampler ratio 0"):
        assert not any(request.spans for request in plain), plain
    else:
        assert sum(len(request.spans) for request in plain) == SPANS, plain


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE"])
def test_grpc_insecure_and_endpoint_without_scheme(
    variable: str, otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``host:port`` with the insecure flag reaches a plaintext gRPC receiver, as with the plain SDK."""
    address = otlp_receiver.grpc_endpoint.removeprefix("http://")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", address)
    monkeypatch.setenv(variable, "true")
    manager = KaosOtelManager("insecure", global_providers=False, bridge_logging=False)
    tracer_provider, meter_provider = _plain_sdk()
    try:
        with manager.span("kaos"):
            pass
        tracer_provider.get_tracer("plain").start_span("plain").end()
        assert manager.force_flush(10)
        assert tracer_provider.force_flush(10_000)
        assert otlp_receiver.wait_for(lambda r: {s.name for s in r.spans()} == {"kaos", "plain"}, 10)
    finally:
        manager.shutdown(5)
        tracer_provider.shutdown()
        meter_provider.shutdown()
