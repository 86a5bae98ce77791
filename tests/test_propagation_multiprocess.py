"""Issue 3 acceptance: one unbroken trace across agent and MCP processes, with every log tied to a span.

The reference system runs as six real processes (scripted model, two MCP servers, three agents)
exporting OTLP to a receiver in this test. One request to the coordinator, plain and streaming,
must give exactly one trace in which every parent is present, delegations nest as client span ->
remote server span -> ``invoke_agent`` span, each MCP call is exactly one client and one server
span, and every log record (including one written from a thread pool) carries the trace and an
existing span.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from instrumented_agent.demo import SCENARIOS
from instrumented_agent.server import TRACE_ID_HEADER
from instrumented_agent.supervisor import Supervisor
from instrumented_agent.system import System, otlp_env, start_system
from kaos_otel.receiver import OtlpReceiver, ReceivedLog, ReceivedSpan

pytestmark = pytest.mark.timeout(120)

AGENTS = ("coordinator", "researcher", "analyst")
MCP_SERVICES = {"echo": "mcp-echo", "add": "mcp-calculator"}
SERVICES = {*AGENTS, *MCP_SERVICES.values()}


@dataclass(frozen=True)
class HandledRequest:
    """The telemetry of one request: its trace id, answer, and the spans and logs it produced."""

    trace_id: str
    answer: str
    spans: list[ReceivedSpan]
    logs: list[ReceivedLog]

    def one(self, service: str, name: str) -> ReceivedSpan:
        matches = [s for s in self.spans if s.service_name == service and s.name == name]
        assert len(matches) == 1, f"expected one {name!r} span in {service}, got {len(matches)}"
        return matches[0]

    def children(self, parent: ReceivedSpan) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.parent_span_id == parent.span_id]


@pytest.fixture(scope="module")
def system(module_receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    env = otlp_env(module_receiver.grpc_endpoint, export_delay_ms=100)
    with Supervisor(tmp_path_factory.mktemp("propagation"), env=env) as supervisor:
        yield start_system(supervisor)


def _answer_of_stream(lines: Iterator[str]) -> str:
    parts: list[str] = []
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[len("data: ") :]).get("choices", ()):
            parts.append(choice.get("delta", {}).get("content") or "")
    return "".join(parts)


def _send(url: str, stream: bool) -> tuple[str, str]:
    """POST the research prompt; returns (trace id, answer)."""
    body = {"messages": [{"role": "user", "content": SCENARIOS["research"].prompt}], "stream": stream}
    with httpx.Client(timeout=30, trust_env=False) as client:
        if not stream:
            response = client.post(f"{url}/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            return response.headers[TRACE_ID_HEADER], response.json()["choices"][0]["message"]["content"]
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            return response.headers[TRACE_ID_HEADER], _answer_of_stream(response.iter_lines())


def _wait_quiet(module_receiver: OtlpReceiver, quiet_s: float = 0.5, timeout_s: float = 10.0) -> None:
    """Wait until nothing new has arrived for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    count, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = len(module_receiver.spans()) + len(module_receiver.logs())
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.05)


@pytest.fixture(scope="module", params=["json", "stream"])
def handled(request: pytest.FixtureRequest, module_receiver: OtlpReceiver, system: System) -> HandledRequest:
    """Send one research request (plain or streaming) and collect what it produced."""
    _wait_quiet(module_receiver)  # startup telemetry (MCP session set-up) is not part of the request
    known = {(s.trace_id, s.span_id) for s in module_receiver.spans()}
    logs_before = len(module_receiver.logs())
    trace_id, answer = _send(system.coordinator_url, stream=request.param == "stream")

    def complete(r: OtlpReceiver) -> bool:
        names = {(s.service_name, s.name) for s in r.spans() if s.trace_id == trace_id}
        return {("coordinator", "POST /v1/chat/completions"), ("mcp-echo", "tools/call echo")} <= names and (
            "mcp-calculator",
            "tools/call add",
        ) in names

    assert module_receiver.wait_for(complete, timeout=15)
    _wait_quiet(module_receiver)
    spans = [s for s in module_receiver.spans() if (s.trace_id, s.span_id) not in known]
    return HandledRequest(trace_id, answer, spans, module_receiver.logs()[logs_before:])


def test_answer_is_correct(handled: HandledRequest) -> None:
    assert all(fragment in handled.answer for fragment in SCENARIOS["research"].expected_fragments)


def test_exactly_one_trace_across_all_services(handled: HandledRequest) -> None:
    assert {s.trace_id for s in handled.spans} == {handled.trace_id}
    assert {s.service_name for s in handled.spans} == SERVICES


def test_every_parent_is_present_and_the_coordinator_server_span_is_the_root(handled: HandledRequest) -> None:
    ids = {s.span_id for s in handled.spans}
    assert len(ids) == len(handled.spans), "duplicate span ids"
    roots = [s for s in handled.spans if s.parent_span_id is None]
    assert [(r.service_name, r.kind, r.name) for r in roots] == [
        ("coordinator", "SERVER", "POST /v1/chat/completions")
    ]
    orphans = [s.name for s in handled.spans if s.parent_span_id is not None and s.parent_span_id not in ids]
    assert orphans == []


def test_server_span_is_parent_of_the_agent_span(handled: HandledRequest) -> None:
    server = handled.one("coordinator", "POST /v1/chat/completions")
    run = handled.one("coordinator", "invoke_agent coordinator")
    assert run.parent_span_id == server.span_id
    assert run.start_time_unix_nano >= server.start_time_unix_nano
    assert run.end_time_unix_nano <= server.end_time_unix_nano


@pytest.mark.parametrize("target", ["researcher", "analyst"])
def test_delegation_client_then_remote_server_then_invoke_agent(handled: HandledRequest, target: str) -> None:
    client = handled.one("coordinator", f"invoke_agent {target}")
    assert client.kind == "CLIENT"
    (server,) = handled.children(client)
    assert (server.service_name, server.kind, server.name) == (target, "SERVER", "POST /v1/chat/completions")
    (run,) = handled.children(server)
    assert (run.service_name, run.kind, run.name) == (target, "INTERNAL", f"invoke_agent {target}")


@pytest.mark.parametrize("tool", ["echo", "add"])
def test_mcp_call_is_one_client_and_one_server_span(handled: HandledRequest, tool: str) -> None:
    clients = [s for s in handled.spans if s.name == f"MCP send tools/call {tool}"]
    servers = [s for s in handled.spans if s.name == f"tools/call {tool}"]
    assert [s.kind for s in clients] == ["CLIENT"]
    assert [s.kind for s in servers] == ["SERVER"]
    assert servers[0].service_name == MCP_SERVICES[tool]
    assert servers[0].parent_span_id == clients[0].span_id
    agent = "researcher" if tool == "echo" else "analyst"
    assert clients[0].parent_span_id == handled.one(agent, f"execute_tool {tool}").span_id


def test_every_log_carries_the_trace_and_an_existing_span(handled: HandledRequest) -> None:
    ids = {s.span_id for s in handled.spans}
    assert handled.logs, "no log records arrived"
    assert {(log.trace_id, log.span_id in ids) for log in handled.logs} == {(handled.trace_id, True)}
    assert {log.service_name for log in handled.logs} >= SERVICES


def test_log_from_a_thread_pool_is_tied_to_its_tool_span(handled: HandledRequest) -> None:
    (search,) = [log for log in handled.logs if str(log.body).startswith("searching for")]
    assert search.span_id == handled.one("mcp-echo", "tools/call echo").span_id


def test_agent_logs_are_tied_to_the_span_they_were_written_in(handled: HandledRequest) -> None:
    by_id = {s.span_id: s for s in handled.spans}
    placed = {
        (log.service_name, str(log.body).split(" ")[0], by_id[str(log.span_id)].name)
        for log in handled.logs
        if log.service_name in AGENTS
    }
    assert ("coordinator", "delegating", "invoke_agent researcher") in placed
    assert ("researcher", "calling", "execute_tool echo") in placed
    assert ("analyst", "run", "invoke_agent analyst") in placed
