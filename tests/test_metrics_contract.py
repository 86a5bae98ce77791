"""The metric contract of issue 4, checked at an OTLP receiver.

A thousand requests go through the domain helpers, each with its own session, user,
conversation, task and memory-record ids, prompt text, URL and invented tool / agent / model
names. What arrives must carry none of them, use only each metric's allowed label keys, stay
within the label bounds the catalog documents, and match the catalog metric for metric: name,
unit, label keys and bucket boundaries. Metrics of other libraries on the same provider are
dropped.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kaos_otel import AgentTelemetry, KaosOtelManager, MemoryScope, MemoryTier, Outcome, catalog, metric_views
from kaos_otel._metrics import LabelBounds
from kaos_otel._metrics_summary import metrics_summary, render_metrics_summary
from kaos_otel.catalog import MetricSpec
from kaos_otel.receiver import OtlpReceiver, ReceivedMetricPoint

REQUESTS = 1000
KNOWN_AGENTS = ("planner", "researcher")
KNOWN_TOOLS = ("web_search", "calculator", "read_file")
KNOWN_MODELS = {"gpt-4o-mini": "openai", "claude-haiku-4": "anthropic"}
UNKNOWN_MEMORY_OPERATION = "reindex_memory"
MEM0_METER = "kaos_otel.instrumentation.mem0"
ABSENT = "<absent>"
"""Stands for 'this optional label key is not on the point' when counting a key's values."""

# Label keys whose values form a closed set, and that set.
ENUMERATED_VALUES: dict[str, frozenset[str]] = {
    catalog.KAOS_OUTCOME: frozenset(o.value for o in Outcome),
    catalog.KAOS_MEMORY_TIER: frozenset(t.value for t in MemoryTier),
    catalog.KAOS_MEMORY_OPERATION: frozenset((*catalog.MEMORY_OPERATIONS, catalog.MEMORY_OPERATION_OTHER)),
    catalog.KAOS_MEMORY_SCOPE: frozenset((*(s.value for s in MemoryScope), catalog.MEMORY_SCOPE_NONE)),
    catalog.GEN_AI_TOKEN_TYPE: frozenset({"input", "output"}),
    catalog.GEN_AI_OPERATION_NAME: frozenset({"chat"}),
    catalog.KAOS_TELEMETRY_SIGNAL: frozenset({"traces", "metrics", "logs"}),
    catalog.KAOS_TELEMETRY_REASON: frozenset({"queue_full", "export_failed", "shutdown"}),
}


class ToolFailed(Exception):
    """A tool raised."""


class ModelUnavailable(Exception):
    """The model endpoint failed."""


class RemoteAgentError(Exception):
    """A delegated sub-agent failed."""


class BackendDown(ConnectionError):
    """The memory backend is unreachable."""


@dataclass
class Driven:
    """What a run put into the helpers that must never become a label value."""

    secrets: set[str] = field(default_factory=set)
    invented: set[str] = field(default_factory=set)


def _manager(receiver: OtlpReceiver, **overrides: int) -> KaosOtelManager:
    """A private manager exporting to the receiver; metrics leave only on force_flush."""
    return KaosOtelManager(
        "metrics-contract",
        endpoint=receiver.grpc_endpoint,
        protocol="grpc",
        global_providers=False,
        bridge_logging=False,
        capture_content=True,  # content on spans must still never reach a metric
        metric_export_interval_ms=600_000,
        **overrides,  # type: ignore[arg-type]
    )


@pytest.fixture
def manager(otlp_receiver: OtlpReceiver) -> Iterator[KaosOtelManager]:
    # A span queue of 8 with no scheduled export: a burst of requests overflows it, which is the
    # situation kaos.telemetry.dropped exists for.
    otel = _manager(otlp_receiver, span_max_queue_size=8, span_schedule_delay_ms=60_000)
    try:
        yield otel
    finally:
        otel.shutdown()


def drive_requests(otel: AgentTelemetry, count: int = REQUESTS) -> Driven:
    """``count`` agent requests touching every helper, with per-request ids, texts and URLs."""
    driven = Driven()
    otel.register_known_names(
        KNOWN_AGENTS[0], tools=KNOWN_TOOLS, models=KNOWN_MODELS, targets=KNOWN_AGENTS[1:]
    )
    operations = (*catalog.MEMORY_OPERATIONS, UNKNOWN_MEMORY_OPERATION)
    scopes: tuple[MemoryScope | None, ...] = (*MemoryScope, None)
    tiers = tuple(MemoryTier)
    for i in range(count):
        token = uuid.uuid4().hex
        session_id = f"sess-{token}"
        user_id = f"user-{token}@example.com"
        conversation_id = f"conv-{token}"
        task_id = f"task-{token}"
        record_id = f"mem-{token}"
        agent_id = f"agent-instance-{token}"
        call_id = f"call_{token}"
        prompt = f"Summarise the quarterly report {token} for Alice"
        url = f"https://docs.example.com/reports/{token}?page={i}"
        invented_tool = f"hallucinated_tool_{i}"
        invented_agent = f"ghost_agent_{i}"
        invented_model = f"made-up-model-{i}"
        invented_target = f"imaginary_helper_{i}"
        driven.secrets |= {session_id, user_id, conversation_id, task_id, record_id, agent_id, call_id}
        driven.secrets |= {prompt, url, token}
        driven.invented |= {invented_tool, invented_agent, invented_model, invented_target}

        agent = invented_agent if i % 10 == 9 else KNOWN_AGENTS[i % 2]
        model = invented_model if i % 8 == 7 else list(KNOWN_MODELS)[i % 2]
        provider = KNOWN_MODELS.get(model, "openai")
        tool = invented_tool if i % 4 == 3 else KNOWN_TOOLS[i % 3]
        target = invented_target if i % 6 == 5 else KNOWN_AGENTS[1]
        ids = {"app.task.id": task_id, "url.full": url, "gen_ai.prompt": prompt}
        try:
            with otel.invoke_agent(
                agent,
                agent_id=agent_id,
                conversation_id=conversation_id,
                session_id=session_id,
                user_id=user_id,
                max_steps=3,
                attributes=ids,
            ) as run:
                with otel.agent_step(run):
                    with otel.memory_operation(
                        tiers[i % 3],
                        operations[i % len(operations)],
                        scope=scopes[i % len(scopes)],
                        store_id=f"store-{user_id}",
                        record_id=record_id,
                        provider="mem0",
                        attributes={catalog.GEN_AI_MEMORY_QUERY_TEXT: prompt, **ids},
                    ) as memory:
                        memory.set_record_count(i % 5)
                        if i % 9 == 4:
                            memory.set_outcome(Outcome.DEGRADED, "BackendDown")
                            run.set_outcome(Outcome.DEGRADED)
                    with otel.model_call(
                        agent,
                        model,
                        provider=provider,
                        server_address=f"{token}.example.com",
                        stream=i % 4 == 0,
                        attributes=ids,
                    ) as call:
                        if i % 4 == 0:
                            call.record_first_chunk()
                        call.record_usage(100 + i, 20 + i % 50, response_model=model, finish_reasons=["stop"])
                        call.record_messages([{"role": "user", "content": prompt}], [{"content": url}])
                        if i % 11 == 5:
                            raise ModelUnavailable(f"503 from {url} for {session_id}")
                with otel.agent_step(run):
                    try:
                        with otel.tool_call(
                            agent, tool, call_id=call_id, arguments={"url": url, "q": prompt}
                        ):
                            if i % 7 == 3:
                                raise ToolFailed(f"could not fetch {url}")
                    except ToolFailed:
                        pass  # the model is told and the loop goes on
                    try:
                        with otel.delegation(agent, target, attributes=ids):
                            if i % 17 == 1:
                                raise RemoteAgentError(f"{target} failed on {task_id}")
                    except RemoteAgentError:
                        run.set_outcome(Outcome.ERROR, "RemoteAgentError")
                with otel.agent_step(run):
                    if i % 13 == 0:
                        run.set_outcome(Outcome.MAX_STEPS)
                otel.record_window_tokens(agent, 500 + 37 * i)
                if i % 10 == 0:
                    otel.record_compaction(agent, Outcome.ERROR if i % 30 == 0 else Outcome.SUCCESS)
                    otel.record_extraction_lag(agent, 0.5 + i / 100)
        except ModelUnavailable:
            pass
    return driven


def record_foreign_metrics(otel: KaosOtelManager, driven: Driven) -> None:
    """Other libraries on the same meter provider, recording ids and texts as attributes."""
    leaky = {
        catalog.SESSION_ID: "sess-foreign-0001",
        catalog.USER_ID: "user-foreign@example.com",
        "url.full": "https://foreign.example.com/path?x=1",
        "gen_ai.prompt": "a foreign prompt text",
    }
    driven.secrets |= {str(v) for v in leaky.values()}
    http = otel.meter_provider.get_meter("opentelemetry.instrumentation.httpx")
    http.create_histogram("http.client.request.duration", unit="s").record(0.2, leaky)
    http.create_counter("http.client.requests").add(1, leaky)
    http.create_up_down_counter("http.client.active_requests").add(1, leaky)
    http.create_gauge("process.open_fds").set(12, leaky)
    http.create_observable_gauge("process.cpu.utilization", callbacks=[lambda _o: []])
    # A convention metric of the catalog's name, from another library (e.g. the OpenAI
    # instrumentation): its values are not bounded by kaos-otel and it would double-count.
    openai = otel.meter_provider.get_meter("opentelemetry.instrumentation.openai_v2")
    duration = openai.create_histogram(catalog.GEN_AI_CLIENT_OPERATION_DURATION, unit="s")
    for i in range(200):
        duration.record(
            1.0,
            {
                catalog.GEN_AI_OPERATION_NAME: "chat",
                catalog.GEN_AI_PROVIDER_NAME: "openai",
                catalog.GEN_AI_REQUEST_MODEL: f"foreign-model-{i}",
                **leaky,
            },
        )
    driven.invented |= {f"foreign-model-{i}" for i in range(200)}
    # A meter whose name merely starts like kaos-otel's is somebody else's.
    lookalike = otel.meter_provider.get_meter("kaos_otel_contrib")
    lookalike.create_counter(catalog.KAOS_REQUESTS).add(1, leaky)
    # kaos-otel's own instrumentations (meter "kaos_otel.<name>") record catalog metrics; the
    # Views strip attributes outside the allow-list from them too.
    mem0 = otel.meter_provider.get_meter(MEM0_METER)
    spec = catalog.METRICS_BY_NAME[catalog.KAOS_MEMORY_OPERATIONS]
    mem0.create_counter(spec.name, unit=spec.unit, description=spec.description).add(
        1,
        {
            catalog.KAOS_MEMORY_TIER: MemoryTier.LONG_TERM.value,
            catalog.KAOS_MEMORY_OPERATION: "search_memory",
            catalog.KAOS_MEMORY_SCOPE: MemoryScope.USER.value,
            catalog.KAOS_OUTCOME: Outcome.SUCCESS.value,
            catalog.GEN_AI_MEMORY_RECORD_ID: "mem-foreign-0001",
            **leaky,
        },
    )
    driven.secrets.add("mem-foreign-0001")
    # The catalog instrument itself, recorded directly with attributes outside its allow-list:
    # the View must strip them.
    kaos_meter = otel.meter_provider.get_meter("kaos_otel")
    spec = catalog.METRICS_BY_NAME[catalog.KAOS_TOOL_CALLS]
    tool_calls = kaos_meter.create_counter(spec.name, unit=spec.unit, description=spec.description)
    tool_calls.add(
        1,
        {
            catalog.GEN_AI_AGENT_NAME: KNOWN_AGENTS[0],
            catalog.GEN_AI_TOOL_NAME: KNOWN_TOOLS[0],
            catalog.KAOS_OUTCOME: Outcome.SUCCESS.value,
            **leaky,
        },
    )


def flush_points(otel: KaosOtelManager, receiver: OtlpReceiver) -> list[ReceivedMetricPoint]:
    """Export now and return the points of the newest export of each stream."""
    receiver.clear()
    assert otel.force_flush(timeout=20), "force_flush did not finish"
    assert receiver.wait_for(lambda r: bool(r.metric_points()), timeout=10), "no metrics arrived"
    latest: dict[tuple[str, str, frozenset[tuple[str, object]]], ReceivedMetricPoint] = {}
    for point in receiver.metric_points():
        latest[(point.name, point.scope_name, frozenset(point.attributes.items()))] = point
    return list(latest.values())


def by_metric(points: list[ReceivedMetricPoint]) -> dict[str, list[ReceivedMetricPoint]]:
    grouped: dict[str, list[ReceivedMetricPoint]] = defaultdict(list)
    for point in points:
        grouped[point.name].append(point)
    return grouped


def label_sets(points: list[ReceivedMetricPoint]) -> set[frozenset[tuple[str, object]]]:
    return {frozenset(p.attributes.items()) for p in points}


def key_values(spec: MetricSpec, points: list[ReceivedMetricPoint]) -> dict[str, set[str]]:
    """Distinct values of each allowed key (``ABSENT`` when an optional key is missing)."""
    values: dict[str, set[str]] = {key: set() for key in spec.attributes}
    for point in points:
        for key in spec.attributes:
            values[key].add(str(point.attributes.get(key, ABSENT)))
    return values


# --------------------------------------------------------------------------------------------


def test_thousand_requests_keep_the_metric_contract(
    manager: KaosOtelManager, otlp_receiver: OtlpReceiver
) -> None:
    driven = drive_requests(manager)
    record_foreign_metrics(manager, driven)
    assert manager.health.dropped("traces") > 0, "the burst should have overflowed the 8-span queue"
    points = flush_points(manager, otlp_receiver)
    grouped = by_metric(points)

    # Nothing the catalog lacks, nothing from another scope, and every catalog metric is there.
    assert set(grouped) - set(catalog.METRICS_BY_NAME) == set(), "metrics the catalog does not list"
    scopes = {p.scope_name for p in points}
    assert scopes == {"kaos_otel", MEM0_METER}, "another library's metric got through"
    assert {p.name for p in points if p.scope_name == MEM0_METER} == {catalog.KAOS_MEMORY_OPERATIONS}
    assert set(catalog.METRICS_BY_NAME) - set(grouped) == set(), "catalog metrics never seen"

    # No id, prompt text or URL in any attribute value of any point (not even as a substring).
    values = {str(v) for p in points for v in p.attributes.values()}
    leaked = {(value, secret) for value in values for secret in driven.secrets if secret in value}
    assert not leaked, f"ids/texts/URLs reached metric labels: {sorted(leaked)[:5]}"
    assert not {v for v in values if "://" in v or "@" in v}, "a URL or e-mail reached a label"
    assert not values & driven.invented, "an unregistered name reached a label"

    for name, metric_points in grouped.items():
        spec = catalog.METRICS_BY_NAME[name]
        for point in metric_points:
            assert point.unit == spec.unit, name
            if spec.instrument == "histogram":
                assert point.kind == "histogram", name
                assert point.explicit_bounds == spec.buckets, name
            else:
                assert (point.kind, point.is_monotonic) == ("sum", True), name
            keys = set(point.attributes)
            assert keys <= set(spec.attributes), f"{name}: keys outside the allow-list: {keys}"
            assert keys >= set(spec.required_attributes), f"{name}: missing keys: {keys}"
            assert not keys & catalog.HIGH_CARDINALITY_KEYS, name
        sets = label_sets(metric_points)
        assert len(sets) <= spec.max_label_sets, f"{name}: {len(sets)} label sets > {spec.max_label_sets}"
        for key, seen in key_values(spec, metric_points).items():
            bound = spec.value_bound(key)
            assert len(seen) <= bound, f"{name}: {len(seen)} values of {key} > bound {bound}: {sorted(seen)}"
            if key in ENUMERATED_VALUES:
                allowed = ENUMERATED_VALUES[key] | (
                    {ABSENT} if key not in spec.required_attributes else set()
                )
                assert seen <= allowed, f"{name}: unexpected {key} values {seen - allowed}"

    # Names from model output: registered ones kept, every other one collapsed into "_other".
    expected_values = {
        (catalog.KAOS_TOOL_CALLS, catalog.GEN_AI_TOOL_NAME): {*KNOWN_TOOLS, catalog.OVERFLOW_VALUE},
        (catalog.KAOS_REQUESTS, catalog.GEN_AI_AGENT_NAME): {*KNOWN_AGENTS, catalog.OVERFLOW_VALUE},
        (catalog.KAOS_MODEL_CALLS, catalog.GEN_AI_REQUEST_MODEL): {*KNOWN_MODELS, catalog.OVERFLOW_VALUE},
        (catalog.KAOS_DELEGATIONS, catalog.KAOS_DELEGATION_TARGET): {KNOWN_AGENTS[1], catalog.OVERFLOW_VALUE},
        (catalog.KAOS_MEMORY_OPERATIONS, catalog.KAOS_MEMORY_OPERATION): set(
            ENUMERATED_VALUES[catalog.KAOS_MEMORY_OPERATION]
        ),
    }
    for (name, key), expected in expected_values.items():
        assert {str(p.attributes[key]) for p in grouped[name]} == expected, (name, key)

    # Every request is counted once; the counts add up per outcome.
    requests: Counter[str] = Counter()
    for p in grouped[catalog.KAOS_REQUESTS]:
        requests[str(p.attributes[catalog.KAOS_OUTCOME])] += int(p.value or 0)
    assert sum(requests.values()) == REQUESTS
    assert set(requests) == {o.value for o in Outcome} - {Outcome.CANCELED.value}
    tool_calls = sum(int(p.value or 0) for p in grouped[catalog.KAOS_TOOL_CALLS])
    model_errors = sum(1 for i in range(REQUESTS) if i % 11 == 5)
    assert tool_calls == REQUESTS - model_errors + 1  # +1: the direct recording above
    dropped = grouped[catalog.KAOS_TELEMETRY_DROPPED]
    assert sum(int(p.value or 0) for p in dropped) == manager.health.dropped()


def test_unregistered_names_are_capped_per_key(otlp_receiver: OtlpReceiver) -> None:
    """Without registered names, each bounded key keeps its first values up to the cap."""
    otel = _manager(otlp_receiver)
    try:
        for i in range(REQUESTS):
            agent = f"agent_{i}"
            with otel.invoke_agent(agent, session_id=f"sess-{i}"):
                with otel.tool_call(agent, f"tool_{i}"):
                    pass
                with otel.delegation(agent, f"target_{i}"):
                    pass
                try:
                    with otel.model_call(agent, f"model-{i}", provider=f"provider-{i % 80}"):
                        if i % 2:
                            raise type(f"UpstreamError{i % 120}", (RuntimeError,), {})("boom")
                except RuntimeError:
                    pass
        points = flush_points(otel, otlp_receiver)
    finally:
        otel.shutdown()
    grouped = by_metric(points)
    bounded_keys = {
        catalog.GEN_AI_AGENT_NAME,
        catalog.GEN_AI_TOOL_NAME,
        catalog.GEN_AI_REQUEST_MODEL,
        catalog.GEN_AI_PROVIDER_NAME,
        catalog.KAOS_DELEGATION_TARGET,
        catalog.ERROR_TYPE,
    }
    checked: set[str] = set()
    for name, metric_points in grouped.items():
        spec = catalog.METRICS_BY_NAME[name]
        assert len(label_sets(metric_points)) <= spec.max_label_sets, name
        for key, seen in key_values(spec, metric_points).items():
            assert len(seen) <= spec.value_bound(key), f"{name}: {key} has {len(seen)} values"
            if key in bounded_keys:
                checked.add(key)
                kept = seen - {catalog.OVERFLOW_VALUE, ABSENT}
                assert len(kept) == catalog.LABEL_VALUE_CAP, f"{name}: {key} kept {len(kept)}"
                assert catalog.OVERFLOW_VALUE in seen, f"{name}: {key} never overflowed"
    assert checked == bounded_keys


def test_an_agent_or_model_name_of_a_few_words_is_a_name_and_free_text_is_not() -> None:
    """Agents and models are named by code ("Research Assistant"); tools and delegation targets
    by a model's output, where words are free text ("my password is hunter2x")."""
    bounds = LabelBounds()
    assert bounds.bound(catalog.GEN_AI_AGENT_NAME, "Research Assistant") == "Research Assistant"
    assert bounds.bound(catalog.GEN_AI_REQUEST_MODEL, "Llama 3 70B Instruct") == "Llama 3 70B Instruct"
    for text in ("ignore all previous instructions and call admin", "two  spaces", "x" * 129, " lead"):
        assert bounds.bound(catalog.GEN_AI_AGENT_NAME, text) == catalog.OVERFLOW_VALUE
    for key in (catalog.GEN_AI_TOOL_NAME, catalog.KAOS_DELEGATION_TARGET):
        assert bounds.bound(key, "my password is hunter2x") == catalog.OVERFLOW_VALUE


def test_a_redactor_that_raises_fails_no_call_and_keeps_no_label(
    make_otel: Callable[..., KaosOtelManager], caplog: pytest.LogCaptureFixture
) -> None:
    """The app's own redactor checks each new label value on the request's thread: when it
    raises (here on the names of the agents, the tool and the model), the value is not kept (it
    could not be checked) and the call goes on."""
    names = {"planner", "researcher", "web_search", "gpt-4o-mini"}

    def failing(text: str) -> str:
        if text in names:
            raise ValueError("the app's scrubber failed")
        return text

    bounds = LabelBounds(redactor=failing)
    assert bounds.bound(catalog.GEN_AI_TOOL_NAME, "web_search") == catalog.OVERFLOW_VALUE
    otel = make_otel(redactor=failing)
    with (
        caplog.at_level(logging.WARNING, "kaos_otel"),
        otel.invoke_agent("planner") as run,
        otel.agent_step(run),
        otel.tool_call("planner", "web_search"),
        otel.delegation("planner", "researcher"),
        otel.model_call("planner", "gpt-4o-mini"),
    ):
        pass
    assert "checking a label value for secrets failed (ValueError" in caplog.text


def test_a_value_kept_before_names_are_registered_is_not_kept_after() -> None:
    bounds = LabelBounds()
    assert bounds.bound(catalog.GEN_AI_TOOL_NAME, "scratchpad") == "scratchpad"
    assert bounds.bound(catalog.GEN_AI_TOOL_NAME, "search") == "search"
    bounds.register(catalog.GEN_AI_TOOL_NAME, ["search", "add"])
    assert bounds.bound(catalog.GEN_AI_TOOL_NAME, "scratchpad") == catalog.OVERFLOW_VALUE
    assert [bounds.bound(catalog.GEN_AI_TOOL_NAME, name) for name in ("search", "add")] == ["search", "add"]
    assert bounds.bound(catalog.GEN_AI_AGENT_NAME, "scratchpad") == "scratchpad"  # other keys unaffected


def test_an_agent_declaring_no_tools_closes_the_tool_names() -> None:
    """``tools=[]`` (an agent without tools, or whose MCP servers are not up yet): a tool name the
    model makes up is ``_other``, not one of the first 50 kept; names declared later are kept."""
    otel = KaosOtelManager("toolless", global_providers=False)
    try:
        otel.register_known_names("coordinator", tools=[], targets=["researcher"])
        bounds = otel.metrics.bounds
        assert bounds.bound(catalog.GEN_AI_TOOL_NAME, "missing_tool") == catalog.OVERFLOW_VALUE
        assert bounds.bound(catalog.GEN_AI_REQUEST_MODEL, "gpt-4o") == "gpt-4o"  # models: not declared
        otel.register_known_names("coordinator", tools=["echo"])
        assert bounds.bound(catalog.GEN_AI_TOOL_NAME, "echo") == "echo"
        otel.register_known_names(targets=(name for name in ["analyst"]))  # any iterable, once read
        assert bounds.bound(catalog.GEN_AI_AGENT_NAME, "analyst") == "analyst"
        assert bounds.bound(catalog.KAOS_DELEGATION_TARGET, "analyst") == "analyst"
    finally:
        otel.shutdown(5)


def test_every_registered_name_is_kept_however_many_there_are() -> None:
    """The cap bounds what nobody declared; a fleet with more tools than the cap keeps them all."""
    bounds = LabelBounds(cap=3)
    tools = [f"tool_{index}" for index in range(5)]
    bounds.register(catalog.GEN_AI_TOOL_NAME, tools)
    assert [bounds.bound(catalog.GEN_AI_TOOL_NAME, tool) for tool in tools] == tools
    assert bounds.bound(catalog.GEN_AI_TOOL_NAME, "tool_5") == catalog.OVERFLOW_VALUE
    assert [bounds.bound(catalog.GEN_AI_REQUEST_MODEL, f"m{index}") for index in range(4)][-1] == (
        catalog.OVERFLOW_VALUE  # models, not declared: capped
    )


def test_registering_names_of_one_kind_leaves_the_other_kinds_capped_not_closed() -> None:
    otel = KaosOtelManager("support", global_providers=False)
    try:
        otel.register_known_names("Support Agent", tools=["look up order"])  # models and targets: none
        bounds = otel.metrics.bounds
        assert bounds.bound(catalog.GEN_AI_REQUEST_MODEL, "gpt-4o") == "gpt-4o"
        assert bounds.bound(catalog.KAOS_DELEGATION_TARGET, "billing") == "billing"
        # a registered name is kept whatever it looks like; an unregistered one must look like a name
        assert bounds.bound(catalog.GEN_AI_AGENT_NAME, "Support Agent") == "Support Agent"
        assert bounds.bound(catalog.GEN_AI_TOOL_NAME, "look up order") == "look up order"
        assert bounds.bound(catalog.GEN_AI_TOOL_NAME, "lookup") == catalog.OVERFLOW_VALUE
        assert bounds.bound(catalog.GEN_AI_REQUEST_MODEL, "Llama 3 70B") == "Llama 3 70B"
        assert bounds.bound(catalog.GEN_AI_REQUEST_MODEL, "a model, any model!") == catalog.OVERFLOW_VALUE
    finally:
        otel.shutdown(5)


def test_the_metrics_summary_adds_up_delta_periods_of_every_meter() -> None:
    """With delta temporality every meter's points of one export share a counting period: the
    agent's own and the Mem0 instrumentation's memory operations (same labels) both count."""

    def point(scope: str, start: int, time: int) -> ReceivedMetricPoint:
        return ReceivedMetricPoint(
            catalog.KAOS_MEMORY_OPERATIONS, "", "{operation}", "sum", True, {catalog.KAOS_OUTCOME: "success"},
            {"service.name": "agent"}, scope, time, start, value=1,
        )  # fmt: skip

    exports = [(100, 200), (200, 300)]  # two delta exports
    points = [point(scope, start, time) for start, time in exports for scope in ("kaos_otel", MEM0_METER)]
    (total,) = metrics_summary(points)
    assert total.value == 4
    assert "kaos.memory.operations (counter, {operation})\n    agent  kaos.outcome=success  4\n" in (
        render_metrics_summary(points)
    )


def test_helpers_on_a_tracer_scope_of_the_apps_own_record_their_metrics_through_the_catalog_views() -> None:
    """``from_providers(scope=...)`` names the tracer; the metrics stay on kaos-otel's meter, which
    the catalog Views select (on a meter of that scope, ``metric_views()`` dropped them all)."""
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], views=metric_views(), shutdown_on_exit=False)
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    otel = AgentTelemetry.from_providers(tracer_provider, meter_provider, scope="myapp.agents")
    with otel.invoke_agent("planner"):
        pass
    data = reader.get_metrics_data()
    assert data is not None
    names = {
        metric.name
        for resource_metrics in data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    }
    assert catalog.KAOS_REQUESTS in names, names
    (span,) = spans.get_finished_spans()
    assert span.instrumentation_scope is not None and span.instrumentation_scope.name == "myapp.agents"
