"""W3C Trace Context across delegations and MCP: inject outgoing, extract incoming with a trust policy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Protocol

from opentelemetry import baggage, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.trace import Link
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kaos_otel import catalog
from kaos_otel._config import TrustPolicy
from kaos_otel._internal_log import internal_error

_TRACE_CONTEXT = TraceContextTextMapPropagator()
_BAGGAGE = W3CBaggagePropagator()
MAX_HEADER_LENGTH = 8192


def inject_headers(
    headers: MutableMapping[str, str] | None = None, *, context: Context | None = None, baggage: bool = False
) -> MutableMapping[str, str]:
    """Add ``traceparent``/``tracestate`` (and ``baggage`` only if asked) for the current context."""
    carrier: MutableMapping[str, str] = {} if headers is None else headers
    try:
        _TRACE_CONTEXT.inject(carrier, context=context)
        if baggage:
            _BAGGAGE.inject(carrier, context=context)
    except Exception as exc:
        internal_error("injecting trace context", exc)
    return carrier


class _HasHeaders(Protocol):
    """Any HTTP request object with a mutable ``headers`` mapping (httpx, httpx2, requests)."""

    @property
    def headers(self) -> MutableMapping[str, str]: ...


def inject_request_hook(request: _HasHeaders) -> None:
    """httpx request event hook: add trace context headers without creating a span.

    ``httpx.Client(event_hooks={"request": [inject_request_hook]})``; works with any request
    object that has a mutable ``headers`` mapping.
    """
    carrier: dict[str, str] = {}
    inject_headers(carrier)
    for key, value in carrier.items():
        request.headers[key] = value


async def async_inject_request_hook(request: _HasHeaders) -> None:
    """The ``httpx.AsyncClient`` form of :func:`inject_request_hook`."""
    inject_request_hook(request)


@dataclass(frozen=True, slots=True)
class IncomingContext:
    """What an incoming request's headers may contribute: a parent, links and baggage."""

    parent: Context
    links: tuple[Link, ...]
    trust: TrustPolicy


def extract_incoming(
    headers: Mapping[str, str],
    *,
    trust: TrustPolicy = TrustPolicy.TRUSTED,
    baggage_allowlist: Iterable[str] = (),
) -> IncomingContext:
    """Read trace context from request headers under a trust policy; never raises.

    ``trusted`` continues the caller's trace, ``link`` starts a new trace linking to it, and
    ``ignore`` discards it. Malformed or oversized headers give a new root. Baggage entries are
    kept only for allow-listed keys, and never anything else (identity never comes from here).
    """
    parent = Context()
    links: tuple[Link, ...] = ()
    try:
        carrier = {
            key.lower(): value
            for key, value in headers.items()
            if key.lower() in ("traceparent", "tracestate", "baggage") and len(value) <= MAX_HEADER_LENGTH
        }
        remote = trace.get_current_span(_TRACE_CONTEXT.extract(carrier)).get_span_context()
        if remote.is_valid and trust is TrustPolicy.TRUSTED:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        elif remote.is_valid and trust is TrustPolicy.LINK:
            links = (Link(remote, {catalog.KAOS_TRACE_TRUST: trust.value}),)
        allowed = set(baggage_allowlist)
        if allowed and trust is not TrustPolicy.IGNORE and "baggage" in carrier:
            for key, value in baggage.get_all(_BAGGAGE.extract(carrier)).items():
                if key in allowed:
                    parent = baggage.set_baggage(key, value, parent)
    except Exception as exc:
        internal_error("extracting trace context", exc)
        return IncomingContext(Context(), (), trust)
    return IncomingContext(parent, links, trust)
