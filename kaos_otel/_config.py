"""What kaos-otel decides itself, and the explicit overrides of a manager.

The OpenTelemetry SDK and the OTLP exporters read their own ``OTEL_*`` variables (endpoints,
headers, TLS, timeouts, compression, sampler, resource, limits, metric interval): kaos-otel
builds them without passing values from the environment, so a manager exports exactly where
and how a plain SDK setup given the same environment would. Read here is only what the SDK
offers no public reader for: ``OTEL_SDK_DISABLED``, which signals have an endpoint (without one
nothing is exported, rather than sent to a default address), which exporter class each signal's
``OTEL_EXPORTER_OTLP[_SIGNAL]_PROTOCOL`` names, and kaos-otel's own variables. Constructor
arguments of :class:`~kaos_otel.KaosOtelManager` are explicit overrides. Nothing here writes to
``os.environ``.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

from opentelemetry.environment_variables import (
    OTEL_LOGS_EXPORTER,
    OTEL_METRICS_EXPORTER,
    OTEL_TRACES_EXPORTER,
)
from opentelemetry.sdk.environment_variables import (
    OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_LOGS_ENDPOINT,
    OTEL_EXPORTER_OTLP_LOGS_PROTOCOL,
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_SDK_DISABLED,
    OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT,
)

from kaos_otel._internal_log import internal_error, log_once
from kaos_otel.catalog import TELEMETRY_SIGNALS

OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
KAOS_OTEL_CONSOLE = "KAOS_OTEL_CONSOLE"
KAOS_OTEL_TRUST = "KAOS_OTEL_TRUST"
KAOS_OTEL_BAGGAGE_ALLOWLIST = "KAOS_OTEL_BAGGAGE_ALLOWLIST"
OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT = "OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT"
"""Read by the SDK's ``LogLimits`` in newer releases (not a constant of every supported one)."""

_E = TypeVar("_E", bound=StrEnum)

SIGNAL_ENDPOINTS = {
    "traces": OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    "metrics": OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    "logs": OTEL_EXPORTER_OTLP_LOGS_ENDPOINT,
}
SIGNAL_EXPORTERS = {
    "traces": OTEL_TRACES_EXPORTER,
    "metrics": OTEL_METRICS_EXPORTER,
    "logs": OTEL_LOGS_EXPORTER,
}
"""Which exporters a signal uses (``otlp``, ``console``, ``none``), as ``opentelemetry-instrument``
reads them."""
SIGNAL_PROTOCOLS = {
    "traces": OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    "metrics": OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    "logs": OTEL_EXPORTER_OTLP_LOGS_PROTOCOL,
}
DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT = 8192
"""The attribute value cap of a signal no ``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT`` limits (the SDK
has none): prompts and stack traces must not make spans of megabytes."""


class OtlpProtocol(StrEnum):
    """OTLP transport (``OTEL_EXPORTER_OTLP_PROTOCOL`` and its per-signal variants)."""

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

    @classmethod
    def from_setting(cls, raw: object) -> TrustPolicy:
        """The policy a setting names, in any case; unset is ``trusted``. A value naming none of
        them trusts nothing (``ignore``), with a warning: a typo must not let callers in."""
        if isinstance(raw, TrustPolicy):
            return raw
        text = "" if raw is None else str(raw).strip().lower()
        if not text:
            return cls.TRUSTED
        try:
            return cls(text)
        except ValueError:
            log_once(
                f"unknown trust {text}",
                "kaos-otel: trust policy %r is not trusted, link or ignore; incoming trace context "
                "is ignored",
                raw,
                level=logging.WARNING,
            )
            return cls.IGNORE


@dataclass(frozen=True, slots=True)
class TelemetrySettings:
    """What one :class:`~kaos_otel.KaosOtelManager` decided, and its explicit overrides.

    ``None`` means "as the SDK reads it from the environment".
    """

    disabled: bool = False
    endpoints: Mapping[str, str] = field(default_factory=dict)
    """Signals that export, and where (the override, else the variable); empty = no export."""
    protocols: Mapping[str, OtlpProtocol] = field(default_factory=dict)
    """Each signal's transport, whether it exports or not (the no-endpoint notice names its port)."""
    endpoint: str | None = None
    """Explicit base endpoint for every signal (``/v1/<signal>`` is added for HTTP)."""
    service_name: str | None = None
    resource_attributes: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    export_timeout_s: float | None = None
    metric_export_interval_ms: int | None = None
    span_schedule_delay_ms: int | None = None
    span_max_queue_size: int | None = None
    attribute_value_length_limit: int = DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
    """kaos-otel's own cap on attribute values: never below a limit the SDK applies to spans or to
    log records (which it reads itself), so that within the SDK's limits a value exports as it
    would without kaos-otel; where the SDK applies none (no variable, or an empty one), it is
    :data:`DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT`."""
    capture_content: ContentCapture = ContentCapture.NO_CONTENT
    console: bool = False
    """Traces and metrics also to stdout (``KAOS_OTEL_CONSOLE``, or ``console=True``)."""
    exporters: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """The exporters ``OTEL_{TRACES,METRICS,LOGS}_EXPORTER`` name for a signal: without ``otlp``,
    the signal exports no OTLP wherever an endpoint points; ``console`` adds stdout. Unset: OTLP."""
    trust: TrustPolicy = TrustPolicy.TRUSTED
    baggage_allowlist: frozenset[str] = frozenset()

    @property
    def exporting(self) -> bool:
        """At least one signal has an OTLP endpoint."""
        return bool(self.endpoints)

    def to_console(self, signal: str) -> bool:
        """Whether ``signal`` is also written to stdout."""
        return (self.console and signal != "logs") or "console" in self.exporters.get(signal, ())

    def chosen_off(self, signal: str) -> bool:
        """Whether the environment turned ``signal``'s OTLP export off (``OTEL_*_EXPORTER`` without
        ``otlp``), rather than no endpoint being set."""
        return signal in self.exporters and "otlp" not in self.exporters[signal]

    @property
    def attribute_limit_from_environment(self) -> bool:
        """Whether a variable the SDK's ``SpanLimits`` reads for attribute value caps is set (an
        empty one too: to the SDK it means no limit)."""
        env = os.environ
        return OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT in env or OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT in env

    @classmethod
    def from_env(cls, **overrides: Any) -> TelemetrySettings:
        """Read what the SDK has no reader for from ``os.environ``, then apply non-``None`` overrides."""
        env = os.environ
        values = {key: value for key, value in overrides.items() if value is not None}
        values.update(_checked_overrides(values))
        protocol = values.pop("protocol", None)
        endpoint = values.pop("endpoint", None) or None  # blank: as not given
        if not values.get("service_name", "given").strip():  # blank: as not given (OTEL_SERVICE_NAME)
            del values["service_name"]
        endpoints: dict[str, str] = {}
        protocols: dict[str, OtlpProtocol] = {}
        chosen = {
            signal: _exporter_names(env, signal)
            for signal in TELEMETRY_SIGNALS
            if env.get(SIGNAL_EXPORTERS[signal], "").strip()
        }
        exporters = {signal: names for signal, (names, _) in chosen.items()}
        for signal in TELEMETRY_SIGNALS:
            named = chosen[signal][1] if signal in chosen else None  # otlp_proto_http...
            from_variables = env.get(SIGNAL_PROTOCOLS[signal]) or env.get(OTEL_EXPORTER_OTLP_PROTOCOL)
            known = from_variables and from_variables.strip() in _PROTOCOL_NAMES  # as the SDK checks
            if named and not protocol and known and _protocol(from_variables) is not named:
                log_once(  # as the SDK's configurator says it
                    f"conflicting-protocol-{signal}",
                    "kaos-otel: conflicting values for %s OTLP exporter protocol, using %r",
                    signal, env.get(SIGNAL_EXPORTERS[signal]),
                    level=logging.WARNING,
                )  # fmt: skip
            signal_protocol = _protocol(protocol or named or from_variables)
            where = _signal_endpoint(env, signal, endpoint, signal_protocol)
            protocols[signal] = signal_protocol
            if where and (signal not in exporters or "otlp" in exporters[signal]):
                endpoints[signal] = where
        values["capture_content"] = _capture_content(values.pop("capture_content", None), env)
        trust = values.get("trust", env.get(KAOS_OTEL_TRUST))
        values["trust"] = TrustPolicy.from_setting(trust)
        # as the SDK's providers read it: "true" in any case, nothing else
        disabled_by_env = (env.get(OTEL_SDK_DISABLED) or "").strip().lower() == "true"
        if disabled_by_env and values.get("disabled") is False:
            log_once(
                "disabled-false-under-sdk-disabled",
                "kaos-otel: disabled=False cannot override %s=%s: the SDK's providers read it "
                "themselves and record nothing; telemetry stays off",
                OTEL_SDK_DISABLED, env.get(OTEL_SDK_DISABLED),
                level=logging.WARNING,
            )  # fmt: skip
            values["disabled"] = True
        values.setdefault("disabled", disabled_by_env)
        values.setdefault("console", _bool(env.get(KAOS_OTEL_CONSOLE)))
        values.setdefault("attribute_value_length_limit", _attribute_cap(env))
        return replace(
            cls(),
            endpoints=endpoints,
            protocols=protocols,
            endpoint=endpoint,
            exporters=exporters,
            baggage_allowlist=frozenset(
                key.strip() for key in env.get(KAOS_OTEL_BAGGAGE_ALLOWLIST, "").split(",") if key.strip()
            ),
            **values,
        )


_WHOLE_OVERRIDES = ("metric_export_interval_ms", "span_schedule_delay_ms", "span_max_queue_size")
_MAPPING_OVERRIDES = ("headers", "resource_attributes")
_SWITCH_OVERRIDES = ("disabled", "console")


def _checked_overrides(values: Mapping[str, object]) -> dict[str, object]:
    """The explicit overrides the exporters are given (sizes and milliseconds as whole numbers,
    mappings as dicts); one no exporter could use is refused by name before anything is built, as
    is a switch that is not a bool (``disabled="false"`` would turn telemetry off) and an endpoint
    or service name that is not text."""
    checked: dict[str, object] = {}
    for name in _SWITCH_OVERRIDES:
        if name in values and not isinstance(values[name], bool):
            raise TypeError(f"kaos-otel: {name} must be True or False, not {type(values[name]).__name__}")
    for name in ("endpoint", "service_name"):
        if name in values and not isinstance(values[name], str):
            raise TypeError(f"kaos-otel: {name} must be a string, not {type(values[name]).__name__}")
    for name in (*_WHOLE_OVERRIDES, "export_timeout_s"):
        if name in values:
            checked[name] = _positive(name, values[name], whole=name in _WHOLE_OVERRIDES)
    for name in _MAPPING_OVERRIDES:
        if name in values:
            checked[name] = _pairs(name, values[name])
    return checked


_LARGEST_OVERRIDE = 1_000_000_000
"""More milliseconds and seconds than an exporter waits, and more items than a queue holds."""


def _positive(name: str, value: object, *, whole: bool) -> int | float:
    """``value`` as a positive finite number (rounded if ``whole``), or an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"kaos-otel: {name} must be a positive number, not {type(value).__name__}")
    try:
        real = float(value)
    except OverflowError:  # an int too large for a float
        real = math.inf
    number = round(real) if whole and math.isfinite(real) else real
    if not math.isfinite(real) or not 0 < number <= _LARGEST_OVERRIDE:
        rounded = " (whole, once rounded)" if whole else ""
        raise ValueError(
            f"kaos-otel: {name} must be a positive number{rounded} up to {_LARGEST_OVERRIDE:,}, "
            f"not {repr(value)[:40]}"
        )
    return number


def _pairs(name: str, value: object) -> dict[object, object]:
    """``value`` as a dict, read as ``dict()`` reads it (a mapping, an object with ``keys()``, or
    pairs; text is no pairs), or an error naming ``name``. Header names are lowercased, as the
    SDK does with the variables (gRPC refuses every export with an uppercase metadata key), and
    headers are text."""
    try:
        if isinstance(value, str | bytes):
            raise TypeError("text")
        if hasattr(value, "keys"):
            items = [(key, value[key]) for key in value.keys()]  # type: ignore[index]  # noqa: SIM118 (as dict() reads it)
        else:
            items = list(value)  # type: ignore[call-overload]
            if any(isinstance(item, str | bytes) for item in items):
                raise TypeError("text")
        pairs = dict(items)
        if name != "headers":
            return pairs
        if not all(isinstance(item, str) for pair in pairs.items() for item in pair):
            raise TypeError("headers are text")
        return {str(key).lower(): header for key, header in pairs.items()}
    except (TypeError, ValueError) as exc:
        what = "names to text values" if name == "headers" else "names to values"
        raise TypeError(f"kaos-otel: {name} must be a mapping of {what}, not {type(value).__name__}") from exc


_OTLP_EXPORTER_NAMES: dict[str, OtlpProtocol | None] = {
    "otlp": None,
    "otlp_proto_grpc": OtlpProtocol.GRPC,
    "otlp_proto_http": OtlpProtocol.HTTP_PROTOBUF,
}
"""OTLP under the names ``opentelemetry-instrument`` knows; the last two fix the protocol."""


def _exporter_names(env: Mapping[str, str], signal: str) -> tuple[frozenset[str], OtlpProtocol | None]:
    """What ``OTEL_<SIGNAL>_EXPORTER`` (comma-separated names) asks for: ``otlp`` and ``console``,
    and the protocol an ``otlp_proto_*`` name fixes; a name kaos-otel cannot build is said once
    and left out."""
    variable = SIGNAL_EXPORTERS[signal]
    names = frozenset(name.strip().lower() for name in env.get(variable, "").split(",") if name.strip())
    unknown = sorted(names - set(_OTLP_EXPORTER_NAMES) - {"console", "none"})
    if unknown:
        log_once(
            f"unknown-exporter-{signal}",
            "kaos-otel: %s=%s: kaos-otel builds the otlp (otlp_proto_grpc, otlp_proto_http) and "
            "console exporters only (or none); "
            "%s ignored",
            variable, env.get(variable), ", ".join(unknown),
            level=logging.WARNING,
        )  # fmt: skip
    otlp = [name for name in _OTLP_EXPORTER_NAMES if name in names]
    chosen = frozenset({"otlp"} if otlp else set()) | (names & {"console"})
    return chosen, next((_OTLP_EXPORTER_NAMES[name] for name in otlp if _OTLP_EXPORTER_NAMES[name]), None)


_PROTOCOL_NAMES = frozenset(OtlpProtocol)
"""The protocols kaos-otel builds, by member and by name (``OtlpProtocol`` is a ``StrEnum``)."""


def _protocol(raw: object) -> OtlpProtocol:
    """The OTLP protocol ``raw`` names (unset: gRPC, the SDK's default); a value naming no
    protocol kaos-otel builds is said once, and gRPC is used."""
    protocol = enum_member(OtlpProtocol, raw, OtlpProtocol.GRPC)
    text = "" if raw is None else str(raw).strip()
    if text and text != protocol.value:
        log_once(
            f"unknown-protocol-{text}",
            "kaos-otel: OTLP protocol %r is not one of %s; grpc is used",
            text, ", ".join(member.value for member in OtlpProtocol),
            level=logging.WARNING,
        )  # fmt: skip
    return protocol


def _signal_endpoint(
    env: Mapping[str, str], signal: str, endpoint: str | None, protocol: OtlpProtocol
) -> str | None:
    """Where ``signal`` goes: the explicit endpoint (the signal's path added for ``protocol``
    HTTP, wherever that protocol was chosen), else the per-signal or base variable."""
    if endpoint:
        if protocol is OtlpProtocol.HTTP_PROTOBUF:
            return endpoint.rstrip("/") + f"/v1/{signal}"
        return endpoint
    return env.get(SIGNAL_ENDPOINTS[signal]) or env.get(OTEL_EXPORTER_OTLP_ENDPOINT) or None


def content_from_env(capture_content: bool | str | None = None) -> tuple[ContentCapture, int]:
    """Content capture (``capture_content``, else ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``)
    and the attribute value cap, read from the environment as a manager reads them, and nothing
    else of it."""
    return _capture_content(capture_content, os.environ), _attribute_cap(os.environ)


def _capture_content(capture: object, env: Mapping[str, str]) -> ContentCapture:
    """The capture ``capture`` asks for (``True``/``False`` or a mode), else the environment's."""
    if isinstance(capture, bool):
        return ContentCapture.SPAN_AND_EVENT if capture else ContentCapture.NO_CONTENT
    from_env = env.get(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)
    return _capture(str(capture) if capture is not None else from_env)


def _attribute_cap(env: Mapping[str, str]) -> int:
    return _attribute_limit(env) or DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT


def _attribute_limit(env: Mapping[str, str]) -> int | None:
    """The largest attribute value cap the SDK applies (span attributes; event and link
    attributes; log record attributes) if a variable sets one; an attribute kind no variable
    limits counts as :data:`DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT`."""
    limits = (
        _first_limit(env, OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT, OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT),
        _first_limit(env, OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT),
        _first_limit(env, OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT, OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT),
    )
    if all(limit is None for limit in limits):
        return None
    return max(DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT if limit is None else limit for limit in limits)


def _first_limit(env: Mapping[str, str], *names: str) -> int | None:
    """The value of the first of ``names`` that is set; ``None`` for no limit: none is set, the
    first set is empty (as the SDK reads it) or not a number."""
    for name in names:
        if name in env:
            try:
                return max(0, int(env[name].strip()))
            except ValueError:
                return None
    return None


def _bool(raw: str | None) -> bool:
    return (raw or "").strip().lower() in ("1", "true", "yes", "on")


def _capture(raw: str | None) -> ContentCapture:
    """The content capture a setting names: a convention value in any case, or true/false; a
    value naming neither captures nothing, with a warning (a typo must not capture content)."""
    if _bool(raw):
        return ContentCapture.SPAN_AND_EVENT
    value = (raw or "").strip().upper()
    if value in _CAPTURE_OFF:
        return ContentCapture.NO_CONTENT
    if value in ContentCapture.__members__:
        return ContentCapture(value)
    log_once(
        f"unknown-capture-{value}",
        "kaos-otel: content capture %r is not one of %s, true or false; no content is captured",
        raw, ", ".join(ContentCapture),
        level=logging.WARNING,
    )  # fmt: skip
    return ContentCapture.NO_CONTENT


_CAPTURE_OFF = frozenset({"", "FALSE", "0", "NO", "OFF"})


def name_set(names: Iterable[str]) -> frozenset[str]:
    """The strings of ``names`` as a set; one string is one name, not its characters
    (``excluded_paths="/health"``), and an item that is not a string is not a name."""
    if type(names) is frozenset:  # already a set (the middleware's allow-list, per request)
        return names
    return frozenset(
        name for name in ((names,) if isinstance(names, str) else names) if isinstance(name, str)
    )


def enum_member(kind: type[_E], raw: object, default: _E, where: str | None = None) -> _E:
    """``raw`` as a member of ``kind`` (a member, or its value with spaces around it); ``default``
    when unset or naming no member, which is logged as an internal error of ``where`` if given."""
    if isinstance(raw, kind):
        return raw
    try:
        text = "" if raw is None else str(raw).strip()
        return kind(text) if text else default
    except Exception as exc:
        if where is not None:
            internal_error(where, exc)
        return default
