"""``instrument_app``: one SERVER span per request, doubled spans reported with the fix, and
telemetry flushed when ``uvicorn app:app`` or gunicorn's uvicorn workers get SIGTERM (real processes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from net_support import free_port
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from kaos_otel import KaosOtelManager, catalog
from kaos_otel.instrumentation.asgi import TraceContextMiddleware, _server_as_addressed
from kaos_otel.instrumentation.fastapi import instrument_app
from kaos_otel.receiver import OtlpReceiver

MakeOtel = Callable[..., KaosOtelManager]


def _native_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A tracer provider for FastAPI's native telemetry, which is on whenever it has one."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _agent_app(otel: KaosOtelManager, telemetry: dict[str, Any]) -> FastAPI:
    app = FastAPI(telemetry=telemetry)  # type: ignore[arg-type]

    @app.get("/ask")
    async def ask() -> dict[str, str]:
        with otel.invoke_agent("helper") as run, otel.agent_step(run):
            pass
        return {"answer": "ok"}

    return app


def _server_spans(receiver: OtlpReceiver) -> list[Any]:
    return [s for s in receiver.spans() if s.kind == "SERVER"]


@pytest.mark.fast
def test_one_server_span_per_request_with_fastapis_native_telemetry_available(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    otel = make_otel()
    provider, native = _native_provider()
    app = _agent_app(otel, {"tracer_provider": provider})
    instrument_app(app, otel)
    with caplog.at_level(logging.WARNING, "kaos_otel"), TestClient(app) as client:
        assert client.get("/ask").status_code == 200
    # the lifespan's end flushed: nothing is waiting for a batch timer
    (server,) = _server_spans(otlp_receiver)
    assert server.name == "GET /ask"
    (agent,) = [s for s in otlp_receiver.spans() if s.name == "invoke_agent helper"]
    assert agent.parent_span_id == server.span_id
    assert native.get_finished_spans() == ()
    assert not caplog.records


@pytest.mark.fast
def test_middleware_added_by_hand_under_native_telemetry_warns_once_with_the_fix(
    make_otel: MakeOtel, caplog: pytest.LogCaptureFixture
) -> None:
    otel = make_otel()
    provider, native = _native_provider()
    app = _agent_app(otel, {"tracer_provider": provider})
    app.add_middleware(TraceContextMiddleware, otel=otel)
    with caplog.at_level(logging.WARNING, "kaos_otel"), TestClient(app) as client:
        assert client.get("/ask").status_code == 200
        assert client.get("/ask").status_code == 200
    assert [s.kind for s in native.get_finished_spans() if s.kind is SpanKind.SERVER] == [SpanKind.SERVER] * 2
    (warning,) = [r for r in caplog.records if "second server span" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "instrument_app(app, otel)" in warning.getMessage()
    assert "from kaos_otel.instrumentation.asgi import FASTAPI_NATIVE_TELEMETRY_OFF" in warning.getMessage()


@pytest.mark.fast
def test_another_server_instrumentation_around_the_app_is_reported_once(
    make_otel: MakeOtel, caplog: pytest.LogCaptureFixture
) -> None:
    otel = make_otel()
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    instrument_app(app, otel)
    provider, _ = _native_provider()
    tracer = provider.get_tracer("opentelemetry.instrumentation.asgi")

    async def outer(scope: Any, receive: Any, send: Any) -> None:  # what OpenTelemetryMiddleware does
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        with tracer.start_as_current_span("GET", kind=SpanKind.SERVER):
            await app(scope, receive, send)

    with caplog.at_level(logging.WARNING, "kaos_otel"), TestClient(outer) as client:
        assert client.get("/").status_code == 200
        assert client.get("/").status_code == 200
    (warning,) = [r for r in caplog.records if "another instrumentation" in r.getMessage()]
    assert "(opentelemetry.instrumentation.asgi)" in warning.getMessage()
    assert "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=fastapi,asgi,starlette" in warning.getMessage()


@pytest.mark.fast
def test_a_second_call_is_ignored(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    otel = make_otel()
    app = FastAPI()

    @app.get("/")
    async def index() -> dict[str, str]:
        return {}

    instrument_app(app, otel)
    with caplog.at_level(logging.WARNING, "kaos_otel"):
        instrument_app(app, otel)
    assert "already called" in caplog.text
    with TestClient(app) as client:
        assert client.get("/").status_code == 200
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) >= 1, 10)
    time.sleep(0.2)
    assert [span.name for span in _server_spans(otlp_receiver)] == ["GET /"]


@pytest.mark.fast
def test_instrument_app_on_an_app_already_serving_says_it_is_too_late(make_otel: MakeOtel) -> None:
    app = FastAPI()
    with TestClient(app) as client:
        client.get("/missing")
        with pytest.raises(RuntimeError, match="before the app's middleware stack is built"):
            instrument_app(app, make_otel())


async def test_an_unhandled_exception_is_seen_with_the_status_the_client_gets(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    app = FastAPI()

    @app.get("/crash")
    async def crash() -> None:
        raise LookupError("no answer")

    @app.get("/unavailable")
    async def unavailable() -> None:
        raise TimeoutError("upstream")

    @app.exception_handler(Exception)  # a catch-all: Starlette's ServerErrorMiddleware runs it
    async def answer(request: Any, exc: Exception) -> PlainTextResponse:
        return PlainTextResponse("sorry", status_code=503 if isinstance(exc, TimeoutError) else 500)

    instrument_app(app, otel)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
        assert (await client.get("/crash")).status_code == 500
        assert (await client.get("/unavailable")).status_code == 503
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) >= 2, 10)
    spans = {span.name: span for span in _server_spans(otlp_receiver)}
    crashed, handled = spans["GET /crash"], spans["GET /unavailable"]
    assert crashed.attributes[catalog.HTTP_RESPONSE_STATUS_CODE] == 500
    assert crashed.status_code == "ERROR" and [e.name for e in crashed.events] == ["exception"]
    assert handled.attributes[catalog.HTTP_RESPONSE_STATUS_CODE] == 503
    assert handled.attributes[catalog.ERROR_TYPE] == "503"


async def test_one_excluded_path_given_as_a_string_is_one_path(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    app = FastAPI()

    @app.get("/")
    async def index() -> dict[str, str]:
        return {}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {}

    instrument_app(app, otel, excluded_paths="/healthz")  # not "/", "h", "e"...
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/")).status_code == 200
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) >= 1, 10)
    assert [span.name for span in _server_spans(otlp_receiver)] == ["GET /"]


GENERIC, FASTAPI = "OTEL_PYTHON_EXCLUDED_URLS", "OTEL_PYTHON_FASTAPI_EXCLUDED_URLS"


@pytest.mark.parametrize(
    ("variables", "traced"),
    [
        ({GENERIC: "internal, (unclosed,"}, ["GET /ask"]),
        ({FASTAPI: "agent/internal", GENERIC: "x"}, ["GET /ask"]),
        ({GENERIC: "ask,(?i)/INTERNAL"}, []),
        ({FASTAPI: "", GENERIC: "internal"}, ["GET /ask", "GET /internal/metrics"]),
    ],
)
async def test_urls_excluded_by_the_opentelemetry_variables_get_no_span(
    make_otel: MakeOtel,
    otlp_receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    variables: dict[str, str],
    traced: list[str],
) -> None:
    """``OTEL_PYTHON_FASTAPI_EXCLUDED_URLS`` (else ``OTEL_PYTHON_EXCLUDED_URLS``; set but empty, it
    excludes nothing) work as with OpenTelemetry's FastAPI instrumentation: regular expressions,
    inline flags too, searched in the URL, whose host is the ``Host`` header's. One that does not
    compile is left out with a warning, the others still apply; an empty entry is left out."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    otel = make_otel()
    app = FastAPI()

    @app.get("/internal/metrics")
    async def internal() -> dict[str, str]:
        return {}

    @app.get("/ask")
    async def ask() -> dict[str, str]:
        return {}

    instrument_app(app, otel)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as client:
        assert (await client.get("/internal/metrics")).status_code == 200
        assert (await client.get("/ask")).status_code == 200
        with otel.span("marker"):  # exported after the requests' spans: all of them are in
            pass
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: any(span.name == "marker" for span in r.spans()), 10)
    assert sorted(span.name for span in _server_spans(otlp_receiver)) == traced
    left_out = [r.getMessage() for r in caplog.records if "excluded URL pattern" in r.getMessage()]
    expected = "kaos-otel: excluded URL pattern '(unclosed' left out: missing ), unterminated subpattern"
    if "(unclosed" in str(variables):
        assert len(left_out) == 1 and left_out[0].startswith(expected), left_out
    else:
        assert left_out == []


def test_a_shutdown_flush_that_misses_its_deadline_says_what_it_left(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """The collector hanging: the flush at lifespan end returns at its deadline and says what is
    not exported yet, since a server that then stops the process by its signal skips the exit
    handlers that would count it."""
    otlp_receiver.set_failure("hang")
    otel = make_otel(environ={"OTEL_BSP_SCHEDULE_DELAY": "3600000"})
    app = FastAPI()

    @app.get("/ask")
    async def ask() -> dict[str, str]:
        return {}

    instrument_app(app, otel, flush_timeout_s=0.5)
    started = time.monotonic()
    with TestClient(app) as client:
        assert client.get("/ask").status_code == 200
    assert time.monotonic() - started < 5
    said = [r.getMessage() for r in caplog.records if "shutdown flush missed" in r.getMessage()]
    assert len(said) == 1 and "not exported yet: 1 traces and any metric points," in said[0], said


CAPTURE = "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_"


async def test_headers_named_by_the_opentelemetry_variables_are_recorded_and_secrets_masked(
    make_otel: MakeOtel,
    otlp_receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST`` / ``_RESPONSE`` name headers
    by regular expressions matching whole names, case-insensitively, as OpenTelemetry's HTTP
    instrumentations read them; each is recorded with all its values (UTF-8) under the HTTP
    conventions' ``http.request.header.<name>``. ``..._SANITIZE_FIELDS`` records a header as
    ``[REDACTED]``, and a secret-named one (``authorization``) is masked by the content-safety
    layer anyway. An expression that does not compile is left out with a warning. At most 32
    names are recorded each way, and the span's own attributes are kept."""
    monkeypatch.setenv(CAPTURE + "REQUEST", "x-request-id, X-Tenant-.*, authorization, x-h[0-9]+, (bad")
    monkeypatch.setenv(CAPTURE + "RESPONSE", "content-type,x-session-id")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS", "session")
    otel = make_otel()
    app = FastAPI()

    @app.get("/ask")
    async def ask() -> PlainTextResponse:
        return PlainTextResponse("ok", headers={"X-Session-Id": "s-123"})

    instrument_app(app, otel)
    named = [
        ("X-Request-Id", "r-1"),
        ("X-Tenant-Region", "eu"),
        ("X-Tenant-Region", "Zürich"),  # UTF-8 bytes on the wire
        ("X-Request-Idx", "not whole"),
        ("Authorization", "Bearer abc123xyz987"),
        ("Cookie", "sid=not-named"),
    ] + [(f"X-H{i}", str(i)) for i in range(200)]
    headers = [(name.encode(), value.encode()) for name, value in named]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as client:
        assert (await client.get("/ask", headers=headers)).status_code == 200
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) == 1, 10)
    attributes = _server_spans(otlp_receiver)[0].attributes
    recorded = {key: value for key, value in attributes.items() if ".header." in key}
    numbered = {key for key in recorded if key.startswith("http.request.header.x-h")}
    assert len(numbered) == 32 - 3  # after the three named first
    assert {key: value for key, value in recorded.items() if key not in numbered} == {
        "http.request.header.x-request-id": ("r-1",),
        "http.request.header.x-tenant-region": ("eu", "Zürich"),
        "http.request.header.authorization": ("[REDACTED]",),
        "http.response.header.content-type": ("text/plain; charset=utf-8",),
        "http.response.header.x-session-id": ("[REDACTED]",),
    }
    assert attributes[catalog.HTTP_REQUEST_METHOD] == "GET" and attributes[catalog.URL_PATH] == "/ask"
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 1 and "'(bad'" in left_out[0], left_out


async def test_captured_headers_never_crowd_out_the_server_spans_own_attributes(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the SDK's attribute count limit the first attributes set are dropped: the captured
    request headers, set before the span's own, are the ones to go."""
    monkeypatch.setenv(CAPTURE + "REQUEST", "x-h[0-9]+")
    otel = make_otel(environ={"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "16"})
    app = FastAPI()

    @app.get("/ask")
    async def ask() -> dict[str, str]:
        return {}

    instrument_app(app, otel)
    headers = {f"x-h{i}": str(i) for i in range(20)}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as client:
        assert (await client.get("/ask", headers=headers)).status_code == 200
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) == 1, 10)
    attributes = _server_spans(otlp_receiver)[0].attributes
    own = [catalog.HTTP_REQUEST_METHOD, catalog.URL_PATH, catalog.HTTP_ROUTE]
    assert [key for key in [*own, catalog.HTTP_RESPONSE_STATUS_CODE] if key not in attributes] == []


async def test_a_header_repeated_past_the_cap_keeps_its_first_values(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A captured header sent 500 times is recorded with its first 16 values."""
    monkeypatch.setenv(CAPTURE + "REQUEST", "x-tag")
    otel = make_otel()
    headers = [(b"x-tag", str(i).encode()) for i in range(500)]
    attributes = await _server_span_of_one_request(otel, otlp_receiver, "http://agent/search", headers)
    assert attributes["http.request.header.x-tag"] == tuple(str(i) for i in range(16))


async def _server_span_of_one_request(
    otel: KaosOtelManager,
    receiver: OtlpReceiver,
    url: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    trust: str = "trusted",
) -> Any:
    """The attributes of the server span of one GET ``url`` to an instrumented app, sent over
    HTTP/2 from the peer 10.0.0.7:51234."""
    app = FastAPI()

    @app.get("/search")
    async def search() -> dict[str, str]:
        return {}

    instrument_app(app, otel, trust=trust)

    async def over_http2(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        """``app`` behind a server speaking HTTP/2 (httpx's ASGI transport says 1.1)."""
        await app({**scope, "http_version": "2"} if scope["type"] == "http" else scope, receive, send)

    transport = httpx.ASGITransport(app=over_http2, client=("10.0.0.7", 51234))
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.get(url, headers=headers)).status_code == 200
    assert otel.force_flush(10)
    assert receiver.wait_for(lambda r: len(_server_spans(r)) == 1, 10)
    return _server_spans(receiver)[0].attributes


PROXIED = [
    (b"x-forwarded-for", b"203.0.113.9, 10.0.0.7"),
    (b"x-forwarded-host", b"agents.example.com"),
    (b"x-forwarded-proto", b"https"),
]


@pytest.mark.parametrize(
    ("trust", "headers", "client", "server", "scheme"),
    [
        ("trusted", [], "10.0.0.7", ("agent", 8000), "http"),
        # at a public edge the client writes the forwarded headers: the peer and Host are recorded
        ("link", PROXIED, "10.0.0.7", ("agent", 8000), "http"),
        ("trusted", PROXIED, "203.0.113.9", ("agents.example.com", 443), "https"),
        (
            "trusted",
            [(b"forwarded", b'for="[2001:db8::17]:4711";host=api.example.com:8443, for=10.0.0.1'), *PROXIED],
            "2001:db8::17",
            ("api.example.com", 8443),
            "https",  # Forwarded has no proto=: X-Forwarded-Proto's
        ),
        ("trusted", [(b"forwarded", b"for=_hidden;proto=http")], "10.0.0.7", ("agent", 8000), "http"),
        # a TLS-terminating proxy that keeps Host and says only the protocol (and the port)
        ("trusted", [(b"host", b"agents.example.com"), (b"x-forwarded-proto", b"https")], "10.0.0.7",
         ("agents.example.com", 443), "https"),
        ("trusted", [(b"host", b"agents.example.com"), (b"forwarded", b"proto=https"),
                     (b"x-forwarded-port", b"8443")], "10.0.0.7", ("agents.example.com", 8443), "https"),
        ("link", [(b"host", b"agents.example.com"), (b"x-forwarded-proto", b"https")], "10.0.0.7",
         ("agents.example.com", 80), "http"),
    ],
)  # fmt: skip
async def test_the_server_span_says_who_asked_and_whom_as_the_http_conventions_do(
    make_otel: MakeOtel,
    otlp_receiver: OtlpReceiver,
    trust: str,
    headers: list[tuple[bytes, bytes]],
    client: str,
    server: tuple[str, int],
    scheme: str,
) -> None:
    """``network.peer.*`` and ``network.protocol.version`` come from the connection;
    ``client.address`` is the original client, ``url.scheme`` the scheme it used and
    ``server.address`` / ``server.port`` the server as it addressed it: behind a proxy of one's
    own (``trusted``) from ``Forwarded``, else ``X-Forwarded-For`` / ``-Host`` / ``-Proto`` /
    ``-Port`` (a port left out is the scheme's default), else the peer and the ``Host`` header.
    An obfuscated ``for=_hidden`` leaves the peer."""
    otel = make_otel()
    attributes = await _server_span_of_one_request(
        otel, otlp_receiver, "http://agent:8000/search", headers, trust
    )
    assert (attributes[catalog.CLIENT_ADDRESS], attributes[catalog.SERVER_ADDRESS]) == (client, server[0])
    assert (attributes[catalog.SERVER_PORT], attributes[catalog.URL_SCHEME]) == (server[1], scheme)
    assert attributes[catalog.NETWORK_PEER_ADDRESS] == "10.0.0.7"
    assert attributes[catalog.NETWORK_PEER_PORT] == 51234
    assert attributes[catalog.NETWORK_PROTOCOL_VERSION] == "2"
    assert catalog.URL_QUERY not in attributes  # none was sent


@pytest.mark.parametrize(
    ("authority", "socket", "expected"),
    [
        (":8080", None, (None, None)),  # a port without a host is no address
        ("[::1]:abc", None, ("::1", None)),  # a port that is no port number: not the scheme's
        ("example.com:70000", None, ("example.com", None)),
        ("example.com", None, ("example.com", 80)),  # no port written: the scheme's
        ("", ["", 0], (None, None)),  # no Host, and a socket without an address
        ("", ["/run/agent.sock", None], ("/run/agent.sock", None)),  # a Unix socket
    ],
)
def test_a_server_without_a_usable_address_records_no_port(
    authority: str, socket: list[object] | None, expected: tuple[str | None, int | None]
) -> None:
    headers = {"host": authority} if authority else {}
    assert _server_as_addressed({"server": socket}, headers, "http", forwarded=False) == expected


async def test_url_query_redacts_the_signatures_the_http_conventions_name(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """The values of ``sig``, ``X-Amz-Signature``... become ``REDACTED`` with their keys kept (the
    keys matched case-sensitively, as the conventions say); any other secret in the query is
    masked by the content-safety layer."""
    otel = make_otel()
    key = "sk-" + "a1B2" * 8
    query = f"q=otel&sig=abc&X-Amz-Signature=def&Sig=mine&api_key={key}"
    attributes = await _server_span_of_one_request(otel, otlp_receiver, f"http://agent/search?{query}")
    recorded = attributes[catalog.URL_QUERY]
    assert recorded.startswith("q=otel&sig=REDACTED&X-Amz-Signature=REDACTED&Sig=mine&api_key=")
    assert key not in recorded and key[3:12] not in recorded, recorded
    assert attributes[catalog.SERVER_PORT] == 80  # the scheme's, as Host has none


async def _answers_with_headers_as_text_from_a_generator(scope: Any, receive: Any, send: Any) -> None:
    """An app within the ASGI spec's letter: headers as any iterable (here of str pairs, which
    servers accept too)."""
    headers = (pair for pair in [("x-app", "1"), ("content-type", "text/plain")])
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_capturing_response_headers_changes_nothing_the_server_is_sent(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers given as a generator reach the server whole although the capture read them, and
    headers given as text, not bytes, are read as well."""
    monkeypatch.setenv(CAPTURE + "RESPONSE", "x-app")
    otel = make_otel()
    sent: list[Any] = []

    async def server_send(message: Any) -> None:
        if message["type"] == "http.response.start":
            sent.extend(message["headers"])

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    middleware = TraceContextMiddleware(_answers_with_headers_as_text_from_a_generator, otel=otel)
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "scheme": "http"}
    await middleware(scope, receive, server_send)
    assert sent == [("x-app", "1"), ("content-type", "text/plain")]
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) == 1, 10)
    assert _server_spans(otlp_receiver)[0].attributes["http.response.header.x-app"] == ("1",)


class ClientGone(OSError):
    """What an ASGI 2.4 server's ``send`` raises once the client has gone."""


async def _raises_before_answering(scope: Any, receive: Any, send: Any) -> None:
    raise LookupError("no answer")


async def _answers_then_runs_failing_background_work(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
    raise RuntimeError("background work failed")


async def _answers_a_client_that_is_gone(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})  # raises ClientGone: not caught


async def _answers_what_the_server_refuses(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
    await send({"type": "http.response.body", "body": b"short"})  # uvicorn: RuntimeError, not sent


SEND_RAISES: dict[object, Exception] = {
    _answers_a_client_that_is_gone: ClientGone("the client closed the connection"),
    _answers_what_the_server_refuses: RuntimeError("Response content shorter than Content-Length"),
}


@pytest.mark.parametrize(
    ("app", "raised", "status", "outcome", "error_type"),
    [
        (_raises_before_answering, LookupError, None, "error", "LookupError"),
        (_answers_then_runs_failing_background_work, RuntimeError, 200, None, None),
        (_answers_a_client_that_is_gone, ClientGone, 200, "canceled", "client_disconnect"),
        (_answers_what_the_server_refuses, RuntimeError, 200, "error", "RuntimeError"),
    ],
)
async def test_the_server_span_ends_by_how_the_exchange_ended_and_the_apps_exception_passes(
    app: Any,
    raised: type[BaseException],
    status: int | None,
    outcome: str | None,
    error_type: str | None,
    make_otel: MakeOtel,
    otlp_receiver: OtlpReceiver,
) -> None:
    otel = make_otel()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if app in SEND_RAISES and message["type"] == "http.response.body":
            raise SEND_RAISES[app]

    scope = {"type": "http", "method": "POST", "path": "/ask", "headers": [], "root_path": ""}
    with pytest.raises(raised):  # the app's own exception, unchanged
        await TraceContextMiddleware(app, otel=otel)(scope, receive, send)
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) >= 1, 10)
    (span,) = _server_spans(otlp_receiver)
    assert span.attributes.get(catalog.HTTP_RESPONSE_STATUS_CODE) == status  # none seen: none guessed
    assert span.attributes.get(catalog.KAOS_OUTCOME) == outcome
    assert span.attributes.get(catalog.ERROR_TYPE) == error_type
    assert (span.status_code == "ERROR") is (outcome == "error")
    assert [event.name for event in span.events] == ["exception"]


async def _answers_nothing(scope: Any, receive: Any, send: Any) -> None:
    """What a middleware that swallows the app's exception returns (the server answers 500)."""


async def _stops_answering_halfway(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"first half", "more_body": True})


@pytest.mark.parametrize(("app", "status"), [(_answers_nothing, None), (_stops_answering_halfway, 200)])
async def test_an_app_returning_before_its_response_is_complete_is_an_error_not_a_disconnect(
    app: Any, status: int | None, make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        pass

    scope = {"type": "http", "method": "GET", "path": "/ask", "headers": [], "root_path": ""}
    await TraceContextMiddleware(app, otel=otel)(scope, receive, send)
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) >= 1, 10)
    (span,) = _server_spans(otlp_receiver)
    assert span.attributes.get(catalog.HTTP_RESPONSE_STATUS_CODE) == status
    assert span.attributes[catalog.KAOS_OUTCOME] == "error"
    assert span.attributes[catalog.ERROR_TYPE] == "incomplete_response"
    assert span.status_code == "ERROR"


@pytest.mark.parametrize(
    ("final_send_fails", "outcome"), [(False, None), (True, ("canceled", "client_disconnect"))]
)
async def test_a_disconnect_reported_during_the_final_send_counts_only_if_that_send_fails(
    final_send_fails: bool, outcome: tuple[str, str] | None, make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """Servers may answer ``receive()`` with ``http.disconnect`` once the response is out, while
    the final send still awaits (hypercorn); Starlette's streaming responses listen meanwhile. The
    response is complete unless that send then fails (the client left before it was written)."""
    otel = make_otel()
    final_send, disconnect_seen = asyncio.Event(), asyncio.Event()

    async def streams_while_listening_for_disconnect(scope: Any, receive: Any, send: Any) -> None:
        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnect_seen.set()

        listener = asyncio.create_task(listen())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            await send({"type": "http.response.body", "body": b"done"})
        finally:
            await listener

    async def receive() -> MutableMapping[str, Any]:
        await final_send.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            final_send.set()
            await disconnect_seen.wait()
            if final_send_fails:
                raise RuntimeError("connection lost")

    scope = {"type": "http", "method": "GET", "path": "/stream", "headers": [], "root_path": ""}
    middleware = TraceContextMiddleware(streams_while_listening_for_disconnect, otel=otel)
    if final_send_fails:
        with pytest.raises(RuntimeError):
            await middleware(scope, receive, send)
    else:
        await middleware(scope, receive, send)
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) >= 1, 10)
    (span,) = _server_spans(otlp_receiver)
    recorded = span.attributes.get(catalog.KAOS_OUTCOME), span.attributes.get(catalog.ERROR_TYPE)
    assert recorded == (outcome or (None, None))


async def test_server_spans_carry_the_full_route_template_however_the_request_ends(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    app, users = FastAPI(), FastAPI()

    @app.get("/orders/{order_id}")
    async def order(order_id: int) -> dict[str, int]:
        if order_id == 0:
            raise LookupError("no order 0")
        return {"order": order_id}

    @users.get("/users/{user_id}")
    async def user(user_id: str) -> dict[str, str]:
        return {"user": user_id}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.mount("/v1", users)
    instrument_app(app, otel)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False, root_path="/api")
    async with httpx.AsyncClient(transport=transport, base_url="http://agent/api") as client:
        assert (await client.get("/orders/1")).status_code == 200
        assert (await client.get("/orders/0")).status_code == 500
        assert (await client.get("/v1/users/alice-123")).status_code == 200
        assert (await client.request("FOOBAR", "/orders/2")).status_code == 405
        assert (await client.get("/health")).status_code == 200  # excluded behind the prefix too
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) >= 4, 10)
    spans = sorted(_server_spans(otlp_receiver), key=lambda s: s.start_time_unix_nano)
    named = [(s.name, s.attributes.get(catalog.HTTP_ROUTE)) for s in spans]
    assert named == [
        ("GET /orders/{order_id}", "/orders/{order_id}"),
        ("GET /orders/{order_id}", "/orders/{order_id}"),  # the failed request keeps its route
        ("GET /v1/users/{user_id}", "/v1/users/{user_id}"),  # the mount's prefix included
        ("HTTP /orders/{order_id}", "/orders/{order_id}"),
    ]
    assert spans[1].status_code == "ERROR"
    unknown = spans[3].attributes
    assert (unknown[catalog.HTTP_REQUEST_METHOD], unknown[catalog.HTTP_REQUEST_METHOD_ORIGINAL]) == (
        "_OTHER",
        "FOOBAR",
    )
    assert catalog.HTTP_REQUEST_METHOD_ORIGINAL not in spans[0].attributes


@pytest.mark.parametrize(
    ("known_methods", "recorded"),
    [
        (None, {"QUERY": ("QUERY /search", "QUERY"), "PROPFIND": ("HTTP /search", "_OTHER")}),
        (
            " PROPFIND ,GET",
            {"QUERY": ("HTTP /search", "_OTHER"), "PROPFIND": ("PROPFIND /search", "PROPFIND")},
        ),
    ],
)
async def test_the_methods_the_http_conventions_call_known_are_recorded_as_sent(
    known_methods: str | None,
    recorded: dict[str, tuple[str, str]],
    make_otel: MakeOtel,
    otlp_receiver: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """QUERY is known by default; ``OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS`` replaces the list."""
    if known_methods is not None:
        monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS", known_methods)
    otel = make_otel()
    app = FastAPI()

    @app.api_route("/search", methods=["QUERY", "PROPFIND"])
    async def search() -> dict[str, str]:
        return {}

    instrument_app(app, otel)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
        for method in recorded:
            assert (await client.request(method, "/search")).status_code == 200
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(_server_spans(r)) >= 2, 10)
    spans = sorted(_server_spans(otlp_receiver), key=lambda s: s.start_time_unix_nano)
    assert [(s.name, s.attributes[catalog.HTTP_REQUEST_METHOD]) for s in spans] == list(recorded.values())


APP = """
    from fastapi import FastAPI

    from kaos_otel import KaosOtelManager
    from kaos_otel.instrumentation.fastapi import instrument_app

    otel = KaosOtelManager("sigterm-agent")
    app = FastAPI()
    instrument_app(app, otel)


    @app.get("/ask")
    async def ask() -> dict[str, str]:
        with otel.invoke_agent("sigterm-agent") as run, otel.agent_step(run):
            pass
        return {"answer": "ok"}
"""


def _serve_then_sigterm(command: list[str], port: int, receiver: OtlpReceiver, tmp_path: Path) -> None:
    """Start the app, answer one request, SIGTERM the process and wait for it to end."""
    (tmp_path / "agent_app.py").write_text(textwrap.dedent(APP))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
        # nothing would be exported before exit without the flush at lifespan end
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
        "OTEL_BLRP_SCHEDULE_DELAY": "600000",
        "OTEL_METRIC_EXPORT_INTERVAL": "600000",
    }
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/ask"
        deadline = time.monotonic() + 60
        with httpx.Client(trust_env=False, timeout=5) as client:
            while True:
                assert server.poll() is None, (tmp_path / "server.log").read_text()
                try:
                    response = client.get(url)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "server never answered"
                    time.sleep(0.1)
        assert response.status_code == 200
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        log.close()


def _assert_exported_once(receiver: OtlpReceiver) -> None:
    # the process has ended: whatever it flushed on the way out has been received
    (server,) = _server_spans(receiver)
    assert server.name == "GET /ask"
    assert {s.name for s in receiver.spans() if s.trace_id == server.trace_id} >= {
        "invoke_agent sigterm-agent", "agent_step",
    }  # fmt: skip
    requests = [p for p in receiver.metric_points() if p.name == catalog.KAOS_REQUESTS]
    assert [p.value for p in requests] == [1]


@pytest.mark.timeout(120)
def test_plain_uvicorn_flushes_on_sigterm(otlp_receiver: OtlpReceiver, tmp_path: Path) -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "agent_app:app",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    _serve_then_sigterm(command, port, otlp_receiver, tmp_path)
    _assert_exported_once(otlp_receiver)


@pytest.mark.timeout(120)
def test_gunicorn_with_uvicorn_workers_flushes_on_sigterm(
    otlp_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    port = free_port()
    command = [
        sys.executable, "-m", "gunicorn", "agent_app:app", "--bind", f"127.0.0.1:{port}",
        "--worker-class", "uvicorn_worker.UvicornWorker", "--workers", "1", "--log-level", "warning",
    ]  # fmt: skip
    _serve_then_sigterm(command, port, otlp_receiver, tmp_path)
    _assert_exported_once(otlp_receiver)


class BrokenSpanProcessor(SpanProcessor):
    """An application's span processor that raises when a span starts or ends."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "on_start":
            raise RuntimeError("span processor broken")

    def on_end(self, span: Any) -> None:
        if self.where == "on_end":
            raise RuntimeError("span processor broken")


class AppError(Exception):
    """The application's own failure."""


def _with_a_broken_span_processor(otel: KaosOtelManager, where: str) -> KaosOtelManager:
    provider = otel.tracer_provider
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(BrokenSpanProcessor(where))
    return otel


@pytest.mark.fast
@pytest.mark.parametrize("where", ["on_start", "on_end"])
def test_a_raising_span_processor_fails_no_request_and_replaces_no_exception(
    where: str, make_otel: MakeOtel
) -> None:
    otel = _with_a_broken_span_processor(make_otel(), where)
    raised = AppError("the app's own")

    async def boom(request: Any) -> PlainTextResponse:
        with otel.span("inner"):
            raise raised

    async def ok(request: Any) -> PlainTextResponse:
        with otel.span("inner"):
            return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/ok", ok), Route("/boom", boom)])
    instrument_app(app, otel)
    with TestClient(app) as client:
        assert client.get("/ok").text == "ok"
        with pytest.raises(AppError) as caught:
            client.get("/boom")
    assert caught.value is raised


@pytest.mark.fast
@pytest.mark.parametrize("where", ["on_start", "on_end"])
def test_a_raising_span_processor_leaves_the_callers_context_as_it_was(
    where: str, make_otel: MakeOtel
) -> None:
    otel = _with_a_broken_span_processor(make_otel(), where)
    before = otel_context.get_current()
    with otel.span("outer"):
        with otel.span("inner") as inner:
            pass
        assert trace.get_current_span() is not inner.span, "an ended span is not current"
    assert otel_context.get_current() is before
