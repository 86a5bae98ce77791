"""Captured chat messages follow the GenAI conventions' JSON schemas, on spans and in the event.

The schemas are the semantic conventions' own (``tests/data/genai-messages-schemas.json``,
v1.41.0); what is checked is what reached a real OTLP receiver.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openai.types.chat import ChatCompletionChunk

from instrumented_agent.supervisor import ServiceSpec, Supervisor
from instrumented_agent.system import agent_spec, otlp_env
from kaos_otel import ContentCapture, KaosOtelManager, _genai_messages, catalog
from kaos_otel._content import ContentPolicy, to_attribute_value, to_log_value
from kaos_otel.receiver import OtlpReceiver

MakeOtel = Callable[..., KaosOtelManager]
SCHEMAS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent / "data" / "genai-messages-schemas.json").read_text()
)["schemas"]
CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

OPENAI_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture, and what is 2 + 3?"},
            {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
]
OPENAI_CHOICE = {
    "index": 0,
    "message": {"role": "assistant", "content": "A cat; 5."},
    "finish_reason": "stop",
}


def _valid(key: str, value: object) -> list[Any]:
    """``value`` checked against the schema of ``key``: JSON text on a span, a structure (OTLP
    arrays and key-value lists) in the event, as the conventions ask of each."""
    messages: list[Any] = json.loads(value if isinstance(value, str) else json.dumps(value))
    errors = [e.message for e in jsonschema.Draft202012Validator(SCHEMAS[key]).iter_errors(messages)]
    assert not errors, (key, errors, messages)
    return messages


def _flushed(otel: KaosOtelManager, receiver: OtlpReceiver, logs: int) -> None:
    assert otel.force_flush(5)
    assert receiver.wait_for(lambda r: len(r.spans()) >= 1 and len(r.logs()) >= logs, 10)


def test_openai_chat_messages_are_recorded_in_the_conventions_shape(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel(environ={CAPTURE: "SPAN_AND_EVENT"})
    given = json.dumps(OPENAI_CONVERSATION)
    with otel.model_call("assistant", "gpt-4o-mini", conversation_id="conv-7") as call:
        call.record_usage(12, 4, finish_reasons=["stop"])
        call.record_messages(OPENAI_CONVERSATION, [OPENAI_CHOICE])
    _flushed(otel, otlp_receiver, logs=1)
    assert json.dumps(OPENAI_CONVERSATION) == given, "the caller's messages were changed"

    (span,) = otlp_receiver.spans()
    assert span.attributes[catalog.GEN_AI_CONVERSATION_ID] == "conv-7"
    (event,) = [
        log for log in otlp_receiver.logs() if log.event_name == catalog.GEN_AI_INFERENCE_DETAILS_EVENT
    ]
    assert isinstance(span.attributes[catalog.GEN_AI_INPUT_MESSAGES], str)
    assert isinstance(event.attributes[catalog.GEN_AI_INPUT_MESSAGES], tuple), "text in the event"
    assert event.time_unix_nano > 0
    for key in (
        catalog.GEN_AI_PROVIDER_NAME,
        catalog.GEN_AI_CONVERSATION_ID,
        catalog.GEN_AI_USAGE_INPUT_TOKENS,
    ):
        assert event.attributes[key] == span.attributes[key], key
    for where in (span.attributes, event.attributes):
        system, user, assistant, tool = _valid(
            catalog.GEN_AI_INPUT_MESSAGES, where[catalog.GEN_AI_INPUT_MESSAGES]
        )
        assert system == {"role": "system", "parts": [{"type": "text", "content": "You are terse."}]}
        assert user["parts"] == [
            {"type": "text", "content": "What is in this picture, and what is 2 + 3?"},
            {"type": "uri", "modality": "image", "uri": "https://example.test/cat.png"},
        ]
        assert assistant["parts"] == [
            {"type": "tool_call", "id": "call_1", "name": "add", "arguments": {"a": 2, "b": 3}}
        ]
        assert tool == {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "call_1", "response": "5"}],
        }
        (answer,) = _valid(catalog.GEN_AI_OUTPUT_MESSAGES, where[catalog.GEN_AI_OUTPUT_MESSAGES])
        assert answer == {
            "role": "assistant",
            "parts": [{"type": "text", "content": "A cat; 5."}],
            "finish_reason": "stop",
        }


@pytest.mark.parametrize(
    ("output", "usage_reasons", "expected_reason"),
    [
        ("5", ["length"], "length"),  # text, and the reason record_usage recorded
        ({"role": "assistant", "content": "5"}, (), "stop"),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "add", "arguments": "2,3"}}],
            },
            (),
            "tool_call",
        ),
        (
            {"message": {"role": "assistant", "content": None}, "finish_reason": "tool_calls"},
            ["stop"],
            "tool_call",
        ),
        (
            {"role": "assistant", "parts": [{"type": "text", "content": "5"}], "finish_reason": "length"},
            ["stop"],
            "length",
        ),
    ],
    ids=["text", "message", "tool-call-message", "openai-choice", "conventions-shape"],
)
def test_each_output_message_gets_a_finish_reason(
    output: object, usage_reasons: list[str], expected_reason: str
) -> None:
    messages = _genai_messages.output_messages(output if isinstance(output, str) else [output], usage_reasons)
    assert isinstance(messages, list)
    (message,) = messages
    assert message["finish_reason"] == expected_reason
    errors = list(
        jsonschema.Draft202012Validator(SCHEMAS[catalog.GEN_AI_OUTPUT_MESSAGES]).iter_errors([message])
    )
    assert not errors, errors


def test_messages_in_the_conventions_shape_are_kept_and_text_becomes_a_text_part() -> None:
    given = [{"role": "user", "parts": [{"type": "text", "content": "hi"}], "name": "ana"}]
    assert _genai_messages.input_messages(given) == given
    assert _genai_messages.input_messages("hi") == [
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]}
    ]
    assert _genai_messages.input_messages(42) == 42  # nothing message-like: recorded as given
    kept = _genai_messages.output_messages([{"role": "assistant", "parts": []}])
    assert kept == [{"role": "assistant", "parts": [], "finish_reason": "stop"}]


def test_the_event_carries_the_messages_when_only_events_may(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel(environ={CAPTURE: "EVENT_ONLY"})
    with otel.model_call("assistant", "gpt-4o-mini") as call:
        call.record_messages("what is 2 + 3?", "5")
    _flushed(otel, otlp_receiver, logs=1)
    (span,) = otlp_receiver.spans()
    assert catalog.GEN_AI_INPUT_MESSAGES not in span.attributes
    (event,) = otlp_receiver.logs()
    _valid(catalog.GEN_AI_INPUT_MESSAGES, event.attributes[catalog.GEN_AI_INPUT_MESSAGES])
    _valid(catalog.GEN_AI_OUTPUT_MESSAGES, event.attributes[catalog.GEN_AI_OUTPUT_MESSAGES])


def test_a_span_the_sampler_dropped_gets_no_content_work(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No messages are converted or serialised and no stack trace is formatted for a span that is
    not recorded; the metrics still count the call."""
    converted: list[object] = []
    monkeypatch.setattr(
        _genai_messages,
        "_message_list",
        lambda value, **_: converted.append(value),  # its signature
    )
    otel = make_otel(environ={CAPTURE: "SPAN_ONLY", "OTEL_TRACES_SAMPLER": "always_off"})
    stacks: list[BaseException] = []

    def exception_attributes(policy: ContentPolicy, exc: BaseException) -> dict[str, str]:
        stacks.append(exc)
        return {}

    monkeypatch.setattr(ContentPolicy, "exception_attributes", exception_attributes)
    with pytest.raises(ValueError), otel.model_call("assistant", "gpt-4o-mini") as call:
        call.record_messages([{"role": "user", "content": "hi"}], None)
        call.set_content(catalog.GEN_AI_OUTPUT_MESSAGES, [{"role": "assistant", "content": "5"}])
        raise ValueError("boom")
    assert (converted, stacks) == ([], [])
    assert otel.force_flush(5)
    assert otlp_receiver.spans() == []


@pytest.mark.parametrize("capture", ["EVENT_ONLY", "SPAN_AND_EVENT"])
def test_the_reference_agent_emits_the_event_in_every_event_mode(
    otlp_receiver: OtlpReceiver, tmp_path: Path, capture: str
) -> None:
    """The researcher (a model call, an MCP tool call, a model call) with content in events."""
    env = {**otlp_env(otlp_receiver.grpc_endpoint, export_delay_ms=200), CAPTURE: capture}
    with Supervisor(tmp_path, env=env) as supervisor:
        model = supervisor.spawn(ServiceSpec("model", ["model"]))
        echo = supervisor.spawn(ServiceSpec("mcp-echo", ["mcp", "echo"]))
        researcher = supervisor.spawn(agent_spec("researcher", model, mcp=[echo]))
        supervisor.wait_ready([model, echo, researcher])
        body = {"model": "researcher", "messages": [{"role": "user", "content": "Find the opening hours."}]}
        httpx.post(
            f"{researcher.url}/v1/chat/completions", json=body, timeout=30, trust_env=False
        ).raise_for_status()

        def details(r: OtlpReceiver) -> list[Any]:
            return [log for log in r.logs() if log.event_name == catalog.GEN_AI_INFERENCE_DETAILS_EVENT]

        assert otlp_receiver.wait_for(lambda r: len(details(r)) >= 2, timeout=15)
    (run,) = [s for s in otlp_receiver.spans() if s.name == "invoke_agent researcher"]
    assert run.attributes[catalog.GEN_AI_PROVIDER_NAME] == "openai"  # required by the conventions
    for event in details(otlp_receiver):
        _valid(catalog.GEN_AI_INPUT_MESSAGES, event.attributes[catalog.GEN_AI_INPUT_MESSAGES])
        (answer,) = _valid(catalog.GEN_AI_OUTPUT_MESSAGES, event.attributes[catalog.GEN_AI_OUTPUT_MESSAGES])
        assert answer["finish_reason"] in ("tool_call", "stop")


class _SdkMessage:
    """Stands for the ``openai`` SDK's pydantic objects: what ``model_dump()`` gives is converted."""

    def __init__(self, **fields: object) -> None:
        self.fields = fields

    def model_dump(self, exclude_none: bool = False) -> dict[str, object]:
        return {k: v for k, v in self.fields.items() if not (exclude_none and v is None)}


def test_other_message_shapes_are_converted_and_other_mappings_kept() -> None:
    completion = {
        "id": "c1",
        "choices": [{"message": {"role": "assistant", "content": "5"}, "finish_reason": "length"}],
    }
    assert _genai_messages.output_messages(completion) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "5"}], "finish_reason": "length"}
    ]
    choice = _SdkMessage(
        index=0, message=_SdkMessage(role="assistant", content="hi", refusal=None), finish_reason="stop"
    )
    assert _genai_messages.output_messages([choice]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "hi"}], "finish_reason": "stop"}
    ]
    legacy = {"role": "assistant", "content": None, "function_call": {"name": "add", "arguments": '{"a": 2}'}}
    refused = {"role": "assistant", "refusal": "I cannot help with that."}
    converted = _genai_messages.output_messages([legacy, refused])
    assert isinstance(converted, list)
    call, refusal = converted
    assert call["parts"] == [{"type": "tool_call", "id": None, "name": "add", "arguments": {"a": 2}}]
    assert refusal["parts"] == [{"type": "refusal", "content": "I cannot help with that."}]
    sdk_call = _SdkMessage(id="c1", type="function", function=_SdkMessage(name="add", arguments="{}"))
    converted = _genai_messages.output_messages([{"role": "assistant", "tool_calls": [sdk_call]}])
    assert isinstance(converted, list)
    (calling,) = converted
    assert calling["parts"] == [{"type": "tool_call", "id": "c1", "name": "add", "arguments": {}}]
    assert calling["finish_reason"] == "tool_call"
    not_messages: list[object] = [
        {"prompt": "what is 2 + 3?"},
        [{"role": "user", "content": "hi"}, {"prompt": "x"}],
        [{"role": "USER", "message": "what is 2 + 3?"}],  # another provider's shape: no content key
        [{"role": "user", "text": "what is 2 + 3?"}],
    ]
    for value in not_messages:
        assert _genai_messages.input_messages(value) is value  # no chat messages: recorded as given
    for value in ({"message": "5"}, {"id": "c2", "choices": ["a", "b"]}):
        assert _genai_messages.output_messages(value) is value
    empty_reply = [{"role": "user", "content": "hi"}, {"role": "assistant"}]  # model_dump(exclude_none=True)
    assert _genai_messages.input_messages(empty_reply) == [
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
        {"role": "assistant", "parts": []},
    ]
    choices = [
        {"index": 1, "message": {"role": "assistant", "content": "b"}},
        {"index": 0, "message": {"role": "assistant", "content": "a"}},
    ]
    in_order = _genai_messages.output_messages(choices, ["stop", "length"])
    assert isinstance(in_order, list)
    assert [m["finish_reason"] for m in in_order] == ["length", "stop"]  # by each choice's index


def test_record_usage_takes_what_it_can_and_never_raises(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    def failing() -> Iterator[str]:
        yield "stop"
        raise RuntimeError("the stream broke")

    otel = make_otel()
    hostile: list[object] = [5, failing(), b"stop", [1, 2]]
    for reasons in hostile:
        with otel.model_call("assistant", "gpt-4o-mini") as call:
            call.record_usage(1, 2, finish_reasons=reasons, response_id=True)  # type: ignore[arg-type]
    assert otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= len(hostile), 10)
    for span in otlp_receiver.spans():
        assert catalog.GEN_AI_RESPONSE_FINISH_REASONS not in span.attributes
        assert span.attributes[catalog.GEN_AI_RESPONSE_ID] == "True"
        assert span.attributes[catalog.GEN_AI_USAGE_OUTPUT_TOKENS] == 2


def test_event_values_are_bounded_as_attribute_values_are() -> None:
    policy = ContentPolicy(capture=ContentCapture.EVENT_ONLY, max_value_length=100)
    cyclic: dict[str, object] = {"role": "user"}
    cyclic["self"] = [cyclic] * 40
    deep: dict[str, object] = {"big": [2**70, {("a", "tuple"): "key"}]}  # JSON has no tuple keys
    for _ in range(6):  # the list at depth 8: past what the cleaning layer walks
        deep = {"deeper": deep}
    shared = [[[1] * 100] * 100] * 100  # the same lists again and again: a million values
    entries = {
        "text": "x" * 5000,
        "big": 2**70,
        "many": [1] * 300 + [2**70],
        "cyclic": cyclic,
        "obj": _SdkMessage(),
        "deep": deep,
    }
    whole = to_log_value(entries, policy)  # keys and strings of the cap's length in all
    assert isinstance(whole, dict) and len(str(whole)) < 300 and whole["text"].endswith("chars]")
    value: dict[str, Any] = {}
    for key, entry in entries.items():
        one = to_log_value({key: entry}, policy)
        assert isinstance(one, dict)
        value.update(one)
    assert len(value["text"]) < 200 and value["big"] == str(2**70)
    assert value["many"] == [1] * 255 + ["..."]  # beyond 256 items: as many as the cleaning layer walks
    assert isinstance(value["cyclic"], dict) and isinstance(value["obj"], str)
    assert str(2**70) in str(value["deep"]) and f"({2**70}" not in str(value["deep"])  # text, not an int
    assert "tuple" in str(value["deep"])
    assert str(to_log_value(shared, policy)).count("1") <= 10_000
    wide = [[[1] * 257] * 257] * 257  # past 256 items: 255 and a marker, within the 10,000 values
    assert str(to_log_value(wide, policy)).count("1") <= 10_000


def test_the_event_repeats_the_call_even_when_the_span_is_not_sampled(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel(environ={CAPTURE: "EVENT_ONLY", "OTEL_TRACES_SAMPLER": "always_off"})
    with otel.model_call(
        "assistant", "gpt-4o-mini", server_address="api.test", conversation_id="conv-9"
    ) as call:
        call.record_usage(12, 4, finish_reasons=["stop"])
        call.record_messages("what is 2 + 3?", "5")
    assert otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: len(r.logs()) >= 1, 10)
    (event,) = otlp_receiver.logs()
    assert {k: v for k, v in event.attributes.items() if not k.endswith("messages")} == {
        catalog.GEN_AI_OPERATION_NAME: "chat",
        catalog.GEN_AI_PROVIDER_NAME: "openai",
        catalog.GEN_AI_REQUEST_MODEL: "gpt-4o-mini",
        catalog.SERVER_ADDRESS: "api.test",
        catalog.GEN_AI_CONVERSATION_ID: "conv-9",
        catalog.GEN_AI_USAGE_INPUT_TOKENS: 12,
        catalog.GEN_AI_USAGE_OUTPUT_TOKENS: 4,
        catalog.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
    }


def _chunk(delta: dict[str, Any] | None, finish_reason: str | None = None, index: int = 0) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": index, "delta": delta, "finish_reason": finish_reason}]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": choices,
    }


def test_a_streamed_completion_is_recorded_from_its_chunks() -> None:
    """What a stream delivers (``stream=True``), as the ``openai`` SDK's ``ChatCompletionChunk``
    objects or as their JSON: each choice's deltas joined into one output message."""
    streamed = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"role": "assistant", "content": "Other"}, index=1),
        _chunk({"content": "The sum "}),
        _chunk({"content": "is 5."}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": ""},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 2,'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "b": 3}'}}]}),
        _chunk({}, finish_reason="tool_calls"),
        _chunk({}, finish_reason="length", index=1),
        {**_chunk(None), "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}},
    ]
    for chunks in (streamed, [ChatCompletionChunk.model_validate(chunk) for chunk in streamed]):
        converted = _genai_messages.output_messages(chunks)
        first, second = _valid(catalog.GEN_AI_OUTPUT_MESSAGES, json.dumps(converted))
        assert first == {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "The sum is 5."},
                {"type": "tool_call", "id": "call_1", "name": "add", "arguments": {"a": 2, "b": 3}},
            ],
            "finish_reason": "tool_call",
        }
        assert second == {
            "role": "assistant",
            "parts": [{"type": "text", "content": "Other"}],
            "finish_reason": "length",
        }
    legacy = [
        _chunk({"role": "assistant", "content": "", "function_call": {"name": "add", "arguments": '{"a"'}}),
        _chunk({"function_call": {"arguments": ": 1}"}}),
        _chunk({}, finish_reason="function_call"),
    ]
    (message,) = _valid(catalog.GEN_AI_OUTPUT_MESSAGES, json.dumps(_genai_messages.output_messages(legacy)))
    assert message["parts"] == [{"type": "tool_call", "id": None, "name": "add", "arguments": {"a": 1}}]
    assert message["finish_reason"] == "tool_call"


def test_tool_arguments_nested_too_deep_to_parse_stay_text_and_the_rest_is_converted() -> None:
    """Arguments a model nested past the JSON parser's recursion limit raised a RecursionError,
    which left every output message in the OpenAI shape."""
    deep = "[" * 100_000 + "]" * 100_000
    reply = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": deep}}]}
    (message,) = _valid(catalog.GEN_AI_OUTPUT_MESSAGES, json.dumps(_genai_messages.output_messages([reply])))
    assert message["parts"] == [{"type": "tool_call", "id": "c1", "name": "f", "arguments": deep}]


def test_a_legacy_function_result_is_a_tool_call_response() -> None:
    """The legacy ``function_call`` is a tool call part: its result (role ``function``) is the
    tool call's response, as a ``tool`` message's is, not text of a role the conventions lack."""
    converted = _genai_messages.input_messages(
        [
            {"role": "assistant", "function_call": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            {"role": "function", "name": "weather", "content": "sunny"},
        ]
    )
    call, result = _valid(catalog.GEN_AI_INPUT_MESSAGES, json.dumps(converted))
    assert call["parts"] == [
        {"type": "tool_call", "id": None, "name": "weather", "arguments": {"city": "Oslo"}}
    ]
    assert result == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": None, "response": "sunny"}],
        "name": "weather",
    }


def test_messages_the_cap_cuts_are_still_json(make_otel: MakeOtel, otlp_receiver: OtlpReceiver) -> None:
    """The conventions' message attributes are JSON: one the cap cuts was JSON text cut in the
    middle of a string, with ``...[truncated]`` after it, which no reader could parse."""
    otel = make_otel(environ={CAPTURE: "SPAN_ONLY", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "600"})
    history = [{"role": "system", "content": "You are terse."}] + [
        {"role": "user", "content": f'line {index}: "quoted"\n\tcafé 😀 ' * 20} for index in range(50)
    ]
    reply = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]}
    with otel.model_call("assistant", "gpt-4o-mini") as call:
        call.record_messages(history, [{"role": "assistant", "content": "é" * 5000}, reply])
    assert otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= 1, 10)
    (span,) = otlp_receiver.spans()
    sent = span.attributes[catalog.GEN_AI_INPUT_MESSAGES]
    assert isinstance(sent, str) and len(sent) <= 600
    system, user, *rest = json.loads(sent)
    assert system == {"role": "system", "parts": [{"type": "text", "content": "You are terse."}]}
    assert user["parts"][0]["content"].endswith("...[truncated]") and rest == ["..."]
    answer, *more = json.loads(span.attributes[catalog.GEN_AI_OUTPUT_MESSAGES])
    assert answer["parts"][0]["content"].startswith("é" * 100) and more == ["..."]


def test_a_long_history_is_converted_only_as_far_as_an_export_can_keep_it() -> None:
    """A history of 50,000 messages was converted whole (half a second on the request thread) for
    the few kilobytes the cap keeps; what is exported is the same."""
    dumped = 0

    class Counted(_SdkMessage):
        def model_dump(self, exclude_none: bool = False) -> dict[str, object]:
            nonlocal dumped
            dumped += 1
            return super().model_dump(exclude_none)

    history = [Counted(role="user", content="") for _ in range(50_000)]
    converted = _genai_messages.input_messages(history)
    assert isinstance(converted, list) and len(converted) == len(history)
    assert dumped <= 4_000
    whole = [_genai_messages._message(message.fields) for message in history]
    for cap in (8192, 10_000_000):
        policy = ContentPolicy(max_value_length=cap)
        assert to_attribute_value(converted, policy) == to_attribute_value(whole, policy)
        assert to_log_value(converted, policy) == to_log_value(whole, policy)


def test_the_event_keeps_a_long_conversation_structured(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """The conventions want the event's messages structured: past 256 messages they were sent as
    one JSON string. They stay a structure, of as many messages as the cleaning layer walks."""
    otel = make_otel(environ={CAPTURE: "EVENT_ONLY"})
    history = [{"role": "user", "content": f"m{index}"} for index in range(300)]
    with otel.model_call("assistant", "gpt-4o-mini") as call:
        call.record_messages(history, "ok")
    _flushed(otel, otlp_receiver, logs=1)
    (event,) = otlp_receiver.logs()
    sent = event.attributes[catalog.GEN_AI_INPUT_MESSAGES]
    assert isinstance(sent, list | tuple) and len(sent) == 256 and sent[-1] == "..."
    kept = _valid(catalog.GEN_AI_INPUT_MESSAGES, list(sent[:-1]))
    assert kept[254] == {"role": "user", "parts": [{"type": "text", "content": "m254"}]}


def test_an_image_sent_inline_is_a_blob_part() -> None:
    """The conventions' ``uri`` part "should not be a base64 data URL, which should use the blob
    part instead": OpenAI's usual way to send an image inline was recorded as a ``uri``."""
    image = {
        "type": "image_url",
        "image_url": {"url": "data:image/png;name=a.png;base64,iVBORw0KGgo=", "detail": "low"},
    }
    linked = {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}}
    converted = _genai_messages.input_messages([{"role": "user", "content": [image, linked]}])
    (message,) = _valid(catalog.GEN_AI_INPUT_MESSAGES, json.dumps(converted))
    assert message["parts"] == [
        {"type": "blob", "modality": "image", "mime_type": "image/png", "content": "iVBORw0KGgo="},
        {"type": "uri", "modality": "image", "uri": "https://example.test/cat.png"},
    ]


def test_anthropic_content_blocks_become_the_conventions_parts() -> None:
    """Anthropic's Messages API blocks were kept as generic parts (``tool_use``, ``tool_result``,
    ``thinking``; an inline image's base64 under ``source``) and its ``stop_reason`` ignored."""
    history = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.test/cat.png"}},
                {"type": "document", "source": {"type": "file", "file_id": "file_011"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Add them.", "signature": "EqQB"},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}]},
    ]
    user, assistant, result = _valid(
        catalog.GEN_AI_INPUT_MESSAGES, json.dumps(_genai_messages.input_messages(history))
    )
    assert user["parts"][1:] == [
        {"type": "blob", "modality": "image", "mime_type": "image/png", "content": "iVBO"},
        {"type": "uri", "modality": "image", "uri": "https://example.test/cat.png"},
        {"type": "file", "modality": "document", "mime_type": None, "file_id": "file_011"},
    ]
    assert assistant["parts"] == [
        {"type": "reasoning", "content": "Add them."},
        {"type": "tool_call", "id": "toolu_1", "name": "add", "arguments": {"a": 2, "b": 3}},
    ]
    assert result["parts"] == [{"type": "tool_call_response", "id": "toolu_1", "response": "5"}]
    reply = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "It is a"}],
        "stop_reason": "max_tokens",
    }
    (answer,) = _valid(catalog.GEN_AI_OUTPUT_MESSAGES, json.dumps(_genai_messages.output_messages(reply)))
    assert answer == {
        "role": "assistant",
        "parts": [{"type": "text", "content": "It is a"}],
        "finish_reason": "length",
    }


def test_openai_files_and_reasoning_become_the_conventions_parts() -> None:
    """A file sent inline was kept as a generic part holding the whole data: URL, an uploaded one
    had no ``file_id`` part, and the reasoning OpenAI-compatible servers return was dropped."""
    content = [
        {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="}},
        {"type": "file", "file": {"file_id": "file-abc"}},
    ]
    tool_result = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "5"}]}
    user, tool = _valid(
        catalog.GEN_AI_INPUT_MESSAGES,
        json.dumps(_genai_messages.input_messages([{"role": "user", "content": content}, tool_result])),
    )
    assert user["parts"] == [
        {"type": "blob", "modality": "document", "mime_type": "application/pdf", "content": "JVBERi0="},
        {"type": "file", "modality": "document", "mime_type": None, "file_id": "file-abc"},
    ]
    assert tool["parts"][0]["response"] == [{"type": "text", "content": "5"}]
    choice = {"index": 0, "message": {"role": "assistant", "content": "4", "reasoning_content": "2 + 2"}}
    chunks = [
        ChatCompletionChunk.model_validate(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "deepseek-reasoner",
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
            }
        )
        for delta, reason in [
            ({"role": "assistant", "reasoning_content": "2 + "}, None),
            ({"reasoning_content": "2"}, None),
            ({"content": "4"}, "stop"),
        ]
    ]
    for output in ([choice], chunks):
        (answer,) = _valid(
            catalog.GEN_AI_OUTPUT_MESSAGES, json.dumps(_genai_messages.output_messages(output))
        )
        assert answer["parts"] == [
            {"type": "reasoning", "content": "2 + 2"},
            {"type": "text", "content": "4"},
        ]
