"""In-process OTLP receiver (gRPC and HTTP/protobuf) with flattened, test-friendly views.

The receiver stores every export request it accepts and exposes spans, metric points and log
records as frozen dataclasses. It can also append each request to a JSON Lines file in OTLP/JSON
(the format of the collector's file exporter), which :func:`load_otlp_json` reads back.
"""

from __future__ import annotations

import base64
import codecs
import json
import logging
import os
import re
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple, Self

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = [
    "ExportRequest",
    "FailureMode",
    "OtlpReceiver",
    "ReceivedEvent",
    "ReceivedLink",
    "ReceivedLog",
    "ReceivedMetricPoint",
    "ReceivedSpan",
    "ReceivedTelemetry",
    "load_otlp_json",
    "parse_otlp_json",
    "to_otlp_json",
]

ExportRequest = (
    trace_service_pb2.ExportTraceServiceRequest
    | metrics_service_pb2.ExportMetricsServiceRequest
    | logs_service_pb2.ExportLogsServiceRequest
)
FailureMode = Literal["ok", "unavailable", "hang"]

_SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
_STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}
# OTLP/JSON renders these bytes fields as lowercase hex instead of protobuf JSON's base64.
_HEX_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})
# (request class, response class) per OTLP/HTTP path.
_HTTP_ROUTES: dict[str, tuple[type[Any], type[Any]]] = {
    "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    "/v1/metrics": (
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
    "/v1/logs": (logs_service_pb2.ExportLogsServiceRequest, logs_service_pb2.ExportLogsServiceResponse),
}
_GRPC_RESPONSES: dict[type[Any], type[Any]] = dict(_HTTP_ROUTES.values())
_JSON_KEYS: dict[str, type[Any]] = {
    "resourceSpans": trace_service_pb2.ExportTraceServiceRequest,
    "resourceMetrics": metrics_service_pb2.ExportMetricsServiceRequest,
    "resourceLogs": logs_service_pb2.ExportLogsServiceRequest,
    # the protobuf JSON mapping also reads the fields' own names, as the collector does
    "resource_spans": trace_service_pb2.ExportTraceServiceRequest,
    "resource_metrics": metrics_service_pb2.ExportMetricsServiceRequest,
    "resource_logs": logs_service_pb2.ExportLogsServiceRequest,
}
_JSON_KEY_OF: dict[type[Any], str] = {
    request_cls: key for key, request_cls in _JSON_KEYS.items() if "_" not in key
}
# The OpenTelemetry Collector's OTLP receiver default (confighttp max_request_body_size), applied
# both to the body as sent and to the body once decompressed.
_MAX_REQUEST_BYTES = 20 * 1024 * 1024
# zlib window bits per compressing Content-Encoding: gzip framing, zlib framing (HTTP's "deflate").
_DECOMPRESS_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# An HTTP client that sends nothing for this long (mid-headers or mid-body) is disconnected.
_HTTP_IDLE_TIMEOUT_S = 30.0

_log = logging.getLogger("kaos_otel")


@dataclass(frozen=True)
class ReceivedEvent:
    """A span event."""

    name: str
    attributes: dict[str, Any]
    time_unix_nano: int = 0


class ReceivedLink(NamedTuple):
    """A span link: (trace_id, span_id, attributes), ids as lowercase hex."""

    trace_id: str
    span_id: str
    attributes: dict[str, Any]


class _FromAService:
    """A received item with its resource's attributes."""

    resource: dict[str, Any]

    @property
    def service_name(self) -> str:
        """The resource's ``service.name`` (empty if absent)."""
        return str(self.resource.get("service.name", ""))


@dataclass(frozen=True)
class ReceivedSpan(_FromAService):
    """One span, flattened together with its resource and scope."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope_name: str
    status_code: str
    status_message: str
    events: tuple[ReceivedEvent, ...]
    links: tuple[ReceivedLink, ...]
    start_time_unix_nano: int
    end_time_unix_nano: int

    @property
    def duration_s(self) -> float:
        """End minus start, in seconds."""
        return (self.end_time_unix_nano - self.start_time_unix_nano) / 1e9


@dataclass(frozen=True)
class ReceivedMetricPoint(_FromAService):
    """One metric data point, flattened together with its metric, resource and scope."""

    name: str
    description: str
    unit: str
    kind: str
    is_monotonic: bool
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope_name: str
    time_unix_nano: int
    start_time_unix_nano: int
    value: int | float | None = None
    count: int | None = None
    sum: float | None = None
    min: float | None = None
    max: float | None = None
    bucket_counts: tuple[int, ...] = ()
    explicit_bounds: tuple[float, ...] = ()


@dataclass(frozen=True)
class ReceivedLog(_FromAService):
    """One log record, flattened together with its resource and scope."""

    body: Any
    severity_text: str
    severity_number: int
    trace_id: str | None
    span_id: str | None
    attributes: dict[str, Any]
    resource: dict[str, Any]
    event_name: str
    scope_name: str
    time_unix_nano: int
    observed_time_unix_nano: int


@dataclass
class ReceivedTelemetry:
    """Flattened spans, metric points and logs."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    metric_points: list[ReceivedMetricPoint] = field(default_factory=list)
    logs: list[ReceivedLog] = field(default_factory=list)


# --------------------------------------------------------------------------- flattening


def _any_value(value: common_pb2.AnyValue) -> Any:
    """Decode an OTLP AnyValue to a python value (arrays become tuples, kvlists dicts)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return tuple(_any_value(v) for v in value.array_value.values)
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which)


def _attributes(kvs: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def _hex_or_none(raw: bytes) -> str | None:
    return raw.hex() if raw.strip(b"\0") else None


def _flatten_traces(request: trace_service_pb2.ExportTraceServiceRequest, out: ReceivedTelemetry) -> None:
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.spans.append(_flatten_span(span, resource, ss.scope.name))


def _flatten_span(span: trace_pb2.Span, resource: dict[str, Any], scope_name: str) -> ReceivedSpan:
    return ReceivedSpan(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=_hex_or_none(span.parent_span_id),
        name=span.name,
        kind=_SPAN_KINDS.get(span.kind, str(span.kind)),
        attributes=_attributes(span.attributes),
        resource=resource,
        scope_name=scope_name,
        status_code=_STATUS_CODES.get(span.status.code, str(span.status.code)),
        status_message=span.status.message,
        events=tuple(ReceivedEvent(e.name, _attributes(e.attributes), e.time_unix_nano) for e in span.events),
        links=tuple(
            ReceivedLink(link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes))
            for link in span.links
        ),
        start_time_unix_nano=span.start_time_unix_nano,
        end_time_unix_nano=span.end_time_unix_nano,
    )


def _flatten_metrics(
    request: metrics_service_pb2.ExportMetricsServiceRequest, out: ReceivedTelemetry
) -> None:
    for rm in request.resource_metrics:
        resource = _attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.metric_points.extend(_flatten_metric(metric, resource, sm.scope.name))


def _flatten_metric(
    metric: metrics_pb2.Metric, resource: dict[str, Any], scope_name: str
) -> list[ReceivedMetricPoint]:
    kind = metric.WhichOneof("data")
    if kind is None:
        return []
    data = getattr(metric, kind)
    is_monotonic = bool(kind == "sum" and metric.sum.is_monotonic)
    points: list[ReceivedMetricPoint] = []
    for dp in data.data_points:
        extra: dict[str, Any] = {}
        if kind in ("sum", "gauge"):
            which = dp.WhichOneof("value")
            extra["value"] = getattr(dp, which) if which else None
        else:
            extra["count"] = dp.count
            extra["sum"] = dp.sum
            if kind != "summary":
                extra["min"] = dp.min if dp.HasField("min") else None
                extra["max"] = dp.max if dp.HasField("max") else None
            if kind == "histogram":
                extra["bucket_counts"] = tuple(dp.bucket_counts)
                extra["explicit_bounds"] = tuple(dp.explicit_bounds)
        points.append(
            ReceivedMetricPoint(
                name=metric.name,
                description=metric.description,
                unit=metric.unit,
                kind=kind,
                is_monotonic=is_monotonic,
                attributes=_attributes(dp.attributes),
                resource=resource,
                scope_name=scope_name,
                time_unix_nano=dp.time_unix_nano,
                start_time_unix_nano=dp.start_time_unix_nano,
                **extra,
            )
        )
    return points


def _flatten_logs(request: logs_service_pb2.ExportLogsServiceRequest, out: ReceivedTelemetry) -> None:
    for rl in request.resource_logs:
        resource = _attributes(rl.resource.attributes)
        for sl in rl.scope_logs:
            for record in sl.log_records:
                out.logs.append(_flatten_log(record, resource, sl.scope.name))


def _flatten_log(record: logs_pb2.LogRecord, resource: dict[str, Any], scope_name: str) -> ReceivedLog:
    return ReceivedLog(
        body=_any_value(record.body),
        severity_text=record.severity_text,
        severity_number=int(record.severity_number),
        trace_id=_hex_or_none(record.trace_id),
        span_id=_hex_or_none(record.span_id),
        attributes=_attributes(record.attributes),
        resource=resource,
        event_name=record.event_name,
        scope_name=scope_name,
        time_unix_nano=record.time_unix_nano,
        observed_time_unix_nano=record.observed_time_unix_nano,
    )


def _flatten_into(request: ExportRequest, out: ReceivedTelemetry) -> None:
    """Append the flattened content of one export request to ``out`` (the only flattening path)."""
    if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
        _flatten_traces(request, out)
    elif isinstance(request, metrics_service_pb2.ExportMetricsServiceRequest):
        _flatten_metrics(request, out)
    else:
        _flatten_logs(request, out)


# --------------------------------------------------------------------------- OTLP/JSON


def _convert_ids(node: Any, convert: Callable[[str], str]) -> Any:
    """Return ``node`` with every trace/span id string rewritten by ``convert``."""
    if isinstance(node, dict):
        return {
            k: convert(v) if k in _HEX_ID_KEYS and isinstance(v, str) else _convert_ids(v, convert)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_convert_ids(v, convert) for v in node]
    return node


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_b64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def to_otlp_json(request: ExportRequest) -> str:
    """Render an export request as one line of OTLP/JSON (hex ids, integer enums)."""
    as_dict = json_format.MessageToDict(request, use_integers_for_enums=True)
    return json.dumps(_convert_ids(as_dict, _b64_to_hex), separators=(",", ":"))


def parse_otlp_json(
    document: Mapping[str, Any], request_type: type[ExportRequest] | None = None
) -> ExportRequest:
    """Parse one decoded OTLP/JSON export request (``resourceSpans``/``resourceMetrics``/``resourceLogs``).

    A document with none of those keys is an empty request (of ``request_type``, else of traces).
    ``request_type`` (an OTLP/HTTP route's) also refuses a document of another signal.
    """
    if not isinstance(document, Mapping):
        raise ValueError("not a JSON object")
    kinds = [key for key in _JSON_KEYS if key in document]
    if len(kinds) > 1:
        raise ValueError(f"expected one of {sorted(_JSON_KEY_OF.values())}, got keys {sorted(document)}")
    default_type = request_type or trace_service_pb2.ExportTraceServiceRequest
    message_type = _JSON_KEYS[kinds[0]] if kinds else default_type
    if request_type is not None and message_type is not request_type:
        raise ValueError(f"expected {_JSON_KEY_OF[request_type]}, got {kinds[0]}")
    message = message_type()
    try:
        json_format.ParseDict(_convert_ids(dict(document), _hex_to_b64), message, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise ValueError(str(exc)) from exc
    result: ExportRequest = message
    return result


_PARTIAL_LAST_TOKEN = re.compile(r"(?:t(?:ru?)?|f(?:a(?:ls?)?)?|n(?:ul?)?|[-+.eE0-9]*)\s*")
"""What may follow where JSON decoding of a line cut short stopped: a literal or number begun."""


def _cut_short(line: str, error: ValueError) -> bool:
    """Whether ``line`` failed to decode because it ends early (a write stopped mid-line), not
    because it is damaged: the error is in a string left open or in the line's last token."""
    if not isinstance(error, json.JSONDecodeError):
        return False
    return error.msg.startswith("Unterminated string") or bool(
        _PARTIAL_LAST_TOKEN.fullmatch(line[error.pos :])
    )


def load_otlp_json(path: Path | str) -> ReceivedTelemetry:
    """Read an OTLP/JSON Lines file (one export request per line) into flattened telemetry.

    Raises ``OSError`` if the file cannot be read and ``ValueError`` naming the file (and line) if
    it is binary or malformed. A last line cut short (its writer stopped mid-line: it breaks off
    in a string or in its last token) is skipped with a warning.
    """
    out = ReceivedTelemetry()
    raw = Path(path).read_bytes()
    try:
        # not final: a character cut short at the end of the file (by a write cut short) is left out;
        # a byte order mark (an editor on Windows) is not part of the first line
        text = codecs.getincrementaldecoder("utf-8-sig")().decode(raw)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: not an OTLP/JSON Lines file (binary content at byte {exc.start}); "
            "expected one JSON export request per line, as `kaos-otel receive --out` or the "
            "collector's file exporter write"
        ) from None
    # "\n" only: str.splitlines() also splits at U+2028 and the like, which JSON strings hold raw
    lines = text.split("\n")
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            request = parse_otlp_json(json.loads(line))
        except ValueError as exc:
            if lineno == len(lines) and _cut_short(line, exc):  # its writer stopped mid-line
                _log.warning("kaos-otel: %s:%d: incomplete last line skipped (%s)", path, lineno, exc)
                continue
            raise ValueError(f"{path}:{lineno}: not an OTLP/JSON export request: {exc}") from exc
        except RecursionError:
            raise ValueError(f"{path}:{lineno}: not an OTLP/JSON export request: nested too deeply") from None
        _flatten_into(request, out)
    return out


def _ends_a_line(path: Path) -> bool:
    """Whether the non-empty file ``path`` ends with a newline."""
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


# --------------------------------------------------------------------------- servers


class _Servicer(
    trace_service_pb2_grpc.TraceServiceServicer,
    metrics_service_pb2_grpc.MetricsServiceServicer,
    logs_service_pb2_grpc.LogsServiceServicer,
):
    """One gRPC servicer implementing Export for traces, metrics and logs."""

    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: ExportRequest, context: grpc.ServicerContext) -> Any:
        """Record the request, or fail according to the receiver's failure mode."""
        if not self._receiver._admit():
            context.abort(grpc.StatusCode.UNAVAILABLE, "receiver unavailable (fault injection)")
        self._receiver._record(request)
        return _GRPC_RESPONSES[type(request)]()


class _RequestTooLarge(Exception):
    """An OTLP/HTTP body past :data:`_MAX_REQUEST_BYTES` (answered 413)."""


def _decompress(body: bytes, encoding: str) -> bytes:
    """Decompress a ``gzip`` (every member) or ``deflate`` body, at most :data:`_MAX_REQUEST_BYTES` of it.

    Raises ``_RequestTooLarge`` past that size, ``ValueError`` if the body is cut short and
    ``zlib.error`` if it is corrupt.
    """
    output = bytearray()
    pending = body
    while pending:
        decompressor = zlib.decompressobj(_DECOMPRESS_WBITS[encoding])
        output += decompressor.decompress(pending, _MAX_REQUEST_BYTES + 1 - len(output))
        if len(output) > _MAX_REQUEST_BYTES:
            raise _RequestTooLarge(f"decompressed body exceeds {_MAX_REQUEST_BYTES} bytes")
        if not decompressor.eof:
            raise ValueError(f"{encoding} body cut short")
        # gzip.decompress reads concatenated members (and skips NUL padding after one); zlib.decompress
        # ignores what follows the stream
        pending = decompressor.unused_data.lstrip(b"\0") if encoding == "gzip" else b""
    return bytes(output)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, receiver: OtlpReceiver, host: str, port: int) -> None:
        if ":" in host:  # an IPv6 address
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _HttpHandler)
        self.receiver = receiver


class _HttpHandler(BaseHTTPRequestHandler):
    """OTLP/HTTP handler: POST /v1/{traces,metrics,logs}, protobuf or JSON, optionally compressed."""

    server: _HttpServer

    def setup(self) -> None:
        """Set the connection's idle timeout (handle_one_request ends a timed-out request quietly)."""
        super().setup()
        self.connection.settimeout(_HTTP_IDLE_TIMEOUT_S)

    def do_POST(self) -> None:
        """Decode, record and acknowledge one export request."""
        route = _HTTP_ROUTES.get(self.path.split("?", 1)[0])
        if route is None:
            self._reply(HTTPStatus.NOT_FOUND, b"unknown path", "text/plain")
            return
        length = self.headers.get("Content-Length")
        if length is None:  # a chunked body, say: this server reads a body of announced length
            self._reply(HTTPStatus.LENGTH_REQUIRED, b"Content-Length required", "text/plain")
            return
        if not (length.isascii() and length.strip().isdigit()):  # "²".isdigit(), yet int() refuses it
            self._reply(HTTPStatus.BAD_REQUEST, b"invalid Content-Length", "text/plain")
            return
        body_size = int(length)
        if body_size > _MAX_REQUEST_BYTES:  # answered unread: the connection closes after any reply
            message = f"body exceeds {_MAX_REQUEST_BYTES} bytes".encode()
            self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, message, "text/plain")
            return
        body = self.rfile.read(body_size)
        encoding = self.headers.get("Content-Encoding", "").strip().lower() or "identity"
        if encoding != "identity" and encoding not in _DECOMPRESS_WBITS:
            message = f"unsupported Content-Encoding {encoding!r} (gzip, deflate or none)".encode()
            self._reply(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, message, "text/plain")
            return
        content_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        request_cls, response_cls = route
        try:
            if encoding in _DECOMPRESS_WBITS:
                body = _decompress(body, encoding)
            if content_type == "application/json":
                request: ExportRequest = parse_otlp_json(json.loads(body), request_cls)
            elif content_type == "application/x-protobuf":
                request = request_cls.FromString(body)
            else:
                self._reply(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, b"unsupported content type", "text/plain")
                return
        except _RequestTooLarge as exc:
            self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(exc).encode(), "text/plain")
            return
        except Exception as exc:  # any decoding failure is the client's fault
            self._reply(HTTPStatus.BAD_REQUEST, str(exc).encode(), "text/plain")
            return
        if not self.server.receiver._admit():
            self._reply(HTTPStatus.SERVICE_UNAVAILABLE, b"receiver unavailable", "text/plain")
            return
        self.server.receiver._record(request)
        if content_type == "application/json":
            self._reply(HTTPStatus.OK, b"{}", "application/json")
        else:
            self._reply(HTTPStatus.OK, response_cls().SerializeToString(), "application/x-protobuf")

    def _reply(self, status: HTTPStatus, payload: bytes, content_type: str) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the exporter gave up waiting (its timeout) and closed the connection

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging."""


class OtlpReceiver:
    """OTLP receiver serving gRPC and HTTP/protobuf on 127.0.0.1 (ephemeral ports unless given).

    ``on_receive`` is called (on a server thread, after storing) with what each accepted request
    contained; it must be quick and not raise. With ``keep=False`` nothing is stored in memory (the
    views stay empty): what arrives goes only to ``on_receive`` and the JSON file, so a receiver
    running for hours (``kaos-otel receive``) does not grow with everything it ever received.

    ``set_failure("unavailable")`` makes exports fail (gRPC UNAVAILABLE / HTTP 503);
    ``set_failure("hang")`` blocks them until the mode changes or ``stop()`` is called, after which
    they are answered as unavailable. Failed or hung requests are not recorded.
    """

    def __init__(
        self,
        json_path: Path | None = None,
        *,
        grpc_port: int = 0,
        http_port: int = 0,
        host: str = "127.0.0.1",
        on_receive: Callable[[ReceivedTelemetry], None] | None = None,
        keep: bool = True,
    ) -> None:
        """``grpc_port`` / ``http_port``: fixed ports (to restart on the same ones); 0 picks free ports.

        ``host``: the IPv4 or IPv6 address both servers listen on (``0.0.0.0`` or ``::`` for every
        interface).
        """
        self._json_path = json_path
        self._json_line_started = False
        """Whether this receiver wrote to the JSON file yet (its first write may finish a partial line)."""
        self._wanted_ports = (grpc_port, http_port)
        self._host = host
        self._url_host = f"[{host}]" if ":" in host else host
        """The host as a URL or gRPC address writes it (an IPv6 address in brackets)."""
        self._on_receive = on_receive
        self._keep = keep
        self._lock = threading.Lock()
        self._mode_changed = threading.Condition()
        self._failure: FailureMode = "ok"
        self._held = 0
        self._stopping = False
        self._requests: list[ExportRequest] = []
        self._telemetry = ReceivedTelemetry()
        self._json_write_error: OSError | None = None
        self._grpc_server: grpc.Server | None = None
        self._grpc_port = 0
        self._http_server: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None

    # lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the gRPC and HTTP servers; returns self.

        Raises ``OSError`` naming the address when a port cannot be bound (nothing is left running).
        """
        if self._grpc_server is not None:
            raise RuntimeError("OtlpReceiver already started")
        with self._mode_changed:
            self._stopping = False
        try:
            http_server = _HttpServer(self, self._host, self._wanted_ports[1])
        except OSError as exc:
            address = f"{self._url_host}:{self._wanted_ports[1]}"
            raise OSError(f"cannot listen for OTLP/HTTP on {address}: {exc.strerror or exc}") from exc
        # Without SO_REUSEPORT (gRPC's default), a port another receiver holds is refused rather
        # than shared with it, each then getting a share of the exports.
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="otlp-grpc"),
            options=[("grpc.so_reuseport", 0)],
        )
        servicer = _Servicer(self)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        grpc_address = f"{self._url_host}:{self._wanted_ports[0]}"
        try:
            self._grpc_port = server.add_insecure_port(grpc_address)
        except RuntimeError as exc:  # grpc reports a taken port as "Failed to bind"
            # HTTP is bound first: an unstarted gRPC server holding a port cannot be made to let go
            http_server.server_close()
            raise OSError(f"cannot listen for OTLP/gRPC on {grpc_address}: {exc}") from exc
        server.start()
        self._grpc_server = server
        self._http_server = http_server
        # a short poll interval: stop() waits up to one interval for the serving loop to notice
        self._http_thread = threading.Thread(
            target=http_server.serve_forever, kwargs={"poll_interval": 0.05}, name="otlp-http", daemon=True
        )
        self._http_thread.start()
        return self

    def stop(self) -> None:
        """Release hung exports and stop both servers (idempotent)."""
        with self._mode_changed:
            self._stopping = True
            self._mode_changed.notify_all()
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=1.0).wait(timeout=5)  # bounded: a stop just after start can hang
            self._grpc_server = None
        if self._http_server is not None and self._http_thread is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_thread.join(timeout=5)
            self._http_server = None
            self._http_thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def grpc_endpoint(self) -> str:
        """``http://HOST:PORT`` of the gRPC server."""
        if self._grpc_server is None:
            raise RuntimeError("OtlpReceiver not started")
        return f"http://{self._url_host}:{self._grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """``http://HOST:PORT`` of the HTTP server (append ``/v1/traces`` etc.)."""
        if self._http_server is None:
            raise RuntimeError("OtlpReceiver not started")
        return f"http://{self._url_host}:{self._http_server.server_address[1]}"

    # fault injection ---------------------------------------------------------------------

    def set_failure(self, status: FailureMode) -> None:
        """Answer subsequent exports normally, as unavailable, or by hanging."""
        with self._mode_changed:
            self._failure = status
            self._mode_changed.notify_all()

    def held_exports(self) -> int:
        """How many exports the ``hang`` mode is holding right now."""
        with self._mode_changed:
            return self._held

    def _admit(self) -> bool:
        """Whether an incoming export may be recorded; blocks while the mode is ``hang``."""
        with self._mode_changed:
            if self._failure == "hang":
                self._held += 1
                self._mode_changed.wait_for(lambda: self._stopping or self._failure != "hang")
                self._held -= 1
                return False
            return self._failure == "ok" and not self._stopping

    # storage -------------------------------------------------------------------------------

    def _record(self, request: ExportRequest) -> None:
        received = ReceivedTelemetry()
        _flatten_into(request, received)
        with self._lock:
            if self._keep:
                self._requests.append(request)
                self._telemetry.spans.extend(received.spans)
                self._telemetry.metric_points.extend(received.metric_points)
                self._telemetry.logs.extend(received.logs)
            if self._json_path is not None and self._json_write_error is None:
                self._append_json_line(self._json_path, request)
        if self._on_receive is not None:
            self._on_receive(received)

    def _append_json_line(self, path: Path, request: ExportRequest) -> None:
        """Append ``request`` to the JSON file; after a failed write, warn once and stop writing.

        Stopping keeps the file readable: a line written after a partial one would join it.
        """
        try:
            with path.open("a", encoding="utf-8") as fh:
                if not self._json_line_started:  # after a line an earlier writer left unfinished
                    self._json_line_started = True
                    if fh.tell() and not _ends_a_line(path):
                        fh.write("\n")
                fh.write(to_otlp_json(request) + "\n")
        except OSError as exc:
            self._json_write_error = exc
            _log.warning(
                "kaos-otel: cannot write %s (%s); writing it stopped, what arrives is kept in memory only",
                path,
                exc.strerror or exc,
            )

    @property
    def json_write_error(self) -> OSError | None:
        """The error that stopped writing the JSON file (``None`` while it is written)."""
        with self._lock:
            return self._json_write_error

    def raw_requests(self) -> list[ExportRequest]:
        """Every accepted export request, as decoded protobuf messages, in arrival order."""
        with self._lock:
            return list(self._requests)

    def spans(self) -> list[ReceivedSpan]:
        """All received spans, in arrival order."""
        with self._lock:
            return list(self._telemetry.spans)

    def metric_points(self) -> list[ReceivedMetricPoint]:
        """All received metric data points, in arrival order."""
        with self._lock:
            return list(self._telemetry.metric_points)

    def logs(self) -> list[ReceivedLog]:
        """All received log records, in arrival order."""
        with self._lock:
            return list(self._telemetry.logs)

    def clear(self) -> None:
        """Forget everything received so far (the JSON file, if any, is left alone)."""
        with self._lock:
            self._requests.clear()
            self._telemetry = ReceivedTelemetry()

    def wait_for(self, predicate: Callable[[OtlpReceiver], bool], timeout: float) -> bool:
        """Poll ``predicate(self)`` until it is true (returns True) or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate(self):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


if __name__ == "__main__":  # python -m kaos_otel.receiver: the same as kaos-otel receive
    import sys

    from kaos_otel.cli import main

    sys.exit(main(["receive", *sys.argv[1:]]))
