"""The reference agents over real HTTP against the scripted model: answers, errors, budgets, identity.

Every scenario runs against real processes (scripted model, MCP servers, agents) exporting OTLP to a
receiver in this test; each test checks the answer the client gets and the telemetry behind it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from starlette.requests import ClientDisconnect
from starlette.types import Message

from instrumented_agent import server
from instrumented_agent.agent import Agent, Identity, RunResult
from instrumented_agent.config import (
    DELEGATE_TOOL,
    MEMORY_SCOPE_HEADER,
    SESSION_ID_HEADER,
    USER_ID_HEADER,
    AgentConfig,
)
from instrumented_agent.demo import SCENARIOS, request_counts
from instrumented_agent.errors import DelegationError, MalformedToolCallError, ToolError
from instrumented_agent.identity import ENV_SESSION_KEY, IdentityError, SessionIssuer, identity_values
from instrumented_agent.mcp_client import McpTool, McpToolbox
from instrumented_agent.model_client import DeltaSink, ModelClient
from instrumented_agent.model_server import create_model_app
from instrumented_agent.openai_api import ChatMessage, Completion, Usage, completion_chunks
from instrumented_agent.server import TRACE_ID_HEADER, _trace_headers, _unless_disconnected
from instrumented_agent.supervisor import ServiceSpec, Supervisor
from instrumented_agent.system import System, agent_spec, otlp_env, start_system
from kaos_otel import KaosOtelManager, Outcome, catalog
from kaos_otel.receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Agents:
    """Base URLs: the demo system plus ``sentinel`` (autonomous, 0.4 s runtime budget) and ``frugal``."""

    system: System
    sentinel: str
    frugal: str

    def url(self, name: str) -> str:
        return self.system.services[name].url


@pytest.fixture(scope="module")
def agents(module_receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    env = otlp_env(module_receiver.grpc_endpoint, export_delay_ms=200)
    with Supervisor(tmp_path_factory.mktemp("scenarios"), env=env) as supervisor:
        system = start_system(supervisor)
        model, echo = system.services["model"], system.services["mcp-echo"]
        unbounded = ["--max-steps", "1000", "--max-tool-calls", "1000"]
        autonomous = ["--autonomous-goal", "Check the echo search.", "--autonomous-interval", "0.3"]
        sentinel = supervisor.spawn(
            agent_spec(
                "sentinel", model, mcp=[echo], extra_args=[*unbounded, "--max-runtime", "0.4", *autonomous]
            )
        )
        frugal = supervisor.spawn(
            agent_spec("frugal", model, mcp=[echo], extra_args=["--max-tool-calls", "2"])
        )
        supervisor.wait_ready([sentinel, frugal])
        yield Agents(system, sentinel.url, frugal.url)


def _post(url: str, prompt: str, headers: dict[str, str] | None = None, **extra: Any) -> httpx.Response:
    body = {"model": "any", "messages": [{"role": "user", "content": prompt}], **extra}
    with httpx.Client(timeout=30, trust_env=False) as client:
        return client.post(f"{url}/v1/chat/completions", json=body, headers=headers or {})


def _complete(spans: list[ReceivedSpan]) -> bool:
    """Every parent is in, and every call to another process that went out has its callee's span.

    Sub-agents and MCP servers export on their own schedule, after the caller's spans may be in.
    """
    ids = {s.span_id for s in spans}
    parents = {s.parent_span_id for s in spans if s.parent_span_id is not None}
    calls_out = [
        s
        for s in spans
        if s.kind == "CLIENT"
        and s.status_code != "ERROR"
        and (
            s.name.startswith("MCP send") or s.attributes.get(catalog.GEN_AI_OPERATION_NAME) == "invoke_agent"
        )
    ]
    return parents <= ids and all(s.span_id in parents for s in calls_out)


def _trace(module_receiver: OtlpReceiver, response: httpx.Response, service: str) -> list[ReceivedSpan]:
    """All spans of the response's trace, once ``service``'s server span (the last to end) is in."""
    trace_id = response.headers[TRACE_ID_HEADER]

    def arrived(r: OtlpReceiver) -> bool:
        return any(
            s.trace_id == trace_id and s.kind == "SERVER" and s.service_name == service for s in r.spans()
        )

    assert module_receiver.wait_for(arrived, timeout=10)
    module_receiver.wait_for(
        lambda r: _complete([s for s in r.spans() if s.trace_id == trace_id]), timeout=10
    )
    return [s for s in module_receiver.spans() if s.trace_id == trace_id]


def _named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def test_health_and_ready(agents: Agents) -> None:
    with httpx.Client(timeout=5, trust_env=False) as client:
        for name in ("coordinator", "researcher", "analyst"):
            assert client.get(agents.url(name) + "/health").json()["status"] == "ok"
            assert client.get(agents.url(name) + "/ready").status_code == 200


def test_research_scenario_answers_with_both_specialists(agents: Agents) -> None:
    response = _post(agents.system.coordinator_url, SCENARIOS["research"].prompt)
    assert response.status_code == 200
    body = response.json()
    answer = body["choices"][0]["message"]["content"]
    assert answer == (
        "Here is what the team found. "
        "Researcher: Search results: echo: Find sources on the AI chip market. "
        "Analyst: The sum of 45 and 30 is 75."
    )
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["model"] == "coordinator"
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0
    assert len(response.headers[TRACE_ID_HEADER]) == 32


def test_research_scenario_streams_the_same_answer(agents: Agents, module_receiver: OtlpReceiver) -> None:
    body = {
        "messages": [{"role": "user", "content": SCENARIOS["research"].prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with (
        httpx.Client(timeout=30, trust_env=False) as client,
        client.stream("POST", agents.system.coordinator_url + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        events = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content.endswith("Analyst: The sum of 45 and 30 is 75.")
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["total_tokens"] > 0
    spans = _trace(module_receiver, response, "coordinator")
    streamed = [s for s in spans if s.service_name == "coordinator" and s.name.startswith("chat ")]
    assert streamed and all(s.attributes[catalog.GEN_AI_REQUEST_STREAM] is True for s in streamed)
    assert all(
        0 < s.attributes[catalog.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] <= s.duration_s for s in streamed
    )


def test_failure_scenario_is_a_502_with_a_json_error(agents: Agents) -> None:
    response = _post(agents.system.coordinator_url, SCENARIOS["failure"].prompt)
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "unknown_agent"
    assert "unknown agent 'ghost'" in error["message"]


def test_failure_before_the_first_chunk_of_a_stream_is_still_an_http_error(agents: Agents) -> None:
    response = _post(agents.system.coordinator_url, SCENARIOS["failure"].prompt, stream=True)
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["type"] == "unknown_agent"


def test_failed_delegation_is_an_error_span_with_exception_log_and_error_outcome(
    agents: Agents, module_receiver: OtlpReceiver
) -> None:
    response = _post(agents.system.coordinator_url, SCENARIOS["failure"].prompt)
    spans = _trace(module_receiver, response, "coordinator")
    (delegation,) = _named(spans, "invoke_agent _other")
    assert (delegation.kind, delegation.status_code) == ("CLIENT", "ERROR")
    exceptions = [e for e in delegation.events if e.name == "exception"]
    assert [e.attributes["exception.type"].rsplit(".", 1)[-1] for e in exceptions] == ["UnknownAgentError"]
    (run,) = _named(spans, "invoke_agent coordinator")
    assert (run.status_code, run.attributes[catalog.KAOS_OUTCOME]) == ("ERROR", "error")
    (server,) = _named(spans, "POST /v1/chat/completions")
    assert server.attributes["http.response.status_code"] == 502

    def logged(r: OtlpReceiver) -> bool:
        return any(log.span_id == delegation.span_id and log.severity_text == "ERROR" for log in r.logs())

    assert module_receiver.wait_for(logged, timeout=5), "no ERROR log inside the delegation span"

    def counted(r: OtlpReceiver) -> bool:
        return request_counts(r.metric_points()).get(("coordinator", "error"), 0) >= 1

    assert module_receiver.wait_for(counted, timeout=5), "kaos.requests{outcome=error} did not arrive"


def test_model_error_is_a_502_and_an_error_chat_span(agents: Agents, module_receiver: OtlpReceiver) -> None:
    response = _post(agents.url("analyst"), "Please trigger a model error.")
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "model_error"
    (chat,) = _named(_trace(module_receiver, response, "analyst"), "chat scripted-model")
    assert chat.status_code == "ERROR"
    assert chat.attributes[catalog.ERROR_TYPE] == "500"  # what the model answered, not "ModelError"
    assert [e.name for e in chat.events] == ["exception"]


def test_unknown_tool_is_a_502_and_an_error_tool_span(agents: Agents, module_receiver: OtlpReceiver) -> None:
    response = _post(agents.url("researcher"), "Use a missing tool, please.")
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "unknown_tool"
    (tool,) = _named(_trace(module_receiver, response, "researcher"), "execute_tool _other")
    assert tool.status_code == "ERROR"


def test_step_budget_stops_the_loop_with_max_steps(agents: Agents, module_receiver: OtlpReceiver) -> None:
    response = _post(agents.url("researcher"), "Search forever.")
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "step budget of 8" in choice["message"]["content"]
    spans = _trace(module_receiver, response, "researcher")
    (run,) = _named(spans, "invoke_agent researcher")
    assert run.attributes[catalog.KAOS_OUTCOME] == "max_steps"
    assert len(_named(spans, "agent_step")) == 8
    assert len(_named(spans, "tools/call echo")) == 8


def test_tool_call_budget_stops_the_loop(agents: Agents) -> None:
    response = _post(agents.frugal, "Search forever.")
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "tool-call budget of 2" in choice["message"]["content"]


def test_runtime_budget_is_a_504(agents: Agents) -> None:
    started = time.monotonic()
    response = _post(agents.sentinel, "Search forever.")
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "budget_exceeded"
    assert time.monotonic() - started < 5


def test_identity_comes_only_from_the_gateway_header(agents: Agents, module_receiver: OtlpReceiver) -> None:
    headers = {USER_ID_HEADER: "alice", "baggage": "user.id=mallory"}
    response = _post(agents.system.coordinator_url, SCENARIOS["research"].prompt, headers, user="mallory")
    assert response.status_code == 200
    runs = [s for s in _trace(module_receiver, response, "coordinator") if s.name.startswith("invoke_agent")]
    identities = {(s.service_name, s.kind, s.attributes.get(catalog.USER_ID)) for s in runs}
    assert identities >= {
        ("coordinator", "INTERNAL", "alice"),
        ("researcher", "INTERNAL", "alice"),
        ("analyst", "INTERNAL", "alice"),
    }

    anonymous = _post(agents.url("analyst"), "Add 1 and 2.", user="mallory")
    (run,) = _named(_trace(module_receiver, anonymous, "analyst"), "invoke_agent analyst")
    assert catalog.USER_ID not in run.attributes


def test_autonomous_runs_use_the_agent_identity_in_their_own_traces(
    agents: Agents, module_receiver: OtlpReceiver
) -> None:
    def autonomous_runs(r: OtlpReceiver) -> list[ReceivedSpan]:
        """Runs with no server span above them: nobody sent a request."""
        return [
            s
            for s in r.spans()
            if s.service_name == "sentinel" and s.name == "invoke_agent sentinel" and s.parent_span_id is None
        ]

    assert module_receiver.wait_for(lambda r: len(autonomous_runs(r)) >= 2, timeout=10)
    runs = autonomous_runs(module_receiver)
    assert {s.attributes.get(catalog.USER_ID) for s in runs} == {"agent:sentinel"}
    assert {s.attributes.get(catalog.KAOS_OUTCOME) for s in runs} == {"success"}
    assert len({s.trace_id for s in runs}) == len(runs)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
def test_a_client_gone_before_the_answer_cancels_the_run(
    otlp_receiver: OtlpReceiver, tmp_path: Path, stream: bool
) -> None:
    """A request whose client gives up during the first model call (before any chunk of a
    stream): the run stops there (no second model call, no tool call) and ends ``canceled``, as
    does the server span."""
    env = otlp_env(otlp_receiver.grpc_endpoint, export_delay_ms=200)
    with Supervisor(tmp_path, env=env) as supervisor:
        model = supervisor.spawn(ServiceSpec("model", ["model", "--latency-ms", "1500"]))
        echo = supervisor.spawn(ServiceSpec("mcp-echo", ["mcp", "echo"]))
        researcher = supervisor.spawn(agent_spec("researcher", model, mcp=[echo]))
        supervisor.wait_ready([model, echo, researcher])
        body = {
            "model": "researcher",
            "stream": stream,
            "messages": [{"role": "user", "content": "Find the opening hours."}],
        }
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{researcher.url}/v1/chat/completions", json=body, timeout=0.5, trust_env=False)

        def run_ended(r: OtlpReceiver) -> bool:
            return any(s.name == "invoke_agent researcher" for s in r.spans())

        assert otlp_receiver.wait_for(run_ended, timeout=15)
        time.sleep(2)  # anything the run would still do (a second model call) is exported by now
    spans = {s.name: s for s in otlp_receiver.spans()}
    server, run = spans["POST /v1/chat/completions"], spans["invoke_agent researcher"]
    assert server.attributes[catalog.KAOS_OUTCOME] == "canceled", server.attributes
    assert server.attributes[catalog.HTTP_RESPONSE_STATUS_CODE] == 499
    assert run.attributes[catalog.KAOS_OUTCOME] == "canceled", run.attributes
    calls = [s for s in otlp_receiver.spans() if s.name.startswith(("chat ", "execute_tool "))]
    assert [(s.name, s.attributes[catalog.KAOS_OUTCOME]) for s in calls] == [
        ("chat scripted-model", "canceled")
    ]


async def test_a_disconnect_cancels_the_work_and_nothing_else_is_lost() -> None:
    """The server's disconnect watch: a disconnect cancels the work (``None``); a ``receive`` that
    fails never reads as one; a cancellation of the request itself cancels the work and still
    propagates, also while the cancelled work unwinds."""
    gone = asyncio.Event()

    async def receive() -> Message:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def failing_receive() -> Message:
        raise OSError("connection reset")

    async def slow_to_unwind() -> str:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.shield(asyncio.sleep(0.2))
        return "answer"

    async def quick() -> str:
        await asyncio.sleep(0.05)
        return "answer"

    answered = asyncio.ensure_future(quick())
    result = await _unless_disconnected(answered, failing_receive)
    assert result == "answer"
    work = asyncio.ensure_future(slow_to_unwind())
    gone.set()
    assert await _unless_disconnected(work, receive) is None and work.cancelled()

    gone.clear()
    work = asyncio.ensure_future(slow_to_unwind())

    async def handle() -> str | None:
        return await _unless_disconnected(work, receive)

    request = asyncio.ensure_future(handle())
    await asyncio.sleep(0.05)
    gone.set()  # the work is cancelled and unwinds for 0.2 s...
    await asyncio.sleep(0.05)
    request.cancel()  # ...when the server cancels the request (its shutdown grace is over)
    with pytest.raises(asyncio.CancelledError):
        await request
    await asyncio.wait({work})
    assert work.cancelled()


def test_the_trace_header_names_only_a_trace_the_sampler_recorded() -> None:
    trace_id, span_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
    for flags, expected in (
        (TraceFlags.SAMPLED, {TRACE_ID_HEADER: "4bf92f3577b34da6a3ce929d0e0e4736"}),
        (TraceFlags.DEFAULT, {}),
    ):
        context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags))
        with trace.use_span(NonRecordingSpan(context)):
            assert _trace_headers() == expected


class _Toolbox(McpToolbox):
    """One connected ``echo`` tool that records its calls."""

    def __init__(self) -> None:
        super().__init__([])
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def tools(self) -> dict[str, McpTool]:
        return {"echo": McpTool("echo", "Echo a message.", {"type": "object"}, "http://mcp.invalid")}

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls.append((name, arguments))
        return f"echo: {arguments}"


def _scripted(*replies: tuple[dict[str, Any], str]) -> Callable[[httpx.Request], httpx.Response]:
    """A model endpoint answering ``(message, finish_reason)`` in turn, then a plain answer."""
    pending = list(replies)

    def endpoint(request: httpx.Request) -> httpx.Response:
        message, finish_reason = (
            pending.pop(0) if pending else ({"role": "assistant", "content": "done"}, "stop")
        )
        choice = {"index": 0, "message": message, "finish_reason": finish_reason}
        return httpx.Response(200, json={"id": "c", "model": "m", "choices": [choice]})

    return endpoint


def _in_process_agent(
    otel: KaosOtelManager, http: httpx.AsyncClient, toolbox: McpToolbox, **settings: Any
) -> Agent:
    config = AgentConfig(name="solo", model_base_url="http://model.invalid/v1", model_name="m", **settings)
    return Agent(config, otel, ModelClient(config.model_base_url, http), toolbox, http)


@pytest.mark.parametrize("tool", ["echo", DELEGATE_TOOL])
@pytest.mark.parametrize("arguments", ['{"message": "drop the ta', "[1, 2]", "[" * 100_000])
async def test_tool_call_arguments_that_are_no_json_object_fail_the_call_without_making_it(
    make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver, tool: str, arguments: str
) -> None:
    """Arguments cut short by the model's token limit (or no object at all) are a clear error in
    the call's span; the tool is not called with arguments guessed (before: called with ``{}``)."""
    otel = make_otel()
    call = {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": arguments}}
    toolbox = _Toolbox()
    endpoint = _scripted(({"role": "assistant", "tool_calls": [call]}, "length"))
    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as http:
        agent = _in_process_agent(otel, http, toolbox, sub_agents={"helper": "http://helper.invalid"})
        with pytest.raises(MalformedToolCallError) as raised:
            await agent.run([ChatMessage(role="user", content="hi")], Identity(user_id="u"))
    assert toolbox.calls == []
    assert (raised.value.status_code, raised.value.error_type) == (502, "malformed_tool_call")
    otel.force_flush(5)
    failed = "execute_tool echo" if tool == "echo" else "invoke_agent _other"

    def arrived(r: OtlpReceiver) -> bool:
        return any(s.name == failed and s.status_code == "ERROR" for s in r.spans())

    assert otlp_receiver.wait_for(arrived, timeout=10)


async def test_a_delegation_task_that_cannot_be_sent_is_a_delegation_error(
    make_otel: Callable[..., KaosOtelManager],
) -> None:
    """Half an emoji in the model's task (a lone surrogate escape): a ``delegation_error`` and no
    request to the sub-agent (before: a raw ``UnicodeEncodeError``, an ``internal error`` 500)."""
    task = '{"agent": "helper", "task": "cut in half \\ud83d"}'
    call = {"id": "call_1", "type": "function", "function": {"name": DELEGATE_TOOL, "arguments": task}}
    model = _scripted(({"role": "assistant", "tool_calls": [call]}, "tool_calls"))
    hosts: list[str] = []

    def endpoint(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        return model(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as http:
        agent = _in_process_agent(
            make_otel(), http, _Toolbox(), sub_agents={"helper": "http://helper.invalid"}
        )
        with pytest.raises(DelegationError, match="the task for helper cannot be sent") as raised:
            await agent.run([ChatMessage(role="user", content="hi")], Identity(user_id="u"))
    assert (raised.value.status_code, raised.value.error_type) == (502, "delegation_error")
    assert hosts == ["model.invalid"]


@pytest.mark.parametrize("finish_reason", ["length", "content_filter", "stop", "tool_calls"])
async def test_a_final_answer_keeps_the_finish_reason_that_says_it_is_cut_short(
    make_otel: Callable[..., KaosOtelManager], finish_reason: str
) -> None:
    """A client must be able to tell an answer the model's token limit cut short (before: ``stop``)."""
    endpoint = _scripted(({"role": "assistant", "content": "The answer is"}, finish_reason))
    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as http:
        agent = _in_process_agent(make_otel(), http, _Toolbox())
        result = await agent.run([ChatMessage(role="user", content="hi")], Identity(user_id="u"))
    expected = finish_reason if finish_reason in ("length", "content_filter") else "stop"
    assert (result.content, result.finish_reason) == ("The answer is", expected)


@pytest.mark.parametrize("tools", [[{"type": "function", "function": None}], [{"function": "echo"}]])
async def test_the_scripted_model_answers_tools_without_a_function_object(tools: list[Any]) -> None:
    """A ``tools`` entry whose function is not an object names no tool (before: a 500)."""
    transport = httpx.ASGITransport(app=create_model_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://model") as client:
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Scripted reply to: hi"


async def test_a_run_begun_without_a_connected_mcp_server_ends_degraded(
    make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    """The model is not offered the tools of an MCP server that is down, so the answer lacks them:
    ``degraded`` as docs/metrics.md defines it (before: ``success``)."""
    otel = make_otel()
    toolbox = McpToolbox(["http://127.0.0.1:9/mcp"])  # never started: not connected
    endpoint = _scripted(({"role": "assistant", "content": "An answer without searching."}, "stop"))
    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as http:
        agent = _in_process_agent(otel, http, toolbox)
        result = await agent.run([ChatMessage(role="user", content="hi")], Identity(user_id="u"))
    assert result.content == "An answer without searching."
    otel.force_flush(5)

    def arrived(r: OtlpReceiver) -> bool:
        return any(s.name == "invoke_agent solo" for s in r.spans())

    assert otlp_receiver.wait_for(arrived, timeout=10)
    (run,) = _named(otlp_receiver.spans(), "invoke_agent solo")
    assert run.attributes[catalog.KAOS_OUTCOME] == "degraded"
    assert (run.attributes[catalog.ERROR_TYPE], run.status_code) == ("tools_unavailable", "UNSET")


class _DroppingToolbox(_Toolbox):
    """``echo``'s server connected until its first call, then gone (or, with ``late``, not
    connected at first and connected by the first model call)."""

    def __init__(self, *, late: bool) -> None:
        super().__init__()
        self.late = late
        self.connected = not late

    @property
    def pending(self) -> list[str]:
        return [] if self.connected else ["http://mcp.invalid"]

    def tools(self) -> dict[str, McpTool]:
        return super().tools() if self.connected else {}

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        self.connected = self.late
        return await super().call(name, arguments)


@pytest.mark.parametrize("late", [False, True])
async def test_degraded_says_whether_a_model_call_went_without_a_servers_tools(
    make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver, late: bool
) -> None:
    """What decides ``tools_unavailable`` is what each model call was offered: a server lost after
    the first step degrades the run; one connected by the first model call (memory recall can take
    seconds) does not (before: the state when the run began decided both ways wrong)."""
    otel = make_otel()
    toolbox = _DroppingToolbox(late=late)
    call = {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
    endpoint = _scripted(({"role": "assistant", "tool_calls": [call]}, "tool_calls"))
    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as http:
        agent = _in_process_agent(otel, http, toolbox)
        if late:
            original = agent._recall

            async def recall_then_connect(*args: Any) -> Any:
                recalled = await original(*args)
                toolbox.connected = True
                return recalled

            agent._recall = recall_then_connect  # type: ignore[method-assign,assignment]
        result = await agent.run([ChatMessage(role="user", content="hi")], Identity(user_id="u"))
    assert (result.content, toolbox.calls) == ("done", [("echo", {})])
    assert result.tools_unavailable is not late
    otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: any(s.name == "invoke_agent solo" for s in r.spans()), timeout=10)
    (run,) = _named(otlp_receiver.spans(), "invoke_agent solo")
    assert run.attributes[catalog.KAOS_OUTCOME] == ("success" if late else "degraded")


class _OneChunkModel(ModelClient):
    """A model that answers ``Hello.`` in one streamed chunk."""

    async def complete(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[dict[str, Any]] = (),
        on_delta: DeltaSink | None = None,
        on_first_chunk: Callable[[], None] | None = None,
    ) -> Completion:
        if on_delta is not None:
            on_delta("Hello.")
        return Completion("c", model, ChatMessage(role="assistant", content="Hello."), "stop", Usage())


async def test_a_stream_the_server_cannot_start_cancels_its_run(
    monkeypatch: pytest.MonkeyPatch, make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    """An ASGI 2.4 server raises once the client is gone: when that happens as the response starts,
    the events are never read, and the run, waiting for its reader, is cancelled (before: it
    waited forever, its span never ended)."""
    monkeypatch.setattr(server, "ModelClient", _OneChunkModel)
    otel = make_otel()
    app = server.create_agent_app(
        AgentConfig(name="solo", model_base_url="http://model.invalid/v1", model_name="m"), otel
    )
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    received = 0

    async def receive() -> Message:
        nonlocal received
        received += 1
        if received == 1:
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client is still there for all the server can tell
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            raise OSError("the client is gone")

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    async with app.router.lifespan_context(app):
        with pytest.raises(ClientDisconnect):
            await asyncio.wait_for(app(scope, receive, send), 10)
        otel.force_flush(5)

        def run_ended(r: OtlpReceiver) -> bool:
            return any(s.name == "invoke_agent solo" for s in r.spans())

        assert otlp_receiver.wait_for(run_ended, timeout=5), "the run was never ended"
    (run,) = _named(otlp_receiver.spans(), "invoke_agent solo")
    assert run.attributes[catalog.KAOS_OUTCOME] == "canceled"


@pytest.mark.parametrize("stream", [False, True])
async def test_half_an_emoji_in_the_models_answer_is_answered_as_a_replacement_character(
    monkeypatch: pytest.MonkeyPatch, make_otel: Callable[..., KaosOtelManager], stream: bool
) -> None:
    """An answer cut in the middle of an escaped emoji (a lone ``\\ud83d``) is answered with
    U+FFFD in its place (before: the run succeeded, then the answer could not be encoded, a
    plain-text 500 ``Internal Server Error``)."""
    message = b'{"role": "assistant", "content": "cut \\ud83d"}'
    if stream:
        body = b'data: {"choices": [{"index": 0, "delta": ' + message + b"}]}\n\ndata: [DONE]\n\n"
    else:
        body = b'{"choices": [{"index": 0, "message": ' + message + b', "finish_reason": "length"}]}'

    class CutModel(ModelClient):
        def __init__(self, base_url: str, http: httpx.AsyncClient, api_key: str | None = None) -> None:
            transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
            super().__init__(base_url, httpx.AsyncClient(transport=transport), api_key)

    monkeypatch.setattr(server, "ModelClient", CutModel)
    app = server.create_agent_app(
        AgentConfig(name="solo", model_base_url="http://model.invalid/v1", model_name="m"), make_otel()
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            request = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
            response = await client.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    if stream:
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        answer = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    else:
        answer = response.json()["choices"][0]["message"]["content"]
    assert answer == "cut \ufffd"


async def test_each_autonomous_run_has_a_session_of_its_own(
    make_otel: Callable[..., KaosOtelManager],
) -> None:
    """As docs/memory.md says: a new session per autonomous run (before: one for all of them, so
    each run recalled the ones before it)."""
    identities: list[Identity] = []

    class Recording(Agent):
        async def run(self, messages: Sequence[ChatMessage], identity: Identity, **_: Any) -> RunResult:
            identities.append(identity)
            return RunResult("ok", "stop", Outcome.SUCCESS, 1, Usage())

    async with httpx.AsyncClient() as http:
        agent = Recording(
            AgentConfig(name="solo", model_base_url="http://model.invalid/v1", model_name="m"),
            make_otel(),
            ModelClient("http://model.invalid/v1", http),
            McpToolbox([]),
            http,
        )
        issuer = SessionIssuer(b"key")
        loop = asyncio.ensure_future(server._autonomous_loop(agent, McpToolbox([]), "Check.", 0.01, issuer))
        while len(identities) < 3:
            await asyncio.sleep(0.01)
        loop.cancel()
        await asyncio.wait({loop})
    assert {i.user_id for i in identities} == {"agent:solo"}
    assert len({i.session_id for i in identities}) == len(identities)
    assert all(issuer.issued(i.session_id, "solo") for i in identities)


async def test_a_tool_whose_server_went_away_after_the_model_call_is_a_tool_error(
    make_otel: Callable[..., KaosOtelManager],
) -> None:
    """The tool was offered to the model, then its MCP session dropped (its tools are forgotten
    until it reconnects): a ``tool_error`` saying so, not ``unknown tool`` (before)."""

    class Dropping(_Toolbox):
        connected = True

        def tools(self) -> dict[str, McpTool]:
            return super().tools() if self.connected else {}

        async def call(self, name: str, arguments: dict[str, Any]) -> str:
            raise ToolError(f"no connected MCP server offers tool {name!r}")

    toolbox = Dropping()
    call = {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
    answer = _scripted(({"role": "assistant", "tool_calls": [call]}, "tool_calls"))

    def endpoint(request: httpx.Request) -> httpx.Response:
        toolbox.connected = False  # the session drops while the model answers
        return answer(request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint)) as http:
        agent = _in_process_agent(make_otel(), http, toolbox)
        with pytest.raises(ToolError, match="no connected MCP server offers tool 'echo'"):
            await agent.run([ChatMessage(role="user", content="hi")], Identity(user_id="u"))


class _Routes(httpx.AsyncBaseTransport):
    """Requests to each host answered by that host's transport."""

    def __init__(self, routes: dict[str, httpx.AsyncBaseTransport]) -> None:
        self.routes = routes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.routes[request.url.host].handle_async_request(request)


async def test_an_autonomous_run_can_delegate_with_its_own_identity(
    monkeypatch: pytest.MonkeyPatch, make_otel: Callable[..., KaosOtelManager]
) -> None:
    """The sub-agent accepts ``agent:solo`` with a session issued to ``solo`` (before: every
    delegation of an autonomous run was refused, 400 ``reserved``)."""
    monkeypatch.setenv(ENV_SESSION_KEY, "shared-key")
    monkeypatch.setattr(server, "ModelClient", _OneChunkModel)
    otel = make_otel()
    helper = server.create_agent_app(
        AgentConfig(name="helper", model_base_url="http://model.invalid/v1", model_name="m"), otel
    )
    task = json.dumps({"agent": "helper", "task": "Say hello."})
    call = {"id": "call_1", "type": "function", "function": {"name": DELEGATE_TOOL, "arguments": task}}
    scripted = _scripted(({"role": "assistant", "tool_calls": [call]}, "tool_calls"))
    tool_results: list[str] = []

    def model(request: httpx.Request) -> httpx.Response:
        messages = json.loads(request.content)["messages"]
        tool_results.extend(m["content"] for m in messages if m["role"] == "tool")
        return scripted(request)

    routes = {"model.invalid": httpx.MockTransport(model), "helper": httpx.ASGITransport(app=helper)}
    async with helper.router.lifespan_context(helper), httpx.AsyncClient(transport=_Routes(routes)) as http:
        agent = _in_process_agent(otel, http, _Toolbox(), sub_agents={"helper": "http://helper"})
        identity = Identity.of_agent("solo", SessionIssuer.from_env())
        result = await agent.run([ChatMessage(role="user", content="Check.")], identity)
        headers = {USER_ID_HEADER: "agent:solo", SESSION_ID_HEADER: identity.session_id}
        body = {"messages": [{"role": "user", "content": "hi"}]}
        for scope, status in (("session", 200), ("user", 403)):
            answer = await http.post(
                "http://helper/v1/chat/completions",
                json=body,
                headers={**headers, MEMORY_SCOPE_HEADER: scope},
            )
            assert answer.status_code == status, answer.text
    assert (result.content, tool_results) == ("done", ["Hello."])


def test_no_client_can_claim_an_agents_identity() -> None:
    """Only a session issued to that very agent goes with ``agent:<name>``, and only at session
    scope: an anonymous session, another agent's, a forged one or none is still a 400."""
    issuer, other = SessionIssuer(b"key"), SessionIssuer(b"another key")
    own = issuer.issue("keeper")
    assert identity_values([(USER_ID_HEADER, "agent:keeper"), (SESSION_ID_HEADER, own)], issuer)
    nonce = own.split("-")[1]
    for session in (
        None,
        issuer.issue(),
        issuer.issue("sentinel"),
        other.issue("keeper"),
        f"anon-{nonce}-{own.split('-')[2]}",
        f"auto-{nonce}-{'0' * 32}",
        f"auto-{nonce}-\u00e9",
    ):
        headers = [(USER_ID_HEADER, "agent:keeper")] + ([(SESSION_ID_HEADER, session)] if session else [])
        with pytest.raises(IdentityError, match="reserved"):
            identity_values(headers, issuer)
    assert not issuer.issued(own)  # nor is it an anonymous session
    with pytest.raises(IdentityError, match="reserved"):
        identity_values([(USER_ID_HEADER, "agent:keeper"), (SESSION_ID_HEADER, own)])
    with pytest.raises(IdentityError, match="reserved"):
        identity_values([(USER_ID_HEADER, ":keeper"), (SESSION_ID_HEADER, own)], issuer)


def _sse_model(*chunks: dict[str, Any]) -> httpx.MockTransport:
    """A model endpoint streaming ``chunks``, then ``[DONE]``."""
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    headers = {"content-type": "text/event-stream"}
    return httpx.MockTransport(lambda request: httpx.Response(200, content=body.encode(), headers=headers))


@pytest.mark.parametrize(
    "names",
    [["echo", None, None], ["ec", "ho", None], ["echo", "echo", "echo"]],
    ids=["once", "in-pieces", "repeated"],
)
async def test_a_streamed_tool_call_name_is_the_name_however_the_server_sends_it(
    names: list[str | None],
) -> None:
    """OpenAI sends the name in the first fragment only, Gemini in pieces, Anthropic's and
    MiniMax's compatible APIs whole in every fragment (before: ``echoechoecho``, an unknown tool)."""
    arguments = ['{"message"', ': "hi"', "}"]
    fragments = [
        {"index": 0, "function": {"arguments": part, **({"name": name} if name else {})}}
        for name, part in zip(names, arguments, strict=True)
    ]
    fragments[0]["id"] = "call_1"
    chunks = [{"choices": [{"index": 0, "delta": {"tool_calls": [f]}}]} for f in fragments]
    async with httpx.AsyncClient(transport=_sse_model(*chunks)) as http:
        model = ModelClient("http://model.invalid/v1", http)
        completion = await model.complete("m", [], on_delta=lambda text: None)
    (call,) = completion.message.tool_calls or []
    assert (call.id, call.function.name, call.arguments_object()) == ("call_1", "echo", {"message": "hi"})


@pytest.mark.parametrize("stream", [False, True])
async def test_a_finish_reason_that_is_no_string_is_read_as_text_streamed_or_not(stream: bool) -> None:
    """As the whole-body path already did (before: a streamed ``1`` stayed an int, and telemetry
    dropped the finish reasons of the call)."""
    if stream:
        transport = _sse_model({"choices": [{"index": 0, "delta": {"content": "Hi."}, "finish_reason": 1}]})
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": "Hi."}, "finish_reason": 1}
        transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"choices": [choice]}))
    async with httpx.AsyncClient(transport=transport) as http:
        on_delta = (lambda text: None) if stream else None
        completion = await ModelClient("http://model.invalid/v1", http).complete("m", [], on_delta=on_delta)
    assert (completion.message.text(), completion.finish_reason) == ("Hi.", "1")


def _scripted_either(*replies: tuple[dict[str, Any], str]) -> Callable[[httpx.Request], httpx.Response]:
    """:func:`_scripted`, streamed (as SSE) to a request that asks for a stream."""
    whole = _scripted(*replies)

    def endpoint(request: httpx.Request) -> httpx.Response:
        response = whole(request)
        if not json.loads(request.content).get("stream"):
            return response
        body = response.json()
        choice = body["choices"][0]
        message = ChatMessage.model_validate(choice["message"])
        completion = Completion(body["id"], body["model"], message, choice["finish_reason"], Usage())
        return httpx.Response(200, content="".join(completion_chunks(completion, include_usage=False)))

    return endpoint


@pytest.mark.parametrize("max_tool_calls", [8, 1])
async def test_a_streamed_answer_is_the_answer_with_what_the_model_said_before_its_tool_calls(
    make_otel: Callable[..., KaosOtelManager], caplog: pytest.LogCaptureFixture, max_tool_calls: int
) -> None:
    """What the model says alongside its tool calls is part of the answer, streamed or not, one
    paragraph per model call (before: streamed, but missing from the answer of a non-streaming
    request, and run together with the answer in the stream); the log line of a stopped run
    names the budget, not what the model said."""
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
        for i in (1, 2)
    ]
    replies = (
        ({"role": "assistant", "content": "Let me search.", "tool_calls": calls[:1]}, "tool_calls"),
        ({"role": "assistant", "tool_calls": calls[1:]}, "tool_calls"),
        ({"role": "assistant", "content": "Found it."}, "stop"),
    )
    answers, streamed = [], []
    for stream in (False, True):
        deltas: list[str] = []
        async with httpx.AsyncClient(transport=httpx.MockTransport(_scripted_either(*replies))) as http:
            agent = _in_process_agent(make_otel(), http, _Toolbox(), max_tool_calls=max_tool_calls)
            result = await agent.run(
                [ChatMessage(role="user", content="hi")],
                Identity(user_id="u"),
                on_delta=deltas.append if stream else None,
            )
        answers.append(result.content)
        streamed += ["".join(deltas)] if stream else []
    expected = (
        "Let me search.\n\nFound it."
        if max_tool_calls == 8
        else "Let me search.\n\nStopped: tool-call budget of 1 used up."
    )
    assert answers == [expected, expected]
    assert streamed == [expected]
    stopped = [r.getMessage() for r in caplog.records if "without a final answer" in r.getMessage()]
    assert stopped == (
        [] if max_tool_calls == 8 else [f"run ended without a final answer: {expected[16:]}"] * 2
    )
