"""A Mem0 operation instrumented by :class:`Mem0Instrumentor` vs the same operation uninstrumented.

Offline Mem0 (in-memory qdrant and history, WordLlama embeddings, ``infer=False``): one operation
is an ``add``, a ``search`` for the same user and the ``delete`` of the record added (so the store
keeps its size and later operations are not slower than earlier ones). Operations alternate
(ABBA) between instrumented and uninstrumented on the same ``Memory`` instance: the instrumentor
stays applied, and the uninstrumented operation calls the original functions it wrapped
(``__wrapped__``), so both run with the same classes (patching and unpatching around each
operation would itself slow the next calls). The ratio is that of the medians; the spans
exported must be three per instrumented operation and none for the others. Times are the
calling thread's CPU time (the operation runs on it entirely: local qdrant, in-process
embeddings), which other processes on the machine do not disturb.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import time
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import SpanKind

from bench._harness import Comparison, interleaved, null_pipeline
from kaos_otel import MemoryScope, MemoryTier, catalog

PENDING = "pending (kaos_otel.instrumentation.mem0 not available)"


def mem0_overhead(pairs: int) -> dict[str, Any] | str:
    """Per-operation time of ``add`` + ``search`` + ``delete`` with and without the instrumentor."""
    os.environ.setdefault("MEM0_TELEMETRY", "False")
    try:
        from kaos_otel.instrumentation.mem0 import Mem0Instrumentor
        from kaos_otel.instrumentation.mem0.offline import offline_memory
    except ImportError as exc:
        return f"{PENDING}: {exc}"
    pipeline = null_pipeline("bench-mem0")
    manager, provider, exporter = pipeline.telemetry, pipeline.tracer_provider, pipeline.exporter
    instrumentor = Mem0Instrumentor()
    logging.getLogger("mem0").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="kaos-bench-mem0-") as folder:
        os.environ.setdefault("MEM0_DIR", folder)
        memory = offline_memory("http://127.0.0.1:9/v1", history_db_path=":memory:")
        for i in range(64):
            memory.add(
                f"Stored fact {i}: the user likes colour {i % 13}", user_id=f"user-{i % 8}", infer=False
            )
        counter = 0
        memory_class = type(memory)

        def operation(instrumented: bool) -> float:
            """One timed operation, through the instrumented methods or the original ones."""
            nonlocal counter
            counter += 1
            user = f"user-{counter % 8}"
            add, search, delete = (memory_class.add, memory_class.search, memory_class.delete)
            if not instrumented:  # the functions the instrumentor wrapped, called directly
                add, search, delete = add.__wrapped__, search.__wrapped__, delete.__wrapped__
            start = time.thread_time()
            added = add(
                memory,
                f"Fact number {counter}: the user likes colour {counter % 13}",
                user_id=user,
                infer=False,
            )
            search(memory, "Which colour does the user like?", filters={"user_id": user}, top_k=3)
            for record in added.get("results", []):
                delete(memory, record["id"])
            return (time.thread_time() - start) * 1e6

        instrumentor.instrument(telemetry=manager)
        on: list[float] = []
        off: list[float] = []
        try:
            for _ in range(10):  # warm up: model load, collection, both code paths
                operation(True)
                operation(False)
            provider.force_flush()
            exporter.exported = 0
            for i in range(pairs):
                for instrumented in (True, False) if i % 2 == 0 else (False, True):
                    (on if instrumented else off).append(operation(instrumented))
            provider.force_flush()
        finally:
            instrumentor.uninstrument()
            pipeline.shutdown()
    return {
        "operation": "add(infer=False) + search(top_k=3) + delete; in-memory qdrant, WordLlama",
        "instrumented_us": round(statistics.median(on), 1),
        "uninstrumented_us": round(statistics.median(off), 1),
        "ratio": statistics.median(on) / statistics.median(off),
        "pairs": pairs,
        "spans_exported": exporter.exported,
        "spans_expected": 3 * pairs,
    }


def memory_span_costs(n: int, reps: int) -> Comparison:
    """One ``memory_operation`` span (as the instrumentor makes it) vs the raw SDK doing the same.

    The raw variant creates a CLIENT span with the same name and attributes and records the same
    two metric points (counter and duration histogram, same labels) on raw SDK instruments: the
    floor any instrumentation recording this telemetry pays.
    """
    pipeline = null_pipeline("bench-mem0")
    manager = pipeline.telemetry
    raw = pipeline.tracer_provider.get_tracer("raw-sdk")
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    meter = meter_provider.get_meter("raw-sdk")
    operations = meter.create_counter(catalog.KAOS_MEMORY_OPERATIONS)
    duration = meter.create_histogram(catalog.KAOS_MEMORY_OPERATION_DURATION)

    def kaos(count: int) -> None:
        for _ in range(count):
            with manager.memory_operation(
                MemoryTier.LONG_TERM,
                "search_memory",
                scope=MemoryScope.USER,
                store_id="mem0",
                provider="mem0",
                attributes={catalog.USER_ID: "user-1"},
            ) as operation:
                operation.set_record_count(3)

    def raw_sdk(count: int) -> None:
        for _ in range(count):
            start = time.perf_counter()
            with raw.start_as_current_span(
                "search_memory",
                kind=SpanKind.CLIENT,
                attributes={
                    catalog.GEN_AI_OPERATION_NAME: "search_memory",
                    catalog.GEN_AI_MEMORY_STORE_ID: "mem0",
                    catalog.KAOS_MEMORY_TIER: MemoryTier.LONG_TERM.value,
                    catalog.KAOS_MEMORY_OPERATION: "search_memory",
                    catalog.KAOS_MEMORY_SCOPE: MemoryScope.USER.value,
                    catalog.KAOS_MEMORY_PROVIDER: "mem0",
                    catalog.USER_ID: "user-1",
                },
            ) as span:
                span.set_attribute(catalog.GEN_AI_MEMORY_RECORD_COUNT, 3)
                span.set_attribute(catalog.KAOS_OUTCOME, "success")
                labels = {
                    catalog.KAOS_MEMORY_TIER: MemoryTier.LONG_TERM.value,
                    catalog.KAOS_MEMORY_OPERATION: "search_memory",
                    catalog.KAOS_MEMORY_SCOPE: MemoryScope.USER.value,
                    catalog.KAOS_OUTCOME: "success",
                }
                operations.add(1, labels)
                duration.record(time.perf_counter() - start, labels)

    try:
        return interleaved({"raw_sdk": raw_sdk, "kaos": kaos}, baseline="raw_sdk", n=n, reps=reps)
    finally:
        pipeline.shutdown()
        meter_provider.shutdown()
