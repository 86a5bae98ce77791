"""The export path: collector down (latency, memory, counted loss) and throughput to a receiver."""

from __future__ import annotations

import asyncio
import gc
import socket
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import httpx
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from bench._harness import rss_bytes
from bench._servers import ServerProcess
from bench.agent import LatencySamples, SimulatedAgent, telemetry_on, timed
from kaos_otel import KaosOtelManager

SPAN_ATTRIBUTES: dict[str, Any] = {
    "app.route": "/chat",
    "app.attempt": 1,
    "app.note": "x" * 200,
}
"""Attributes of the spans pushed through the export path (about 300 bytes of values)."""


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _queue_length(manager: KaosOtelManager) -> int:
    """Spans waiting in the manager's batch queue."""
    return manager.queued("traces")


def collector_down_latency(
    blocks: int, requests_per_block: int, model_latency_s: float, queue_size: int
) -> dict[str, Any]:
    """Agent request latency with the collector down vs up, in alternating blocks.

    Each block builds a fresh manager exporting over OTLP/gRPC either to a receiver process
    (up) or to a closed port (down), warms it up until the down manager's queue is full (so
    every later span end takes the queue-full path), times ``requests_per_block`` requests and
    shuts the manager down with a deadline.
    """
    samples = LatencySamples()
    shutdown_s: dict[str, list[float]] = {"up": [], "down": []}
    dropped: dict[str, int] = {"up": 0, "down": 0}
    down_endpoint = f"http://127.0.0.1:{closed_port()}"
    warmup = queue_size // 8 + 5
    with (
        ServerProcess("model", "--latency", str(model_latency_s)) as model,
        ServerProcess("receiver") as receiver,
    ):

        async def block(mode: str) -> None:
            endpoint = receiver.endpoint if mode == "up" else down_endpoint
            manager = telemetry_on(endpoint, span_max_queue_size=queue_size, export_timeout_s=2)
            try:
                async with httpx.AsyncClient(timeout=30) as client:
                    agent = SimulatedAgent(manager, client, model.port)
                    for i in range(warmup):
                        await agent.handle(f"warm up {i}", f"warm-{i}")
                    for i in range(requests_per_block):
                        await timed(samples, mode, agent.handle(f"What is 2 + 3? ({i})", f"conv-{i}"))
            finally:
                start = time.perf_counter()
                manager.shutdown(timeout=2)
                shutdown_s[mode].append(time.perf_counter() - start)
                dropped[mode] += manager.health.dropped("traces")

        for i in range(blocks):
            for mode in ("up", "down") if i % 2 == 0 else ("down", "up"):
                asyncio.run(block(mode))
    up, down = samples.stats("up"), samples.stats("down")
    return {
        "model_latency_ms": model_latency_s * 1000,
        "span_max_queue_size": queue_size,
        "up": up,
        "down": down,
        "p50_ratio": down["p50_ms"] / up["p50_ms"],
        "p99_ratio": down["p99_ms"] / up["p99_ms"],
        "shutdown_max_s": {mode: round(max(values), 3) for mode, values in shutdown_s.items()},
        "spans_dropped_counted": dropped,
    }


def _live_spans() -> int:
    """SDK span objects still alive (after a collection)."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, ReadableSpan))


def memory_with_collector_down(spans: int, queue_size: int) -> dict[str, Any]:
    """Memory held by the pipeline while ``spans`` spans are made with the collector down.

    First the bound itself: the Python memory (tracemalloc) held once the queue is full, with
    ``2 x queue`` spans made. tracemalloc slows allocation-heavy code many times over, so the
    rest of the run is watched without it: resident memory (RSS) and the number of span objects
    alive at checkpoints up to ``spans``. After a shutdown that lets the queued spans fail their
    export, the loss counted by the telemetry-health counters is compared with the spans made.
    """
    manager = KaosOtelManager(
        "bench-memory",
        endpoint=f"http://127.0.0.1:{closed_port()}",
        span_max_queue_size=queue_size,
        export_timeout_s=2,
        global_providers=False,
        bridge_logging=False,
    )
    made = 0

    def make(until: int) -> None:
        nonlocal made
        while made < until:
            with manager.span("memory-probe", attributes=SPAN_ATTRIBUTES):
                pass
            made += 1

    gc.collect()
    base_rss = rss_bytes()
    tracemalloc.start()
    base_traced = tracemalloc.get_traced_memory()[0]
    make(2 * queue_size)
    gc.collect()
    held_when_full = tracemalloc.get_traced_memory()[0] - base_traced
    tracemalloc.stop()
    checkpoints: dict[str, dict[str, float]] = {}
    for checkpoint in sorted({spans // 10, spans // 4, spans // 2, spans}):
        make(checkpoint)
        checkpoints[str(checkpoint)] = {
            "rss_growth_mb": round((rss_bytes() - base_rss) / 2**20, 2),
            "live_spans": _live_spans(),
            "queued": _queue_length(manager),
        }
    counted_before_shutdown = manager.health.dropped("traces")
    shutdown_start = time.perf_counter()
    finished = manager.shutdown(timeout=30)
    shutdown_s = time.perf_counter() - shutdown_start
    counted = manager.health.dropped("traces")
    per_span = held_when_full / queue_size
    live = [point["live_spans"] for point in checkpoints.values()]
    return {
        "spans": spans,
        "span_max_queue_size": queue_size,
        "held_when_queue_full_mb": round(held_when_full / 2**20, 2),
        "per_queued_span_kb": round(per_span / 1024, 2),
        "unbounded_equivalent_mb": round(per_span * spans / 2**20, 1),
        "checkpoints": checkpoints,
        "max_live_spans": max(live),
        "bounded": max(live) <= queue_size + 3 * min(512, queue_size),
        "lost_counted_before_shutdown": counted_before_shutdown,
        "lost_counted": counted,
        "lost_by_reason": {
            f"{sig}/{reason}": n for (sig, reason), n in manager.health.snapshot().items() if sig == "traces"
        },
        "all_loss_counted": counted == spans,
        "shutdown_s": round(shutdown_s, 3),
        "shutdown_finished": finished,
    }


def _raw_sdk_queue(provider: object) -> Any:
    """The batch queue of the raw SDK's first batch processor (SDK internals: bench code only)."""
    active = getattr(provider, "_active_span_processor", None)
    for processor in getattr(active, "_span_processors", ()):
        queue = getattr(getattr(processor, "_batch_processor", None), "_queue", None)
        if queue is not None:
            return queue
    raise RuntimeError("no batch span processor found")


def _push(
    make_span: Callable[[], None],
    queued: Callable[[], int],
    flush: Callable[[], object],
    spans: int,
    receiver: ServerProcess,
    queue_size: int,
) -> dict[str, Any]:
    """Make ``spans`` spans with back-pressure on the queue and wait until all are received."""
    high_water = queue_size - 256
    receiver.command("clear")
    start = time.perf_counter()
    made = 0
    while made < spans:
        while queued() > high_water:
            time.sleep(0.001)
        count = min(128, spans - made)
        for _ in range(count):
            make_span()
        made += count
    flush()
    complete = receiver.wait_for_spans(spans, timeout_s=60)
    elapsed = time.perf_counter() - start
    received = receiver.span_count()
    return {"received": received, "complete": complete, "spans_per_s": round(received / elapsed)}


def throughput(spans: int, rounds: int) -> dict[str, Any]:
    """Spans per second through the whole pipeline to a receiver process, without drops.

    The producer makes spans as fast as it can but waits while the batch queue is near
    capacity (so nothing is dropped); the rate is spans made divided by the time until the
    receiver holds all of them. The raw SDK (BatchSpanProcessor into the OTLP/gRPC exporter)
    is measured the same way, alternating with kaos-otel for ``rounds`` rounds (median rates,
    and the median of the ratios within a round); kaos-otel adds the content cleaning of every
    exported string on the export thread.
    """
    queue_size = 2048
    kaos_rates: list[int] = []
    raw_rates: list[int] = []
    complete = {"kaos": True, "raw_sdk": True}  # a round cut short by the wait's timeout reads slow
    dropped = 0
    with ServerProcess("receiver") as receiver:
        for i in range(rounds):
            manager = telemetry_on(
                receiver.endpoint, span_max_queue_size=queue_size, span_schedule_delay_ms=200
            )
            raw_provider = TracerProvider()
            raw_provider.add_span_processor(
                BatchSpanProcessor(
                    OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True),
                    max_queue_size=queue_size,
                    schedule_delay_millis=200,
                )
            )
            raw = raw_provider.get_tracer("raw-sdk")

            def kaos_span(manager: KaosOtelManager = manager) -> None:
                with manager.span("throughput", attributes=SPAN_ATTRIBUTES):
                    pass

            def raw_span(raw: Any = raw) -> None:
                with raw.start_as_current_span("throughput", attributes=SPAN_ATTRIBUTES):
                    pass

            def run_kaos(manager: KaosOtelManager = manager) -> None:
                result = _push(
                    kaos_span,
                    lambda: manager.queued("traces"),
                    lambda: manager.force_flush(timeout=30),
                    spans,
                    receiver,
                    queue_size,
                )
                kaos_rates.append(result["spans_per_s"])
                complete["kaos"] = complete["kaos"] and result["complete"]

            def run_raw(raw_provider: TracerProvider = raw_provider) -> None:
                raw_queue = _raw_sdk_queue(raw_provider)
                result = _push(
                    raw_span,
                    lambda: len(raw_queue),
                    lambda: raw_provider.force_flush(30_000),
                    spans,
                    receiver,
                    queue_size,
                )
                raw_rates.append(result["spans_per_s"])
                complete["raw_sdk"] = complete["raw_sdk"] and result["complete"]

            try:
                for run in (run_kaos, run_raw) if i % 2 == 0 else (run_raw, run_kaos):
                    run()
            finally:
                manager.shutdown(timeout=5)
                raw_provider.shutdown()
            dropped += manager.health.dropped("traces")
    kaos_rate, raw_rate = statistics.median(kaos_rates), statistics.median(raw_rates)
    # each round's two runs are adjacent in time: the ratio within a round shares its conditions
    ratio = statistics.median(k / r for k, r in zip(kaos_rates, raw_rates, strict=True))
    return {
        "spans_per_round": spans,
        "rounds": rounds,
        "spans_per_s": round(kaos_rate),
        "all_received": complete["kaos"],
        "dropped": dropped,
        "raw_sdk_spans_per_s": round(raw_rate),
        "raw_sdk_all_received": complete["raw_sdk"],
        "ratio_to_raw_sdk": round(ratio, 3),
        "samples": {"kaos": kaos_rates, "raw_sdk": raw_rates},
    }
