"""A Mem0 operation instrumented by :class:`Mem0Instrumentor`, by the raw SDK, and not at all.

Offline Mem0 (in-memory qdrant and history, WordLlama embeddings, ``infer=False``): one operation
is an ``add``, a ``search`` for the same user and the ``delete`` of the record added (so the store
keeps its size and later operations are not slower than earlier ones). Operations rotate between
three variants on the same ``Memory`` instance: instrumented (the instrumentor stays applied), the
original functions it wrapped (``__wrapped__``) called directly, and those originals each inside
the telemetry a minimal hand-written instrumentation on the raw SDK records (the same CLIENT span
and attributes, the same two metric points): the floor any instrumentation recording this
telemetry pays *in place*, where Mem0's own work between calls leaves the CPU caches cold (a span
costs two to three times what it costs in a tight loop). Patching and unpatching around each
operation would itself slow the next calls, hence the originals. The ratios are those of the
medians; the spans exported must be three per instrumented or raw-SDK operation. Times are the
calling thread's CPU time (the operation runs on it entirely: local qdrant, in-process
embeddings), which other processes on the machine do not disturb.
"""

from __future__ import annotations

import gc
import logging
import os
import statistics
import tempfile
import time
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from bench._harness import Comparison, interleaved, null_pipeline
from bench.raw_sdk import RawSdkMemoryTelemetry
from kaos_otel import MemoryScope, MemoryTier, catalog

PENDING = "pending (kaos_otel.instrumentation.mem0 not available)"
VARIANTS = ("instrumented", "uninstrumented", "raw_sdk")


def mem0_overhead(pairs: int) -> dict[str, Any] | str:
    """Per-operation time of ``add`` + ``search`` + ``delete``: instrumented, raw SDK, and neither."""
    os.environ.setdefault("MEM0_TELEMETRY", "False")
    try:
        from kaos_otel.instrumentation.mem0 import Mem0Instrumentor
        from kaos_otel.instrumentation.mem0.offline import offline_memory
    except ImportError as exc:
        return f"{PENDING}: {exc}"
    pipeline = null_pipeline("bench-mem0")
    manager, provider, exporter = pipeline.telemetry, pipeline.tracer_provider, pipeline.exporter
    raw_meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    raw = RawSdkMemoryTelemetry(provider.get_tracer("raw-sdk"), raw_meter_provider.get_meter("raw-sdk"))
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
        instrumentor.instrument(telemetry=manager)
        # the functions the instrumentor wrapped, called directly; and those inside raw-SDK telemetry
        wrapped = (memory_class.add, memory_class.search, memory_class.delete)
        originals = tuple(method.__wrapped__ for method in wrapped)
        operations = ("create_memory", "search_memory", "delete_memory")
        methods = {
            "instrumented": wrapped,
            "uninstrumented": originals,
            "raw_sdk": tuple(
                raw.traced(name, method) for name, method in zip(operations, originals, strict=True)
            ),
        }

        def operation(variant: str) -> float:
            """One timed operation in ``variant`` (one of :data:`VARIANTS`)."""
            nonlocal counter
            counter += 1
            user = f"user-{counter % 8}"
            add, search, delete = methods[variant]
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

        times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        try:
            for _ in range(10):  # warm up: model load, collection, every code path
                for variant in VARIANTS:
                    operation(variant)
            provider.force_flush()
            exporter.exported = 0
            # Mem0, its models and stores stay alive for the whole run: frozen out of the collector,
            # the per-operation collection below only walks what the operations left behind.
            gc.collect()
            gc.freeze()
            for i in range(pairs):
                shift = i % len(VARIANTS)  # rotate, so no variant always runs after another
                for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                    gc.collect()  # the previous operation's garbage is not collected on this one's clock
                    times[variant].append(operation(variant))
            provider.force_flush()
        finally:
            gc.unfreeze()
            instrumentor.uninstrument()
            pipeline.shutdown()
            raw_meter_provider.shutdown()
    median = {variant: statistics.median(values) for variant, values in times.items()}
    return {
        "operation": "add(infer=False) + search(top_k=3) + delete; in-memory qdrant, WordLlama",
        "instrumented_us": round(median["instrumented"], 1),
        "uninstrumented_us": round(median["uninstrumented"], 1),
        "raw_sdk_us": round(median["raw_sdk"], 1),
        "ratio": median["instrumented"] / median["uninstrumented"],
        "raw_sdk_ratio": median["raw_sdk"] / median["uninstrumented"],
        "ratio_vs_raw_sdk": median["instrumented"] / median["raw_sdk"],
        "pairs": pairs,
        "spans_exported": exporter.exported,
        "spans_expected": 2 * 3 * pairs,
    }


def memory_span_costs(n: int, reps: int) -> Comparison:
    """One ``memory_operation`` span (as the instrumentor makes it) vs the raw SDK doing the same.

    The raw variant (:class:`RawSdkMemoryTelemetry`) creates a CLIENT span with the same name and
    attributes and records the same two metric points on raw SDK instruments, in a tight loop
    (warm caches), unlike the in-place comparison of :func:`mem0_overhead`.
    """
    pipeline = null_pipeline("bench-mem0")
    manager = pipeline.telemetry
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    raw = RawSdkMemoryTelemetry(
        pipeline.tracer_provider.get_tracer("raw-sdk"), meter_provider.get_meter("raw-sdk")
    )

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
            with raw.call("search_memory", MemoryScope.USER, "user-1") as span:
                span.set_attribute(catalog.GEN_AI_MEMORY_RECORD_COUNT, 3)

    try:
        return interleaved({"raw_sdk": raw_sdk, "kaos": kaos}, baseline="raw_sdk", n=n, reps=reps)
    finally:
        pipeline.shutdown()
        meter_provider.shutdown()
