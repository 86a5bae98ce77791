"""ASGI (FastAPI, Starlette) server spans that continue the caller's trace under a trust policy.

The SERVER span is current while the application runs, so the agent's ``invoke_agent`` span is
its child, and it stays open until the application returns: after the last chunk of a streaming
response, and after background tasks run once the response was sent (their exceptions are events
on the span, which the response's status decides). A response the client cut short ends
``canceled``, when the application or the server sees the disconnect (an app that never reads
its request again, on a server that drops writes to a closed connection, learns nothing of it;
nor does a streaming response whose final send, waiting on a slow client, is cancelled because
that client left).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from kaos_otel import catalog
from kaos_otel._config import TrustPolicy, name_set
from kaos_otel._content import REDACTED
from kaos_otel._internal_log import internal_error
from kaos_otel._spans import SpanHandle
from kaos_otel._telemetry import AgentTelemetry
from kaos_otel.catalog import Outcome
from kaos_otel.propagation import extract_incoming

if TYPE_CHECKING:  # FastAPI >= 0.16x only; no runtime import
    from fastapi.telemetry import TelemetryConfig

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


FASTAPI_NATIVE_TELEMETRY_OFF: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""``FastAPI(telemetry=...)`` value that leaves server spans, metrics and logs to this middleware.

FastAPI (0.16x) ships its own OpenTelemetry around the whole application: with it on, every
request gets a second server span, the agent span hangs off FastAPI's endpoint span, and its
error logs carry exception messages regardless of the content policy.
:func:`kaos_otel.instrumentation.fastapi.instrument_app` turns it off for you.
"""

_log = logging.getLogger("kaos_otel")
_NATIVE_TELEMETRY_FIX = (
    "kaos-otel: FastAPI's native telemetry is on as well, so every request gets a second server "
    "span. Fix: call kaos_otel.instrumentation.fastapi.instrument_app(app, otel) instead of "
    "add_middleware, or create the app with FastAPI(telemetry=FASTAPI_NATIVE_TELEMETRY_OFF) "
    "(from kaos_otel.instrumentation.asgi import FASTAPI_NATIVE_TELEMETRY_OFF)"
)
_OUTER_SERVER_SPAN_FIX = (
    "kaos-otel: another instrumentation already opened a server span (%s) around this app, so every "
    "request gets two. Fix: remove it (OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=fastapi,asgi,starlette "
    "under opentelemetry-instrument, or do not instrument the app with FastAPIInstrumentor too), or "
    "do not add kaos-otel's middleware twice"
)


_CLIENT_DISCONNECT = "client_disconnect"
"""``error.type`` of a server span whose client went away before the response was complete."""

_INCOMPLETE_RESPONSE = "incomplete_response"
"""``error.type`` of a server span whose application returned before its response was complete
(the server then answers 500, or cuts the response short)."""


class TraceContextMiddleware:
    """ASGI middleware creating one SERVER span per HTTP request.

    ``app.add_middleware(TraceContextMiddleware, otel=otel, trust=TrustPolicy.TRUSTED)``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        otel: AgentTelemetry,
        trust: TrustPolicy | str | None = None,
        baggage_allowlist: Iterable[str] | None = None,
        excluded_paths: Iterable[str] = ("/health", "/ready"),
    ) -> None:
        """``excluded_paths``: paths served without a span; URLs matching
        ``OTEL_PYTHON_FASTAPI_EXCLUDED_URLS`` (else ``OTEL_PYTHON_EXCLUDED_URLS``) too, as with
        OpenTelemetry's own HTTP server instrumentations. Headers named by
        ``OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST`` / ``_RESPONSE`` are recorded
        on the span (none by default). ``OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS`` replaces the
        methods recorded as sent (others are ``_OTHER``). The variables are read when the
        middleware is built (by Starlette, when the app starts)."""
        self.app = app
        self._otel = otel
        settings = getattr(otel, "settings", None)
        default_trust = settings.trust if settings is not None else TrustPolicy.TRUSTED
        self._trust = TrustPolicy.from_setting(trust) if trust is not None else default_trust
        default_allowlist = settings.baggage_allowlist if settings is not None else frozenset()
        self._baggage_allowlist = (
            name_set(baggage_allowlist) if baggage_allowlist is not None else default_allowlist
        )
        self._excluded = name_set(excluded_paths)
        self._excluded_urls = _excluded_url_patterns(os.environ)
        self._headers = _HeaderCapture.from_env(os.environ)
        self._known_methods = _known_methods(os.environ)
        self._warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._otel.enabled:
            await self.app(scope, receive, send)
            return
        root_path = scope.get("root_path", "")  # a proxy's prefix (uvicorn --root-path)
        if _route_path(scope.get("path", ""), root_path) in self._excluded or (
            self._excluded_urls and _excluded_url(self._excluded_urls, _url(scope))
        ):
            await self.app(scope, receive, send)
            return
        try:
            if not self._warned:
                self._warn_if_doubled(scope)
            sent = scope.get("method", "GET")
            method = sent if sent in self._known_methods else _OTHER_METHOD
            handle = self._begin(scope, sent, method)
        except Exception as exc:  # telemetry never fails a request
            internal_error("starting a server span", exc)
            await self.app(scope, receive, send)
            return
        status_code = 0
        completed = disconnected = disconnect_after_final_send = False

        async def send_with_status(message: Message) -> None:
            nonlocal status_code, completed, disconnected
            kind = message["type"]
            if kind == "http.response.start":
                status_code = int(message["status"])
                handle.set_attribute(catalog.HTTP_RESPONSE_STATUS_CODE, status_code)
                if self._headers.response:
                    self._record_response_headers(handle, message)
            sent_before = completed
            # complete before the send returns: a server may answer receive() with a disconnect
            # once the response is out, while this send is still awaiting (hypercorn does)
            completed = (
                completed
                or (kind == "http.response.body" and not message.get("more_body", False))
                or kind in ("http.response.pathsend", "http.response.zerocopysend")
            )
            try:
                await send(message)
            except Exception as exc:  # not sent (a cancellation may come once it was)
                completed = sent_before
                # ASGI 2.4 raises OSError once the client has gone; or it went while this waited
                disconnected = disconnected or isinstance(exc, OSError) or disconnect_after_final_send
                raise

        async def receive_watching_disconnect() -> Message:
            nonlocal disconnected, disconnect_after_final_send
            message = await receive()
            if message["type"] == "http.disconnect":
                if completed:
                    disconnect_after_final_send = True
                else:
                    disconnected = True
            return message

        raised: BaseException | None = None
        try:
            await self.app(scope, receive_watching_disconnect, send_with_status)
        except BaseException as exc:
            raised = exc
            raise
        finally:  # neither call raises: the app's exception, if any, passes unchanged
            _name_by_route(handle, scope, root_path, method)
            _end_server_span(handle, raised, status_code, completed=completed, disconnected=disconnected)

    def _record_response_headers(self, handle: SpanHandle, message: Message) -> None:
        """Record the response headers to capture; never raises (the response goes out as sent)."""
        try:
            headers = message.get("headers") or ()
            if not isinstance(headers, list | tuple):  # any iterable: read once, so kept for the server
                headers = message["headers"] = list(headers)
            handle.set_attributes(self._headers.response_attributes(headers))
        except Exception as exc:
            internal_error("recording response headers", exc)

    def _warn_if_doubled(self, scope: Scope) -> None:
        """Report, once per middleware, a second server span around this one (with the fix)."""
        outer = trace.get_current_span()
        if "fastapi.telemetry" in scope:
            self._warned = True
            _log.warning(_NATIVE_TELEMETRY_FIX)
        elif outer.is_recording() and getattr(outer, "kind", None) is SpanKind.SERVER:
            self._warned = True
            scope_name = getattr(getattr(outer, "instrumentation_scope", None), "name", "unknown")
            _log.warning(_OUTER_SERVER_SPAN_FIX, scope_name)

    def _begin(self, scope: Scope, sent: str, method: str) -> Any:
        """Begin the server span of a request sent with method ``sent`` (recorded as ``method``)."""
        pairs = [
            (key.decode("latin-1"), value.decode("latin-1")) for key, value in scope.get("headers") or ()
        ]
        headers: dict[str, str] = {}
        for name, value in pairs:  # the first of a repeated header (a proxy's list comes first)
            headers.setdefault(name, value)
        incoming = extract_incoming(pairs, trust=self._trust, baggage_allowlist=self._baggage_allowlist)
        # forwarded headers only behind a proxy of one's own: at a public edge a client writes them
        forwarded = self._trust is TrustPolicy.TRUSTED
        scheme = _scheme_as_sent(scope, headers, forwarded=forwarded)
        server_address, server_port = _server_as_addressed(scope, headers, scheme, forwarded=forwarded)
        peer_address, peer_port = _address_and_port(scope.get("client"))
        # captured headers first: past the SDK's attribute count limit the first ones set are
        # dropped, not the request's method, path or trust
        attributes: dict[str, object] = self._headers.request_attributes(scope.get("headers") or ())
        attributes |= {
            catalog.HTTP_REQUEST_METHOD: method,
            catalog.HTTP_REQUEST_METHOD_ORIGINAL: sent if method == _OTHER_METHOD else None,
            catalog.URL_PATH: scope.get("path"),
            catalog.URL_QUERY: _url_query(scope.get("query_string")),
            catalog.URL_SCHEME: scheme,
            catalog.SERVER_ADDRESS: server_address,
            catalog.SERVER_PORT: server_port,
            catalog.CLIENT_ADDRESS: (_forwarded_client(headers) if forwarded else None) or peer_address,
            catalog.NETWORK_PEER_ADDRESS: peer_address,
            catalog.NETWORK_PEER_PORT: peer_port,
            catalog.NETWORK_PROTOCOL_VERSION: scope.get("http_version"),
            catalog.USER_AGENT_ORIGINAL: headers.get("user-agent"),
            catalog.KAOS_TRACE_TRUST: incoming.trust.value,
        }
        return self._otel.span_begin(
            _span_method(method), SpanKind.SERVER, attributes, links=incoming.links, parent=incoming.parent
        )


_SIGNATURE_PARAMETERS = frozenset(
    {"X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "AWSAccessKeyId", "Signature", "sig",
     "X-Goog-Signature"}
)  # fmt: skip
"""Query parameters whose values the HTTP conventions have ``url.query`` say ``REDACTED`` (matched
case-sensitively, as they say); any other secret in a query is masked by the content-safety layer."""


def _url_query(raw: object) -> str | None:
    """The query string as ``url.query`` records it (``None`` when there is none), signature values
    replaced by ``REDACTED`` and their keys kept: ``q=otel&sig=REDACTED``."""
    if not isinstance(raw, bytes | str) or not raw:
        return None
    query = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    if not any(name in query for name in _SIGNATURE_PARAMETERS):
        return query
    parameters = []
    for parameter in query.split("&"):
        name, equals, _ = parameter.partition("=")
        parameters.append(f"{name}=REDACTED" if equals and name in _SIGNATURE_PARAMETERS else parameter)
    return "&".join(parameters)


def _address_and_port(pair: object) -> tuple[str | None, int | None]:
    """An ASGI ``client`` or ``server`` entry (``[host, port]``, or ``None`` for a Unix socket...)."""
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        return None, None
    host, port = pair
    if not isinstance(host, str) or not host:
        return None, None
    return host, port if type(port) is int and port > 0 else None


_DEFAULT_PORTS = {"http": 80, "https": 443}
"""The port a ``Host`` without one means, by scheme."""


def _host_and_port(authority: str) -> tuple[str | None, str]:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address, as its host and the port
    as written (empty when it writes none)."""
    authority = authority.strip()
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif authority.count(":") == 1:
        host, _, port = authority.partition(":")
    else:
        host, port = authority, ""
    return (host, port) if host else (None, "")


def _port(text: str) -> int | None:
    """A port number written in ``text`` (1 to 65535), else ``None``."""
    number = int(text) if text.isascii() and text.isdigit() and len(text) <= 5 else 0
    return number if 0 < number <= 65535 else None


def _forwarded(headers: Mapping[str, str], parameter: str) -> str | None:
    """A parameter of the first element of the ``Forwarded`` header (RFC 7239), unquoted."""
    first = headers.get("forwarded", "").split(",", 1)[0]
    for pair in first.split(";"):
        name, _, value = pair.partition("=")
        if name.strip().lower() == parameter:
            return value.strip().strip('"') or None
    return None


def _first_entry(headers: Mapping[str, str], name: str) -> str:
    """The first entry of a comma-separated header a proxy appends to (``X-Forwarded-For``...)."""
    return headers.get(name, "").split(",", 1)[0].strip()


def _forwarded_client(headers: Mapping[str, str]) -> str | None:
    """The original client's address a proxy passed on: ``Forwarded: for=``, else the first entry
    of ``X-Forwarded-For``; none for an obfuscated (``_hidden``) or ``unknown`` one."""
    given = _forwarded(headers, "for") or _first_entry(headers, "x-forwarded-for")
    if not given or given.startswith("_") or given.lower() == "unknown":
        return None
    return _host_and_port(given)[0]


_SCHEME = re.compile(r"[a-z][a-z0-9+.-]{0,15}")
"""A URI scheme as a proxy may forward it (``https``)."""


def _scheme_as_sent(scope: Scope, headers: Mapping[str, str], *, forwarded: bool) -> str | None:
    """The scheme the client used: the proxy's ``Forwarded: proto=`` or ``X-Forwarded-Proto``
    (when ``forwarded``: a TLS-terminating proxy speaks ``http`` to the app), else the scope's."""
    if forwarded:
        proto = (_forwarded(headers, "proto") or _first_entry(headers, "x-forwarded-proto")).lower()
        if _SCHEME.fullmatch(proto):
            return proto
    scheme = scope.get("scheme")
    return scheme if isinstance(scheme, str) else None


def _server_as_addressed(
    scope: Scope, headers: Mapping[str, str], scheme: str | None, *, forwarded: bool
) -> tuple[str | None, int | None]:
    """``server.address`` and ``server.port`` as the HTTP conventions set them on a server span: the
    host and port the client addressed, from the proxy's ``Forwarded: host=`` or
    ``X-Forwarded-Host`` (when ``forwarded``), else the ``Host`` header, else the socket the request
    came in on. A port the host leaves out is the proxy's ``X-Forwarded-Port`` (when
    ``forwarded``), else ``scheme``'s default."""
    proxied = ""
    if forwarded:
        proxied = _forwarded(headers, "host") or _first_entry(headers, "x-forwarded-host")
    authority = proxied or headers.get("host", "")
    if not authority:
        return _address_and_port(scope.get("server"))
    host, written = _host_and_port(authority)
    if host is None:
        return None, None
    if written:  # a port that is no port number (`:99999`, `:abc`) leaves the port unknown
        return host, _port(written)
    port = _port(_first_entry(headers, "x-forwarded-port")) if forwarded else None
    if port is None:
        port = _DEFAULT_PORTS.get(scheme or "")
    return host, port


_KNOWN_METHODS = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY", "TRACE"}
)
"""The methods the HTTP conventions call known by default: RFC 9110's, PATCH and QUERY."""
_OTHER_METHOD = "_OTHER"
"""The HTTP conventions' method for any other (names a span ``HTTP``): a client cannot make up
span names or label values."""
_KNOWN_METHODS_VARIABLE = "OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS"


def _known_methods(env: Mapping[str, str]) -> frozenset[str]:
    """The methods recorded as sent: :data:`_KNOWN_METHODS_VARIABLE`'s comma-separated,
    case-sensitive list in their place when it names any, as the HTTP conventions have it."""
    named = frozenset(part.strip() for part in env.get(_KNOWN_METHODS_VARIABLE, "").split(","))
    return (named - {""}) or _KNOWN_METHODS


def _end_server_span(
    handle: SpanHandle, exc: BaseException | None, status_code: int, *, completed: bool, disconnected: bool
) -> None:
    """End the server span by how the exchange ended; never raises.

    - The whole response sent: its status decides (5xx: ``error``). An exception after it (a
      background task) is recorded as an event: the client had its answer.
    - The client gone first (a disconnect seen, a send that raised): ``canceled``, also when the
      application then raised (Starlette's ``ClientDisconnect``; the exception is an event).
    - An exception before any response: ``error``. The status the client then gets is not seen
      here unless the middleware wraps the app's error handling (``instrument_app`` places it so).
    - The application returned, the client still there, before its response was complete (a
      middleware swallowed an exception): ``error``, :data:`_INCOMPLETE_RESPONSE`.
    """
    try:
        if exc is not None and (completed or disconnected):
            handle.record_exception(exc)
        elif exc is not None:
            handle.failure(exc)
            return
        if disconnected:
            handle.set_outcome(Outcome.CANCELED, _CLIENT_DISCONNECT)
        elif not completed:
            handle.set_outcome(Outcome.ERROR, _INCOMPLETE_RESPONSE)
        elif status_code >= 500:
            handle.set_outcome(Outcome.ERROR, error_type=str(status_code))
        handle.success()
    except Exception as internal:
        internal_error("ending a server span", internal)


def _route_path(path: str, root_path: str) -> str:
    """``path`` without the proxy prefix ``root_path`` the server was started with."""
    if root_path and path.startswith(root_path) and path[len(root_path) : len(root_path) + 1] in ("", "/"):
        return path[len(root_path) :] or "/"
    return path


def _name_by_route(handle: SpanHandle, scope: Scope, root_path: str, method: str) -> None:
    """Name the span ``{method} {route}`` (``method`` as ``http.request.method`` records it) and set
    ``http.route`` once routing matched a route (the prefixes of the sub-applications it was
    mounted under included)."""
    try:
        route_path = getattr(scope.get("route"), "path", None)
        if not isinstance(route_path, str):
            return
        mounted = scope.get("root_path", "")
        prefix = mounted[len(root_path) :] if mounted.startswith(root_path) else ""
        template = prefix + route_path
        handle.span.update_name(f"{_span_method(method)} {template}")
        handle.set_attribute(catalog.HTTP_ROUTE, template)
    except Exception as exc:
        internal_error("naming a server span", exc)


_CAPTURED_HEADERS_VARIABLES = (
    "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST",
    "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_RESPONSE",
    "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS",
)


@dataclass(frozen=True, slots=True)
class _HeaderCapture:
    """The request and response headers recorded on the server span, as OpenTelemetry's HTTP
    server instrumentations read :data:`_CAPTURED_HEADERS_VARIABLES`: comma-separated regular
    expressions matching whole header names, case-insensitively; a header matching a
    ``SANITIZE_FIELDS`` expression (searched in its name) is recorded as ``[REDACTED]``.

    A header is recorded as the HTTP conventions say: ``http.request.header.<name>`` (and
    ``http.response.header.<name>``), the name in lowercase, its values as a list (UTF-8, else
    Latin-1). (OpenTelemetry Python's instrumentations still write ``-`` as ``_`` in the name:
    ``content_type``.) At most :data:`_MAX_CAPTURED_HEADERS` names each way, and
    :data:`_MAX_HEADER_VALUES` values per name: a client sending hundreds of headers does not crowd
    out the span's other attributes. Values pass through the content-safety layer as every
    attribute does: ``authorization``, ``cookie`` and other secret-named headers are masked whole."""

    request: tuple[re.Pattern[str], ...] = ()
    response: tuple[re.Pattern[str], ...] = ()
    sanitized: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> _HeaderCapture:
        """The capture the environment asks for (none by default)."""
        request, response, sanitized = (_header_patterns(env, name) for name in _CAPTURED_HEADERS_VARIABLES)
        return cls(request, response, sanitized)

    def request_attributes(self, headers: Iterable[tuple[bytes | str, bytes | str]]) -> dict[str, object]:
        """The request's headers to record, from its ASGI scope's (name, value) pairs."""
        return self._attributes(catalog.HTTP_REQUEST_HEADER_TEMPLATE, self.request, headers)

    def response_attributes(self, headers: Iterable[tuple[bytes | str, bytes | str]]) -> dict[str, object]:
        """The response's headers to record, from an ``http.response.start`` message's."""
        return self._attributes(catalog.HTTP_RESPONSE_HEADER_TEMPLATE, self.response, headers)

    def _attributes(
        self,
        prefix: str,
        patterns: tuple[re.Pattern[str], ...],
        headers: Iterable[tuple[bytes | str, bytes | str]],
    ) -> dict[str, object]:
        if not patterns:
            return {}
        recorded: dict[str, list[str]] = {}
        for raw_name, raw_value in headers:
            name = _header_text(raw_name).lower()
            key = f"{prefix}.{name}"
            if key not in recorded and (
                len(recorded) >= _MAX_CAPTURED_HEADERS or not any(p.fullmatch(name) for p in patterns)
            ):
                continue
            values = recorded.setdefault(key, [])
            if len(values) < _MAX_HEADER_VALUES:
                sanitized = any(pattern.search(name) for pattern in self.sanitized)
                values.append(REDACTED if sanitized else _header_text(raw_value))
        return {key: tuple(values) for key, values in recorded.items()}


_MAX_CAPTURED_HEADERS = 32
"""Header names recorded at most per request, and per response."""

_MAX_HEADER_VALUES = 16
"""Values recorded at most per header name (a header repeated more often keeps its first ones)."""


def _header_text(raw: bytes | str) -> str:
    """A header's name or value as text: UTF-8, else Latin-1 (any byte), as OpenTelemetry's ASGI
    instrumentation decodes them; a server may pass text already."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _header_patterns(env: Mapping[str, str], name: str) -> tuple[re.Pattern[str], ...]:
    """The header-name expressions of the variable ``name`` (case-insensitive); an empty entry is
    left out, and so is one that does not compile, with a warning."""
    patterns = []
    for entry in (part.strip() for part in env.get(name, "").split(",")):
        if not entry:
            continue
        try:
            patterns.append(re.compile(entry, re.IGNORECASE))
        except re.error as exc:
            _log.warning("kaos-otel: %s entry %r left out: %s", name, entry, exc)
    return tuple(patterns)


_EXCLUDED_URLS_VARIABLES = ("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS", "OTEL_PYTHON_EXCLUDED_URLS")


def _excluded_url_patterns(env: Mapping[str, str]) -> tuple[re.Pattern[str], ...]:
    """The URLs served without a span, as OpenTelemetry's FastAPI instrumentation reads them: the
    first of :data:`_EXCLUDED_URLS_VARIABLES` that is set (an empty one excludes nothing), a
    comma-separated list of regular expressions searched in ``scheme://host[:port]/path``. An
    empty entry is left out (OpenTelemetry's would exclude every URL), and so is one that does not
    compile, with a warning."""
    raw = next((env[name] for name in _EXCLUDED_URLS_VARIABLES if name in env), "")
    patterns = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        try:
            patterns.append(re.compile(entry))
        except re.error as exc:
            _log.warning("kaos-otel: excluded URL pattern %r left out: %s", entry, exc)
    return tuple(patterns)


def _excluded_url(patterns: tuple[re.Pattern[str], ...], url: str) -> bool:
    """Whether one of ``patterns`` is found in ``url`` (built once per request)."""
    return any(pattern.search(url) for pattern in patterns)


def _url(scope: Scope) -> str:
    """The request's URL as the excluded-URL patterns see it, built as OpenTelemetry's ASGI
    instrumentation builds it: ``scheme://host[:port]/path``, the host from the ``Host`` header."""
    host = next((value for key, value in scope.get("headers") or () if key == b"host"), None)
    if host is not None:
        authority = host.decode("latin-1")
    else:
        server_host, port = scope.get("server") or ("0.0.0.0", 80)
        authority = server_host if str(port) == "80" else f"{server_host}:{port}"
    return f"{scope.get('scheme', 'http')}://{authority}{scope.get('path', '')}"


def _span_method(method: str) -> str:
    """The method part of a server span's name, from ``http.request.method``: ``HTTP`` for ``_OTHER``."""
    return "HTTP" if method == _OTHER_METHOD else method
