"""Settings and the environment variables they read, in one place.

Every setting comes from the standard ``OTEL_*`` variables unless a constructor argument of
:class:`~kaos_otel.KaosOtelManager` overrides it. Nothing here writes to ``os.environ``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import unquote

OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
OTEL_EXPORTER_OTLP_TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
OTEL_TRACES_SAMPLER = "OTEL_TRACES_SAMPLER"
OTEL_TRACES_SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
OTEL_BSP_SCHEDULE_DELAY = "OTEL_BSP_SCHEDULE_DELAY"
OTEL_BSP_MAX_QUEUE_SIZE = "OTEL_BSP_MAX_QUEUE_SIZE"
OTEL_BSP_MAX_EXPORT_BATCH_SIZE = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
OTEL_BLRP_SCHEDULE_DELAY = "OTEL_BLRP_SCHEDULE_DELAY"
OTEL_BLRP_MAX_QUEUE_SIZE = "OTEL_BLRP_MAX_QUEUE_SIZE"
OTEL_METRIC_EXPORT_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
KAOS_OTEL_CONSOLE = "KAOS_OTEL_CONSOLE"
KAOS_OTEL_TRUST = "KAOS_OTEL_TRUST"
KAOS_OTEL_BAGGAGE_ALLOWLIST = "KAOS_OTEL_BAGGAGE_ALLOWLIST"

_E = TypeVar("_E", bound=StrEnum)

SIGNALS = ("traces", "metrics", "logs")
DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT = 8192
DEFAULT_EXPORT_TIMEOUT_S = 5.0


class Protocol(StrEnum):
    """OTLP transport (``OTEL_EXPORTER_OTLP_PROTOCOL``)."""

    GRPC = "grpc"
    HTTP_PROTOBUF = "http/protobuf"


class ContentCapture(StrEnum):
    """Where prompt, response, tool and memory content may go (GenAI convention values)."""

    NO_CONTENT = "NO_CONTENT"
    SPAN_ONLY = "SPAN_ONLY"
    EVENT_ONLY = "EVENT_ONLY"
    SPAN_AND_EVENT = "SPAN_AND_EVENT"

    @property
    def on_spans(self) -> bool:
        """Content may be set as span attributes."""
        return self in (ContentCapture.SPAN_ONLY, ContentCapture.SPAN_AND_EVENT)

    @property
    def on_events(self) -> bool:
        """Content may be emitted as log events."""
        return self in (ContentCapture.EVENT_ONLY, ContentCapture.SPAN_AND_EVENT)

    @property
    def enabled(self) -> bool:
        """Any content is captured."""
        return self is not ContentCapture.NO_CONTENT


class TrustPolicy(StrEnum):
    """What an incoming ``traceparent`` is allowed to do."""

    TRUSTED = "trusted"
    """Continue the caller's trace."""
    LINK = "link"
    """Start a new trace with a span link to the caller's (public edges)."""
    IGNORE = "ignore"
    """Start a new trace and discard the caller's context."""


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    """Resolved configuration of one :class:`~kaos_otel.KaosOtelManager`."""

    service_name: str = "unknown_service"
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    disabled: bool = False
    endpoints: Mapping[str, str] = field(default_factory=dict)
    """Per-signal OTLP endpoint (full URL for http/protobuf, host URL for gRPC); empty = no export."""
    protocol: Protocol = Protocol.GRPC
    headers: Mapping[str, str] = field(default_factory=dict)
    export_timeout_s: float = DEFAULT_EXPORT_TIMEOUT_S
    sampler: str = "parentbased_always_on"
    sampler_arg: str | None = None
    span_schedule_delay_ms: int = 1000
    span_max_queue_size: int = 2048
    span_max_export_batch_size: int = 512
    log_schedule_delay_ms: int = 1000
    log_max_queue_size: int = 2048
    metric_export_interval_ms: int = 60000
    attribute_value_length_limit: int = DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
    capture_content: ContentCapture = ContentCapture.NO_CONTENT
    console: bool = False
    trust: TrustPolicy = TrustPolicy.TRUSTED
    baggage_allowlist: frozenset[str] = frozenset()

    @property
    def exporting(self) -> bool:
        """At least one signal has an OTLP endpoint."""
        return bool(self.endpoints)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> TelemetrySettings:
        """Read the ``OTEL_*`` variables, then apply non-``None`` overrides."""
        env = os.environ if environ is None else environ
        protocol = _enum(Protocol, env.get(OTEL_EXPORTER_OTLP_PROTOCOL), Protocol.GRPC)
        settings = cls(
            service_name=env.get(OTEL_SERVICE_NAME) or "unknown_service",
            resource_attributes=parse_key_values(env.get(OTEL_RESOURCE_ATTRIBUTES, "")),
            disabled=_bool(env.get(OTEL_SDK_DISABLED)),
            endpoints=_endpoints(env, protocol, env.get(OTEL_EXPORTER_OTLP_ENDPOINT)),
            protocol=protocol,
            headers=parse_key_values(env.get(OTEL_EXPORTER_OTLP_HEADERS, "")),
            export_timeout_s=_int(env, OTEL_EXPORTER_OTLP_TIMEOUT, int(DEFAULT_EXPORT_TIMEOUT_S * 1000))
            / 1000,
            sampler=env.get(OTEL_TRACES_SAMPLER) or "parentbased_always_on",
            sampler_arg=env.get(OTEL_TRACES_SAMPLER_ARG),
            span_schedule_delay_ms=_int(env, OTEL_BSP_SCHEDULE_DELAY, 1000),
            span_max_queue_size=_int(env, OTEL_BSP_MAX_QUEUE_SIZE, 2048),
            span_max_export_batch_size=_int(env, OTEL_BSP_MAX_EXPORT_BATCH_SIZE, 512),
            log_schedule_delay_ms=_int(env, OTEL_BLRP_SCHEDULE_DELAY, 1000),
            log_max_queue_size=_int(env, OTEL_BLRP_MAX_QUEUE_SIZE, 2048),
            metric_export_interval_ms=_int(env, OTEL_METRIC_EXPORT_INTERVAL, 60000),
            attribute_value_length_limit=_int(
                env, OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT, DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
            ),
            capture_content=_capture(env.get(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)),
            console=_bool(env.get(KAOS_OTEL_CONSOLE)),
            trust=_enum(TrustPolicy, env.get(KAOS_OTEL_TRUST), TrustPolicy.TRUSTED),
            baggage_allowlist=frozenset(
                key.strip() for key in env.get(KAOS_OTEL_BAGGAGE_ALLOWLIST, "").split(",") if key.strip()
            ),
        )
        return settings.with_overrides(**overrides)

    def with_overrides(self, **overrides: Any) -> TelemetrySettings:
        """A copy with every non-``None`` override applied (``endpoint`` sets all signals)."""
        values = {key: value for key, value in overrides.items() if value is not None}
        protocol = _enum(Protocol, values.pop("protocol", None), self.protocol)
        endpoint = values.pop("endpoint", None)
        capture = values.pop("capture_content", None)
        if isinstance(capture, bool):
            values["capture_content"] = (
                ContentCapture.SPAN_AND_EVENT if capture else ContentCapture.NO_CONTENT
            )
        elif capture is not None:
            values["capture_content"] = _capture(str(capture))
        if "trust" in values:
            values["trust"] = _enum(TrustPolicy, values["trust"], self.trust)
        if endpoint is not None:
            values["endpoints"] = _endpoints({}, protocol, endpoint)
        elif protocol is not self.protocol and self.endpoints:
            values["endpoints"] = _endpoints({}, protocol, _base_endpoint(self.endpoints, self.protocol))
        return replace(self, protocol=protocol, **values)


def parse_key_values(raw: str) -> dict[str, str]:
    """Parse ``k1=v1,k2=v2`` (W3C-baggage style, percent-decoded); malformed pairs are skipped."""
    pairs: dict[str, str] = {}
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


def _signal_path(signal: str) -> str:
    return f"/v1/{signal}"


def _endpoints(env: Mapping[str, str], protocol: Protocol, base: str | None) -> dict[str, str]:
    """Resolve each signal's endpoint from the base and the per-signal variables."""
    resolved: dict[str, str] = {}
    for signal in SIGNALS:
        specific = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
        if specific:
            resolved[signal] = specific
        elif base:
            stripped = base.rstrip("/")
            resolved[signal] = stripped if protocol is Protocol.GRPC else stripped + _signal_path(signal)
    return resolved


def _base_endpoint(endpoints: Mapping[str, str], protocol: Protocol) -> str:
    """Recover the base endpoint from resolved per-signal endpoints."""
    first = next(iter(endpoints.values()))
    if protocol is Protocol.HTTP_PROTOBUF:
        for signal in SIGNALS:
            if first.endswith(_signal_path(signal)):
                return first[: -len(_signal_path(signal))]
    return first


def _bool(raw: str | None) -> bool:
    return (raw or "").strip().lower() in ("1", "true", "yes", "on")


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(float(env[key]))
    except (KeyError, ValueError):
        return default


def _capture(raw: str | None) -> ContentCapture:
    value = (raw or "").strip().upper()
    if value in ("TRUE", "1", "YES", "ON"):
        return ContentCapture.SPAN_AND_EVENT
    return _enum(ContentCapture, value, ContentCapture.NO_CONTENT)


def _enum(kind: type[_E], raw: Any, default: _E) -> _E:
    if isinstance(raw, kind):
        return raw
    try:
        return kind(str(raw).strip()) if raw not in (None, "") else default
    except ValueError:
        return default
