"""Bounded resources and clear errors: body, message and text limits over HTTP, invalid Unicode,
what memory stores and recalls, MCP calls that fail on their own, and errors without secrets."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from mcp.server.mcpserver.exceptions import ToolError as McpToolError
from net_support import free_port

from instrumented_agent.errors import ModelError, ToolError
from instrumented_agent.limits import MAX_BODY_BYTES, MAX_MESSAGE_CHARS, MAX_MESSAGES, MAX_STORED_TURN_CHARS
from instrumented_agent.mcp_client import MAX_TOOL_ARGUMENTS_BYTES, McpToolbox
from instrumented_agent.mcp_servers import MCP_PATH, TraceContextMetaGuard, create_mcp_server
from instrumented_agent.memory import MemoryService, RelationalStore, Turn
from instrumented_agent.memory.relational import Summary, estimate_tokens
from instrumented_agent.memory.service import Recall
from instrumented_agent.model_client import ModelClient
from instrumented_agent.openai_api import ChatMessage
from instrumented_agent.supervisor import ServiceSpec, Supervisor
from instrumented_agent.system import agent_spec
from kaos_otel import KaosOtelManager, MemoryScope
from kaos_otel._internal_log import internal_error

pytestmark = pytest.mark.timeout(180)


@dataclass
class Running:
    agent: str
    echo: str


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    workdir = tmp_path_factory.mktemp("limits")
    with Supervisor(workdir) as supervisor:
        model = supervisor.spawn(ServiceSpec("model", ["model"]))
        echo = supervisor.spawn(ServiceSpec("mcp-echo", ["mcp", "echo"]))
        memory = ["--memory-url", f"sqlite:///{workdir / 'memory.db'}"]
        agent = supervisor.spawn(agent_spec("researcher", model, mcp=[echo], extra_args=memory))
        supervisor.wait_ready([model, echo, agent])
        yield Running(agent.url, echo.url)


def _post(
    url: str, content: bytes | Iterator[bytes], headers: dict[str, str] | None = None
) -> httpx.Response:
    with httpx.Client(timeout=60, trust_env=False) as client:
        return client.post(
            f"{url}/v1/chat/completions",
            content=content,
            headers={"content-type": "application/json", **(headers or {})},
        )


def _body(messages: list[dict[str, str]]) -> bytes:
    return json.dumps({"model": "any", "messages": messages}).encode()


def test_a_body_above_the_cap_is_a_413_declared_or_streamed(running: Running) -> None:
    big = _body([{"role": "user", "content": "x" * (MAX_BODY_BYTES + 1)}])
    declared = _post(running.agent, big)
    assert declared.status_code == 413 and declared.json()["error"]["type"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no content-length: the cap counts what arrives
        for start in range(0, len(big), 64 * 1024):
            yield big[start : start + 64 * 1024]

    assert _post(running.agent, chunks()).status_code == 413
    assert _post(running.agent, _body([{"role": "user", "content": "hello"}])).status_code == 200


def test_message_count_and_size_are_capped(running: Running) -> None:
    many = [{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1)
    assert _post(running.agent, _body(many)).status_code == 413
    long = [{"role": "user", "content": "y" * (MAX_MESSAGE_CHARS + 1)}]
    assert _post(running.agent, _body(long)).status_code == 413


def test_invalid_unicode_is_a_400(running: Running) -> None:
    lone_surrogate = b'{"model": "any", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    answer = _post(running.agent, lone_surrogate)
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"
    invalid_utf8 = b'{"model": "any", "messages": [{"role": "user", "content": "a\xff\xfeb"}]}'
    for body in (invalid_utf8, b"not json", _body([])):
        answer = _post(running.agent, body)
        assert answer.status_code == 400, body
        assert answer.json()["error"]["type"] == "invalid_request_error", answer.text


@pytest.mark.parametrize(
    "message",
    [
        b'{"role": "user", "content": "hi", "name": "a\\ud800"}',
        b'{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "\\udfff"}}]}',
        b'{"role": "assistant", "tool_calls": '
        b'[{"id": "c", "function": {"name": "x", "arguments": "\\ud800"}}]}',
    ],
)
def test_invalid_unicode_anywhere_in_a_message_is_a_400(running: Running, message: bytes) -> None:
    """A lone surrogate outside the text cannot be sent on to the model either: the client's 400
    (before: a 502 ``malformed model response`` blamed on the model, and a failed model call)."""
    body = b'{"model": "any", "messages": [' + message + b', {"role": "user", "content": "hi"}]}'
    answer = _post(running.agent, body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_token_estimate_does_not_depend_on_spaces() -> None:
    spaced, unspaced = " ".join(["word"] * 1000), "w" * 5000
    assert estimate_tokens(unspaced) >= 1000
    assert estimate_tokens(spaced) >= 1000


@pytest.mark.parametrize("sessions", [1, 3])
@pytest.mark.parametrize("budget", [120, 400, 9])
def test_summaries_larger_than_the_budget_are_cut_and_the_newest_turns_stay(
    budget: int, sessions: int
) -> None:
    summaries = tuple(
        Summary(f"s{n}", 4, " ".join(f"folded turn {i} about the opening hours" for i in range(60)))
        for n in range(sessions)
    )
    turns = tuple(Turn("user", f"turn {i}: what are the opening hours?") for i in range(5))
    recalled = Recall(turns, summaries).within(budget)
    texts = [t.content for t in recalled.turns] + [s.content for s in recalled.summaries]
    assert sum(estimate_tokens(text) for text in texts) <= budget
    assert sum(estimate_tokens(s.content) for s in recalled.summaries) <= budget // 2
    if budget >= 120:
        assert recalled.turns[-1] == turns[-1]  # the newest turn is kept
        newest = recalled.summaries[0]
        assert newest.session_id == "s0" and newest.content.startswith("... ")
        assert newest.content.endswith("folded turn 59 about the opening hours")


async def test_stored_turns_are_capped_and_recall_stays_within_its_budget(
    make_otel: Callable[..., KaosOtelManager],
) -> None:
    memory = MemoryService("bounded", make_otel(), RelationalStore("sqlite://"), window_tokens=2000)
    await memory.start()
    owner = memory.owner("alice", "s1")
    await memory.remember(owner, [Turn("user", "z" * 100_000)])
    await memory.remember(owner, [Turn("user", f"turn {i} " + "q" * 400) for i in range(50)])
    recalled = await memory.recall(owner, MemoryScope.SESSION, "")
    texts = (
        [t.content for t in recalled.turns] + [s.content for s in recalled.summaries] + list(recalled.facts)
    )
    assert all(len(text) <= MAX_STORED_TURN_CHARS for text in texts)
    assert sum(estimate_tokens(text) for text in texts) <= memory.recall_tokens
    assert recalled.turns  # the newest turns are kept
    await memory.aclose()


async def test_a_failing_or_oversized_mcp_call_fails_only_its_own_request(running: Running) -> None:
    toolbox = McpToolbox([running.echo + MCP_PATH])
    toolbox.start()
    try:
        while not toolbox.ready:
            await asyncio.sleep(0.05)
        with pytest.raises(ToolError, match="above"):
            await toolbox.call("echo", {"message": "m" * (MAX_TOOL_ARGUMENTS_BYTES + 1)})
        # sized as UTF-8 sends it: two bytes a character here, not the six of a JSON escape
        accented = "é" * (MAX_TOOL_ARGUMENTS_BYTES // 3)
        assert accented in await toolbox.call("echo", {"message": accented})
        with pytest.raises(ToolError, match="cannot be sent"):  # half an emoji, as a model's JSON may hold
            await toolbox.call("echo", {"message": "\ud83d"})
        with pytest.raises(ToolError):
            await toolbox.call("echo", {"wrong_argument": 1})  # the server rejects it
        results = await asyncio.gather(*(toolbox.call("echo", {"message": f"m{i}"}) for i in range(20)))
        assert all(f"m{i}" in result for i, result in enumerate(results))
        assert toolbox.ready
    finally:
        await toolbox.aclose()


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("meta", [{"baggage": 5}, {"tracestate": 7}, {"tracestate": ["a=1", 3]}])
def test_an_mcp_call_with_trace_context_that_is_not_text_is_served(
    running: Running, meta: dict[str, object]
) -> None:
    """OpenTelemetry's propagators raise on a number in ``_meta``; the servers drop such entries
    before the SDK's tracing reads them, so the call is served (before, ``baggage: 5`` failed it)."""
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    with httpx.Client(base_url=running.echo, timeout=30, trust_env=False) as client:
        init = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        started = client.post(
            MCP_PATH,
            headers=headers,
            json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init},
        )
        headers["mcp-protocol-version"] = started.json()["result"]["protocolVersion"]
        params = {
            "name": "echo",
            "arguments": {"message": "hi"},
            "_meta": {"traceparent": TRACEPARENT, **meta},
        }
        answer = client.post(
            MCP_PATH,
            headers=headers,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
        )
    assert "error" not in answer.json() and "hi" in answer.text, answer.text


async def test_the_trace_context_guard_keeps_the_text_entries_of_meta() -> None:
    """A valid ``traceparent`` next to a ``tracestate`` that is not text is kept (the SDK would
    otherwise drop the whole context); every other ``_meta`` entry is left alone."""
    seen: list[object] = []

    async def call_next(ctx: Any) -> Any:
        seen.append(ctx.meta)
        return None

    meta = {"traceparent": TRACEPARENT, "tracestate": 7, "baggage": None, "progressToken": 3}
    await TraceContextMetaGuard()(cast(Any, SimpleNamespace(meta=meta)), call_next)
    await TraceContextMetaGuard()(cast(Any, SimpleNamespace(meta={"traceparent": TRACEPARENT})), call_next)
    assert seen == [{"traceparent": TRACEPARENT, "progressToken": 3}, {"traceparent": TRACEPARENT}]


async def test_model_endpoint_errors_are_masked_before_they_reach_anyone() -> None:
    key = "sk-proj-" + "k" * 40
    short_key = "abc123-not-a-known-shape"

    def endpoint(request: httpx.Request) -> httpx.Response:
        sent = request.headers["authorization"].removeprefix("Bearer ")
        return httpx.Response(401, json={"error": {"message": f"Incorrect API key provided: {sent}."}})

    for api_key in (key, short_key):
        async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as http:
            client = ModelClient("http://model.invalid/v1", http, api_key)
            with pytest.raises(ModelError) as raised:
                await client.complete("m", [ChatMessage(role="user", content="hi")])
        assert api_key not in str(raised.value) and "[REDACTED]" in str(raised.value)


@pytest.mark.parametrize(
    ("status", "body", "stream", "reason"),
    [
        (429, b'{"error": {"message": "slow down"}}', False, "429"),
        (200, b'{"choices": ["not a choice"]}', False, "malformed_response"),
        (200, b'data: {"error": "overloaded"}\n\n', True, "stream_error"),
        (200, b"data: [1, 2]\n\n", True, "malformed_response"),
        (200, b"[" * 100_000, False, "malformed_response"),  # too deep for the JSON parser
    ],
)
async def test_every_model_failure_is_a_model_error_naming_what_failed(
    status: int, body: bytes, stream: bool, reason: str
) -> None:
    """What becomes the chat span's ``error.type``: the status, or what was wrong with the reply."""

    def endpoint(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as http:
        client = ModelClient("http://model.invalid/v1", http, None)
        with pytest.raises(ModelError) as raised:
            await client.complete(
                "m", [ChatMessage(role="user", content="hi")], (), print if stream else None
            )
    assert raised.value.reason == reason


def test_credentials_in_exporter_urls_are_masked_in_diagnostics(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kaos_otel")
    url = "https://ingest:hunter2@collector.example:4318/v1/traces?token=tok-123456&sig=abcdef"
    internal_error(f"test export to {url}", ConnectionError(f"cannot reach {url}"))
    text = caplog.text
    assert "collector.example" in text
    assert not [secret for secret in ("hunter2", "tok-123456", "abcdef") if secret in text]


def test_the_otlp_exporters_own_warnings_do_not_show_url_credentials(
    make_otel: Callable[..., KaosOtelManager], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    token = "tok-" + "9" * 24
    closed = f"http://127.0.0.1:{free_port()}/v1/traces?token={token}"
    otel = make_otel(
        "http/protobuf",
        environ={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": closed, "OTEL_EXPORTER_OTLP_TIMEOUT": "1000"},
    )
    with otel.span("doomed"):
        pass
    otel.force_flush(3)
    assert "/v1/traces" in caplog.text or "export" in caplog.text.lower()  # the failure was logged
    assert token not in caplog.text


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", None])
async def test_a_model_endpoint_that_does_not_stream_still_answers_a_streaming_call(
    content_type: str | None,
) -> None:
    """An endpoint that ignores ``stream`` and answers one JSON body (whatever its content type
    says): its answer is passed on as one chunk (before: an empty answer, reported as a success)."""

    def endpoint(request: httpx.Request) -> httpx.Response:
        choice = {"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        body = json.dumps({"id": "c-1", "model": "m", "choices": [choice], "usage": usage}, indent=1)
        headers = {"content-type": content_type} if content_type else {}
        return httpx.Response(200, content=body.encode(), headers=headers)

    deltas: list[str] = []
    first_chunks: list[bool] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as http:
        client = ModelClient("http://model.invalid/v1", http, None)
        completion = await client.complete(
            "m",
            [ChatMessage(role="user", content="hi")],
            (),
            deltas.append,
            lambda: first_chunks.append(True),
        )
    assert (completion.message.content, completion.id, completion.usage.total_tokens) == ("whole", "c-1", 4)
    assert deltas == ["whole"] and first_chunks == [True]


@pytest.mark.parametrize("body", [b"", b"event: ping\n\n", b"<html>busy</html>"])
async def test_a_streaming_answer_without_events_or_a_completion_is_a_malformed_response(body: bytes) -> None:
    """No ``data:`` event and no completion in the body is an error, not an empty success."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    async with httpx.AsyncClient(transport=transport) as http:
        client = ModelClient("http://model.invalid/v1", http, None)
        with pytest.raises(ModelError) as raised:
            await client.complete("m", [ChatMessage(role="user", content="hi")], (), lambda text: None)
    assert raised.value.reason == "malformed_response"


async def test_a_stream_labelled_json_is_still_read_as_a_stream() -> None:
    """A proxy that labels the event stream ``application/json``: the events are what count."""
    chunk = {"id": "c-2", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}
    last = {
        "id": "c-2",
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}],
    }
    body = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, content=body, headers={"content-type": "application/json"})
    )
    deltas: list[str] = []
    async with httpx.AsyncClient(transport=transport) as http:
        client = ModelClient("http://model.invalid/v1", http, None)
        completion = await client.complete("m", [ChatMessage(role="user", content="hi")], (), deltas.append)
    assert (completion.message.content, deltas) == ("Hello", ["Hel", "lo"])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_conversation_with_half_an_emoji_still_reaches_the_model(stream: bool) -> None:
    """A tool result (or a tool's description) holding a lone surrogate is sent with U+FFFD in its
    place (before: it could not be encoded, and the call failed as a ``malformed_response`` the
    model never gave)."""
    sent: list[dict[str, Any]] = []

    def endpoint(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content.decode("utf-8")))
        if stream:
            return httpx.Response(200, content=b'data: {"choices": [{"delta": {"content": "ok"}}]}\n\n')
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "ok"}}]})

    messages = [
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="tool", tool_call_id="c", content="half \ud83d"),
    ]
    tools = [{"type": "function", "function": {"name": "echo", "description": "\udfff"}}]
    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as http:
        client = ModelClient("http://model.invalid/v1", http, None)
        completion = await client.complete("m", messages, tools, (lambda text: None) if stream else None)
    assert completion.message.content == "ok"
    (body,) = sent
    assert body["messages"][1]["content"] == "half \ufffd"
    assert body["tools"][0]["function"]["description"] == "\ufffd"
    assert body.get("stream", False) is stream


@pytest.mark.parametrize(
    ("fragments", "answer"),
    [
        (["Hel", [{"type": "text", "text": "lo"}, {"type": "thinking", "thinking": "hm"}]], "Hello"),
        (["Hel", 5], None),
        (["Hel", ["lo"]], None),
    ],
)
async def test_streamed_content_is_text_or_text_parts_and_nothing_else_is_passed_on(
    fragments: list[object], answer: str | None
) -> None:
    """Content parts in a delta (as some endpoints stream them) are passed on as their text; other
    content is a malformed response before any of it reaches the client (before: parts were a
    ``malformed_response`` and a number or a list went on to the answer's stream, which showed
    ``internal error`` instead of the model's failure)."""
    chunks = [{"choices": [{"index": 0, "delta": {"content": fragment}}]} for fragment in fragments]
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body.encode()))
    deltas: list[object] = []
    async with httpx.AsyncClient(transport=transport) as http:
        client = ModelClient("http://model.invalid/v1", http, None)
        messages = [ChatMessage(role="user", content="hi")]
        if answer is None:
            with pytest.raises(ModelError) as raised:
                await client.complete("m", messages, (), deltas.append)
            assert (raised.value.reason, deltas) == ("malformed_response", ["Hel"])
        else:
            completion = await client.complete("m", messages, (), deltas.append)
            assert (completion.message.content, deltas) == (answer, ["Hel", "lo"])


@pytest.mark.parametrize(
    "arguments", [{"a": 1e308, "b": 1e308}, {"a": float("nan"), "b": 1}, {"a": float("-inf"), "b": 1}]
)
async def test_the_calculator_refuses_sums_that_are_not_finite_numbers(arguments: dict[str, float]) -> None:
    """JSON has no NaN or infinity: such a sum was answered as a success whose result read null."""
    calculator = create_mcp_server("calculator")
    with pytest.raises(McpToolError, match="must be finite"):
        await calculator.call_tool("add", arguments)
    assert "5.0" in str(await calculator.call_tool("add", {"a": 2, "b": 3}))
