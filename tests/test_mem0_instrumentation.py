"""Mem0 instrumentation against the real mem0ai, fully offline, asserted at an OTLP receiver."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wrapt
from mem0_support import (
    AsyncMemory,
    Flavor,
    Memory,
    NetworkGuard,
    ScriptedModelServer,
    make_memory,
    memory_caller,
)
from opentelemetry.instrumentation.dependencies import get_dependency_conflicts, get_dist_dependency_conflicts
from opentelemetry.instrumentation.utils import suppress_instrumentation
from packaging.requirements import Requirement

import kaos_otel.instrumentation.mem0 as mem0_instrumentation
from kaos_otel import AgentTelemetry, KaosOtelManager, MemoryOperation, MemoryScope, catalog
from kaos_otel._config import OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT
from kaos_otel.instrumentation.mem0 import Mem0Instrumentor
from kaos_otel.instrumentation.mem0._wrappers import METHODS, scope_and_ids
from kaos_otel.instrumentation.mem0.package import _instruments
from kaos_otel.receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.timeout(60)

FLAVORS: tuple[Flavor, ...] = ("sync", "async")
FACTS = ("Alice likes blue", "Alice has a cat named Tom")
# content that must never leave the process unless content capture is on
QUERY = "Which teacup colour does Zorblax prefer?"
MEMORY_TEXT = "Zorblax prefers ultramarine teacups"
FACT = "Zorblax collects quartz pebbles"
MESSAGE = "Remember that I, Zorblax, collect quartz pebbles"
UPDATED_TEXT = "Zorblax now prefers vermilion teacups"
METADATA_VALUE = "melancholic-otter-7731"
CAPTURE_ENV = OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT
AGENT = catalog.GEN_AI_AGENT_ID
CONTENT_KEYS = (catalog.GEN_AI_MEMORY_QUERY_TEXT, catalog.GEN_AI_MEMORY_RECORDS)


class EmbedderDown(RuntimeError):
    """The embedder failed."""


# --- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[NetworkGuard]:
    """Fail the test on any non-loopback connection or name lookup."""
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENROUTER_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    guard = NetworkGuard()
    guard.install(monkeypatch)
    yield guard
    assert guard.violations == []


@pytest.fixture
def model_server() -> Iterator[ScriptedModelServer]:
    """The scripted extraction LLM, answering with :data:`FACTS`."""
    with ScriptedModelServer(FACTS) as server:
        yield server


def _manager(receiver: OtlpReceiver, **kwargs: Any) -> KaosOtelManager:
    return KaosOtelManager(
        "mem0-test",
        endpoint=receiver.grpc_endpoint,
        protocol="grpc",
        global_providers=False,
        metric_export_interval_ms=3_600_000,
        **kwargs,
    )


@pytest.fixture
def otel(otlp_receiver: OtlpReceiver) -> Iterator[KaosOtelManager]:
    """A private-provider manager exporting to the receiver, content capture off."""
    manager = _manager(otlp_receiver)
    yield manager
    manager.shutdown()


@pytest.fixture
def instrumentor() -> Iterator[Mem0Instrumentor]:
    """The instrumentor, uninstrumented after the test whatever it did."""
    instrumentor = Mem0Instrumentor()
    yield instrumentor
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


@pytest.fixture
def instrumented(instrumentor: Mem0Instrumentor, otel: KaosOtelManager) -> Mem0Instrumentor:
    """Instrumented with ``otel`` and no child spans."""
    instrumentor.instrument(telemetry=otel)
    return instrumentor


# --- helpers ------------------------------------------------------------------------------------
def flushed(otel: KaosOtelManager, receiver: OtlpReceiver) -> OtlpReceiver:
    """Export everything buffered, then hand back the receiver."""
    assert otel.force_flush()
    assert otel.health.snapshot() == {}, "nothing dropped or failed to export"
    return receiver


def mem0_spans(receiver: OtlpReceiver) -> list[ReceivedSpan]:
    """The memory operation spans, in start order."""
    spans = [s for s in receiver.spans() if s.attributes.get(catalog.KAOS_MEMORY_PROVIDER) == "mem0"]
    return sorted(spans, key=lambda span: span.start_time_unix_nano)


def children(receiver: OtlpReceiver, parent: ReceivedSpan) -> list[ReceivedSpan]:
    """Spans whose parent is ``parent``."""
    return [s for s in receiver.spans() if s.parent_span_id == parent.span_id]


def span_id(handle: Any) -> str:
    """The hex span id of a span handle."""
    return format(handle.span.get_span_context().span_id, "016x")


def memory_counts(receiver: OtlpReceiver) -> dict[tuple[str, str, str], int]:
    """Latest ``kaos.memory.operations`` values by (operation, scope, outcome); tier is long_term."""
    counts: dict[tuple[str, str, str], int] = {}
    for point in receiver.metric_points():
        if point.name != catalog.KAOS_MEMORY_OPERATIONS:
            continue
        labels = point.attributes
        assert set(labels) == {
            catalog.KAOS_MEMORY_TIER,
            catalog.KAOS_MEMORY_OPERATION,
            catalog.KAOS_MEMORY_SCOPE,
            catalog.KAOS_OUTCOME,
        }
        assert labels[catalog.KAOS_MEMORY_TIER] == "long_term"
        key = (
            labels[catalog.KAOS_MEMORY_OPERATION],
            labels[catalog.KAOS_MEMORY_SCOPE],
            labels[catalog.KAOS_OUTCOME],
        )
        counts[key] = int(point.value or 0)
    return counts


def received_bytes(receiver: OtlpReceiver) -> bytes:
    """Every export request the receiver accepted, serialized."""
    return b"".join(request.SerializeToString() for request in receiver.raw_requests())


# --- every method, sync and async ---------------------------------------------------------------
@pytest.mark.parametrize("flavor", FLAVORS)
async def test_every_method_is_a_child_span_with_metrics(
    flavor: Flavor,
    otel: KaosOtelManager,
    instrumented: Mem0Instrumentor,
    otlp_receiver: OtlpReceiver,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    memory = make_memory(flavor, model_server, tmp_path)
    call = memory_caller(memory)
    with otel.span("caller") as parent:
        inferred = await call("add", "I love blue and my cat is called Tom", user_id="alice")
        added = await call("add", "Alice works at Acme", user_id="alice", run_id="run-1", infer=False)
        memory_id = added["results"][0]["id"]
        found = await call("search", "What colour does Alice like?", filters={"user_id": "alice"}, top_k=1)
        await call("get", memory_id)
        listed = await call("get_all", filters={"user_id": "alice"})
        await call("update", memory_id, text="Alice works at Initech")
        history = await call("history", memory_id)
        await call("delete", memory_id)
        await call("delete_all", agent_id="helper")
        await call("reset")
    assert [record["memory"] for record in inferred["results"]] == list(FACTS)
    assert len(found["results"]) == 1 and len(listed["results"]) == 3 and len(history) == 2
    assert len(model_server.requests) == 1
    assert model_server.requests[0]["response_format"] == {"type": "json_object"}

    receiver = flushed(otel, otlp_receiver)
    spans = mem0_spans(receiver)
    expected = [
        # (span name, scope, record count, record id)
        ("create_memory", "user", 2, None),
        ("create_memory", "session", 1, memory_id),
        ("search_memory", "user", 1, None),
        ("get_memory", "store", 1, memory_id),
        ("list_memory", "user", 3, None),
        ("update_memory", "store", 1, memory_id),
        ("memory_history", "store", 2, memory_id),
        ("delete_memory", "store", 1, memory_id),
        ("delete_memory", "agent", None, None),
        ("delete_memory_store", "store", None, None),
    ]
    assert [
        (
            span.name,
            span.attributes[catalog.KAOS_MEMORY_SCOPE],
            span.attributes.get(catalog.GEN_AI_MEMORY_RECORD_COUNT),
            span.attributes.get(catalog.GEN_AI_MEMORY_RECORD_ID),
        )
        for span in spans
    ] == expected
    parent_trace = format(parent.span.get_span_context().trace_id, "032x")
    for span in spans:
        assert span.parent_span_id == span_id(parent) and span.trace_id == parent_trace
        assert span.kind == "CLIENT" and span.status_code == "UNSET"
        assert span.attributes[catalog.GEN_AI_OPERATION_NAME] == span.name
        assert span.attributes[catalog.KAOS_MEMORY_OPERATION] == span.name
        assert span.attributes[catalog.KAOS_MEMORY_TIER] == "long_term"
        assert span.attributes[catalog.GEN_AI_MEMORY_STORE_ID] == "mem0"
        assert span.attributes[catalog.KAOS_OUTCOME] == "success"
        assert all(key not in span.attributes for key in CONTENT_KEYS)
    assert [span.attributes.get(catalog.KAOS_MEMORY_INFER) for span in spans[:2]] == [True, False]
    assert [span.attributes.get(catalog.USER_ID) for span in spans[:3]] == ["alice"] * 3
    assert spans[1].attributes[catalog.SESSION_ID] == "run-1"
    assert spans[8].attributes[catalog.GEN_AI_AGENT_ID] == "helper"
    assert all(not children(receiver, span) for span in spans), "child spans are off by default"

    counts = memory_counts(receiver)
    assert counts == {
        ("create_memory", "user", "success"): 1,
        ("create_memory", "session", "success"): 1,
        ("search_memory", "user", "success"): 1,
        ("get_memory", "store", "success"): 1,
        ("list_memory", "user", "success"): 1,
        ("update_memory", "store", "success"): 1,
        ("memory_history", "store", "success"): 1,
        ("delete_memory", "store", "success"): 1,
        ("delete_memory", "agent", "success"): 1,
        ("delete_memory_store", "store", "success"): 1,
    }
    durations = [p for p in receiver.metric_points() if p.name == catalog.KAOS_MEMORY_OPERATION_DURATION]
    assert sum(p.count or 0 for p in durations) == 10
    assert all(p.unit == "s" and p.attributes[catalog.KAOS_MEMORY_TIER] == "long_term" for p in durations)
    assert b"alice" not in b"".join(
        request.SerializeToString()
        for request in receiver.raw_requests()
        if request.DESCRIPTOR.name == "ExportMetricsServiceRequest"
    ), "ids never go on metrics"
    memory.close()


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_error_span_and_original_exception(
    flavor: Flavor,
    otel: KaosOtelManager,
    instrumented: Mem0Instrumentor,
    otlp_receiver: OtlpReceiver,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    original = EmbedderDown(f"embedder failed on {MEMORY_TEXT!r}")
    memory = make_memory(flavor, model_server, tmp_path)

    def explode(*args: Any, **kwargs: Any) -> list[float]:
        raise original

    memory.embedding_model.embed = explode
    call = memory_caller(memory)
    with otel.span("caller") as parent:
        with pytest.raises(EmbedderDown) as raised:
            await call("add", MEMORY_TEXT, user_id="alice", infer=False)
        with pytest.raises(ValueError, match="not found"):
            await call("delete", "no-such-id")
    assert raised.value is original

    receiver = flushed(otel, otlp_receiver)
    add, delete = mem0_spans(receiver)
    assert add.parent_span_id == delete.parent_span_id == span_id(parent)
    assert (add.status_code, add.attributes[catalog.ERROR_TYPE]) == ("ERROR", "EmbedderDown")
    assert (delete.status_code, delete.attributes[catalog.ERROR_TYPE]) == ("ERROR", "ValueError")
    assert add.attributes[catalog.KAOS_OUTCOME] == delete.attributes[catalog.KAOS_OUTCOME] == "error"
    assert catalog.GEN_AI_MEMORY_RECORD_COUNT not in add.attributes
    assert [event.name for event in add.events] == ["exception"]
    assert memory_counts(receiver) == {
        ("create_memory", "user", "error"): 1,
        ("delete_memory", "store", "error"): 1,
    }
    assert MEMORY_TEXT.encode() not in received_bytes(receiver), "exception messages are content"
    memory.close()


# --- content ------------------------------------------------------------------------------------
@pytest.mark.parametrize("capture", [False, True])
def test_content_leaves_only_with_capture_on(
    capture: bool,
    instrumentor: Mem0Instrumentor,
    otlp_receiver: OtlpReceiver,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    otel = _manager(otlp_receiver, capture_content=capture)
    instrumentor.instrument(telemetry=otel)
    model_server.facts = (FACT,)
    mem0_logger = logging.getLogger("mem0")
    level = mem0_logger.level
    mem0_logger.setLevel(logging.DEBUG)  # mem0 logs memory text at INFO and DEBUG
    try:
        memory = make_memory("sync", model_server, tmp_path)
        metadata = {"mood": METADATA_VALUE}
        memory.add([{"role": "user", "content": MESSAGE}], user_id="zorblax", metadata=metadata)
        added = memory.add(MEMORY_TEXT, user_id="zorblax", metadata=metadata, infer=False)
        memory_id = added["results"][0]["id"]
        memory.search(QUERY, filters={"user_id": "zorblax"})
        memory.get(memory_id)
        memory.get_all(filters={"user_id": "zorblax"})
        memory.update(memory_id, text=UPDATED_TEXT)
        memory.history(memory_id)
        memory.close()
    finally:
        mem0_logger.setLevel(level)
    receiver = flushed(otel, otlp_receiver)
    otel.shutdown()

    blob = received_bytes(receiver)
    spans = mem0_spans(receiver)
    assert len(spans) == 7 and b"zorblax" in blob, "ids are not content"
    mem0_logs = [log for log in receiver.logs() if log.scope_name.startswith("mem0")]
    if capture:
        for text in (QUERY, MEMORY_TEXT, FACT, UPDATED_TEXT, METADATA_VALUE):
            assert text.encode() in blob, text
        search = next(span for span in spans if span.name == "search_memory")
        assert search.attributes[catalog.GEN_AI_MEMORY_QUERY_TEXT] == QUERY
        records = json.loads(search.attributes[catalog.GEN_AI_MEMORY_RECORDS])
        found = next(record for record in records if record["id"] == memory_id)
        assert (found["content"], found["metadata"]) == (MEMORY_TEXT, metadata)
        assert isinstance(found["score"], float)
        # every records attribute is a list of the conventions' MemoryRecord: content required,
        # id a string, metadata an object, score a number (gen-ai-memory-records.json)
        kinds = {"id": str, "metadata": dict, "score": float}
        for span in spans:
            for record in json.loads(span.attributes.get(catalog.GEN_AI_MEMORY_RECORDS, "[]")):
                assert "content" in record, (span.name, record)
                assert all(isinstance(record[key], kind) for key, kind in kinds.items() if key in record)
        assert any(MEMORY_TEXT in str(log.body) for log in mem0_logs)
    else:
        for text in (QUERY, MEMORY_TEXT, FACT, MESSAGE, UPDATED_TEXT, METADATA_VALUE):
            assert text.encode() not in blob, text
        assert mem0_logs == []
        assert all(
            catalog.GEN_AI_MEMORY_QUERY_TEXT not in s.attributes
            and catalog.GEN_AI_MEMORY_RECORDS not in s.attributes
            for s in spans
        )


@pytest.mark.parametrize(
    ("kwargs", "environ", "captured"),
    [
        ({}, {}, False),
        ({}, {OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: "SPAN_ONLY"}, True),
        ({"capture_content": True}, {}, True),
        (
            {"capture_content": False},
            {OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: "SPAN_ONLY"},
            False,
        ),
    ],
)
def test_providers_and_capture_setting_without_telemetry(
    kwargs: dict[str, Any],
    environ: dict[str, str],
    captured: bool,
    otel: KaosOtelManager,
    instrumentor: Mem0Instrumentor,
    otlp_receiver: OtlpReceiver,
    model_server: ScriptedModelServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.delenv(CAPTURE_ENV, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    instrumentor.instrument(
        tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider, **kwargs
    )
    memory = make_memory("sync", model_server, tmp_path)
    memory.search(QUERY, filters={"user_id": "zorblax"})
    memory.close()

    receiver = flushed(otel, otlp_receiver)
    (span,) = mem0_spans(receiver)
    assert span.scope_name == "kaos_otel.instrumentation.mem0"
    assert (span.attributes.get(catalog.GEN_AI_MEMORY_QUERY_TEXT) == QUERY) is captured
    assert (span.attributes[catalog.GEN_AI_MEMORY_RECORD_COUNT], span.attributes[catalog.USER_ID]) == (
        0,
        "zorblax",
    )
    assert memory_counts(receiver) == {("search_memory", "user", "success"): 1}


# --- child spans --------------------------------------------------------------------------------
@pytest.mark.parametrize("flavor", FLAVORS)
async def test_child_spans_for_embedder_llm_and_vector_store(
    flavor: Flavor,
    otel: KaosOtelManager,
    instrumentor: Mem0Instrumentor,
    otlp_receiver: OtlpReceiver,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    instrumentor.instrument(telemetry=otel, child_spans=True)
    memory = make_memory(flavor, model_server, tmp_path)
    call = memory_caller(memory)
    with otel.span("caller"):
        await call("add", "I love blue and my cat is called Tom", user_id="alice")
        await call("search", "What colour does Alice like?", filters={"user_id": "alice"})
    memory.embedding_model.embed("outside any memory operation", "search")

    receiver = flushed(otel, otlp_receiver)
    add, search = mem0_spans(receiver)
    assert add.attributes[catalog.GEN_AI_MEMORY_RECORD_COUNT] == 2
    add_children = {span.name: span for span in children(receiver, add)}
    assert {"embeddings wordllama-l2-supercat", "chat scripted", "search mem0", "insert mem0"} <= set(
        add_children
    )
    chat = add_children["chat scripted"]
    assert chat.kind == "CLIENT"
    assert chat.attributes[catalog.GEN_AI_OPERATION_NAME] == "chat"
    assert chat.attributes[catalog.GEN_AI_PROVIDER_NAME] == "openai"
    embeddings = add_children["embeddings wordllama-l2-supercat"]
    assert embeddings.attributes[catalog.GEN_AI_OPERATION_NAME] == "embeddings"
    assert catalog.GEN_AI_PROVIDER_NAME not in embeddings.attributes, "a custom embedder has no provider"
    assert add_children["insert mem0"].attributes == {
        catalog.DB_SYSTEM_NAME: "qdrant",
        catalog.DB_OPERATION_NAME: "insert",
        catalog.DB_COLLECTION_NAME: "mem0",
    }
    assert {"embeddings wordllama-l2-supercat", "search mem0"} <= {s.name for s in children(receiver, search)}
    embedding_spans = [s for s in receiver.spans() if s.name.startswith("embeddings")]
    assert all(s.parent_span_id in (add.span_id, search.span_id) for s in embedding_spans), "no orphans"
    memory.close()


# --- instrument / uninstrument ------------------------------------------------------------------
def test_an_unknown_instrument_argument_is_said(
    instrumentor: Mem0Instrumentor, otel: KaosOtelManager, caplog: pytest.LogCaptureFixture
) -> None:
    misspelt: dict[str, Any] = {"telemetri": otel}
    instrumentor.instrument(**misspelt, skip_dep_check=True)
    assert instrumentor.is_instrumented_by_opentelemetry
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("unknown arguments ignored: telemetri" in message for message in said), said


def test_capture_content_beside_telemetry_is_said_to_be_ignored(
    instrumentor: Mem0Instrumentor, otel: KaosOtelManager, caplog: pytest.LogCaptureFixture
) -> None:
    """The telemetry's own content policy applies: an opt-out given beside it is not followed
    silently."""
    instrumentor.instrument(telemetry=otel, capture_content=False, skip_dep_check=True)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("capture_content is ignored with telemetry=" in message for message in said), said


def test_instrument_twice_does_not_double_spans(
    otel: KaosOtelManager,
    instrumentor: Mem0Instrumentor,
    otlp_receiver: OtlpReceiver,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    original = Memory.__dict__["search"]
    instrumentor.instrument(telemetry=otel)
    instrumentor.instrument(telemetry=otel)
    Mem0Instrumentor().instrument(telemetry=otel)
    assert Mem0Instrumentor() is instrumentor
    assert Memory.__dict__["search"].__wrapped__ is original
    memory = make_memory("sync", model_server, tmp_path)
    memory.search("blue", filters={"user_id": "alice"})
    memory.close()
    assert len(mem0_spans(flushed(otel, otlp_receiver))) == 1


def test_uninstrument_restores_mem0_exactly(
    otel: KaosOtelManager,
    instrumentor: Mem0Instrumentor,
    otlp_receiver: OtlpReceiver,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    originals = {(cls, m.name): cls.__dict__[m.name] for cls in (Memory, AsyncMemory) for m in METHODS}
    before = make_memory("sync", model_server, tmp_path)
    components = (before.embedding_model, before.llm, before.vector_store)
    instrumentor.instrument(telemetry=otel, child_spans=True)
    assert all(isinstance(cls.__dict__[name], wrapt.FunctionWrapper) for cls, name in originals)
    after = make_memory("sync", model_server, tmp_path)
    before.add("Alice likes blue", user_id="alice", infer=False)
    after.add("Bob likes red", user_id="bob", infer=False)
    assert type(before.vector_store) is not type(components[2]), "child-span proxies installed"
    instrumentor.uninstrument()

    assert all(cls.__dict__[name] is original for (cls, name), original in originals.items())
    restored = (before.embedding_model, before.llm, before.vector_store)
    assert all(now is then for now, then in zip(restored, components, strict=True))
    assert type(after.vector_store).__module__ == "mem0.vector_stores.qdrant"
    receiver = flushed(otel, otlp_receiver)
    created = mem0_spans(receiver)
    assert [s.attributes[catalog.USER_ID] for s in created] == ["alice", "bob"], "old and new instances"
    before.search("blue", filters={"user_id": "alice"})
    after.get_all(filters={"user_id": "bob"})
    assert len(mem0_spans(flushed(otel, otlp_receiver))) == 2, "no spans once uninstrumented"
    before.close()
    after.close()


def test_a_method_bound_while_instrumented_traces_nothing_after_uninstrument(
    instrumentor: Mem0Instrumentor, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    """Agent frameworks keep bound methods as tools; one kept across ``uninstrument()`` must not
    put proxies back, nor send a later manager's child spans to the earlier one."""
    first_receiver, second_receiver = OtlpReceiver().start(), OtlpReceiver().start()
    first, second = _manager(first_receiver), _manager(second_receiver)
    try:
        memory = make_memory("sync", model_server, tmp_path)
        store = memory.vector_store
        instrumentor.instrument(telemetry=first, child_spans=True)
        tool = memory.get_all
        tool(filters={"user_id": "alice"})
        instrumentor.uninstrument()
        tool(filters={"user_id": "alice"})
        assert memory.vector_store is store, "no proxy put back by the kept method"

        instrumentor.instrument(telemetry=second, child_spans=True)
        memory.search("blue", filters={"user_id": "alice"})
        instrumentor.uninstrument()
        assert memory.vector_store is store

        assert len(mem0_spans(flushed(first, first_receiver))) == 1, "the call after uninstrument is untraced"
        assert [s.name for s in first_receiver.spans()].count("list mem0") == 1, "one child span, then none"
        (search,) = mem0_spans(flushed(second, second_receiver))
        assert {s.name for s in children(second_receiver, search)} >= {"search mem0"}
        assert not [s for s in first_receiver.spans() if s.name.startswith("search")]
        memory.close()
    finally:
        first.shutdown()
        second.shutdown()
        first_receiver.stop()
        second_receiver.stop()


def test_suppressed_instrumentation_records_nothing(
    otel: KaosOtelManager,
    instrumented: Mem0Instrumentor,
    otlp_receiver: OtlpReceiver,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    memory = make_memory("sync", model_server, tmp_path)
    with suppress_instrumentation():
        memory.search("blue", filters={"user_id": "alice"})
    memory.close()
    assert mem0_spans(flushed(otel, otlp_receiver)) == []


def test_broken_telemetry_never_breaks_mem0(
    otel: KaosOtelManager,
    instrumentor: Mem0Instrumentor,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    class BrokenTelemetry(AgentTelemetry):
        def memory_operation(self, *args: Any, **kwargs: Any) -> MemoryOperation:
            raise RuntimeError("telemetry bug")

    broken = BrokenTelemetry(otel.tracer_provider.get_tracer("t"), otel.metrics, otel.content_policy)
    instrumentor.instrument(telemetry=broken)
    memory = make_memory("sync", model_server, tmp_path)
    added = memory.add("Alice likes blue", user_id="alice", infer=False)
    assert memory.get(added["results"][0]["id"])["memory"] == "Alice likes blue"
    memory.close()


def test_a_component_that_cannot_be_described_runs_untraced(
    otel: KaosOtelManager,
    instrumentor: Mem0Instrumentor,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    """An embedder of the app's own whose ``config`` raises: the call runs, without a child span."""
    instrumentor.instrument(telemetry=otel, child_spans=True)
    memory = make_memory("sync", model_server, tmp_path)
    embedder = memory.embedding_model

    class UndescribableEmbedder:
        @property
        def config(self) -> Any:
            raise KeyError("model")

        def embed(self, text: str, memory_action: str | None = None) -> Any:
            return embedder.embed(text, memory_action)

    memory.embedding_model = UndescribableEmbedder()
    added = memory.add("Alice likes blue", user_id="alice", infer=False)
    assert memory.get(added["results"][0]["id"])["memory"] == "Alice likes blue"
    memory.close()


# --- concurrency --------------------------------------------------------------------------------
async def test_fifty_concurrent_async_operations_are_parented_correctly(
    otel: KaosOtelManager,
    instrumented: Mem0Instrumentor,
    otlp_receiver: OtlpReceiver,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    memory = make_memory("async", model_server, tmp_path)
    for index in range(50):  # qdrant's local mode is not safe for concurrent writes: add first
        await memory.add(f"Fact number {index}", user_id=f"user-{index}", infer=False)

    async def operation(index: int) -> tuple[str, str]:
        with otel.span(f"caller-{index}") as parent:
            if index % 2:
                await memory.get_all(filters={"user_id": f"user-{index}"})
            else:
                await memory.search("fact", filters={"user_id": f"user-{index}"})
            return span_id(parent), f"user-{index}"

    callers = dict(await asyncio.gather(*(operation(index) for index in range(50))))
    receiver = flushed(otel, otlp_receiver)
    spans = [span for span in mem0_spans(receiver) if span.name != "create_memory"]
    assert len(spans) == 50
    assert {span.parent_span_id: span.attributes[catalog.USER_ID] for span in spans} == callers
    assert all(span.attributes[catalog.GEN_AI_MEMORY_RECORD_COUNT] == 1 for span in spans)
    caller_traces = {s.span_id: s.trace_id for s in receiver.spans() if s.name.startswith("caller-")}
    assert all(caller_traces.get(span.parent_span_id or "") == span.trace_id for span in spans)
    assert len(set(caller_traces.values())) == 50
    assert memory_counts(receiver) == {
        ("create_memory", "user", "success"): 50,
        ("list_memory", "user", "success"): 25,
        ("search_memory", "user", "success"): 25,
    }
    memory.close()


# --- pure parts ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bound", "scope", "ids"),
    [
        ({}, MemoryScope.STORE, {}),
        ({"memory_id": "m1"}, MemoryScope.STORE, {}),
        ({"user_id": "u"}, MemoryScope.USER, {catalog.USER_ID: "u"}),
        ({"agent_id": "a"}, MemoryScope.AGENT, {AGENT: "a"}),
        (  # the agent's memory of one user: the agent scope (narrower than the user's)
            {"agent_id": "a", "user_id": " u "},
            MemoryScope.AGENT,
            {catalog.GEN_AI_AGENT_ID: "a", catalog.USER_ID: "u"},
        ),
        (
            {"run_id": "r", "user_id": "u"},
            MemoryScope.SESSION,
            {catalog.SESSION_ID: "r", catalog.USER_ID: "u"},
        ),
        ({"filters": {"agent_id": "a"}}, MemoryScope.AGENT, {AGENT: "a"}),
        ({"filters": {"user_id": 42, "run_id": ""}}, MemoryScope.USER, {catalog.USER_ID: "42"}),
        ({"filters": {"user_id": {"in": ["a", "b"]}, "agent_id": True}}, MemoryScope.STORE, {}),
        (  # mem0 reads "*" as any value: the search spans all of u's agents
            {"filters": {"user_id": "u", "agent_id": "*"}},
            MemoryScope.USER,
            {catalog.USER_ID: "u"},
        ),
    ],
)
def test_scope_and_ids(bound: dict[str, Any], scope: MemoryScope, ids: dict[str, str]) -> None:
    assert scope_and_ids(bound) == (scope, ids)


def test_entry_point_and_dependencies() -> None:
    (entry_point,) = importlib.metadata.entry_points(group="opentelemetry_instrumentor", name="mem0")
    assert entry_point.load() is Mem0Instrumentor
    assert tuple(Mem0Instrumentor().instrumentation_dependencies()) == ("mem0ai >= 2.2, < 3",)
    assert get_dependency_conflicts(Mem0Instrumentor().instrumentation_dependencies()) is None


def test_instrument_waits_for_the_application_to_import_mem0() -> None:
    """Under ``opentelemetry-instrument`` every process instruments: one that never uses mem0 must
    not load it (4 s, PostHog started before the app could set ``MEM0_TELEMETRY=False``)."""
    probe = textwrap.dedent(
        """
        import os, sys
        from kaos_otel.instrumentation.mem0 import Mem0Instrumentor

        instrumentor = Mem0Instrumentor()
        instrumentor.instrument()
        loaded = sorted(name for name in sys.modules if name.split(".")[0] == "mem0")
        os.environ["MEM0_TELEMETRY"] = "False"  # the app's own setting, before its import
        from mem0 import AsyncMemory, Memory
        from mem0.memory import telemetry

        wrapped = [type(vars(cls)["add"]).__name__ for cls in (Memory, AsyncMemory)]
        instrumentor.uninstrument()
        restored = [type(vars(cls)["add"]).__name__ for cls in (Memory, AsyncMemory)]
        instrumentor.instrument()
        again = type(vars(Memory)["add"]).__name__
        print(loaded, wrapped, restored, again, telemetry.MEM0_TELEMETRY)
        """
    )
    done = _run_probe(probe)
    assert done.stdout.split() == [
        "[]",
        "['FunctionWrapper',",
        "'FunctionWrapper']",
        "['function',",
        "'function']",
        "FunctionWrapper",
        "False",
    ], done.stderr


def test_uninstrument_before_mem0_is_imported_leaves_it_unwrapped() -> None:
    probe = (
        "from kaos_otel.instrumentation.mem0 import Mem0Instrumentor; i = Mem0Instrumentor(); "
        "i.instrument(); i.uninstrument(); from mem0 import Memory; print(type(vars(Memory)['add']).__name__)"
    )
    done = _run_probe(probe, MEM0_TELEMETRY="False")
    assert done.stdout.strip() == "function", done.stderr


def test_instrument_during_another_threads_import_of_mem0_wraps_once() -> None:
    """The import hook (on the importing thread) and ``instrument()`` (here) must not both wrap."""
    probe = textwrap.dedent(
        """
        import sys, threading, time
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        from kaos_otel.instrumentation.mem0 import Mem0Instrumentor

        providers = {"tracer_provider": TracerProvider(), "meter_provider": MeterProvider()}
        instrumentor = Mem0Instrumentor()
        instrumentor.instrument(**providers)
        instrumentor.uninstrument()  # before the import: the hook stays registered
        importer = threading.Thread(target=__import__, args=("mem0",))
        importer.start()
        while "mem0.memory.main" not in sys.modules:  # the import is under way over there
            time.sleep(0.001)
        instrumentor.instrument(**providers)
        importer.join()
        from mem0.memory.main import Memory

        def layers():
            found, function = 0, vars(Memory)["history"]
            while hasattr(function, "__wrapped__"):
                found, function = found + 1, function.__wrapped__
            return found

        wrapped = layers()
        instrumentor.uninstrument()
        print(wrapped, layers())
        """
    )
    done = _run_probe(probe, MEM0_TELEMETRY="False")
    assert done.stdout.split() == ["1", "0"], done.stderr


def _run_probe(probe: str, **environ: str) -> subprocess.CompletedProcess[str]:
    """``probe`` in a fresh interpreter, ``MEM0_TELEMETRY`` unset unless given."""
    env = {name: value for name, value in os.environ.items() if name != "MEM0_TELEMETRY"}
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env={**env, **environ}
    )


def test_a_mem0_without_a_covered_method_is_left_as_it_was(
    otel: KaosOtelManager,
    instrumentor: Mem0Instrumentor,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    class FutureMemory:  # a release that dropped ``reset``
        def add(self) -> str:
            return "added"

    class FutureAsyncMemory(FutureMemory):
        pass

    monkeypatch.setattr(mem0_instrumentation, "_memory_classes", lambda: (FutureMemory, FutureAsyncMemory))
    instrumentor.instrument(telemetry=otel)
    assert type(vars(FutureMemory)["add"]).__name__ == "function", "all methods or none"
    assert "lacks" in caplog.text
    instrumentor.uninstrument()
    assert type(vars(FutureMemory)["add"]).__name__ == "function"


def test_opentelemetry_instrument_checks_the_supported_range_before_loading_the_instrumentor() -> None:
    """It checks the distribution's ``instruments`` extra, then calls ``instrument(skip_dep_check=True)``."""
    extra = [
        requirement.split(";")[0].replace(" ", "")
        for requirement in importlib.metadata.requires("kaos-otel") or []
        if 'extra == "instruments"' in requirement
    ]
    assert extra and Requirement(extra[0]) == Requirement(_instruments[0].replace(" ", ""))
    assert get_dist_dependency_conflicts(importlib.metadata.distribution("kaos-otel")) is None


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_the_offline_llm_stays_offline_with_an_openrouter_key_set(
    flavor: Flavor, model_server: ScriptedModelServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """mem0's openai LLM goes to openrouter.ai whenever ``OPENROUTER_API_KEY`` is set."""
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-not-for-this-server")
    memory = make_memory(flavor, model_server, tmp_path)
    added = await memory_caller(memory)("add", "I love blue and my cat is called Tom", user_id="alice")
    assert [record["memory"] for record in added["results"]] == list(FACTS)
    assert len(model_server.requests) == 1
    memory.close()


def test_network_guard_blocks_remote_hosts(no_network: NetworkGuard) -> None:
    import socket

    with pytest.raises(OSError, match="blocked"):
        socket.create_connection(("10.255.255.1", 443), timeout=1)
    with pytest.raises(OSError, match="blocked"):
        socket.getaddrinfo("api.openai.com", 443)
    assert len(no_network.violations) == 2
    no_network.violations.clear()


def test_importing_the_offline_setup_leaves_the_root_logger_alone() -> None:
    # wordllama's import calls logging.basicConfig(level=INFO): mem0 would then print memory text
    # to stderr, and the log bridge would take every library's INFO records
    probe = (
        "import logging; root = logging.getLogger(); "
        "import kaos_otel.instrumentation.mem0.offline; "
        "print(logging.getLevelName(root.level), len(root.handlers))"
    )
    done = _run_probe(probe)
    assert done.stdout.split() == ["WARNING", "0"]
