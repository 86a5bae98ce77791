"""One content-safety layer: a secret in any exported string arrives masked.

Span names, status descriptions, attribute values (sequences too), event names and attributes,
link attributes, log bodies and attributes, exception messages and stack traces, and metric label
values, through the manager's own pipeline and through a host's providers with
:func:`kaos_otel.sanitized_exporter`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import _logs, trace
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider, LogRecordProcessor
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from kaos_otel import (
    AgentTelemetry,
    ContentCapture,
    ContentPolicy,
    KaosOtelManager,
    _config,
    catalog,
    sanitized_exporter,
)
from kaos_otel._content import to_attribute_value
from kaos_otel._logs import KaosLoggingHandler
from kaos_otel._secrets import REDACTED
from kaos_otel.receiver import OtlpReceiver

MakeOtel = Callable[..., KaosOtelManager]

SECRET = "sk-proj-" + "Zx9" * 12
"""An OpenAI-style key: the default redactor masks it wherever it appears."""
CREDENTIAL = "hunter2plaincredential"
"""A secret of no known shape: masked only where a key or header names it a secret."""


def _emit_everywhere(
    tracer_provider: trace.TracerProvider, logger: logging.Logger, logger_provider: _logs.LoggerProvider
) -> None:
    tracer = tracer_provider.get_tracer("safety")
    with tracer.start_as_current_span("linked") as linked:
        pass
    caller = SpanContext(  # an incoming traceparent and tracestate: the tracestate is the caller's text
        0x1F, 0x2F, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", SECRET)])
    )
    with tracer.start_as_current_span("called", context=set_span_in_context(NonRecordingSpan(caller))):
        pass
    with tracer.start_as_current_span(
        f"name {SECRET}",
        attributes={
            "plain": f"value {SECRET}",
            "many": (f"a {SECRET}", "b"),
            "http.request.header.authorization": (CREDENTIAL,),
            "headers": f'{{"Authorization": "Token {CREDENTIAL}"}}',
            f"cache.{SECRET}": "hit",  # a key that holds a credential
            "raw": f"Authorization: Bearer {SECRET}".encode(),
        },
        links=[Link(linked.get_span_context(), {"why": f"link {SECRET}"})],
    ) as span:
        span.add_event(f"event {SECRET}", {"detail": f"event attribute {SECRET}"})
        span.set_status(Status(StatusCode.ERROR, f"status {SECRET}"))
        try:
            raise ValueError(f"message {SECRET}")
        except ValueError as exc:
            span.record_exception(exc)
            structured = {
                "request": {"api_key": CREDENTIAL, "note": f"n {SECRET}", SECRET: "keyed"},
                "attempts": [1, SECRET],
                "raw_header": f"Authorization: Bearer {SECRET}".encode(),
            }
            logger.exception("body %s", SECRET, extra={"extra.key": f"attribute {SECRET}", **structured})
    logger_provider.get_logger("safety").emit(  # a structured body, through the Logs API
        body={
            "password": CREDENTIAL,
            "tool": {"arguments": {"api_key": CREDENTIAL}},
            f"k {SECRET}": f"Authorization: Bearer {SECRET}".encode(),
        }
    )


def _assert_masked(receiver: OtlpReceiver, spans: int, logs: int) -> None:
    assert receiver.wait_for(lambda r: len(r.spans()) >= spans and len(r.logs()) >= logs, 20)
    payload = b"".join(request.SerializeToString() for request in receiver.raw_requests())
    assert SECRET.encode() not in payload and CREDENTIAL.encode() not in payload
    assert payload.count(REDACTED.encode()) >= 9  # the texts did arrive, masked (the test can fail)


def test_the_manager_masks_every_exported_string(make_otel: MakeOtel, otlp_receiver: OtlpReceiver) -> None:
    otel = make_otel(
        environ={
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY",
            "OTEL_RESOURCE_ATTRIBUTES": f"db.url=postgres://app:{CREDENTIAL}@db/app,openai.key={SECRET}",
        }
    )
    logger = logging.getLogger("tests.safety.manager")
    logger.addHandler(KaosLoggingHandler(otel.logger_provider, otel.content_policy))
    logger.propagate = False
    try:
        _emit_everywhere(otel.tracer_provider, logger, otel.logger_provider)
        otel.metrics.record_tool_call("agent", f"tool-{SECRET}", catalog.Outcome.SUCCESS, 0.1)
        assert otel.force_flush(10)
    finally:
        logger.handlers.clear()
        logger.propagate = True
    _assert_masked(otlp_receiver, spans=3, logs=2)
    labels = {p.attributes.get(catalog.GEN_AI_TOOL_NAME) for p in otlp_receiver.metric_points()}
    assert labels >= {catalog.OVERFLOW_VALUE}
    assert not any(SECRET in str(label) for label in labels)


def test_another_meters_label_values_are_masked_when_the_manager_exports_them(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """With ``export_other_metrics`` (and under the distro, which sets it), the app's own meters
    reach the manager's metric exporter: their label values, and the resource, are cleaned too."""
    otel = make_otel(environ={"OTEL_RESOURCE_ATTRIBUTES": f"openai.key={SECRET}"}, export_other_metrics=True)
    orders = otel.meter_provider.get_meter("shop").create_counter("shop.db.queries")
    orders.add(1, {"db.url": f"postgres://app:{CREDENTIAL}@db/app", "auth": f"Bearer {SECRET}"})
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: any(p.name == "shop.db.queries" for p in r.metric_points()), 10)
    (point,) = [p for p in otlp_receiver.metric_points() if p.name == "shop.db.queries"]
    assert point.attributes == {"db.url": f"postgres://{REDACTED}@db/app", "auth": f"Bearer {REDACTED}"}
    payload = b"".join(request.SerializeToString() for request in otlp_receiver.raw_requests())
    assert SECRET.encode() not in payload and CREDENTIAL.encode() not in payload


def test_a_host_with_its_own_providers_adds_the_layer_with_one_call_per_exporter(
    otlp_receiver: OtlpReceiver,
) -> None:
    endpoint = otlp_receiver.grpc_endpoint
    resource = Resource.create(
        {"db.url": f"postgres://app:{CREDENTIAL}@db/app", "process.command_args": ("a", f"--key={SECRET}")}
    )
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(sanitized_exporter(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    )
    logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)  # masked in log records too
    logger_provider.add_log_record_processor(
        BatchLogRecordProcessor(sanitized_exporter(OTLPLogExporter(endpoint=endpoint, insecure=True)))
    )
    logger = logging.getLogger("tests.safety.host")
    logger.addHandler(KaosLoggingHandler(logger_provider, ContentPolicy()))
    logger.propagate = False
    try:
        _emit_everywhere(tracer_provider, logger, logger_provider)
        telemetry = AgentTelemetry.from_providers(tracer_provider)
        with telemetry.span(f"domain {SECRET}"):
            pass
        assert tracer_provider.force_flush(10_000)
        assert logger_provider.force_flush(10_000)
        _assert_masked(otlp_receiver, spans=4, logs=2)
    finally:
        logger.handlers.clear()
        logger.propagate = True
        tracer_provider.shutdown()
        logger_provider.shutdown()


def test_disabled_and_enabled_managers_share_one_policy_type(make_otel: MakeOtel) -> None:
    """The layer's policy is the manager's: its redactor and cap are the ones exported strings get."""
    otel: KaosOtelManager = make_otel(environ={"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "64"})
    assert otel.content_policy.max_value_length == 64
    assert otel.content_policy.clean_text(f"x {SECRET}") == f"x {REDACTED}"


@pytest.mark.parametrize(
    "key",
    ["password", "db.passwd", "secret", "auth_token", "api_key", "private_key", "ssh.private-key",
     "aws.access_key", "accessKey", "credentials", "authorization", "cookie", "passphrase",
     "azure.account_key", "client_secret"],
)  # fmt: skip
def test_a_whole_attribute_whose_key_names_a_secret_is_masked(key: str) -> None:
    """Every key name the README lists masks the whole value, whatever its shape."""
    assert ContentPolicy().clean_attribute(key, "plain-value-42") == REDACTED


@pytest.mark.parametrize(
    "key",
    ["gen_ai.usage.input_tokens", "max_tokens", "primary_key", "keyboard", "gen_ai.token.type",
     "tokenizer.vocab_size", "password_min_length", "credential.expires_in_s"],
)  # fmt: skip
def test_keys_that_only_look_like_secrets_keep_their_values(key: str) -> None:
    assert ContentPolicy().clean_attribute(key, "plain-value-42") == "plain-value-42"
    assert ContentPolicy().clean_attribute(key, 50257) == 50257


def test_structured_log_attributes_are_cleaned_item_by_item_and_capped() -> None:
    policy = ContentPolicy(max_value_length=64)
    structured = {"api_key": CREDENTIAL, "items": [1, f"x {SECRET}", b"b" * 100]}
    cleaned = policy.clean_attribute("request", structured)  # type: ignore[arg-type]
    assert cleaned == {"api_key": REDACTED, "items": [1, f"x {REDACTED}", b"b" * 64]}
    assert policy.clean_attribute("cookie", ("a", "b")) == (REDACTED, REDACTED)
    assert policy.clean_attribute("embedding", (0.5, 1, True)) == (0.5, 1, True)
    # numbers and bytes under a secret-named key, bytes holding a secret
    assert policy.clean_attribute("password", 12345678) == REDACTED
    assert policy.clean_attribute("db.password", b"hunter2") == REDACTED
    assert policy.clean_attribute("retry.count", 3) == 3
    assert policy.clean_attribute("tls.secret_set", True) is True
    assert policy.clean_attribute("raw", f"x {SECRET}".encode()) == f"x {REDACTED}"
    assert policy.clean_attribute("raw", b"\xff\x00 plain") == b"\xff\x00 plain"
    # whatever the type under a secret-named key: masked whole
    assert policy.clean_attribute("password", {"primary": "hunter2"}) == REDACTED
    assert policy.clean_attribute("db.password", (1, 2, 3, 4)) == REDACTED
    assert policy.clean_attribute("request", {"credentials": {"user": "u"}}) == {"credentials": REDACTED}
    huge = policy.clean_attribute("huge", {"k": "v" * 5_000_000})
    assert isinstance(huge, dict) and len(huge["k"]) == 64
    assert huge["k"].endswith("...[truncated 4999936 chars]")
    wide = policy.clean_attribute("wide", {str(i): i for i in range(10_000)})
    # too wide to stay a structure: JSON text within the cap, still JSON
    assert isinstance(wide, str) and len(wide) <= 64 and isinstance(json.loads(wide), dict)


class _Queued(LogRecordProcessor):
    """The log records as they are handed to the export queue (before any export-side cleaning)."""

    def __init__(self) -> None:
        self.records: list[Any] = []

    def on_emit(self, log_data: Any) -> None:
        self.records.append(log_data.log_record)

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_a_huge_extra_string_is_capped_before_it_is_queued(make_otel: MakeOtel) -> None:
    """A log record waits in the queue for the export thread, which cleans it: a 1 MB ``extra=``
    string must not wait there whole (1,000 such records held a gigabyte with the collector down).
    The cap is the attribute value limit the environment sets, as for a span's attributes."""
    otel = make_otel(environ={"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "20000"})
    queued = _Queued()
    provider = otel.logger_provider
    assert isinstance(provider, LoggerProvider)
    provider.add_log_record_processor(queued)
    under = "u" * 15_000
    logging.getLogger("test.huge").warning("big", extra={"app.blob": "y" * 1_000_000, "app.under": under})
    (record,) = [r for r in queued.records if r.body == "big"]
    assert 20_000 <= len(record.attributes["app.blob"]) <= 20_000 + 256  # the cap and its marker
    assert record.attributes["app.under"] == under


def test_a_value_the_cap_cuts_is_cleaned_before_the_cut(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """The cap keeps a URL up to the end of its password and cuts off the "@": the password is
    masked all the same (the cut no longer hides what made it a credential)."""
    limit = 256
    head = "postgres://admin:hunter2hunter2"
    tail = "@db.internal/app?sslmode=require" * 4
    marker = len(f"...[truncated {len(tail)} chars]")
    value = "q" * (limit - marker - len(head)) + head + tail  # the kept part ends with the password
    otel = make_otel(environ={"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": str(limit)})
    with otel.span("db.query", attributes={"db.statement": value}):
        pass
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) == 1, 10)
    exported = otlp_receiver.spans()[0].attributes["db.statement"]
    assert len(exported) <= limit and "truncated" in exported
    assert "hunter2" not in exported and "postgres://" in exported


def test_a_value_set_on_the_sdk_span_is_cut_by_the_layer_not_before_it(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """A value set through the OpenTelemetry span itself (the app's own code, another
    instrumentation) is cut by the SDK, which masks nothing, just past the cap: the layer still
    sees a token the cap cuts through, and masks it whole."""
    token = "ghp_" + "k7Qx2" * 6 + "AbCdEf"
    otel = make_otel()
    cap = otel.content_policy.max_value_length
    value = " " * (cap - 20) + token + " and the rest of a long request body" * 400
    with otel.span("request") as span:
        span.span.set_attribute("http.request.body.text", value)
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) == 1, 10)
    exported = otlp_receiver.spans()[0].attributes["http.request.body.text"]
    assert isinstance(exported, str) and len(exported) <= cap
    assert token[:20] not in exported and exported.endswith("...[truncated]")


def test_a_json_password_holding_an_escaped_quote_is_masked_whole() -> None:
    """The collector's RE2 patterns cannot follow JSON escapes this far: the SDK's layer does."""
    text = json.dumps({"username": "bob", "password": 'ab"cd-SuperSecret99'})
    cleaned = ContentPolicy().clean_text(text)
    assert "SuperSecret99" not in cleaned and '"username": "bob"' in cleaned


def test_a_masked_json_value_keeps_its_quotes() -> None:
    """Memory records and messages exported as JSON stay JSON once their secrets are masked."""
    metadata = {"api_key": SECRET, "password": CREDENTIAL, "token": "abc", "note": "kept"}
    cleaned = ContentPolicy().clean_text(json.dumps([{"memory": "m", "metadata": metadata}]))
    assert json.loads(cleaned) == [
        {
            "memory": "m",
            "metadata": {"api_key": REDACTED, "password": REDACTED, "token": REDACTED, "note": "kept"},
        }
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Bob's credentials: password: hunter3xyz",
        "passwords: wifi: hunter3xyz",
        "login failed, password: hunter3xyz: invalid credentials",  # a colon after the secret
        "DATABASE_URL=postgres://app:it's-hunter3xyz@db:5432/app",  # a quote in a URL password
        "amqp://guest:pa<hunter3xyz>@rabbit/",
        "refresh_token_value=hunter3xyz",  # a key with a suffix after "token"
        "session_token_v2=hunter3xyz",
    ],
)
def test_a_secret_near_a_label_a_colon_or_a_quote_is_masked(text: str) -> None:
    assert "hunter3xyz" not in ContentPolicy().clean_text(text)


@pytest.mark.parametrize(
    "document",
    [{"password": "abc\\", "user": "bob"}, {"secret_dir": "C:\\vault\\", "user": "bob"}],
)
def test_a_masked_json_value_ending_in_a_backslash_keeps_the_next_key(document: dict[str, str]) -> None:
    assert json.loads(ContentPolicy().clean_text(json.dumps(document)))["user"] == "bob"


def test_capped_json_that_masking_takes_past_the_cap_stays_json() -> None:
    """Content made to fit the cap exactly: a short secret's mask is longer than the secret, and
    the JSON text is then cut inside its structure (cutting it as text would break it)."""
    policy = ContentPolicy(max_value_length=120)
    messages = [
        {"role": "user", "content": "my password=ab, keep it"},
        {"role": "assistant", "content": "y" * 200},
    ]
    captured = to_attribute_value(messages, policy)
    assert isinstance(captured, str) and len(captured) == 120
    exported = policy.clean_attribute(catalog.GEN_AI_INPUT_MESSAGES, captured)
    assert isinstance(exported, str) and len(exported) <= 120
    first, *_ = json.loads(exported)
    assert first == {"role": "user", "content": f"my password={REDACTED}, keep it"}
    # text that is not JSON is cut as text
    prose = policy.clean_attribute("note", "[x] password=ab " + "z" * 104)
    assert isinstance(prose, str) and len(prose) == 120 and "password=[REDACTED]" in prose


def test_what_the_sdk_limits_dropped_is_still_counted_after_cleaning(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """The layer copies what it cleans; the copies keep the SDK's counts of dropped attributes,
    events and links, as the raw SDK exports them, and a log record's resource is masked too."""
    otel = make_otel(environ={"OTEL_RESOURCE_ATTRIBUTES": f"openai.key={SECRET}"})
    many = {f"a{index}": index for index in range(130)}  # the SDK keeps 128
    linked = otel.tracer_provider.get_tracer("tests").start_span("linked")
    linked.end()
    with otel.tracer_provider.get_tracer("tests").start_as_current_span(
        "limited", attributes=many, links=[Link(linked.get_span_context(), many) for _ in range(130)]
    ) as span:
        for _ in range(130):
            span.add_event("step", many)
    _logs.get_logger("tests", logger_provider=otel.logger_provider).emit(body="limited", attributes=many)
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) == 2 and len(r.logs()) == 1, 10)
    payload = b"".join(request.SerializeToString() for request in otlp_receiver.raw_requests())
    assert SECRET.encode() not in payload
    exported = [
        span
        for request in otlp_receiver.raw_requests()
        for resource_spans in getattr(request, "resource_spans", ())
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
        if span.name == "limited"
    ]
    (limited,) = exported
    assert (limited.dropped_attributes_count, limited.dropped_events_count, limited.dropped_links_count) == (
        2,
        2,
        2,
    )
    assert limited.events[0].dropped_attributes_count == 2 and limited.links[0].dropped_attributes_count == 2
    (log,) = [
        record
        for request in otlp_receiver.raw_requests()
        for resource_logs in getattr(request, "resource_logs", ())
        for scope_logs in resource_logs.scope_logs
        for record in scope_logs.log_records
    ]
    assert log.dropped_attributes_count == 2


def test_domain_helpers_on_host_providers_follow_the_environment_as_a_manager_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Content capture and the cap come from the standard variables, not from defaults of ours."""
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "64")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")  # the host's business: nothing said of it
    said: list[object] = []
    monkeypatch.setattr(_config, "log_once", lambda *args, **kwargs: said.append(args))
    policy = AgentTelemetry.from_providers(TracerProvider(shutdown_on_exit=False)).content_policy
    assert (policy.capture, policy.max_value_length) == (ContentCapture.SPAN_ONLY, 64)
    exported = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(sanitized_exporter(exported)))
    with provider.get_tracer("tests").start_as_current_span("long", attributes={"text": "x" * 100}):
        pass
    (span,) = exported.get_finished_spans()
    assert span.attributes is not None and len(str(span.attributes["text"])) == 64
    assert said == []
