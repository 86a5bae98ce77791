"""Each outcome value, arising from the situation that causes it.

Every scenario runs real agent-shaped code through the domain helpers and checks both what the
spans say (``kaos.outcome``, ``error.type``, status) and the ``kaos.outcome`` label of the
metrics at the OTLP receiver.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kaos_otel import KaosOtelManager, MemoryScope, MemoryTier, Outcome, catalog
from kaos_otel.receiver import OtlpReceiver, ReceivedMetricPoint, ReceivedSpan

AGENT = "planner"
SUB_AGENT = "researcher"
MODEL = "gpt-4o-mini"
TOOL = "web_search"


class ModelError(Exception):
    """The model endpoint answered 500."""


class ToolError(Exception):
    """The tool raised."""


class RemoteAgentError(Exception):
    """The sub-agent answered with an error."""


class BackendDown(ConnectionError):
    """The memory backend cannot be reached."""


@dataclass
class Received:
    spans: list[ReceivedSpan]
    points: list[ReceivedMetricPoint]

    def span(self, name: str, kind: str | None = None) -> ReceivedSpan:
        found = [s for s in self.spans if s.name == name and (kind is None or s.kind == kind)]
        assert len(found) == 1, f"expected one span {name!r} ({kind}), got {[s.name for s in self.spans]}"
        return found[0]

    def outcomes(self, metric: str) -> Counter[str]:
        """Count (counters) or number of observations (histograms) per kaos.outcome label."""
        counts: Counter[str] = Counter()
        for point in self.points:
            if point.name == metric:
                value = point.count if point.kind == "histogram" else point.value
                counts[str(point.attributes[catalog.KAOS_OUTCOME])] += int(value or 0)
        return counts

    def points_of(self, metric: str) -> list[ReceivedMetricPoint]:
        return [p for p in self.points if p.name == metric]


class Harness:
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver
        self.otel = KaosOtelManager(
            "outcomes",
            endpoint=receiver.grpc_endpoint,
            protocol="grpc",
            global_providers=False,
            bridge_logging=False,
            metric_export_interval_ms=600_000,
            span_schedule_delay_ms=50,
        )
        self.otel.register_known_names(AGENT, tools=[TOOL], models=[MODEL], targets=[SUB_AGENT])

    def collect(self, expected_spans: int) -> Received:
        assert self.otel.force_flush(timeout=10)
        assert self.receiver.wait_for(lambda r: len(r.spans()) >= expected_spans, timeout=10), [
            s.name for s in self.receiver.spans()
        ]
        latest: dict[tuple[str, frozenset[tuple[str, object]]], ReceivedMetricPoint] = {}
        for point in self.receiver.metric_points():
            latest[(point.name, frozenset(point.attributes.items()))] = point
        return Received(self.receiver.spans(), list(latest.values()))


@pytest.fixture
def harness(otlp_receiver: OtlpReceiver) -> Iterator[Harness]:
    h = Harness(otlp_receiver)
    try:
        yield h
    finally:
        h.otel.shutdown()


def assert_span_outcome(span: ReceivedSpan, outcome: Outcome, error_type: str | None) -> None:
    assert span.attributes.get(catalog.KAOS_OUTCOME) == outcome.value, span.name
    assert span.attributes.get(catalog.ERROR_TYPE) == error_type, span.name
    failed = outcome in (Outcome.ERROR, Outcome.MAX_STEPS)
    assert (span.status_code == "ERROR") is failed, (span.name, span.status_code)


# --------------------------------------------------------------------------------------------


def test_success(harness: Harness) -> None:
    otel = harness.otel
    with otel.invoke_agent(AGENT, session_id="s-1", max_steps=4) as run, otel.agent_step(run):
        with otel.memory_operation(MemoryTier.LONG_TERM, "search_memory", scope=MemoryScope.USER) as m:
            m.set_record_count(2)
        with otel.model_call(AGENT, MODEL) as call:
            call.record_usage(120, 30)
        with otel.tool_call(AGENT, TOOL, call_id="call_1"):
            pass
        with otel.delegation(AGENT, SUB_AGENT):
            pass
    got = harness.collect(expected_spans=6)

    for name in (
        catalog.KAOS_REQUESTS,
        catalog.KAOS_REQUEST_DURATION,
        catalog.KAOS_REQUEST_STEPS,
        catalog.KAOS_MODEL_CALLS,
        catalog.KAOS_TOOL_CALLS,
        catalog.KAOS_DELEGATIONS,
        catalog.KAOS_MEMORY_OPERATIONS,
    ):
        assert got.outcomes(name) == {"success": 1}, name
    (duration,) = got.points_of(catalog.GEN_AI_CLIENT_OPERATION_DURATION)
    assert catalog.ERROR_TYPE not in duration.attributes
    for span in (
        got.span(f"invoke_agent {AGENT}"),
        got.span(f"chat {MODEL}"),
        got.span(f"execute_tool {TOOL}"),
        got.span(f"invoke_agent {SUB_AGENT}", "CLIENT"),
        got.span("search_memory"),
    ):
        assert_span_outcome(span, Outcome.SUCCESS, None)


def test_model_error_is_an_error_on_the_call_and_the_request(harness: Harness) -> None:
    otel = harness.otel
    with (
        pytest.raises(ModelError),
        otel.invoke_agent(AGENT) as run,
        otel.agent_step(run),
        otel.model_call(AGENT, MODEL),
    ):
        raise ModelError("HTTP 500")
    got = harness.collect(expected_spans=3)

    assert got.outcomes(catalog.KAOS_MODEL_CALLS) == {"error": 1}
    assert got.outcomes(catalog.KAOS_REQUESTS) == {"error": 1}
    (duration,) = got.points_of(catalog.GEN_AI_CLIENT_OPERATION_DURATION)
    assert duration.attributes[catalog.ERROR_TYPE] == "ModelError"
    assert_span_outcome(got.span(f"chat {MODEL}"), Outcome.ERROR, "ModelError")
    assert_span_outcome(got.span(f"invoke_agent {AGENT}"), Outcome.ERROR, "ModelError")


def test_tool_error_is_an_error_on_the_call_and_the_request(harness: Harness) -> None:
    otel = harness.otel
    with (
        pytest.raises(ToolError),
        otel.invoke_agent(AGENT) as run,
        otel.agent_step(run),
        otel.tool_call(AGENT, TOOL),
    ):
        raise ToolError("no such page")
    got = harness.collect(expected_spans=3)

    assert got.outcomes(catalog.KAOS_TOOL_CALLS) == {"error": 1}
    assert got.outcomes(catalog.KAOS_TOOL_DURATION) == {"error": 1}
    assert got.outcomes(catalog.KAOS_REQUESTS) == {"error": 1}
    assert_span_outcome(got.span(f"execute_tool {TOOL}"), Outcome.ERROR, "ToolError")
    assert_span_outcome(got.span(f"invoke_agent {AGENT}"), Outcome.ERROR, "ToolError")


def test_failed_delegation_is_an_error(harness: Harness) -> None:
    otel = harness.otel
    with pytest.raises(RemoteAgentError), otel.invoke_agent(AGENT), otel.delegation(AGENT, SUB_AGENT):
        raise RemoteAgentError("sub-agent returned 502")
    got = harness.collect(expected_spans=2)

    assert got.outcomes(catalog.KAOS_DELEGATIONS) == {"error": 1}
    assert got.outcomes(catalog.KAOS_DELEGATION_DURATION) == {"error": 1}
    assert got.outcomes(catalog.KAOS_REQUESTS) == {"error": 1}
    assert_span_outcome(got.span(f"invoke_agent {SUB_AGENT}", "CLIENT"), Outcome.ERROR, "RemoteAgentError")


def test_swallowed_delegation_error_is_never_success(harness: Harness) -> None:
    """The agent catches the sub-agent's failure and answers anyway: not a success."""
    otel = harness.otel
    with otel.invoke_agent(AGENT) as run:
        with otel.agent_step(run):
            try:
                with otel.delegation(AGENT, SUB_AGENT):
                    raise RemoteAgentError("sub-agent timed out")
            except RemoteAgentError as exc:
                # What the agent must do when it swallows the error: say so on the run.
                run.set_outcome(Outcome.ERROR, type(exc).__qualname__)
        with otel.agent_step(run), otel.model_call(AGENT, MODEL):
            pass  # the model writes an answer without the sub-agent's part
    got = harness.collect(expected_spans=5)

    assert got.outcomes(catalog.KAOS_DELEGATIONS) == {"error": 1}
    assert got.outcomes(catalog.KAOS_MODEL_CALLS) == {"success": 1}
    assert got.outcomes(catalog.KAOS_REQUESTS) == {"error": 1}
    assert got.outcomes(catalog.KAOS_REQUEST_DURATION) == {"error": 1}
    assert_span_outcome(got.span(f"invoke_agent {SUB_AGENT}", "CLIENT"), Outcome.ERROR, "RemoteAgentError")
    assert_span_outcome(got.span(f"invoke_agent {AGENT}"), Outcome.ERROR, "RemoteAgentError")


def test_running_out_of_steps_is_max_steps(harness: Harness) -> None:
    otel = harness.otel
    max_steps = 3
    with otel.invoke_agent(AGENT, max_steps=max_steps) as run:
        for _ in range(max_steps):
            with otel.agent_step(run), otel.model_call(AGENT, MODEL), otel.tool_call(AGENT, TOOL):
                pass  # the model keeps asking for tools and never answers
        run.set_outcome(Outcome.MAX_STEPS)
    got = harness.collect(expected_spans=1 + 3 * max_steps)

    assert got.outcomes(catalog.KAOS_REQUESTS) == {"max_steps": 1}
    (steps,) = got.points_of(catalog.KAOS_REQUEST_STEPS)
    assert steps.attributes[catalog.KAOS_OUTCOME] == "max_steps"
    assert (steps.count, steps.sum) == (1, max_steps)
    assert got.outcomes(catalog.KAOS_MODEL_CALLS) == {"success": max_steps}
    run_span = got.span(f"invoke_agent {AGENT}")
    assert_span_outcome(run_span, Outcome.MAX_STEPS, "max_steps")
    assert run_span.attributes[catalog.KAOS_AGENT_STEPS] == max_steps
    assert run_span.attributes[catalog.KAOS_AGENT_MAX_STEPS] == max_steps


async def test_cancellation_is_canceled(harness: Harness) -> None:
    otel = harness.otel
    in_model_call = asyncio.Event()

    async def request() -> None:
        async with otel.invoke_agent(AGENT) as run:
            with otel.agent_step(run):
                async with otel.model_call(AGENT, MODEL):
                    in_model_call.set()
                    await asyncio.sleep(30)  # a slow model; the client disconnects

    task = asyncio.create_task(request())
    await asyncio.wait_for(in_model_call.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    got = harness.collect(expected_spans=3)

    assert got.outcomes(catalog.KAOS_MODEL_CALLS) == {"canceled": 1}
    assert got.outcomes(catalog.KAOS_REQUESTS) == {"canceled": 1}
    for span in (got.span(f"chat {MODEL}"), got.span(f"invoke_agent {AGENT}")):
        assert span.attributes[catalog.KAOS_OUTCOME] == "canceled"
        assert span.attributes[catalog.ERROR_TYPE] == "CancelledError"
        assert span.events == ()  # as OpenTelemetry's use_span: no exception event for it
    # the convention's metric has error.type for failed calls only: a dashboard on it counts none
    (duration,) = got.points_of(catalog.GEN_AI_CLIENT_OPERATION_DURATION)
    assert catalog.ERROR_TYPE not in duration.attributes


@pytest.mark.parametrize("interruption", [KeyboardInterrupt(), SystemExit(0)], ids=["ctrl-c", "sigterm-exit"])
def test_the_process_stopping_mid_request_is_canceled(harness: Harness, interruption: BaseException) -> None:
    """Ctrl-C, or SIGTERM turned into SystemExit as the guide shows: the interrupted request did
    not fail, and must not feed the error-rate alerts at every deploy."""
    otel = harness.otel
    with (
        pytest.raises(type(interruption)),
        otel.invoke_agent(AGENT) as run,
        otel.agent_step(run),
        otel.model_call(AGENT, MODEL),
    ):
        raise interruption
    got = harness.collect(expected_spans=3)
    assert got.outcomes(catalog.KAOS_REQUESTS) == {"canceled": 1}
    for span in (got.span(f"chat {MODEL}"), got.span(f"invoke_agent {AGENT}")):
        assert_span_outcome(span, Outcome.CANCELED, type(interruption).__qualname__)


def search_long_term(backend_up: bool) -> list[str]:
    if not backend_up:
        raise BackendDown("connection refused: qdrant:6333")
    return ["Alice likes blue"]


def test_memory_backend_down_is_degraded(harness: Harness) -> None:
    """Long-term memory is unreachable; the agent answers from the short-term window."""
    otel = harness.otel
    with otel.invoke_agent(AGENT) as run, otel.agent_step(run):
        with otel.memory_operation(
            MemoryTier.LONG_TERM, "search_memory", scope=MemoryScope.USER, provider="mem0"
        ) as op:
            try:
                memories = search_long_term(backend_up=False)
            except BackendDown as exc:
                memories = []
                op.set_outcome(Outcome.DEGRADED, type(exc).__qualname__)
                run.set_outcome(Outcome.DEGRADED)
        with otel.model_call(AGENT, MODEL):
            assert memories == []
    got = harness.collect(expected_spans=4)

    assert got.outcomes(catalog.KAOS_MEMORY_OPERATIONS) == {"degraded": 1}
    assert got.outcomes(catalog.KAOS_MEMORY_OPERATION_DURATION) == {"degraded": 1}
    (memory_point,) = got.points_of(catalog.KAOS_MEMORY_OPERATIONS)
    assert memory_point.attributes[catalog.KAOS_MEMORY_TIER] == "long_term"
    assert memory_point.attributes[catalog.KAOS_MEMORY_OPERATION] == "search_memory"
    assert memory_point.attributes[catalog.KAOS_MEMORY_SCOPE] == "user"
    assert got.outcomes(catalog.KAOS_MODEL_CALLS) == {"success": 1}
    assert got.outcomes(catalog.KAOS_REQUESTS) == {"degraded": 1}
    assert_span_outcome(got.span("search_memory"), Outcome.DEGRADED, "BackendDown")
    assert_span_outcome(got.span(f"invoke_agent {AGENT}"), Outcome.DEGRADED, None)


def test_memory_error_that_escapes_the_operation_then_degraded_request(harness: Harness) -> None:
    """The memory call raises out of its span (an error there); the agent goes on degraded."""
    otel = harness.otel
    with otel.invoke_agent(AGENT) as run:
        try:
            with otel.memory_operation(MemoryTier.LONG_TERM, "create_memory", scope=MemoryScope.AGENT):
                search_long_term(backend_up=False)
        except BackendDown:
            run.set_outcome(Outcome.DEGRADED)
    got = harness.collect(expected_spans=2)

    assert got.outcomes(catalog.KAOS_MEMORY_OPERATIONS) == {"error": 1}
    assert got.outcomes(catalog.KAOS_REQUESTS) == {"degraded": 1}
    assert_span_outcome(got.span("create_memory"), Outcome.ERROR, "BackendDown")


def test_an_exception_after_degraded_is_an_error(harness: Harness) -> None:
    """Memory degraded earlier, then the model fails and the request ends by exception."""
    otel = harness.otel
    with pytest.raises(ModelError), otel.invoke_agent(AGENT) as run:
        run.set_outcome(Outcome.DEGRADED, "BackendDown")
        with otel.model_call(AGENT, MODEL):
            raise ModelError("HTTP 500")
    got = harness.collect(expected_spans=2)

    assert got.outcomes(catalog.KAOS_REQUESTS) == {"error": 1}
    assert_span_outcome(got.span(f"invoke_agent {AGENT}"), Outcome.ERROR, "ModelError")


def test_a_degraded_model_call_is_no_failed_call_in_the_convention_metric(harness: Harness) -> None:
    """A model call that answered without a dependency (the tools of a server that is down) did
    not fail: its ``error.type`` is on the span only, while one the agent says failed (no
    exception) has it on the convention's metric too."""
    otel = harness.otel
    with otel.invoke_agent(AGENT) as run, otel.agent_step(run):
        with otel.model_call(AGENT, MODEL) as degraded:
            degraded.set_outcome(Outcome.DEGRADED, "tools_unavailable")
        with otel.model_call(AGENT, MODEL) as failed:
            failed.set_outcome(Outcome.ERROR)
    got = harness.collect(expected_spans=4)

    assert got.outcomes(catalog.KAOS_MODEL_CALLS) == {"degraded": 1, "error": 1}
    errors = Counter(
        p.attributes.get(catalog.ERROR_TYPE) for p in got.points_of(catalog.GEN_AI_CLIENT_OPERATION_DURATION)
    )
    assert errors == {None: 1, "error": 1}
