"""Agent-domain helpers produce convention-conformant spans, checked at a real OTLP receiver."""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from kaos_otel import KaosOtelManager, MemoryScope, MemoryTier, Outcome, catalog
from kaos_otel.receiver import OtlpReceiver, ReceivedSpan

MakeOtel = Callable[..., KaosOtelManager]
SPEC_KIND = {
    catalog.SPAN_INVOKE_AGENT: "INTERNAL",
    catalog.SPAN_AGENT_STEP: "INTERNAL",
    catalog.SPAN_CHAT: "CLIENT",
    catalog.SPAN_EXECUTE_TOOL: "INTERNAL",
    catalog.SPAN_DELEGATION: "CLIENT",
    catalog.SPAN_MEMORY: "CLIENT",
}


def collect(otel: KaosOtelManager, receiver: OtlpReceiver, count: int) -> list[ReceivedSpan]:
    assert otel.force_flush(5)
    assert receiver.wait_for(lambda r: len(r.spans()) >= count, 10), receiver.spans()
    spans = receiver.spans()
    assert len(spans) == count, sorted(s.name for s in spans)
    return spans


def named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.name == name]


def test_catalog_kinds_match_the_conventions() -> None:
    """The catalog this file checks against says what conventions.md says."""
    kinds = {spec.name: spec.kind for spec in catalog.SPANS}
    for name, kind in SPEC_KIND.items():
        assert kinds[name] == kind, name


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_agent_loop_spans(make_otel: MakeOtel, otlp_receiver: OtlpReceiver, protocol: str) -> None:
    otel = make_otel(protocol)
    run = otel.invoke_agent("planner", agent_id="planner-1", conversation_id="conv-9", max_steps=2)
    for _ in range(2):
        step = otel.agent_step(run)
        model = otel.model_call(
            "planner", "gpt-4o-mini", provider="openai", server_address="127.0.0.1", server_port=8000
        )
        model.record_usage(120, 17, response_model="gpt-4o-mini-2024-07-18", finish_reasons=["tool_calls"])
        model.success()
        tool = otel.tool_call("planner", "web_search", call_id="call_1", arguments={"query": "weather"})
        tool.success()
        delegation = otel.delegation("planner", "researcher")
        # a swallowed remote error is still recorded as an error, not success
        delegation.set_outcome(Outcome.ERROR, error_type="http_503")
        otel.span_success(delegation)
        otel.span_success(step)
    run.set_outcome(Outcome.MAX_STEPS)  # ran out of steps: not a success
    otel.span_success(run)

    spans = collect(otel, otlp_receiver, 1 + 2 * 4)
    assert len({span.trace_id for span in spans}) == 1

    (agent,) = named(spans, "invoke_agent planner")
    assert agent.kind == "INTERNAL"
    assert agent.parent_span_id is None
    assert agent.attributes[catalog.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert agent.attributes[catalog.GEN_AI_AGENT_NAME] == "planner"
    assert agent.attributes[catalog.GEN_AI_AGENT_ID] == "planner-1"
    assert agent.attributes[catalog.GEN_AI_CONVERSATION_ID] == "conv-9"
    assert agent.attributes[catalog.KAOS_AGENT_MAX_STEPS] == 2
    assert agent.attributes[catalog.KAOS_AGENT_STEPS] == 2
    assert agent.attributes[catalog.KAOS_OUTCOME] == "max_steps"
    assert agent.attributes[catalog.ERROR_TYPE] == "max_steps"
    assert agent.status_code == "ERROR"

    steps = named(spans, catalog.SPAN_AGENT_STEP)  # one span name for every step
    assert sorted(s.attributes[catalog.KAOS_AGENT_STEP] for s in steps) == [1, 2]
    assert {s.name for s in spans if "step" in s.name} == {catalog.SPAN_AGENT_STEP}
    for step_span in steps:
        assert step_span.kind == "INTERNAL"
        assert step_span.parent_span_id == agent.span_id
        assert step_span.attributes[catalog.GEN_AI_AGENT_NAME] == "planner"
    step_ids = {s.span_id for s in steps}

    chats = named(spans, "chat gpt-4o-mini")
    assert len(chats) == 2
    for chat in chats:
        assert chat.kind == "CLIENT"
        assert chat.parent_span_id in step_ids
        assert chat.attributes[catalog.GEN_AI_OPERATION_NAME] == "chat"
        assert chat.attributes[catalog.GEN_AI_PROVIDER_NAME] == "openai"
        assert chat.attributes[catalog.GEN_AI_REQUEST_MODEL] == "gpt-4o-mini"
        assert chat.attributes[catalog.GEN_AI_RESPONSE_MODEL] == "gpt-4o-mini-2024-07-18"
        assert chat.attributes[catalog.GEN_AI_USAGE_INPUT_TOKENS] == 120
        assert chat.attributes[catalog.GEN_AI_USAGE_OUTPUT_TOKENS] == 17
        assert chat.attributes[catalog.GEN_AI_RESPONSE_FINISH_REASONS] == ("tool_calls",)
        assert chat.attributes[catalog.SERVER_ADDRESS] == "127.0.0.1"
        assert chat.attributes[catalog.SERVER_PORT] == 8000
        assert chat.attributes[catalog.KAOS_OUTCOME] == "success"
        assert chat.status_code == "UNSET"
        assert "gen_ai.system" not in chat.attributes  # deprecated name not used

    tools = named(spans, "execute_tool web_search")
    assert len(tools) == 2
    for tool_span in tools:
        assert tool_span.kind == "INTERNAL"
        assert tool_span.parent_span_id in step_ids
        assert tool_span.attributes[catalog.GEN_AI_OPERATION_NAME] == "execute_tool"
        assert tool_span.attributes[catalog.GEN_AI_TOOL_NAME] == "web_search"
        assert tool_span.attributes[catalog.GEN_AI_TOOL_CALL_ID] == "call_1"
        assert tool_span.attributes[catalog.KAOS_OUTCOME] == "success"
        assert catalog.GEN_AI_TOOL_CALL_ARGUMENTS not in tool_span.attributes  # content is opt-in

    delegations = named(spans, "invoke_agent researcher")
    assert len(delegations) == 2
    for delegation_span in delegations:
        assert delegation_span.kind == "CLIENT"
        assert delegation_span.parent_span_id in step_ids
        assert delegation_span.attributes[catalog.GEN_AI_OPERATION_NAME] == "invoke_agent"
        assert delegation_span.attributes[catalog.GEN_AI_AGENT_NAME] == "researcher"
        assert delegation_span.attributes[catalog.KAOS_DELEGATION_SOURCE] == "planner"
        assert delegation_span.attributes[catalog.KAOS_DELEGATION_TARGET] == "researcher"
        assert delegation_span.attributes[catalog.KAOS_OUTCOME] == "error"
        assert delegation_span.attributes[catalog.ERROR_TYPE] == "http_503"
        assert delegation_span.status_code == "ERROR"


def test_failures_and_cancellation_outcomes(make_otel: MakeOtel, otlp_receiver: OtlpReceiver) -> None:
    otel = make_otel()
    with pytest.raises(TimeoutError), otel.invoke_agent("coder") as run:
        with otel.agent_step(run, step=1), otel.tool_call("coder", "shell"):
            pass
        with otel.agent_step(run, step=2), otel.model_call("coder", "llama3", provider="ollama"):
            raise TimeoutError("model timed out")
    cancelled = otel.tool_call("coder", "long_job")
    otel.span_failure(cancelled, KeyboardInterrupt())

    spans = collect(otel, otlp_receiver, 6)
    (agent,) = named(spans, "invoke_agent coder")
    (chat,) = named(spans, "chat llama3")
    (shell,) = named(spans, "execute_tool shell")
    (job,) = named(spans, "execute_tool long_job")
    steps = {s.attributes[catalog.KAOS_AGENT_STEP]: s for s in named(spans, "agent_step")}

    assert chat.attributes[catalog.GEN_AI_PROVIDER_NAME] == "ollama"
    for failed in (chat, steps[2], agent):
        assert failed.status_code == "ERROR", failed.name
        assert failed.attributes[catalog.ERROR_TYPE] == "TimeoutError"
        assert failed.attributes[catalog.KAOS_OUTCOME] == "error"
        assert [e.name for e in failed.events] == ["exception"]
    assert agent.attributes[catalog.KAOS_AGENT_STEPS] == 2
    assert shell.status_code == "UNSET"
    assert shell.attributes[catalog.KAOS_OUTCOME] == "success"
    assert steps[1].status_code == "UNSET"
    assert job.attributes[catalog.KAOS_OUTCOME] == "canceled"
    assert job.status_code == "UNSET"  # a cancellation is not an error


class Unprintable(Exception):
    """An exception (or any value) whose ``str()`` and ``repr()`` raise."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    __repr__ = __str__


def test_helpers_given_strings_or_bad_values_record_what_they_can_and_never_raise(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()

    def add(a: int, b: int) -> int:
        return a + b

    assert otel.traced()(functools.partial(add, 1))(2) == 3  # a partial has no __qualname__
    with otel.invoke_agent("coder", origin="delegated") as run:  # the enums' strings work too
        run.set_outcome("max_steps")
        with otel.model_call("coder", "llama3") as call:
            call.record_usage(2**63, "10", finish_reasons="stop")  # type: ignore[arg-type]
    with otel.invoke_agent("coder", origin="nobody") as run:
        run.set_outcome("nonsense")  # logged, not raised: the outcome stays success
    otel.record_window_tokens("coder", None)  # type: ignore[arg-type]
    otel.record_compaction("coder", "degraded")
    otel.record_extraction_lag("coder", None)  # type: ignore[arg-type]
    with otel.memory_operation("short_term", "search_memory", scope="session"):
        pass
    wrong: dict[str, Any] = {"operation": None, "scope": "nowhere", "attributes": [("k", "v")]}
    with otel.memory_operation("no_tier", **wrong):  # logged, not raised; the span still exports
        pass

    no_repr: dict[str, Any] = {"operation": Unprintable(), "scope": Unprintable()}
    with otel.memory_operation(MemoryTier.LONG_TERM, **no_repr):
        pass

    spans = collect(otel, otlp_receiver, 7)
    delegated, nobody = sorted(named(spans, "invoke_agent coder"), key=lambda s: s.start_time_unix_nano)
    assert delegated.attributes[catalog.KAOS_REQUEST_ORIGIN] == "delegated"
    assert delegated.attributes[catalog.KAOS_OUTCOME] == "max_steps"
    assert nobody.attributes[catalog.KAOS_REQUEST_ORIGIN] == "user"
    assert nobody.attributes[catalog.KAOS_OUTCOME] == "success"
    (chat,) = named(spans, "chat llama3")
    assert chat.attributes[catalog.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert catalog.GEN_AI_USAGE_INPUT_TOKENS not in chat.attributes
    assert catalog.GEN_AI_USAGE_OUTPUT_TOKENS not in chat.attributes
    (search,) = named(spans, "search_memory")
    assert search.attributes[catalog.KAOS_MEMORY_TIER] == "short_term"
    assert search.attributes[catalog.KAOS_MEMORY_SCOPE] == "session"
    others = named(spans, catalog.MEMORY_OPERATION_OTHER)
    other, unprintable = sorted(others, key=lambda span: span.start_time_unix_nano)
    assert other.attributes[catalog.KAOS_MEMORY_TIER] == "short_term"
    assert catalog.KAOS_MEMORY_SCOPE not in other.attributes
    assert unprintable.attributes[catalog.KAOS_MEMORY_TIER] == "long_term"
    assert otlp_receiver.wait_for(
        lambda r: any(p.name == catalog.KAOS_MEMORY_COMPACTIONS for p in r.metric_points()), 10
    )
    compactions = [p for p in otlp_receiver.metric_points() if p.name == catalog.KAOS_MEMORY_COMPACTIONS]
    assert {p.attributes[catalog.KAOS_OUTCOME] for p in compactions} == {"degraded"}


def test_helpers_given_attributes_that_are_no_mapping_or_no_agent_run_trace_all_and_never_raise(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture, unsaid_notices: None
) -> None:
    otel = make_otel()
    not_a_mapping: Any = [("k", "v")]
    not_a_run: Any = None
    with (
        otel.invoke_agent("checker", attributes=not_a_mapping) as run,
        otel.agent_step(not_a_run),
        otel.model_call("checker", "m", attributes=not_a_mapping),
        otel.tool_call("checker", "grep", attributes=not_a_mapping),
        otel.delegation("checker", "helper", attributes=not_a_mapping),
        otel.memory_operation("short_term", "recall", attributes=not_a_mapping),
    ):
        pass
    spans = {span.name: span for span in collect(otel, otlp_receiver, 6)}
    root = spans["invoke_agent checker"]
    assert root.parent_span_id is None and run.steps == 0
    step = spans[catalog.SPAN_AGENT_STEP]
    assert step.parent_span_id == root.span_id and catalog.KAOS_AGENT_STEP not in step.attributes
    assert {"chat m", "execute_tool grep", "invoke_agent helper", "recall"} <= set(spans)
    assert all("k" not in span.attributes for span in spans.values())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("memory operation 'recall' is not one of" in w for w in warnings), warnings


class Uncomparable:
    """A name from model output parsed into an object that cannot be compared (as a NumPy array's
    ``!=`` has no truth value)."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("no truth value")

    def __ne__(self, other: object) -> bool:
        raise ValueError("no truth value")

    __hash__ = None  # type: ignore[assignment]


def test_a_tool_or_target_name_that_cannot_be_compared_is_other_never_an_exception(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel(capture_content=True)
    with otel.tool_call("coord", Uncomparable()), otel.delegation("coord", Uncomparable()):  # type: ignore[arg-type]
        pass
    spans = collect(otel, otlp_receiver, 2)
    assert sorted(span.name for span in spans) == ["execute_tool _other", "invoke_agent _other"]
    assert all(catalog.KAOS_REQUESTED_NAME in span.attributes for span in spans)  # what was asked for


def test_one_name_given_as_a_string_is_one_name(make_otel: MakeOtel) -> None:
    otel = make_otel()
    otel.register_known_names("coder", tools="echo", models="m1", targets="helper")
    bounds = otel.metrics.bounds
    assert [bounds.bound(catalog.GEN_AI_TOOL_NAME, name) for name in ("echo", "e")] == ["echo", "_other"]
    assert [bounds.bound(catalog.GEN_AI_REQUEST_MODEL, name) for name in ("m1", "m")] == ["m1", "_other"]
    assert bounds.bound(catalog.KAOS_DELEGATION_TARGET, "helper") == "helper"
    assert bounds.bound(catalog.GEN_AI_AGENT_NAME, "helper") == "helper"


def test_names_of_every_kind_are_bounded_in_span_names_and_never_raise(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Span names carry the bounded name of agents and models as of tools and delegation targets;
    a name that is not text (a model's ``{"name": 42}``) is ``_other``, never an exception."""
    otel = make_otel()
    otel.register_known_names("coord", tools=["search"], models=["gpt-4o"], targets=["researcher"])
    otel.register_known_names(tools=[["not", "text"]])  # type: ignore[list-item]  # left out, not raised
    not_text: list[Any] = [42, ["a"], {"name": 1}, 1.5, True, None]
    with otel.invoke_agent("made-up-agent") as run, otel.agent_step(run):
        with otel.model_call("coord", "made-up-model"), otel.model_call("coord", "gpt-4o"):
            pass
        for name in not_text:
            with otel.tool_call("coord", name), otel.delegation("coord", name):
                pass
    with otel.invoke_agent(42):  # type: ignore[arg-type]
        pass

    spans = collect(otel, otlp_receiver, 5 + 2 * len(not_text))
    assert Counter(span.name for span in spans) == {
        "invoke_agent _other": 2 + len(not_text),
        catalog.SPAN_AGENT_STEP: 1,
        "chat _other": 1,
        "chat gpt-4o": 1,
        "execute_tool _other": len(not_text),
    }
    (model,) = named(spans, "chat _other")
    assert model.attributes[catalog.GEN_AI_REQUEST_MODEL] == "made-up-model"  # as given
    roots = [span for span in spans if span.parent_span_id is None]
    assert {span.attributes[catalog.GEN_AI_AGENT_NAME] for span in roots} == {"made-up-agent", 42}
    assert not [r for r in caplog.records if "kaos-otel" in r.getMessage()]

    def requests(receiver: OtlpReceiver) -> list[Any]:
        return [p for p in receiver.metric_points() if p.name == catalog.KAOS_REQUESTS]

    assert otlp_receiver.wait_for(lambda r: sum(int(p.value or 0) for p in requests(r)) == 2, 10)
    assert {p.attributes[catalog.GEN_AI_AGENT_NAME] for p in requests(otlp_receiver)} == {"_other"}


def test_values_that_cannot_be_printed_raise_nothing_and_lose_no_other_span(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel(capture_content=True)
    with otel.span("recorded") as span:
        span.record_exception(Unprintable())
    with otel.model_call("coord", "llama3") as call:
        call.record_usage(Unprintable(), 3)  # type: ignore[arg-type]
    with otel.span(Unprintable()) as unnamed:  # type: ignore[arg-type]
        unnamed.add_event(Unprintable())  # type: ignore[arg-type]
    with otel.span("after"):
        pass

    spans = collect(otel, otlp_receiver, 4)
    placeholder = "<unprintable Unprintable>"
    assert {span.name for span in spans} == {"recorded", "chat llama3", placeholder, "after"}
    (event,) = named(spans, "recorded")[0].events
    assert event.attributes["exception.message"] == placeholder
    (call_span,) = named(spans, "chat llama3")
    assert catalog.GEN_AI_USAGE_INPUT_TOKENS not in call_span.attributes
    assert call_span.attributes[catalog.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert [event.name for event in named(spans, placeholder)[0].events] == [placeholder]
    assert otel.health.dropped() == 0


def test_memory_operation_span(make_otel: MakeOtel, otlp_receiver: OtlpReceiver) -> None:
    otel = make_otel()
    with (
        otel.invoke_agent("assistant"),
        otel.memory_operation(
            MemoryTier.LONG_TERM, "search_memory", scope=MemoryScope.USER, store_id="facts", provider="mem0"
        ) as memory,
    ):
        memory.set_record_count(3)

    spans = collect(otel, otlp_receiver, 2)
    (agent,) = named(spans, "invoke_agent assistant")
    (search,) = named(spans, "search_memory")
    assert search.kind == "CLIENT"
    assert search.parent_span_id == agent.span_id
    assert search.attributes[catalog.GEN_AI_OPERATION_NAME] == "search_memory"
    assert search.attributes[catalog.GEN_AI_MEMORY_STORE_ID] == "facts"
    assert search.attributes[catalog.GEN_AI_MEMORY_RECORD_COUNT] == 3
    assert search.attributes[catalog.KAOS_MEMORY_TIER] == "long_term"
    assert search.attributes[catalog.KAOS_MEMORY_SCOPE] == "user"
    assert search.attributes[catalog.KAOS_MEMORY_PROVIDER] == "mem0"
    assert search.attributes[catalog.KAOS_OUTCOME] == "success"


def test_a_run_started_inside_a_delegation_counts_as_delegated(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """An in-process sub-agent: one user request, one delegated, in spans and in ``kaos.requests``;
    a span of the app's own between the delegation and the run (a decorated function) too."""
    otel = make_otel()

    @otel.traced()
    def write() -> None:
        with otel.invoke_agent("writer"):
            pass

    with otel.invoke_agent("coordinator") as run, otel.agent_step(run):
        with (
            otel.delegation("coordinator", "researcher"),
            otel.invoke_agent("researcher"),
            otel.invoke_agent("helper"),  # inside the researcher's run, not the delegation
        ):
            pass
        with otel.delegation("coordinator", "analyst"), otel.invoke_agent("analyst", origin="user"):
            pass  # said explicitly: kept
        with otel.delegation("coordinator", "writer"):
            write()
    spans = collect(otel, otlp_receiver, 10)
    origins = {
        span.attributes[catalog.GEN_AI_AGENT_NAME]: span.attributes[catalog.KAOS_REQUEST_ORIGIN]
        for span in spans
        if span.kind == "INTERNAL" and span.name.startswith("invoke_agent")
    }
    assert origins == {
        "coordinator": "user", "researcher": "delegated", "helper": "user", "analyst": "user",
        "writer": "delegated",
    }  # fmt: skip
    assert otlp_receiver.wait_for(
        lambda r: any(p.name == catalog.KAOS_REQUESTS for p in r.metric_points()), 10
    )
    counted = {
        (p.attributes[catalog.GEN_AI_AGENT_NAME], p.attributes[catalog.KAOS_REQUEST_ORIGIN])
        for p in otlp_receiver.metric_points()
        if p.name == catalog.KAOS_REQUESTS
    }
    assert ("researcher", "delegated") in counted and ("researcher", "user") not in counted


def test_usage_recorded_in_parts_adds_up_and_after_the_end_says_so(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream's usage, then its finish reason (providers send them in either order): both kept,
    tokens in the metrics; usage recorded after the block ended is not silently lost."""
    otel = make_otel()
    with otel.model_call("assistant", "gpt-4o-mini") as streamed:
        streamed.record_usage(42, 5)
        streamed.record_usage("many", finish_reasons=["stop"])  # type: ignore[arg-type]  # 42 stays
    with caplog.at_level(logging.WARNING, "kaos_otel"):
        with otel.model_call("assistant", "late-model") as late:
            pass
        late.record_usage(7, 1)
    assert "record_usage on a model call that has ended" in caplog.text
    spans = collect(otel, otlp_receiver, 2)
    (chat,) = named(spans, "chat gpt-4o-mini")
    assert chat.attributes[catalog.GEN_AI_USAGE_INPUT_TOKENS] == 42
    assert chat.attributes[catalog.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    (late_chat,) = named(spans, "chat late-model")
    assert catalog.GEN_AI_USAGE_INPUT_TOKENS not in late_chat.attributes

    def input_tokens(model: str) -> list[float | None]:
        return [
            p.sum
            for p in otlp_receiver.metric_points()
            if p.name == catalog.GEN_AI_CLIENT_TOKEN_USAGE
            and p.attributes[catalog.GEN_AI_REQUEST_MODEL] == model
            and p.attributes[catalog.GEN_AI_TOKEN_TYPE] == "input"
        ]

    assert otlp_receiver.wait_for(lambda r: input_tokens("gpt-4o-mini") != [], 10)
    assert set(input_tokens("gpt-4o-mini")) == {42} and input_tokens("late-model") == []


def test_a_streamed_call_records_its_time_to_first_chunk(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    with otel.model_call("assistant", "streamed-model", stream=True) as streamed:
        streamed.record_first_chunk()
        first = streamed.first_chunk_s
        streamed.record_first_chunk()  # the next chunks change nothing
    with otel.model_call("assistant", "plain-model"):
        pass
    spans = collect(otel, otlp_receiver, 2)
    (chat,) = named(spans, "chat streamed-model")
    assert chat.attributes[catalog.GEN_AI_REQUEST_STREAM] is True
    assert first is not None and chat.attributes[catalog.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == first
    (plain,) = named(spans, "chat plain-model")
    assert catalog.GEN_AI_REQUEST_STREAM not in plain.attributes
    assert catalog.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK not in plain.attributes

    def first_chunks() -> dict[str, int | None]:
        return {
            p.attributes[catalog.GEN_AI_REQUEST_MODEL]: p.count
            for p in otlp_receiver.metric_points()
            if p.name == catalog.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK
        }

    assert otlp_receiver.wait_for(lambda r: first_chunks() != {}, 10)
    assert first_chunks() == {"streamed-model": 1}


def test_a_provider_given_in_the_attributes_is_the_one_on_the_metrics_too(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """Convention attributes given with the call (as ``gen_ai.request.temperature`` is) win on the
    span; the metrics must say the same provider, not the ``openai`` default."""
    otel = make_otel()
    attributes = {catalog.GEN_AI_PROVIDER_NAME: "anthropic", "gen_ai.request.temperature": 0.2}
    with otel.model_call("assistant", "claude-sonnet", attributes=attributes) as call:
        call.record_usage(10, 3)
    (chat,) = collect(otel, otlp_receiver, 1)
    assert chat.attributes[catalog.GEN_AI_PROVIDER_NAME] == "anthropic"

    def providers() -> set[object]:
        return {
            p.attributes[catalog.GEN_AI_PROVIDER_NAME]
            for p in otlp_receiver.metric_points()
            if p.name in (catalog.GEN_AI_CLIENT_OPERATION_DURATION, catalog.GEN_AI_CLIENT_TOKEN_USAGE)
        }

    assert otlp_receiver.wait_for(lambda r: providers() != set(), 10)
    assert providers() == {"anthropic"}


def test_handles_of_a_disabled_manager_answer_like_the_others(make_otel: MakeOtel) -> None:
    otel = make_otel(environ={"OTEL_SDK_DISABLED": "true"})
    for handle in (otel.span_begin("s"), otel.model_call("a", "m"), otel.delegation("a", "b")):
        assert handle.elapsed_s == 0.0 and handle.is_ended  # the shared no-op handles began nothing


def test_a_step_number_that_is_no_count_is_logged_and_the_steps_still_counted(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """A step number of the wrong kind (text from a config, a bool, a negative number) raised
    into the agent at its next step and lost the run's steps metric; now it counts as a step."""
    otel = make_otel()
    wrong: list[Any] = [True, -1, "2"]
    with otel.invoke_agent("stepper") as run:
        for step in wrong:
            with otel.agent_step(run, step):
                pass
        with otel.agent_step(run):
            pass
    spans = collect(otel, otlp_receiver, 5)
    assert sorted(s.attributes[catalog.KAOS_AGENT_STEP] for s in named(spans, catalog.SPAN_AGENT_STEP)) == [
        1,
        2,
        3,
        4,
    ]
    (root,) = named(spans, "invoke_agent stepper")
    assert root.attributes[catalog.KAOS_AGENT_STEPS] == 4

    def steps(receiver: OtlpReceiver) -> list[Any]:
        return [p for p in receiver.metric_points() if p.name == catalog.KAOS_REQUEST_STEPS]

    assert otlp_receiver.wait_for(lambda r: steps(r) != [], 10)
    assert [(p.count, p.sum) for p in steps(otlp_receiver)] == [(1, 4)]


class _Index:
    """An integer that is no ``int`` (as NumPy's are)."""

    def __index__(self) -> int:
        return 7


def test_counts_durations_and_outcomes_of_the_wrong_kind_are_left_out_never_miscounted(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture, unsaid_notices: None
) -> None:
    """A bool, a fraction, an infinite or out-of-range number is no window size, record count or
    lag (it reached the metric as 1 token, 1e30 tokens...), and an outcome naming none is no
    ``success``: each is logged and left out; an outcome in capitals is that outcome."""
    otel = make_otel()
    wrong: list[Any] = [True, -5, 10**30, float("nan"), float("inf"), "512", None, 10**400]
    with caplog.at_level(logging.WARNING, "kaos_otel"):
        for value in [*wrong, 2.5]:
            otel.record_window_tokens("keeper", value)
        for value in wrong:
            otel.record_extraction_lag("keeper", value)
        otel.record_window_tokens("keeper", 512)
        otel.record_window_tokens("keeper", _Index())  # type: ignore[arg-type]
        otel.record_extraction_lag("keeper", 1.5)
        otel.record_compaction("keeper", "ERROR")
        otel.record_compaction("keeper", "exploded")
        with otel.memory_operation(MemoryTier.SHORT_TERM, "get_memory") as wrong_count:
            wrong_count.set_record_count(True)
        with otel.memory_operation(MemoryTier.SHORT_TERM, "list_memory") as count:
            count.set_record_count(_Index())  # type: ignore[arg-type]
    for said in (
        "record_window_tokens failed (ValueError: not a count: True)",
        "record_extraction_lag failed (ValueError: not a duration in seconds: True)",
        "record_compaction failed (ValueError: not an outcome: 'exploded')",
        "set_record_count failed (ValueError: not a count: True)",
    ):
        assert said in caplog.text
    spans = collect(otel, otlp_receiver, 2)
    assert catalog.GEN_AI_MEMORY_RECORD_COUNT not in named(spans, "get_memory")[0].attributes
    assert named(spans, "list_memory")[0].attributes[catalog.GEN_AI_MEMORY_RECORD_COUNT] == 7
    names = {
        catalog.KAOS_MEMORY_WINDOW_TOKENS,
        catalog.KAOS_MEMORY_EXTRACTION_LAG,
        catalog.KAOS_MEMORY_COMPACTIONS,
    }

    def recorded(receiver: OtlpReceiver) -> dict[str, list[tuple[Any, ...]]]:
        found: dict[str, list[tuple[Any, ...]]] = {}
        for p in receiver.metric_points():
            if p.name in names:
                found.setdefault(p.name, []).append(
                    (p.attributes.get(catalog.KAOS_OUTCOME), p.count, p.sum, p.value)
                )
        return found

    assert otlp_receiver.wait_for(lambda r: len(recorded(r)) == 3, 10)
    assert recorded(otlp_receiver) == {
        catalog.KAOS_MEMORY_WINDOW_TOKENS: [(None, 2, 519, None)],
        catalog.KAOS_MEMORY_EXTRACTION_LAG: [("success", 1, 1.5, None)],
        catalog.KAOS_MEMORY_COMPACTIONS: [("error", None, None, 1)],
    }


def test_enum_values_in_any_case_are_those_values(make_otel: MakeOtel, otlp_receiver: OtlpReceiver) -> None:
    """``"Delegated"`` or ``"LONG_TERM"`` (from a config, an environment variable) was logged and
    recorded as ``user`` / ``short_term``: a sub-agent's runs counted as user requests."""
    otel = make_otel()
    with otel.invoke_agent("helper", origin=" Delegated "):
        pass
    with otel.memory_operation("LONG_TERM", "search_memory", scope="User"):
        pass
    spans = collect(otel, otlp_receiver, 2)
    assert named(spans, "invoke_agent helper")[0].attributes[catalog.KAOS_REQUEST_ORIGIN] == "delegated"
    memory = named(spans, "search_memory")[0].attributes
    assert (memory[catalog.KAOS_MEMORY_TIER], memory[catalog.KAOS_MEMORY_SCOPE]) == ("long_term", "user")


def test_a_later_outcome_replaces_the_error_type_of_an_earlier_one(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """A failed attempt's ``error.type`` does not stay on a call whose retry succeeded, nor name
    the error of a run that then ran out of steps, on the span or the convention's metric."""
    otel = make_otel()
    with otel.tool_call("assistant", "search") as tool:
        tool.set_outcome(Outcome.ERROR, "tool_error")  # the first attempt failed
        tool.set_outcome(Outcome.SUCCESS)  # the retry worked
    assert tool.error_type is None
    with otel.model_call("assistant", "llama3") as call:
        call.set_outcome(Outcome.ERROR, "rate_limited")
        call.set_outcome(Outcome.MAX_STEPS)
    spans = collect(otel, otlp_receiver, 2)
    (searched,) = named(spans, "execute_tool search")
    assert searched.attributes[catalog.KAOS_OUTCOME] == "success"
    assert catalog.ERROR_TYPE not in searched.attributes and searched.status_code == "UNSET"
    (chat,) = named(spans, "chat llama3")
    assert (chat.attributes[catalog.KAOS_OUTCOME], chat.attributes[catalog.ERROR_TYPE]) == (
        "max_steps",
        "max_steps",
    )

    def error_types() -> set[object]:
        return {
            p.attributes.get(catalog.ERROR_TYPE)
            for p in otlp_receiver.metric_points()
            if p.name == catalog.GEN_AI_CLIENT_OPERATION_DURATION
        }

    assert otlp_receiver.wait_for(lambda r: error_types() != set(), 10)
    assert error_types() == {"max_steps"}
