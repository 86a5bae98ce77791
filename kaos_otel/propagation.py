"""W3C Trace Context across delegations and MCP: inject outgoing, extract incoming with a trust policy.

Incoming headers are parsed here, by W3C Trace Context Level 2 and RFC 9110 (repeated header
fields), where the OpenTelemetry SDK's parser differs: it sees one value per header name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, unquote

from opentelemetry import baggage, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kaos_otel import catalog
from kaos_otel._config import TrustPolicy, name_set
from kaos_otel._internal_log import internal_error

_TRACE_CONTEXT = TraceContextTextMapPropagator()
MAX_HEADER_LENGTH = 8192
_MAX_BAGGAGE_MEMBERS = 180
_TOKEN_PUNCTUATION = "!#$%&'*+-.^_`|~"
"""What an RFC 9110 token holds besides letters and digits."""


def inject_headers(
    headers: MutableMapping[str, str] | None = None, *, context: Context | None = None, baggage: bool = False
) -> MutableMapping[str, str]:
    """Add ``traceparent``/``tracestate`` (and ``baggage`` only if asked) for the current context.

    A field it sets replaces the carrier's field of that name in any case, and a ``traceparent``
    the carrier's ``tracestate``: a header sent on holds one trace context, this one.
    """
    carrier: MutableMapping[str, str] = {} if headers is None else headers
    try:
        fields: dict[str, str] = {}
        _TRACE_CONTEXT.inject(fields, context=context)
        if baggage:
            header = _baggage_header(context)
            if header:
                fields["baggage"] = header
        replaced = {*fields, "tracestate"} if "traceparent" in fields else set(fields)
        for key in [key for key in carrier if isinstance(key, str) and key.lower() in replaced]:
            del carrier[key]
        carrier.update(fields)
    except Exception as exc:
        internal_error("injecting trace context", exc)
    return carrier


def _baggage_header(context: Context | None) -> str:
    """The W3C ``baggage`` value of the context's entries: values percent-encoded as UTF-8 (a
    space as ``%20``: a ``+`` is a plus to a W3C receiver, kaos-otel's included), keys as they are
    but for characters a token cannot hold; whole members only, as many as fit in
    :data:`MAX_HEADER_LENGTH` characters, at most 180 (OpenTelemetry's propagator's limits)."""
    members: list[str] = []
    length = -1  # no comma before the first member
    for key, value in baggage.get_all(context).items():
        member = f"{quote(str(key), safe=_TOKEN_PUNCTUATION)}={quote(str(value), safe='')}"
        if length + 1 + len(member) <= MAX_HEADER_LENGTH:
            members.append(member)
            length += 1 + len(member)
            if len(members) == _MAX_BAGGAGE_MEMBERS:
                break
    return ",".join(members)


class _HasHeaders(Protocol):
    """Any HTTP request object with a mutable ``headers`` mapping (httpx, httpx2, requests)."""

    @property
    def headers(self) -> MutableMapping[str, str]: ...


def inject_request_hook(request: _HasHeaders) -> None:
    """httpx request event hook: add trace context headers without creating a span.

    ``httpx.Client(event_hooks={"request": [inject_request_hook]})``; works with any request
    object that has a mutable ``headers`` mapping.
    """
    inject_headers(request.headers)


async def async_inject_request_hook(request: _HasHeaders) -> None:
    """The ``httpx.AsyncClient`` form of :func:`inject_request_hook`."""
    inject_request_hook(request)


@dataclass(frozen=True, slots=True)
class IncomingContext:
    """What an incoming request's headers may contribute: a parent, links and baggage."""

    parent: Context
    links: tuple[Link, ...]
    trust: TrustPolicy


Headers = Mapping[str, object] | Mapping[bytes, object] | Iterable[tuple[str | bytes, object]]
"""Request headers: a mapping, or (name, value) pairs where a name may repeat (an ASGI scope's
``headers``, a WSGI framework's header list). Names and values are text or bytes (read as
Latin-1); a value may be a list of field lines; what is neither (a number in an MCP ``_meta``)
is no field line."""

_HEX_FIELDS = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE_ID = "0" * 32
_ZERO_PARENT_ID = "0" * 16
_KNOWN_FLAGS = 0x01 | 0x02
"""sampled and (Level 2) random; the other bits are reserved and not propagated."""
_TRACESTATE_KEY = re.compile(
    r"[a-z][a-z0-9_\-*/]{0,255}"  # simple-key
    r"|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13}"  # multi-tenant-key: tenant-id@system-id
)
_TRACESTATE_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
MAX_TRACESTATE_MEMBERS = 32
_OWS = " \t"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Control characters (C0, DEL, C1) and the Unicode line and paragraph separators."""
_BAGGAGE_KEY = re.compile(f"[{re.escape(_TOKEN_PUNCTUATION)}0-9A-Za-z]+")
"""A baggage key: an RFC 9110 token."""
_BAGGAGE_VALUE = re.compile(r"(?:[\x21\x23\x24\x26-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]|%[0-9A-Fa-f]{2})*")
"""A baggage value: baggage-octets (printable ASCII but for ``"``, ``,``, ``;`` and ``\\``), and a
``%`` only as a percent-encoding."""


def _text(value: object) -> str | None:
    """A header name or field line as text (bytes as Latin-1, as HTTP sends them), or ``None``."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return value.decode("latin-1")
    return None


def combined_fields(headers: Headers, name: str) -> list[str]:
    """Every field line of header ``name`` (any case), in order, each without surrounding whitespace."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    fields: list[str] = []
    for key, value in pairs:
        text = _text(key)
        if text is None or text.lower() != name:
            continue
        for line in value if isinstance(value, list | tuple) else (value,):
            field = _text(line)
            if field is not None:
                fields.append(field.strip(_OWS))
    return fields


def parse_traceparent(fields: Sequence[str]) -> tuple[str, str, int] | None:
    """``(trace-id, parent-id, flags)`` from the ``traceparent`` field lines, or ``None`` (restart).

    W3C Trace Context Level 2, 3.2: exactly one field; version two lowercase hex digits, not
    ``ff``; version ``00`` is exactly 55 characters; a higher version is at least 55 characters
    and its flags are followed by the end or a dash (later fields are ignored); trace-id and
    parent-id lowercase hex and not all zeros; only the sampled and random flags are kept.
    """
    if len(fields) != 1 or len(fields[0]) > MAX_HEADER_LENGTH:
        return None  # more than one traceparent: which one is the caller is unknown
    value = fields[0]
    match = _HEX_FIELDS.match(value)
    if match is None:
        return None
    version, trace_id, parent_id, flags = match.groups()
    if version == "ff" or (version == "00" and len(value) != 55):
        return None
    if len(value) > 55 and value[55] != "-":
        return None
    if trace_id == _ZERO_TRACE_ID or parent_id == _ZERO_PARENT_ID:
        return None
    return trace_id, parent_id, int(flags, 16) & _KNOWN_FLAGS


def parse_tracestate(fields: Sequence[str]) -> TraceState:
    """The ``tracestate`` list from its field lines, combined in order (RFC 9110 5.3).

    W3C Trace Context Level 2, 3.3: members are separated by commas with optional spaces and tabs
    around them; empty members are ignored; keys follow the simple-key or ``tenant@system`` grammar
    and their length limits, values are printable ASCII without ``,`` and ``=`` (at most 256
    characters, not ending in a space). A list that breaks the grammar or has more than 32
    members is discarded whole; of a duplicated key the first (most recent) entry is kept.
    """
    combined = ",".join(fields)
    if len(combined) > MAX_HEADER_LENGTH:
        return TraceState()
    entries: dict[str, str] = {}
    members = 0
    for member in combined.split(","):
        member = member.strip(_OWS)
        if not member:
            continue
        key, equals, value = member.partition("=")
        if not equals or not _TRACESTATE_KEY.fullmatch(key) or not _TRACESTATE_VALUE.fullmatch(value):
            return TraceState()
        members += 1
        if members > MAX_TRACESTATE_MEMBERS:
            return TraceState()
        entries.setdefault(key, value)
    return TraceState(list(entries.items()))


def parse_baggage(fields: Sequence[str], allowed: frozenset[str]) -> dict[str, str]:
    """Allow-listed entries of the combined ``baggage`` field lines, read by the W3C Baggage grammar.

    A member is ``key=value`` with optional properties after ``;`` (dropped); the key is a token
    (not decoded), the value percent-decoded as UTF-8 (``+`` is a plus; octets that are no UTF-8
    become U+FFFD). A member that breaks the grammar, or whose value holds a control or
    line-breaking character (CR, LF, NUL, NEL, U+2028...), is dropped alone and silently: a caller
    cannot flood the logs. Of a
    repeated key the last entry counts. Nothing of the current context is mixed in.
    """
    if not allowed or not fields:
        return {}
    combined = ",".join(fields)
    if len(combined) > MAX_HEADER_LENGTH:
        return {}
    entries: dict[str, str] = {}
    for member in combined.split(","):
        key, equals, value = member.split(";", 1)[0].partition("=")
        key, value = key.strip(_OWS), value.strip(_OWS)
        if not equals or key not in allowed or not _BAGGAGE_KEY.fullmatch(key):
            continue
        if not _BAGGAGE_VALUE.fullmatch(value):
            continue
        decoded = unquote(value, errors="replace")  # bytes that are no UTF-8: U+FFFD, as it says
        if not _CONTROL.search(decoded):
            entries[key] = decoded
    return entries


def extract_incoming(
    headers: Headers,
    *,
    trust: TrustPolicy | str = TrustPolicy.TRUSTED,
    baggage_allowlist: Iterable[str] = (),
) -> IncomingContext:
    """Read trace context from request headers under a trust policy; never raises.

    ``trusted`` continues the caller's trace, ``link`` starts a new trace linking to it, and
    ``ignore`` discards it. Malformed, oversized or repeated ``traceparent`` headers give a new
    root. Baggage entries are kept only for allow-listed keys, and never anything else
    (identity never comes from here).
    """
    parent = Context()
    links: tuple[Link, ...] = ()
    try:
        trust = TrustPolicy.from_setting(trust)  # "link" as well as TrustPolicy.LINK
        pairs = list(headers.items() if isinstance(headers, Mapping) else headers)
        parsed = parse_traceparent(combined_fields(pairs, "traceparent"))
        if parsed is not None and trust is not TrustPolicy.IGNORE:
            trace_id, parent_id, flags = parsed
            remote = SpanContext(
                int(trace_id, 16),
                int(parent_id, 16),
                is_remote=True,
                trace_flags=TraceFlags(flags),
                trace_state=parse_tracestate(combined_fields(pairs, "tracestate")),
            )
            if trust is TrustPolicy.TRUSTED:
                parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
            else:
                links = (Link(remote, {catalog.KAOS_TRACE_TRUST: trust.value}),)
        if trust is not TrustPolicy.IGNORE:
            allowed = name_set(baggage_allowlist)
            for key, value in parse_baggage(combined_fields(pairs, "baggage"), allowed).items():
                parent = baggage.set_baggage(key, value, parent)
    except Exception as exc:
        internal_error("extracting trace context", exc)
        return IncomingContext(Context(), (), trust if isinstance(trust, TrustPolicy) else TrustPolicy.IGNORE)
    return IncomingContext(parent, links, trust)
