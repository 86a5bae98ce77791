"""Content capture is opt-in; secrets are masked and sizes capped in everything exported.

Every check searches what actually reached the OTLP receiver, down to the raw export requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.util.types import AnyValue

from kaos_otel import AgentTelemetry, ContentCapture, KaosOtelManager, catalog
from kaos_otel._content import (
    CACHED_TEXTS,
    REDACTED,
    REDACTION_MARGIN,
    ContentPolicy,
    cap_text,
    default_redactor,
    remember,
    to_attribute_value,
    to_log_value,
)
from kaos_otel._logs import KaosLoggingHandler
from kaos_otel.receiver import OtlpReceiver, ReceivedLog, ReceivedSpan

MakeOtel = Callable[..., KaosOtelManager]
LOGGER = "test.content"


def fake_api_key() -> str:
    return "sk-proj-" + secrets.token_hex(24)


def marker(label: str) -> str:
    """A unique string standing for user content (built at run time, never in source lines)."""
    return f"{label}-{secrets.token_hex(6)}"


def raw_bytes(receiver: OtlpReceiver) -> bytes:
    """Every export request the receiver accepted, serialized: the whole wire payload."""
    return b"".join(request.SerializeToString() for request in receiver.raw_requests())


def flush(otel: KaosOtelManager, receiver: OtlpReceiver, spans: int, logs: int) -> None:
    assert otel.force_flush(5)
    assert receiver.wait_for(lambda r: len(r.spans()) >= spans and len(r.logs()) >= logs, 10), (
        receiver.spans(),
        receiver.logs(),
    )


def only_span(receiver: OtlpReceiver, name: str) -> ReceivedSpan:
    (span,) = [s for s in receiver.spans() if s.name == name]
    return span


def only_log(receiver: OtlpReceiver, needle: str) -> ReceivedLog:
    (log,) = [log for log in receiver.logs() if needle in str(log.body)]
    return log


def record_agent_turn(otel: KaosOtelManager, content: dict[str, str]) -> None:
    """A turn that offers every kind of content: messages, tool arguments, an exception message."""
    log = logging.getLogger(LOGGER)
    with otel.invoke_agent("assistant") as run, otel.agent_step(run):
        with otel.model_call("assistant", "gpt-4o-mini") as model:
            model.record_messages(
                [{"role": "user", "content": content["prompt"]}],
                [{"role": "assistant", "content": content["response"]}],
            )
        with otel.tool_call("assistant", "lookup", arguments={"query": content["arguments"]}):
            pass
        error = ValueError(content["exception"])
        try:
            with otel.tool_call("assistant", "failing"):
                raise error
        except ValueError:
            log.exception("tool failed")


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_content_is_absent_by_default(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, protocol: str
) -> None:
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    otel = make_otel(protocol)
    content = {key: marker(key) for key in ("prompt", "response", "arguments", "exception")}
    record_agent_turn(otel, content)
    flush(otel, otlp_receiver, spans=5, logs=1)

    chat = only_span(otlp_receiver, "chat gpt-4o-mini")
    assert catalog.GEN_AI_INPUT_MESSAGES not in chat.attributes
    assert catalog.GEN_AI_OUTPUT_MESSAGES not in chat.attributes
    assert (
        catalog.GEN_AI_TOOL_CALL_ARGUMENTS not in only_span(otlp_receiver, "execute_tool lookup").attributes
    )
    failing = only_span(otlp_receiver, "execute_tool failing")
    (event,) = failing.events
    assert event.attributes["exception.type"] == "ValueError"  # the type and frames stay
    assert "record_agent_turn" in event.attributes["exception.stacktrace"]
    log = only_log(otlp_receiver, "tool failed")
    assert log.attributes["exception.type"] == "ValueError"
    assert "record_agent_turn" in log.attributes["exception.stacktrace"]
    payload = raw_bytes(otlp_receiver)
    for key, value in content.items():
        assert value.encode() not in payload, key


def test_without_capture_a_chained_stack_keeps_every_cause_but_no_message() -> None:
    inner, outer = marker("inner"), marker("outer")  # not in the source lines the stack shows

    def lookup() -> None:
        raise KeyError(inner)

    def tool() -> None:
        try:
            lookup()
        except KeyError as exc:
            raise ValueError(outer) from exc

    try:
        tool()
    except ValueError as exc:
        stack = ContentPolicy().exception_attributes(exc)["exception.stacktrace"]
    assert isinstance(stack, str)
    assert inner not in stack and outer not in stack
    cause, _, effect = stack.partition("The above exception was the direct cause of the following exception:")
    assert "in lookup" in cause and cause.rstrip().endswith("KeyError")
    assert "in tool" in effect and effect.rstrip().endswith("ValueError")


def test_without_capture_an_exception_group_keeps_its_members_but_no_message() -> None:
    first, second = marker("first"), marker("second")

    async def lookup() -> None:
        raise KeyError(first)

    async def fetch() -> None:
        raise TimeoutError(second)

    async def tool() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(lookup())
            group.create_task(fetch())

    try:
        asyncio.run(tool())
    except ExceptionGroup as exc:
        stack = ContentPolicy().exception_attributes(exc)["exception.stacktrace"]
    assert isinstance(stack, str)
    assert first not in stack and second not in stack
    assert "| KeyError" in stack and "| TimeoutError" in stack and "in lookup" in stack
    assert stack.splitlines()[-1].startswith("|")  # the members follow the group, as Python prints


def test_without_capture_an_exception_groups_stack_keeps_pythons_limits() -> None:
    """At most 15 members of a group and 10 groups deep are shown, as Python's own traceback
    shows them: 2,000 failed tasks of one group are not each formatted on the request's thread."""
    wide = ExceptionGroup("wide", [ValueError(marker("member")) for _ in range(2000)])
    deep: Exception = ValueError("innermost")
    for _ in range(300):
        deep = ExceptionGroup("deep", [deep])
    policy = ContentPolicy()
    wide_stack = policy.exception_attributes(wide)["exception.stacktrace"]
    deep_stack = policy.exception_attributes(deep)["exception.stacktrace"]
    assert isinstance(wide_stack, str) and isinstance(deep_stack, str)
    assert wide_stack.count("ValueError") == 15 and "| and 1985 more exceptions" in wide_stack
    assert deep_stack.count("ExceptionGroup") == 11 and "max_group_depth is 10" in deep_stack
    assert "ValueError" not in deep_stack


@pytest.mark.parametrize("how", ["env", "env-true", "flag"])
def test_content_is_present_when_opted_in(make_otel: MakeOtel, otlp_receiver: OtlpReceiver, how: str) -> None:
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    if how == "env":
        otel = make_otel(environ={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_AND_EVENT"})
    elif how == "env-true":
        otel = make_otel(environ={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"})
    else:
        otel = make_otel(capture_content=True)
    content = {key: marker(key) for key in ("prompt", "response", "arguments", "exception")}
    record_agent_turn(otel, content)
    flush(otel, otlp_receiver, spans=5, logs=1)

    chat = only_span(otlp_receiver, "chat gpt-4o-mini")
    assert content["prompt"] in chat.attributes[catalog.GEN_AI_INPUT_MESSAGES]
    assert content["response"] in chat.attributes[catalog.GEN_AI_OUTPUT_MESSAGES]
    lookup = only_span(otlp_receiver, "execute_tool lookup")
    assert content["arguments"] in lookup.attributes[catalog.GEN_AI_TOOL_CALL_ARGUMENTS]
    (event,) = only_span(otlp_receiver, "execute_tool failing").events
    assert event.attributes["exception.message"] == content["exception"]
    assert "exception.escaped" not in event.attributes  # deprecated by the conventions
    log = only_log(otlp_receiver, "tool failed")
    assert log.attributes["exception.message"] == content["exception"]
    assert content["exception"] in log.attributes["exception.stacktrace"]


def test_content_stays_off_spans_when_only_events_may_carry_it(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel(environ={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY"})
    content = {key: marker(key) for key in ("prompt", "response", "arguments", "exception")}
    record_agent_turn(otel, content)
    flush(otel, otlp_receiver, spans=5, logs=1)
    spans = str([(s.name, s.attributes, [e.attributes for e in s.events]) for s in otlp_receiver.spans()])
    for key in ("prompt", "response", "arguments"):
        assert content[key] not in spans, key
    # the messages go in the GenAI conventions' inference-details event, in the model call's context
    details = catalog.GEN_AI_INFERENCE_DETAILS_EVENT
    (event,) = [log for log in otlp_receiver.logs() if log.event_name == details]
    call = only_span(otlp_receiver, "chat gpt-4o-mini")
    assert (event.trace_id, event.span_id) == (call.trace_id, call.span_id)
    assert event.attributes[catalog.GEN_AI_REQUEST_MODEL] == "gpt-4o-mini"
    assert content["prompt"] in str(event.attributes[catalog.GEN_AI_INPUT_MESSAGES])
    assert content["response"] in str(event.attributes[catalog.GEN_AI_OUTPUT_MESSAGES])


@pytest.mark.parametrize("capture", ["SPAN_ONLY", "SPAN_AND_EVENT", "NO_CONTENT"])
def test_the_inference_details_event_follows_the_capture_mode(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, capture: str
) -> None:
    otel = make_otel(environ={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": capture})
    content = {key: marker(key) for key in ("prompt", "response", "arguments", "exception")}
    record_agent_turn(otel, content)
    flush(otel, otlp_receiver, spans=5, logs=0)
    events = [log for log in otlp_receiver.logs() if log.event_name == catalog.GEN_AI_INFERENCE_DETAILS_EVENT]
    assert len(events) == (1 if capture == "SPAN_AND_EVENT" else 0)
    on_span = catalog.GEN_AI_INPUT_MESSAGES in only_span(otlp_receiver, "chat gpt-4o-mini").attributes
    assert on_span == (capture != "NO_CONTENT")


@pytest.mark.parametrize("capture", [False, True], ids=["capture-off", "capture-on"])
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_api_keys_are_masked_everywhere(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, capture: bool, protocol: str
) -> None:
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    otel = make_otel(protocol, capture_content=capture)
    key = fake_api_key()
    log = logging.getLogger(LOGGER)
    with otel.span("request", attributes={"http.request.header.authorization": f"Bearer {key}"}) as span:
        span.set_attribute("note", f"calling the model with {key} now")
        span.set_attribute("openai_api_key", key)
        span.set_attribute("keys", [key, "harmless"])
        span.add_event("retry", {"detail": f"key={key}"})
        log.warning("using key %s for the call", key)
        with otel.model_call("assistant", "gpt-4o-mini") as model:
            model.record_messages([{"role": "user", "content": f"my key is {key}"}], None)
        with otel.tool_call("assistant", "http_get", arguments={"url": "https://x", "api_key": key}):
            pass
        try:
            with otel.span("auth"):
                raise PermissionError(f"401 for {key}")
        except PermissionError:
            log.exception("auth failed with %s", key)
    flush(otel, otlp_receiver, spans=4, logs=2)

    payload = raw_bytes(otlp_receiver)
    assert key.encode() not in payload
    assert key[-16:].encode() not in payload  # not even a tail of it
    assert b"[REDACTED]" in payload
    request = only_span(otlp_receiver, "request")
    assert request.attributes["note"] == "calling the model with [REDACTED] now"
    assert request.attributes["openai_api_key"] == "[REDACTED]"
    assert request.attributes["keys"] == ("[REDACTED]", "harmless")
    assert "[REDACTED]" in request.attributes["http.request.header.authorization"]
    assert only_log(otlp_receiver, "using key").body == "using key [REDACTED] for the call"
    (auth_event,) = only_span(otlp_receiver, "auth").events
    if capture:
        assert auth_event.attributes["exception.message"] == "401 for [REDACTED]"
        assert only_log(otlp_receiver, "auth failed").attributes["exception.message"] == "401 for [REDACTED]"
    else:  # no message at all, rather than an empty one a backend would show
        assert "exception.message" not in auth_event.attributes
        assert "exception.message" not in only_log(otlp_receiver, "auth failed").attributes
        assert auth_event.attributes["exception.type"] == "PermissionError"


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_huge_and_odd_values_are_capped_and_stringified(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, protocol: str
) -> None:
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    otel = make_otel(protocol, capture_content=True)
    ten_mb = "x" * 10_000_000

    class Opaque:
        def __repr__(self) -> str:
            return "<Opaque thing>"

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

        __repr__ = __str__

    with otel.span("sibling-before"):
        pass
    with otel.span("huge", attributes={"begin.big": ten_mb, "begin.set": {1, 2}}) as span:
        span.set_attribute("big", ten_mb)
        span.set_attribute("big.list", [ten_mb, "small"])
        span.set_attribute("opaque", Opaque())
        span.set_attribute("unprintable", Unprintable())
        span.set_attribute("nested", {"a": [1, {"b": Opaque()}]})
        span.set_attribute("mixed", [1, "two", 3.0])
        span.add_event("big-event", {"payload": ten_mb, "obj": Opaque()})
        with otel.model_call("assistant", "m") as model:
            model.record_messages([{"role": "user", "content": ten_mb}], None)
        logging.getLogger(LOGGER).info("body %s", ten_mb, extra={"blob": ten_mb, "obj": Opaque()})
        try:
            with otel.span("huge-error"):
                raise ValueError(ten_mb)
        except ValueError:
            pass
    with otel.span("sibling-after"):
        pass
    flush(otel, otlp_receiver, spans=5, logs=1)  # nothing rejected: every span of the batch arrived

    limit = otel.settings.attribute_value_length_limit
    assert len(raw_bytes(otlp_receiver)) < 1_000_000
    huge = only_span(otlp_receiver, "huge")
    for key in ("begin.big", "big"):
        assert len(huge.attributes[key]) <= limit
        assert "truncated" in huge.attributes[key]
    assert all(len(item) <= limit for item in huge.attributes["big.list"])
    assert huge.attributes["opaque"] == "<Opaque thing>"
    assert huge.attributes["unprintable"] == "<unprintable Unprintable>"
    assert huge.attributes["nested"] == '{"a": [1, {"b": "<Opaque thing>"}]}'
    assert huge.attributes["begin.set"] == "{1, 2}"
    assert isinstance(huge.attributes["mixed"], str)
    (event,) = huge.events
    assert len(event.attributes["payload"]) <= limit
    chat = only_span(otlp_receiver, "chat m")
    assert len(chat.attributes[catalog.GEN_AI_INPUT_MESSAGES]) <= limit
    (error_event,) = only_span(otlp_receiver, "huge-error").events
    assert len(error_event.attributes["exception.message"]) <= limit
    assert len(error_event.attributes["exception.stacktrace"]) <= limit
    log = only_log(otlp_receiver, "body ")
    assert len(log.body) <= limit
    assert len(log.attributes["blob"]) <= limit


def test_the_cap_follows_the_attribute_length_limit_setting(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel(environ={"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "500"})
    with otel.span("s") as span:
        span.set_attribute("big", "y" * 100_000)
        span.add_event("e", {"big": "z" * 100_000})
    flush(otel, otlp_receiver, spans=1, logs=0)
    span_received = only_span(otlp_receiver, "s")
    assert len(span_received.attributes["big"]) == 500
    assert len(span_received.events[0].attributes["big"]) == 500


def test_a_huge_exception_message_is_scanned_only_as_far_as_it_is_kept(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """Redaction scans only what the cap keeps: not 10 MB (several seconds) on any thread."""
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    scanned: list[int] = []

    def measuring_redactor(text: str) -> str:
        scanned.append(len(text))
        return default_redactor(text)

    otel = make_otel(capture_content=True, redactor=measuring_redactor)
    message = "token=" + "a" * 10_000_000
    try:
        with otel.span("fails"):
            raise ValueError(message)
    except ValueError:
        logging.getLogger(LOGGER).exception("failed")
    flush(otel, otlp_receiver, spans=1, logs=1)
    assert max(scanned) <= otel.settings.attribute_value_length_limit + REDACTION_MARGIN
    (event,) = only_span(otlp_receiver, "fails").events
    assert event.attributes["exception.message"].startswith("token=[REDACTED]")
    assert only_log(otlp_receiver, "failed").attributes["exception.message"].startswith("token=[REDACTED]")


@pytest.mark.parametrize("capture", [False, True])
def test_model_controlled_names_never_name_spans_or_logs(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, capture: bool
) -> None:
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    otel = make_otel(capture_content=capture)
    otel.register_known_names("assistant", tools=["lookup"], targets=["researcher"])
    key = fake_api_key()
    tool = f"lookup {marker('ZEBRA')} {key}"
    target = f"researcher {marker('PLUM')}"
    with otel.invoke_agent("assistant"):
        with otel.tool_call("assistant", tool), otel.tool_call("assistant", "lookup"):
            pass
        with otel.delegation("assistant", target):
            pass
    flush(otel, otlp_receiver, spans=4, logs=0)

    names = sorted(span.name for span in otlp_receiver.spans())
    assert names == [
        "execute_tool _other",
        "execute_tool lookup",
        "invoke_agent _other",
        "invoke_agent assistant",
    ]
    tool_span = only_span(otlp_receiver, "execute_tool _other")
    assert tool_span.attributes[catalog.GEN_AI_TOOL_NAME] == catalog.OVERFLOW_VALUE
    delegation = only_span(otlp_receiver, "invoke_agent _other")
    assert delegation.attributes[catalog.KAOS_DELEGATION_TARGET] == catalog.OVERFLOW_VALUE
    assert catalog.KAOS_REQUESTED_NAME not in only_span(otlp_receiver, "execute_tool lookup").attributes
    payload = raw_bytes(otlp_receiver)
    assert key.encode() not in payload  # masked even where the raw name is kept
    if capture:
        assert tool_span.attributes[catalog.KAOS_REQUESTED_NAME] == tool.replace(key, "[REDACTED]")
        assert delegation.attributes[catalog.KAOS_REQUESTED_NAME] == target
    else:
        assert tool.split()[1].encode() not in payload
        assert target.split()[1].encode() not in payload
        assert catalog.KAOS_REQUESTED_NAME not in tool_span.attributes


@pytest.mark.parametrize("capture", [ContentCapture.NO_CONTENT, ContentCapture.SPAN_ONLY])
def test_the_log_bridge_takes_application_loggers_and_content_loggers_only_with_capture_on(
    capture: ContentCapture,
) -> None:
    handler = KaosLoggingHandler(LoggerProvider(), ContentPolicy(capture=capture))
    exported = {
        "app": True,
        "app.tools": True,
        "kaos_otel": True,
        "mem0": capture.enabled,
        "mem0.memory.main": capture.enabled,
        "mem0x": True,
        "mcp": capture.enabled,
        "mcp.server.mcpserver.server": capture.enabled,
        "mcp.client.streamable_http": capture.enabled,
        "mcpx": True,
        "opentelemetry.sdk._shared_internal": False,
        "grpc": False,
        "grpcio": True,
        "kaos_otel.exporters.batch": False,
    }
    for _ in range(2):  # the second pass answers from the names the first one remembered
        decided = {
            name: handler.filter(logging.LogRecord(name, logging.INFO, __file__, 1, "m", None, None))
            for name in exported
        }
        assert decided == exported


def test_remembered_values_stay_bounded() -> None:
    cache: dict[int, int] = {}
    for key in range(CACHED_TEXTS * 2 + 1):
        assert remember(cache, key, -key) == -key
        assert len(cache) <= CACHED_TEXTS
    assert cache[CACHED_TEXTS * 2] == -CACHED_TEXTS * 2


@pytest.mark.parametrize("limit", [0, 5, 22, 23, 24, 64])
def test_a_capped_text_never_exceeds_its_limit(limit: int) -> None:
    text = "x" * 100
    capped = cap_text(text, limit)
    assert len(capped) == limit
    marker = f"...[truncated {100 - limit} chars]"
    assert capped.endswith(marker) == (len(marker) < limit)


class _CountedText:
    """A value that counts how often it is turned into text."""

    made = 0

    def __str__(self) -> str:
        type(self).made += 1
        return "content"


def test_a_long_structure_costs_what_its_cap_keeps() -> None:
    """A conversation of 100,000 messages set as one attribute: only the messages the cap keeps
    are turned into text, and the cut says so without claiming to know how much was left."""
    policy = ContentPolicy(max_value_length=1000)
    history = [{"role": "user", "content": _CountedText()} for _ in range(100_000)]
    text = to_attribute_value(history, policy)
    assert isinstance(text, str) and len(text) <= 1000
    kept = json.loads(text)  # still JSON: the messages past the cut are one "..."
    assert kept[0] == {"role": "user", "content": "content"} and kept[-1] == "..."
    assert _CountedText.made < 200


def test_a_structure_whose_text_passes_the_cap_is_cut_inside_and_stays_json() -> None:
    """The walk's count falls short of the text (closing brackets, escapes): what it kept is cut
    again, inside the structure, until its JSON text fits."""
    policy = ContentPolicy(max_value_length=1000)
    records = [{"id": index} for index in range(90)]  # about 1,170 characters of JSON
    text = to_attribute_value(records, policy)
    assert isinstance(text, str) and len(text) <= 1000
    kept = json.loads(text)
    assert kept[:-1] == records[: len(kept) - 1] and kept[-1] == "..." and len(kept) > 70
    quotes = to_attribute_value({"q": '"' * 5000, "n": 1}, policy)  # each quote is two characters escaped
    assert isinstance(quotes, str) and len(quotes) <= 1000
    assert json.loads(quotes)["q"].endswith('"...[truncated]') and len(json.loads(quotes)["q"]) > 400


@pytest.mark.parametrize("lines", [440, 460, 480])
def test_text_the_walk_counted_under_the_cap_is_refitted_not_given_up(lines: int) -> None:
    """Escapes (``\\n``, quotes) take the JSON text of a walk that cut nothing over the cap: it is
    walked again with less room than it counted (460 lines of code became ``"..."``: the room was
    shrunk from the cap, not from what was counted, so nothing was cut again)."""
    code = 'print("hello")\n' * lines
    call = {"type": "tool_call", "id": "c1", "name": "run_python", "arguments": {"code": code}}
    text = to_attribute_value([{"role": "assistant", "parts": [call]}], ContentPolicy())
    assert isinstance(text, str) and 7000 < len(text) <= 8192
    assert json.loads(text)[0]["parts"][0]["arguments"]["code"].startswith('print("hello")')


def test_a_long_log_value_is_walked_only_as_far_as_it_is_kept() -> None:
    walked = 0

    class CountingList(list[int]):
        def __iter__(self) -> Iterator[int]:
            nonlocal walked
            for item in super().__iter__():
                walked += 1
                yield item

    value = to_log_value({"numbers": CountingList(range(1_000_000))}, ContentPolicy(max_value_length=1000))
    assert value == {"numbers": [*range(255), "..."]}  # a structure still, of what the export layer walks
    assert walked <= 1_000


def test_attribute_json_writes_keys_and_numbers_as_json_does_and_cuts_bytes_like_text() -> None:
    policy = ContentPolicy(max_value_length=1000)
    odd_keys = {None: 1, True: 2, 1.5: 3, "big": 2**70}
    assert to_attribute_value(odd_keys, policy) == json.dumps(odd_keys)
    blobs = to_attribute_value([b"\0" * 100_000] * 10_000, policy)  # six characters each, escaped
    assert isinstance(blobs, str) and len(blobs) <= 1000
    first, *rest = json.loads(blobs)
    assert first.startswith("\0" * 100) and first.endswith("...[truncated]") and rest == ["..."]


def test_a_secret_a_cut_inside_json_text_goes_through_is_masked_whole() -> None:
    """A string cut where the cap's room runs out is cleaned as it is cut, and says it was cut
    even when what is left fits under the cap."""
    policy = ContentPolicy(max_value_length=200)
    url = "https://admin:Sup3rS3cretPassw0rd@db.example/x"
    for cut_at in range(150, 200, 7):  # the cut falls before, inside and after the password
        text = to_attribute_value(["a" * cut_at + " " + url + " " + "b" * 400, 1], policy)
        assert isinstance(text, str) and len(text) <= 200
        assert "Sup3r" not in str(policy.clean_attribute("messages", text)), cut_at
        assert json.loads(text)[0].endswith("...[truncated]"), text
    many_numbers = to_attribute_value(
        {"ids": [2**62 + i for i in range(200)], "note": "n" * 9000}, ContentPolicy()
    )
    assert isinstance(many_numbers, str) and json.loads(many_numbers)["note"].endswith("n...[truncated]")


def test_a_secret_the_scan_window_cuts_is_not_kept_when_masking_shortened_the_text() -> None:
    """The scan stops REDACTION_MARGIN past the cap: a secret it cuts is not matched, and masking
    before it moves the cut later. Nothing of it is kept, as a plain string or inside JSON."""
    policy = ContentPolicy()
    limit = policy.max_value_length
    token = "ghp_" + "Q7wX9kLm2Np4Rt6Vy8Za1Bc3De5Fg7Hj9K0"
    text = "token=" + "x" * (limit + REDACTION_MARGIN - 36) + " " + token + " tail"  # 29 of it scanned
    for value in (text, [1, text], {"note": text}):
        exported = str(policy.clean_attribute("k", to_attribute_value(value, policy)))
        assert "ghp_Q7wX9k" not in exported and "token=[REDACTED]" in exported, value.__class__


def test_a_structure_under_a_secret_named_key_is_masked_whole_in_json_text() -> None:
    policy = ContentPolicy()
    value = {"db": {"credentials": {"user": "bob", "pass": "hunter2"}}, "api_key": ["k-9f8e7d"], "n": 1}
    text = to_attribute_value(value, policy)
    assert isinstance(text, str) and "hunter2" not in text and "k-9f8e7d" not in text
    assert json.loads(text) == {"db": {"credentials": "[REDACTED]"}, "api_key": "[REDACTED]", "n": 1}


def test_log_values_mask_by_whole_key_names_clean_long_bytes_and_scan_few_strings() -> None:
    scans: list[int] = []

    def counting_redactor(text: str) -> str:
        scans.append(len(text))
        return default_redactor(text)

    short_cap = ContentPolicy(max_value_length=16)
    for pair in ({"database_password": "hunter2"}, {b"api_key": "k-9f8e7d"}):
        masked = to_log_value(pair, short_cap)
        assert isinstance(masked, dict) and set(masked.values()) == {"[REDACTED]"}, masked  # cut names too
    kept = to_log_value({"first": "a" * 10, "second": "b" * 10, "third": "c"}, short_cap)
    assert kept == {"first": "a" * 10, "second": "...", "...": "..."}, kept  # the cap's length in all
    token = "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    policy = ContentPolicy(redactor=counting_redactor)
    blob = to_log_value(("x" * (policy.max_value_length - 30) + " " + token + " tail").encode(), policy)
    assert isinstance(blob, str) and "A1b2C3" not in blob  # bytes over the cap: cleaned as text
    scans.clear()
    big = "y" * 20_000
    to_log_value({"a": [[big] * 200 for _ in range(49)]}, policy)  # 9,800 long strings
    assert len(scans) <= 20, len(scans)


def test_exported_bytes_cut_through_a_secret_are_masked_whole() -> None:
    """The export layer cuts bytes as it cuts text: a secret the cut goes through is masked."""
    policy = ContentPolicy()
    token = "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    exported = policy.clean_attribute("blob", ("x" * (policy.max_value_length - 30) + " " + token).encode())
    assert "A1b2C3" not in str(exported)
    assert policy.clean_attribute("blob", b"plain bytes") == b"plain bytes"


def test_a_long_set_deque_or_dict_view_costs_what_its_cap_keeps() -> None:
    """Short ones stay the text ``str()`` makes of them; a long one is walked as a list, as far as
    the cap keeps it, as an attribute and inside a log value."""
    policy = ContentPolicy(max_value_length=1000)
    assert to_attribute_value({1, 2}, policy) == "{1, 2}"
    long_values: list[object] = [
        {_CountedText() for _ in range(100_000)},
        deque(_CountedText() for _ in range(100_000)),
        {index: _CountedText() for index in range(100_000)}.values(),
    ]
    large_items: list[object] = [{"x" * 2_000_000, "y"}, deque(["x" * 2_000_000])]
    for value in large_items:  # few items, but long ones: walked, not made text whole
        text = to_attribute_value(value, policy)
        assert isinstance(text, str) and text.startswith("[") and len(text) <= 1000
    for value in long_values:
        _CountedText.made = 0
        text = to_attribute_value(value, policy)
        assert (
            isinstance(text, str) and text.startswith('["content", ') and text.endswith('"content", "..."]')
        )
        logged = to_log_value({"items": value}, policy)
        assert isinstance(logged, dict) and isinstance(logged["items"], list)
        assert logged["items"][-1] == "..." and len(str(logged["items"])) <= 2000  # strings within the cap
        cleaned = policy.clean_attribute("items", logged["items"])
        assert isinstance(cleaned, tuple) and list(cleaned) == logged["items"]  # walked, not flattened
        assert _CountedText.made < 400, type(value)


def test_secret_named_pairs_and_tuple_keys_are_masked() -> None:
    """A (name, value) pair in a list of pairs (a header list, environment items) and a tuple key
    are read as a key and its value."""
    policy = ContentPolicy()
    headers = [(b"host", b"example.com"), (b"x-api-key", b"k-9f8e7d")]
    assert policy.clean_attribute("asgi.headers", to_log_value(headers, policy)) == [
        [b"host", b"example.com"],
        [b"x-api-key", REDACTED],
    ]
    entries: list[AnyValue] = [
        ["PORT", 5432],
        ["DB_PASSWORD", "hunter2"],
        ["PIN_PASSWORD", 918273],
        ["password", ""],
    ]
    assert policy.clean_attribute("env", entries) == [
        ["PORT", 5432], ["DB_PASSWORD", REDACTED], ["PIN_PASSWORD", REDACTED], ["password", ""]
    ]  # fmt: skip
    # not pairs: a schema's two field names, a sentence and its answer, a lone two-name attribute
    schema: dict[str, AnyValue] = {
        "required": ["password", "username"],
        "examples": [["What is the secret", "42"]],
    }
    assert policy.clean_attribute("tool.schema", schema) == schema
    assert policy.clean_attribute("fields", ("password", "username")) == ("password", "username")
    env = {"env": [("PORT", "5432"), ("DB_PASSWORD", "hunter2"), ("PIN_PASSWORD", 9182)]}
    text = policy.clean_text(str(to_attribute_value(env, policy)))
    assert "hunter2" not in text and "9182" not in text and "5432" in text
    assert to_attribute_value({("db", "password"): "hunter2"}, policy) == json.dumps(
        {"('db', 'password')": REDACTED}
    )
    # a host's own handler hands the export layer the structure itself: the same rule for its keys
    tuple_keyed: Any = {("db", "password"): "hunter2"}  # not an AnyValue, yet a host's handler passes it
    assert policy.clean_body(tuple_keyed) == {"('db', 'password')": REDACTED}


def test_keys_are_read_as_the_key_of_key_value_text() -> None:
    """An attribute's key or a mapping's key inside a value (a log record's ``extra=``, a
    converted object) names a secret as it would written key=value: its value is masked in the
    structure as in the text."""
    policy = ContentPolicy()
    settings: dict[str, AnyValue] = {
        "SECRET_KEY_BASE": "4f9a8b7c6d5e",
        "MYSQL_PWD": 918273,
        "db": {"client_secret": "cs-1a2b", "password_min_length": 8, "password_hash": ""},
        "max_tokens": 256,
    }
    masked = {
        "SECRET_KEY_BASE": REDACTED,
        "MYSQL_PWD": REDACTED,
        "db": {"client_secret": REDACTED, "password_min_length": 8, "password_hash": ""},
        "max_tokens": 256,
    }
    assert policy.clean_attribute("settings", settings) == masked
    assert policy.clean_body(settings) == masked
    assert to_log_value(settings, policy) == masked  # the request thread's walk: the same rule
    text = policy.clean_text(json.dumps(settings))  # and the text form
    assert "4f9a8b7c6d5e" not in text and "918273" not in text and "cs-1a2b" not in text
    assert policy.clean_attribute("deploy.SECRET_KEY_BASE", "4f9a8b7c6d5e") == REDACTED  # one rule for keys
    for key in (
        "config/SECRET_KEY_BASE",
        "env:MYSQL_PWD",
        "app.integrations.salesforce.oauth.client_secret_v2",
        "db.password.value",
        "password_confirmation",
        "private_key_pem",
        "pwd",
        "user[password]",
        "DB_PASS",
        "smtp.pass",
        "MYSQL_ROOT_PASS",
        "ldapBindPass",
        "APP__DB__PASS",
    ):
        assert policy.clean_attribute(key, "4f9a8b7c6d5e") == REDACTED, key  # the key's last name
    said_about_a_secret: dict[str, AnyValue] = {  # counts, dates, places: not the secret
        "guardrail.secrets_detected": 2,
        "auth.password_attempts": 3,
        "user.password_reset_requested": "2026-01-02",
        "llm.api_key_env_var": "OPENAI_API_KEY",
        "app.private_key_path": "/etc/app/key.pem",
        "storage.access_key_id": "key-id-7",
        "PWD": "/srv/app",
        "process.env.OLDPWD": "/home/app",
        "k8s.secret.uid": "3f1c",
        "tokens_used": 5,
        "net.bypass": "proxy.local",
        "pass_through": "yes",
        "ci.LINT_PASS": "clean",
        "PASS": "12",
        "nginx.proxy_pass": "http://app:8000",
        "compilerPass": "inline",
    }
    assert policy.clean_attributes(said_about_a_secret) == said_about_a_secret
    conventions: dict[str, AnyValue] = {
        "gen_ai.usage.input_tokens": 9,
        "gen_ai.request.max_tokens": 64,
        "mcp.session.id": "s-1",
    }
    assert policy.clean_attributes(conventions) == conventions


def test_a_remembered_attribute_is_cleaned_as_when_first_seen() -> None:
    """Short text attributes are remembered with their cleaned key and value, per key: the same
    value stays masked under a secret-named key and kept under another, and a key holding a
    credential stays masked, however often the mapping repeats."""
    policy = ContentPolicy()
    key_with_a_key = "cache.sk-proj-" + "a1B2" * 8
    attributes: dict[str, AnyValue] = {
        "db.password": "hunter2-value",
        "app.note": "hunter2-value",
        key_with_a_key: "hit",
    }
    first = policy.clean_attributes(attributes)
    assert first == {"db.password": REDACTED, "app.note": "hunter2-value", f"cache.{REDACTED}": "hit"}
    for _ in range(3):
        assert policy.clean_attributes(attributes) == first
    assert policy.clean_attributes({"app.note": "hunter2-value", "db.password": "hunter2-value"}) == {
        "app.note": "hunter2-value",
        "db.password": REDACTED,
    }


def test_the_argument_a_secret_naming_flag_precedes_is_masked() -> None:
    """``process.command_args`` (the conventions' own attribute) holds a flag and its value as two
    items: the value is masked, on a span and in the resource alike."""
    policy = ContentPolicy()
    args = ("docker", "login", "--password", "Hunt3r2Secret", "--max-tokens", "100", "--clientSecret", "cs-1")
    masked = ("docker", "login", "--password", REDACTED, "--max-tokens", "100", "--clientSecret", REDACTED)
    assert policy.clean_attribute("process.command_args", args) == masked
    assert policy.redact_resource({"process.command_args": args}) == {"process.command_args": masked}
    assert policy.clean_attribute("argv", ("mysql", "--pass", "hunter2x")) == ("mysql", "--pass", REDACTED)
    for kept in (("--password-file", "/run/pw"), ("--no-password", "db"), ("--ask-pass", "-i", "hosts")):
        assert policy.clean_attribute("tool.argv", kept) == kept
    # a log record's body or structured value holding an argument list (`log.info(sys.argv)`)
    assert policy.clean_body(["mysql", "--pass", "hunter2x"]) == ["mysql", "--pass", REDACTED]
    nested = {"command": {"argv": ["docker", "login", "--password", "Hunt3r2Secret"]}}
    assert policy.clean_body(nested) == {"command": {"argv": ["docker", "login", "--password", REDACTED]}}


def test_a_structure_made_json_text_is_valid_json_with_nan_and_infinity() -> None:
    """Tool arguments with a NaN or an infinity (a statistics tool): ``json.dumps`` would write
    ``NaN`` and ``Infinity``, which no strict JSON reader takes; their names are written as text."""
    policy = ContentPolicy()
    text = to_attribute_value(
        {"mean": float("nan"), "max": float("inf"), "min": -float("inf"), "n": 1.5}, policy
    )
    assert isinstance(text, str)

    def refuse(constant: str) -> object:
        raise ValueError(f"not JSON: {constant}")

    assert json.loads(text, parse_constant=refuse) == {
        "mean": "NaN",
        "max": "Infinity",
        "min": "-Infinity",
        "n": 1.5,
    }


def test_a_structure_the_export_layer_flattens_is_valid_json_with_nan() -> None:
    """A log attribute deeper than the cleaning layer walks becomes JSON text: valid JSON too."""
    policy = ContentPolicy()
    deep: AnyValue = {"score": float("nan"), "max": float("inf")}
    for _ in range(10):
        deep = {"level": deep}
    cleaned = policy.clean_attribute("scores", deep)
    while isinstance(cleaned, dict):  # the levels the cleaning layer walks stay a structure
        cleaned = cleaned["level"]
    assert isinstance(cleaned, str)

    def refuse(constant: str) -> object:
        raise ValueError(f"not JSON: {constant}")

    innermost = json.loads(cleaned, parse_constant=refuse)
    while "level" in innermost:
        innermost = innermost["level"]
    assert innermost == {"score": "NaN", "max": "Infinity"}


def test_a_key_of_many_digits_is_judged_in_one_pass() -> None:
    """A key a model wrote (``token`` and 3,000 digits): each word of a key's ending is read one
    way, so the check ends at once (it took 5 s at 24 digits when a digit run could be split)."""
    assert not ContentPolicy().is_secret_named("token" + "1" * 3000 + "x")
    assert ContentPolicy().is_secret_named("token" + "1" * 20)


def test_pairs_in_a_list_made_json_text_are_masked() -> None:
    """A list of (name, value) pairs too long to walk becomes JSON text: its secret pairs are
    masked there, where the export layer no longer sees pairs."""
    pairs: list[AnyValue] = [["session.token.1", "S3cretV4lue"], ["token.new", "S3cretV4lue"]]
    filler: list[AnyValue] = [["k", i] for i in range(300)]
    text = ContentPolicy().clean_attribute("env", pairs + filler)
    assert isinstance(text, str) and "S3cretV4lue" not in text
    assert text.startswith('[["session.token.1", "[REDACTED]"], ["token.new", "[REDACTED]"], ["k", 0]')


def test_text_holding_a_surrogate_reaches_the_receiver(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """A prompt read with ``surrogateescape`` or tool arguments with a lone ``\\ud83d`` escape hold
    a surrogate, which UTF-8 cannot encode: the OTLP exporter dropped the whole attribute (and
    logged a traceback for each). Each surrogate is exported as U+FFFD."""
    otel = make_otel(environ={"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_AND_EVENT"})
    prompt = marker("prompt") + b" caf\xe9".decode("utf-8", "surrogateescape")
    call = {"id": "c1", "function": {"name": "lookup", "arguments": '{"q": "\\ud83d"}'}}
    with otel.model_call("assistant", "gpt-4o-mini") as model:
        model.record_messages(prompt, [{"role": "assistant", "tool_calls": [call]}])
        model.set_attribute("app.note", {"caf\udce9": ["\ud83d", "ok"]})
    flush(otel, otlp_receiver, spans=1, logs=1)
    chat = only_span(otlp_receiver, "chat gpt-4o-mini")
    assert prompt.replace("\udce9", "\ufffd") in chat.attributes[catalog.GEN_AI_INPUT_MESSAGES]
    assert '"arguments": {"q": "\ufffd"}' in chat.attributes[catalog.GEN_AI_OUTPUT_MESSAGES]
    assert chat.attributes["app.note"] == '{"caf\ufffd": ["\ufffd", "ok"]}'
    (event,) = otlp_receiver.logs()
    assert prompt.replace("\udce9", "\ufffd") in str(event.attributes[catalog.GEN_AI_INPUT_MESSAGES])
    assert "\ufffd" in str(event.attributes[catalog.GEN_AI_OUTPUT_MESSAGES])
    policy = ContentPolicy()
    assert policy.clean_attributes({"k\udce9": "\udce9" + "x" * 9000}) == {
        "k\ufffd": policy.clean_text("\ufffd" + "x" * 9000, policy.max_value_length)
    }


@pytest.mark.parametrize(
    ("given", "capture"),
    [
        ("span_only", ContentCapture.SPAN_ONLY),
        (" EVENT_ONLY ", ContentCapture.EVENT_ONLY),
        ("true", ContentCapture.SPAN_AND_EVENT),
        (True, ContentCapture.SPAN_AND_EVENT),
        (False, ContentCapture.NO_CONTENT),
        ("False", ContentCapture.NO_CONTENT),
        ("spans please", ContentCapture.NO_CONTENT),
        (None, ContentCapture.NO_CONTENT),
    ],
)
def test_a_policy_reads_a_mode_given_as_text_or_a_bool_as_the_variable_is(
    given: object, capture: ContentCapture
) -> None:
    """``ContentPolicy("SPAN_ONLY")`` or ``ContentPolicy(True)`` (as ``capture_content`` takes it)
    failed with an AttributeError when the telemetry was built; an unknown mode captures nothing."""
    policy = ContentPolicy(given)  # type: ignore[arg-type]
    assert policy.capture is capture
    otel = AgentTelemetry.from_providers(TracerProvider(), MeterProvider(), policy=policy)
    with otel.model_call("assistant", "gpt-4o-mini") as call:
        call.record_messages("hi", "hello")
