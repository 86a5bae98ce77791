"""OtlpReceiver end to end: the real OTLP exporters of the SDK over gRPC and HTTP/protobuf."""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import re
import socket
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from kaos_otel import cli
from kaos_otel import receiver as receiver_module
from kaos_otel.receiver import OtlpReceiver, ReceivedSpan, load_otlp_json

BOUNDS = (0.1, 1.0, 10.0)
MAX_REQUEST_BYTES = 20 * 1024 * 1024
"""The OpenTelemetry Collector's default OTLP/HTTP request body limit, which the receiver follows."""
Protocol = str  # "grpc", "http" or "http-gzip"


@dataclass
class Pipeline:
    """Raw SDK providers exporting over OTLP to one receiver."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    logger_provider: LoggerProvider

    def flush(self) -> None:
        """Export everything recorded so far."""
        assert self.tracer_provider.force_flush()
        assert self.meter_provider.force_flush()
        assert self.logger_provider.force_flush()

    def shutdown(self) -> None:
        """Shut all providers down."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        self.logger_provider.shutdown()


def make_pipeline(receiver: OtlpReceiver, protocol: Protocol, service: str = "receiver-test") -> Pipeline:
    """Build TracerProvider/MeterProvider/LoggerProvider with OTLP exporters for ``protocol``."""
    resource = Resource.create({"service.name": service, "deployment.environment.name": "test"})
    if protocol == "grpc":
        endpoint = receiver.grpc_endpoint
        span_exporter: GrpcSpanExporter | HttpSpanExporter = GrpcSpanExporter(
            endpoint=endpoint, insecure=True
        )
        metric_exporter: GrpcMetricExporter | HttpMetricExporter = GrpcMetricExporter(
            endpoint=endpoint, insecure=True
        )
        log_exporter: GrpcLogExporter | HttpLogExporter = GrpcLogExporter(endpoint=endpoint, insecure=True)
    else:
        base = receiver.http_endpoint
        compression = Compression.Gzip if protocol == "http-gzip" else Compression.NoCompression
        span_exporter = HttpSpanExporter(endpoint=f"{base}/v1/traces", compression=compression)
        metric_exporter = HttpMetricExporter(endpoint=f"{base}/v1/metrics", compression=compression)
        log_exporter = HttpLogExporter(endpoint=f"{base}/v1/logs", compression=compression)
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=3_600_000)
    view = View(instrument_name="test.duration", aggregation=ExplicitBucketHistogramAggregation(list(BOUNDS)))
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader], views=[view])
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
    return Pipeline(tracer_provider, meter_provider, logger_provider)


def emit_sample(pipeline: Pipeline) -> None:
    """Record a small request trace (with an error span), metrics and logs."""
    tracer = pipeline.tracer_provider.get_tracer("test.scope")
    meter = pipeline.meter_provider.get_meter("test.scope")
    logger = pipeline.logger_provider.get_logger("test.scope")
    with tracer.start_as_current_span("other") as other:
        other_context = other.get_span_context()
    with tracer.start_as_current_span(
        "POST /chat", kind=SpanKind.SERVER, attributes={"http.route": "/chat"}
    ) as root:
        root.set_status(Status(StatusCode.OK))
        with tracer.start_as_current_span(
            "chat model-x",
            kind=SpanKind.CLIENT,
            attributes={"gen_ai.request.model": "model-x", "tags": ["a", "b"], "tokens": 12, "ratio": 0.5},
            links=[Link(other_context, {"link.reason": "follows"})],
        ) as chat:
            chat.add_event("first_token", {"position": 1})
            logger.emit(
                body="model answered",
                severity_number=SeverityNumber.INFO,
                severity_text="INFO",
                attributes={"needle": "haystack-42"},
                event_name="test.answer",
            )
        with pytest.raises(ValueError), tracer.start_as_current_span("delegate ghost"):
            raise ValueError("unknown agent 'ghost'")
    logger.emit(body={"structured": [1, 2]}, severity_number=SeverityNumber.WARN, severity_text="WARN")
    meter.create_counter("test.requests", unit="{request}").add(3, {"outcome": "success"})
    meter.create_up_down_counter("test.inflight").add(-2)
    histogram = meter.create_histogram("test.duration", unit="s", description="Request duration")
    for value in (0.05, 0.5, 0.7, 20.0):
        histogram.record(value, {"outcome": "success"})


def by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    """Index spans by name (names are unique in the sample)."""
    return {s.name: s for s in spans}


@pytest.mark.parametrize("protocol", ["grpc", "http", "http-gzip"])
def test_receives_traces_metrics_and_logs(otlp_receiver: OtlpReceiver, protocol: Protocol) -> None:
    pipeline = make_pipeline(otlp_receiver, protocol)
    try:
        emit_sample(pipeline)
        pipeline.flush()
        assert otlp_receiver.wait_for(
            lambda r: len(r.spans()) == 4 and len(r.logs()) == 2 and len(r.metric_points()) >= 3, timeout=10
        )
    finally:
        pipeline.shutdown()

    spans = by_name(otlp_receiver.spans())
    root, chat, failed, other = (
        spans["POST /chat"],
        spans["chat model-x"],
        spans["delegate ghost"],
        spans["other"],
    )
    assert root.parent_span_id is None
    assert chat.parent_span_id == root.span_id and failed.parent_span_id == root.span_id
    assert {chat.trace_id, failed.trace_id} == {root.trace_id}
    assert len(root.trace_id) == 32 and len(root.span_id) == 16 and root.trace_id == root.trace_id.lower()
    assert (root.kind, chat.kind, failed.kind) == ("SERVER", "CLIENT", "INTERNAL")
    assert root.status_code == "OK" and chat.status_code == "UNSET"
    assert chat.attributes == {
        "gen_ai.request.model": "model-x",
        "tags": ("a", "b"),
        "tokens": 12,
        "ratio": 0.5,
    }
    assert [(e.name, e.attributes) for e in chat.events] == [("first_token", {"position": 1})]
    assert [tuple(link) for link in chat.links] == [
        (other.trace_id, other.span_id, {"link.reason": "follows"})
    ]
    assert failed.status_code == "ERROR" and "unknown agent" in failed.status_message
    exception = next(e for e in failed.events if e.name == "exception")
    assert exception.attributes["exception.type"] == "ValueError"
    assert root.service_name == "receiver-test" and root.resource["deployment.environment.name"] == "test"
    assert root.scope_name == "test.scope"
    assert 0 <= chat.duration_s <= root.duration_s < 10

    answer, warning = otlp_receiver.logs()
    assert (answer.body, answer.severity_text, answer.severity_number) == ("model answered", "INFO", 9)
    assert (answer.trace_id, answer.span_id) == (chat.trace_id, chat.span_id)
    assert answer.event_name == "test.answer" and answer.attributes == {"needle": "haystack-42"}
    assert answer.service_name == "receiver-test" and answer.scope_name == "test.scope"
    assert warning.body == {"structured": (1, 2)}
    assert warning.trace_id is None and warning.span_id is None

    points = {p.name: p for p in otlp_receiver.metric_points()}
    requests = points["test.requests"]
    assert (requests.kind, requests.is_monotonic, requests.value) == ("sum", True, 3)
    assert requests.attributes == {"outcome": "success"} and requests.unit == "{request}"
    inflight = points["test.inflight"]
    assert (inflight.kind, inflight.is_monotonic, inflight.value) == ("sum", False, -2)
    duration = points["test.duration"]
    assert (duration.kind, duration.unit, duration.description) == ("histogram", "s", "Request duration")
    assert duration.explicit_bounds == BOUNDS
    assert duration.bucket_counts == (1, 2, 0, 1)
    assert duration.count == 4 and duration.sum == pytest.approx(21.25)
    assert (duration.min, duration.max) == (0.05, 20.0)
    assert duration.resource["service.name"] == "receiver-test" and duration.time_unix_nano > 0

    assert any("haystack-42" in str(request) for request in otlp_receiver.raw_requests())
    otlp_receiver.clear()
    assert otlp_receiver.spans() == [] and otlp_receiver.raw_requests() == []


def test_json_lines_round_trip_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "otlp.jsonl"
    with OtlpReceiver(json_path=path) as receiver:
        pipeline = make_pipeline(receiver, "grpc", service="coordinator")
        try:
            emit_sample(pipeline)
            pipeline.flush()
            assert receiver.wait_for(lambda r: len(r.spans()) == 4 and len(r.logs()) == 2, timeout=10)
        finally:
            pipeline.shutdown()
        live_spans, live_points, live_logs = receiver.spans(), receiver.metric_points(), receiver.logs()

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert {next(iter(doc)) for doc in lines} == {"resourceSpans", "resourceMetrics", "resourceLogs"}
    first_span = next(doc for doc in lines if "resourceSpans" in doc)["resourceSpans"][0]["scopeSpans"][0][
        "spans"
    ][0]
    assert first_span["traceId"] in {s.trace_id for s in live_spans}  # OTLP/JSON ids are hex, not base64
    assert isinstance(first_span["kind"], int)

    loaded = load_otlp_json(path)
    assert (loaded.spans, loaded.metric_points, loaded.logs) == (live_spans, live_points, live_logs)

    assert cli.main(["traces", "show", str(path)]) == 0
    out = capsys.readouterr().out
    root = by_name(live_spans)["POST /chat"]
    assert f"trace {root.trace_id} (" in out and "3 spans)" in out
    assert "└─ coordinator  POST /chat  " in out
    assert "   ├─ coordinator  chat model-x  " in out
    assert "   └─ coordinator  delegate ghost  " in out and "  ERROR\n" in out
    assert "! ValueError: unknown agent 'ghost'" in out
    assert "\x1b[" not in out

    assert cli.main(["traces", "show", str(path), "--trace-id", root.trace_id[:8]]) == 0
    filtered = capsys.readouterr().out
    assert root.trace_id in filtered and "other" not in filtered


def test_cli_reports_missing_and_malformed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["traces", "show", str(tmp_path / "absent.jsonl")]) == 1
    assert "cannot read" in capsys.readouterr().err
    malformed = tmp_path / "bad.jsonl"
    malformed.write_text('{"resourceSpans": []}\n{"resourceSpans": [{"scopeSpans": 7}]}\n')
    assert cli.main(["traces", "show", str(malformed)]) == 1
    err = capsys.readouterr().err
    assert f"{malformed}:2:" in err and "Traceback" not in err
    malformed.write_text("not json\n")
    assert cli.main(["traces", "show", str(malformed)]) == 1
    assert f"{malformed}:1:" in capsys.readouterr().err


def finished_spans() -> tuple[ReadableSpan, ...]:
    """One finished span to hand to exporters directly."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("probe"):
        pass
    provider.shutdown()
    return memory.get_finished_spans()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_failure_modes(otlp_receiver: OtlpReceiver, protocol: Protocol) -> None:
    spans = finished_spans()
    exporter: GrpcSpanExporter | HttpSpanExporter
    if protocol == "grpc":
        exporter = GrpcSpanExporter(endpoint=otlp_receiver.grpc_endpoint, insecure=True, timeout=1)
    else:
        exporter = HttpSpanExporter(endpoint=f"{otlp_receiver.http_endpoint}/v1/traces", timeout=1)
    try:
        otlp_receiver.set_failure("unavailable")
        assert exporter.export(spans) == SpanExportResult.FAILURE
        otlp_receiver.set_failure("hang")
        started = time.monotonic()
        assert exporter.export(spans) == SpanExportResult.FAILURE
        assert time.monotonic() - started < 5
        assert otlp_receiver.spans() == []
        otlp_receiver.set_failure("ok")
        assert exporter.export(spans) == SpanExportResult.SUCCESS
        assert [s.name for s in otlp_receiver.spans()] == ["probe"]
    finally:
        exporter.shutdown()


def post(url: str, body: bytes, content_type: str) -> int:
    """POST and return the HTTP status."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            status: int = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    return status


def json_span_document(name: str) -> bytes:
    """One OTLP/JSON trace export request holding one span called ``name``."""
    span = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": name}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


def test_http_status_codes_and_otlp_json(otlp_receiver: OtlpReceiver) -> None:
    base = otlp_receiver.http_endpoint
    document = json_span_document("json-span")
    assert post(f"{base}/v1/unknown", b"", "application/x-protobuf") == 404
    assert post(f"{base}/v1/traces", b"", "text/plain") == 415
    assert post(f"{base}/v1/traces", b"\xff\xff", "application/x-protobuf") == 400
    otlp_receiver.set_failure("unavailable")
    assert post(f"{base}/v1/traces", document, "application/json") == 503
    otlp_receiver.set_failure("ok")
    assert post(f"{base}/v1/traces", document, "application/json") == 200
    (received,) = otlp_receiver.spans()
    assert (received.trace_id, received.span_id, received.name) == (
        "0af7651916cd43dd8448eb211c80319c",
        "b7ad6b7169203331",
        "json-span",
    )


def test_stop_releases_hung_exports() -> None:
    receiver = OtlpReceiver().start()
    exporter = GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True, timeout=3)
    receiver.set_failure("hang")
    results: list[SpanExportResult] = []
    worker = threading.Thread(target=lambda: results.append(exporter.export(finished_spans())))
    worker.start()
    assert receiver.wait_for(lambda r: r.held_exports() == 1, timeout=10)
    started = time.monotonic()
    receiver.stop()
    assert time.monotonic() - started < 5
    worker.join(timeout=10)
    exporter.shutdown()
    assert results == [SpanExportResult.FAILURE] and receiver.spans() == []


def test_a_grpc_port_another_receiver_holds_is_refused_not_shared() -> None:
    with OtlpReceiver() as first:
        port = int(first.grpc_endpoint.rsplit(":", 1)[1])
        second = OtlpReceiver(grpc_port=port)
        with pytest.raises(OSError, match=f"cannot listen for OTLP/gRPC on 127.0.0.1:{port}"):
            second.start()
        second.stop()
        exporter = GrpcSpanExporter(endpoint=first.grpc_endpoint, insecure=True, timeout=5)
        try:
            assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        assert [span.name for span in first.spans()] == ["probe"]


def post_exactly(
    otlp_receiver: OtlpReceiver, headers: Mapping[str, str], body: bytes = b"", path: str = "/v1/traces"
) -> tuple[int, bytes]:
    """POST these headers (no Content-Length unless given) and body; return the status and reply body."""
    host, port = otlp_receiver.http_endpoint.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.putrequest("POST", path, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        connection.send(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({"Transfer-Encoding": "chunked"}, b"0\r\n\r\n", 411),
        ({"Content-Length": "abc"}, b"", 400),
        ({"Content-Length": "-1"}, b"", 400),
        ({"Content-Length": "\N{SUPERSCRIPT TWO}"}, b"", 400),  # a digit to str.isdigit, not to int()
    ],
)
def test_http_requests_without_a_usable_content_length_are_refused(
    otlp_receiver: OtlpReceiver, headers: dict[str, str], body: bytes, status: int
) -> None:
    protobuf_headers = {"Content-Type": "application/x-protobuf", **headers}
    assert post_exactly(otlp_receiver, protobuf_headers, body)[0] == status
    assert otlp_receiver.raw_requests() == []


def sized(headers: Mapping[str, str], body: bytes) -> dict[str, str]:
    """``headers`` plus the Content-Length of ``body``."""
    return {**headers, "Content-Length": str(len(body))}


@pytest.mark.parametrize("length", [MAX_REQUEST_BYTES + 1, 10**20, 4 * 10**11])
def test_http_bodies_announced_past_the_size_limit_get_413_unread(
    otlp_receiver: OtlpReceiver, length: int
) -> None:
    headers = {"Content-Type": "application/x-protobuf", "Content-Length": str(length)}
    status, reply = post_exactly(otlp_receiver, headers)  # no body: it would be refused unread
    assert status == 413 and str(MAX_REQUEST_BYTES).encode() in reply
    assert otlp_receiver.raw_requests() == []


@pytest.mark.parametrize(("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_http_bodies_decompressing_past_the_size_limit_get_413(
    otlp_receiver: OtlpReceiver, encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    bomb = compress(bytes(MAX_REQUEST_BYTES + 1))  # about 20 KB
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": encoding}
    status, reply = post_exactly(otlp_receiver, sized(headers, bomb), bomb)
    assert status == 413 and b"decompressed" in reply
    assert otlp_receiver.raw_requests() == []


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("gzip", lambda body: gzip.compress(body[:10]) + gzip.compress(body[10:])),  # two members
        ("gzip", lambda body: gzip.compress(body) + b"\0\0"),  # NUL padding, as gzip.decompress reads
        ("identity", lambda body: body),
    ],
)
def test_http_bodies_in_each_content_encoding_are_accepted(
    otlp_receiver: OtlpReceiver, encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    body = compress(json_span_document("compressed"))
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    assert post_exactly(otlp_receiver, sized(headers, body), body)[0] == 200
    assert [span.name for span in otlp_receiver.spans()] == ["compressed"]
    truncated = body[:-4]
    assert post_exactly(otlp_receiver, sized(headers, truncated), truncated)[0] == 400


def test_http_json_of_another_signal_and_unknown_encodings_are_refused(otlp_receiver: OtlpReceiver) -> None:
    logs = json.dumps(
        {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"severityText": "INFO"}]}]}]}
    ).encode()
    status, reply = post_exactly(otlp_receiver, sized({"Content-Type": "application/json"}, logs), logs)
    assert status == 400 and b"expected resourceSpans, got resourceLogs" in reply
    snake = json.dumps({"resource_metrics": [{"scope_metrics": []}]}).encode()  # the fields' own names
    status, reply = post_exactly(otlp_receiver, sized({"Content-Type": "application/json"}, snake), snake)
    assert status == 400 and b"expected resourceSpans, got resource_metrics" in reply
    body = json_span_document("brotli")
    headers = {"Content-Type": "application/json", "Content-Encoding": "br"}
    status, reply = post_exactly(otlp_receiver, sized(headers, body), body)
    assert status == 415 and b"'br'" in reply
    assert otlp_receiver.raw_requests() == []


def test_empty_export_requests_are_accepted_written_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "otlp.jsonl"
    with OtlpReceiver(json_path=path) as otlp_receiver:
        with grpc.insecure_channel(otlp_receiver.grpc_endpoint.removeprefix("http://")) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
            stub.Export(trace_service_pb2.ExportTraceServiceRequest(), timeout=5)
        status, _ = post_exactly(
            otlp_receiver, sized({"Content-Type": "application/json"}, b"{}"), b"{}", "/v1/logs"
        )
        assert status == 200
        traces, logs = otlp_receiver.raw_requests()  # typed by gRPC method and by HTTP route
        assert isinstance(traces, trace_service_pb2.ExportTraceServiceRequest)
        assert isinstance(logs, logs_service_pb2.ExportLogsServiceRequest)
    assert path.read_text() == "{}\n{}\n"
    loaded = load_otlp_json(path)
    assert (loaded.spans, loaded.metric_points, loaded.logs) == ([], [], [])


def test_load_otlp_json_splits_lines_at_newlines_only(tmp_path: Path) -> None:
    name = "one\u2028two\u2029three\x85four"  # str.splitlines() splits at each; json.dumps keeps them raw
    path = tmp_path / "raw-utf8.jsonl"
    document = json.loads(json_span_document(name))
    path.write_text(json.dumps(document, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [span.name for span in load_otlp_json(path).spans] == [name]


def test_load_otlp_json_reads_a_file_saved_with_a_byte_order_mark(tmp_path: Path) -> None:
    """An editor on Windows saves UTF-8 with a BOM: the first line is JSON all the same."""
    path = tmp_path / "edited.jsonl"
    path.write_text(json_span_document("first").decode() + "\n", encoding="utf-8-sig")
    assert [span.name for span in load_otlp_json(path).spans] == ["first"]


def test_a_failed_json_file_write_is_reported_once_and_receiving_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    unwritable = tmp_path  # a directory: opening it to append fails as a full disk would
    with caplog.at_level(logging.WARNING, "kaos_otel"), OtlpReceiver(json_path=unwritable) as otlp_receiver:
        exporters = (
            GrpcSpanExporter(endpoint=otlp_receiver.grpc_endpoint, insecure=True, timeout=5),
            HttpSpanExporter(endpoint=f"{otlp_receiver.http_endpoint}/v1/traces", timeout=5),
        )
        try:
            for exporter in exporters:
                assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        finally:
            for exporter in exporters:
                exporter.shutdown()
        assert [span.name for span in otlp_receiver.spans()] == ["probe", "probe"]
        assert isinstance(otlp_receiver.json_write_error, IsADirectoryError)
    (warning,) = [record.getMessage() for record in caplog.records if record.name == "kaos_otel"]
    assert f"cannot write {unwritable}" in warning and "kept in memory only" in warning


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_failed_start_leaves_no_port_bound() -> None:
    grpc_port = free_port()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken_http_port = blocker.getsockname()[1]
        with pytest.raises(OSError, match="cannot listen for OTLP/HTTP"):
            OtlpReceiver(grpc_port=grpc_port, http_port=taken_http_port).start()
    with OtlpReceiver(grpc_port=grpc_port) as first:
        assert first.grpc_endpoint.endswith(f":{grpc_port}")
        http_port = free_port()
        with pytest.raises(OSError, match="cannot listen for OTLP/gRPC"):
            OtlpReceiver(grpc_port=grpc_port, http_port=http_port).start()
        with OtlpReceiver(http_port=http_port) as second:
            assert second.http_endpoint.endswith(f":{http_port}")


@pytest.mark.parametrize(
    ("cut", "error_when_terminated"),
    [
        (b'"name":"sp', ":2: not an OTLP/JSON export request"),  # mid-string
        (b'"name":"caf\xc3', ": not an OTLP/JSON Lines file"),  # mid-character: binary once a line follows
    ],
)
def test_load_otlp_json_skips_an_incomplete_last_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cut: bytes, error_when_terminated: str
) -> None:
    whole = json_span_document("whole") + b"\n"
    cut_short = whole[: whole.index(b'"name"')] + cut
    path = tmp_path / "cut.jsonl"
    path.write_bytes(whole + cut_short)
    with caplog.at_level(logging.WARNING, "kaos_otel"):
        assert [span.name for span in load_otlp_json(path).spans] == ["whole"]
    assert f"{path}:2: incomplete last line skipped" in caplog.text
    for bad_file in (whole + cut_short + b"\n", whole + cut_short + b"\n" + whole):  # not the last line
        path.write_bytes(bad_file)
        with pytest.raises(ValueError, match=re.escape(f"{path}{error_when_terminated}")):
            load_otlp_json(path)


def test_a_last_line_damaged_in_its_middle_is_an_error_not_skipped(tmp_path: Path) -> None:
    whole = json_span_document("whole") + b"\n"
    damaged = whole.replace(b'"name":', b'"name"', 1).rstrip(b"\n")  # full length, no newline
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(whole + damaged)
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: not an OTLP/JSON export request")):
        load_otlp_json(path)


def test_a_receiver_appending_to_a_file_cut_short_starts_a_new_line(tmp_path: Path) -> None:
    """An earlier writer killed mid-line leaves a partial last line: the next receiver writing to
    the file starts on a new line, so only that partial line is lost (skipped when read)."""
    whole = json_span_document("before") + b"\n"
    path = tmp_path / "appended.jsonl"
    path.write_bytes(whole + whole[:40])
    with OtlpReceiver(json_path=path) as otlp_receiver:
        body = json_span_document("after")
        headers = {"Content-Type": "application/json"}
        assert post_exactly(otlp_receiver, sized(headers, body), body)[0] == 200
        assert post_exactly(otlp_receiver, sized(headers, body), body)[0] == 200
    with pytest.raises(ValueError, match=":2: not an OTLP/JSON export request"):  # the partial line
        load_otlp_json(path)
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == whole[:40] and [json.loads(line) for line in lines[2:4]] == [json.loads(body)] * 2


def test_a_stalled_http_client_is_disconnected_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(receiver_module, "_HTTP_IDLE_TIMEOUT_S", 0.1)
    with OtlpReceiver() as otlp_receiver:
        host, port = otlp_receiver.http_endpoint.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                b"Content-Length: 100\r\n\r\n0123456789"  # 90 bytes short
            )
            assert client.recv(1024) == b""  # closed without an answer (and not after 10 s)
        assert otlp_receiver.raw_requests() == []
    assert "Traceback" not in capsys.readouterr().err


def test_a_receiver_that_does_not_keep_passes_everything_on_and_stores_nothing(tmp_path: Path) -> None:
    out = tmp_path / "telemetry.jsonl"
    received: list[str] = []
    with OtlpReceiver(
        json_path=out, keep=False, on_receive=lambda got: received.extend(s.name for s in got.spans)
    ) as otlp_receiver:
        exporter = GrpcSpanExporter(endpoint=otlp_receiver.grpc_endpoint, insecure=True, timeout=5)
        try:
            for _ in range(3):
                assert exporter.export(finished_spans()) is SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        assert received == ["probe"] * 3
        assert [span.name for span in load_otlp_json(out).spans] == ["probe"] * 3
        assert (otlp_receiver.raw_requests(), otlp_receiver.spans()) == ([], [])
