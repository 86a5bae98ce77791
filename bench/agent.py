"""An agent request end to end, with telemetry on and with ``OTEL_SDK_DISABLED=true``.

The request is the agent loop of the reference agent's shape, written with the domain helpers
(``invoke_agent`` > ``agent_step`` > ``chat`` model call over real local HTTP, then
``execute_tool``), against the scripted model of :mod:`bench._servers` running in its own
process and answering after a configurable latency. Three model calls, two tool calls, nine
spans (:data:`SPANS_PER_REQUEST`) and 23 metric points per request.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from bench._harness import percentile
from bench._servers import TOOL_SCRIPT, ServerProcess
from bench.raw_sdk import AgentLoopTelemetry, RawSdkAgentTelemetry
from kaos_otel import KaosOtelManager

AGENT = "bench-agent"
MODEL = "scripted"
TOOLS: dict[str, Callable[..., object]] = {
    "add": lambda a, b: a + b,
    "lookup": lambda query: f"Found 1 result for {query!r}: opens at 9:00.",
}
SPANS_PER_REQUEST = 3 * len(TOOL_SCRIPT) + 3
"""Spans of one request: ``invoke_agent``; per tool call the scripted model asks for, a step with
its ``chat`` and the ``execute_tool``; the last step with the ``chat`` that answers."""


class SimulatedAgent:
    """A tool-calling agent loop instrumented with the domain helpers (or their raw-SDK equivalents)."""

    def __init__(self, telemetry: AgentLoopTelemetry, client: httpx.AsyncClient, model_port: int) -> None:
        self._otel = telemetry
        self._client = client
        self._port = model_port
        self._url = f"http://127.0.0.1:{model_port}/v1/chat/completions"

    async def handle(self, task: str, conversation_id: str) -> str:
        """Run one request to its final answer."""
        otel = self._otel
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": task},
        ]
        with otel.invoke_agent(AGENT, conversation_id=conversation_id, max_steps=5) as run:
            for step in range(1, 6):
                with otel.agent_step(run, step):
                    with otel.model_call(
                        AGENT, MODEL, server_address="127.0.0.1", server_port=self._port
                    ) as call:
                        response = await self._client.post(
                            self._url, json={"model": MODEL, "messages": messages}
                        )
                        response.raise_for_status()
                        body = response.json()
                        choice = body["choices"][0]
                        usage = body["usage"]
                        call.record_usage(
                            usage["prompt_tokens"],
                            usage["completion_tokens"],
                            response_model=body["model"],
                            finish_reasons=[choice["finish_reason"]],
                        )
                        call.record_messages(messages, [choice["message"]])
                    message = choice["message"]
                    messages.append(message)
                    if not message.get("tool_calls"):
                        otel.record_window_tokens(AGENT, usage["total_tokens"])
                        return str(message["content"])
                    for tool_call in message["tool_calls"]:
                        name = tool_call["function"]["name"]
                        arguments = json.loads(tool_call["function"]["arguments"])
                        with otel.tool_call(AGENT, name, call_id=tool_call["id"], arguments=arguments):
                            result = TOOLS[name](**arguments)
                        messages.append(
                            {"role": "tool", "tool_call_id": tool_call["id"], "content": str(result)}
                        )
            return "step budget used up"


class RawSdkPipeline:
    """The raw SDK exporting over OTLP/gRPC as a plain SDK setup would (batch spans, periodic
    metrics), with the agent loop's telemetry on it."""

    def __init__(self, endpoint: str) -> None:
        self.tracer_provider = TracerProvider(resource=Resource.create({SERVICE_NAME: AGENT}))
        self.tracer_provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True))
        )
        self.meter_provider = MeterProvider(
            metric_readers=[
                PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint, insecure=True))
            ],
            resource=Resource.create({SERVICE_NAME: AGENT}),
        )
        self.telemetry = RawSdkAgentTelemetry(
            self.tracer_provider.get_tracer("raw-sdk"), self.meter_provider.get_meter("raw-sdk")
        )

    def shutdown(self) -> None:
        """Flush and stop both providers."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@dataclass
class LatencySamples:
    """Request latencies (wall ms) and request-thread CPU times (ms) per mode."""

    by_mode: dict[str, list[float]] = field(default_factory=dict)
    cpu_by_mode: dict[str, list[float]] = field(default_factory=dict)

    def add(self, mode: str, ms: float, cpu_ms: float = float("nan")) -> None:
        """Record one request."""
        self.by_mode.setdefault(mode, []).append(ms)
        self.cpu_by_mode.setdefault(mode, []).append(cpu_ms)

    def stats(self, mode: str) -> dict[str, float]:
        """p50, p90, p99 and mean latency, and the median CPU time, of one mode."""
        values = self.by_mode[mode]
        return {
            "n": len(values),
            "p50_ms": round(percentile(values, 50), 3),
            "p90_ms": round(percentile(values, 90), 3),
            "p99_ms": round(percentile(values, 99), 3),
            "mean_ms": round(statistics.fmean(values), 3),
            "cpu_ms": round(statistics.median(self.cpu_by_mode[mode]), 3),
        }


Request = Callable[[int], Awaitable[object]]


async def timed(samples: LatencySamples, mode: str, request: Awaitable[object]) -> None:
    """Await ``request`` and record its latency and the CPU time of this thread meanwhile."""
    cpu = time.thread_time()
    start = time.perf_counter()
    await request
    elapsed = time.perf_counter() - start
    samples.add(mode, elapsed * 1000, (time.thread_time() - cpu) * 1000)


async def alternate(requests: Mapping[str, Request], pairs: int, warmup: int = 3) -> LatencySamples:
    """Time requests of each mode in rotation (ABBA order for two), ``pairs`` per mode."""
    samples = LatencySamples()
    names = list(requests)
    for i in range(warmup):
        for name in names:
            await requests[name](i)
    for i in range(pairs):
        shift = i % len(names)  # rotate (ABBA for two modes): no mode always runs after another
        for name in names[shift:] + names[:shift]:
            await timed(samples, name, requests[name](i))
    return samples


def telemetry_on(endpoint: str, **overrides: Any) -> KaosOtelManager:
    """A private manager exporting over OTLP/gRPC to ``endpoint`` (defaults otherwise)."""
    manager = KaosOtelManager(
        AGENT, endpoint=endpoint, global_providers=False, bridge_logging=False, **overrides
    )
    manager.register_known_names(AGENT, tools=TOOLS, models=[MODEL])
    return manager


def telemetry_disabled() -> KaosOtelManager:
    """A manager configured by ``OTEL_SDK_DISABLED=true``."""
    manager = KaosOtelManager(AGENT, global_providers=False, disabled=True)
    manager.register_known_names(AGENT, tools=TOOLS, models=[MODEL])
    return manager


def agent_overhead(pairs: int, model_latency_s: float) -> dict[str, Any]:
    """Agent request latency with telemetry on, with the raw SDK recording the same (both
    exporting to a receiver process), and with telemetry disabled."""
    with (
        ServerProcess("model", "--latency", str(model_latency_s)) as model,
        ServerProcess("receiver") as receiver,
    ):
        on = telemetry_on(receiver.endpoint)
        off = telemetry_disabled()
        raw = RawSdkPipeline(receiver.endpoint)

        async def run() -> LatencySamples:
            async with httpx.AsyncClient(timeout=30) as client:
                agents = {
                    "on": SimulatedAgent(on, client, model.port),
                    "off": SimulatedAgent(off, client, model.port),
                    "raw_sdk": SimulatedAgent(raw.telemetry, client, model.port),
                }

                def request(agent: SimulatedAgent) -> Request:
                    return lambda i: agent.handle(f"What is 2 + 3? ({i})", f"conv-{i}")

                return await alternate({name: request(agent) for name, agent in agents.items()}, pairs)

        try:
            samples = asyncio.run(run())
            on.force_flush(timeout=10)
            raw.tracer_provider.force_flush(10_000)
            exported = receiver.span_count()  # both exporting modes'
        finally:
            on.shutdown(timeout=5)
            raw.shutdown()
    on_stats, off_stats, raw_stats = samples.stats("on"), samples.stats("off"), samples.stats("raw_sdk")
    return {
        "agent": "simulated (domain helpers over HTTP to a scripted model process)",
        "model_latency_ms": model_latency_s * 1000,
        "spans_per_request": SPANS_PER_REQUEST,
        "on": on_stats,
        "off": off_stats,
        "raw_sdk": raw_stats,
        "ratio": on_stats["p50_ms"] / off_stats["p50_ms"],
        "raw_sdk_ratio": raw_stats["p50_ms"] / off_stats["p50_ms"],
        "added_ms_p50": round(on_stats["p50_ms"] - off_stats["p50_ms"], 3),
        "cpu_added_ms": round(on_stats["cpu_ms"] - off_stats["cpu_ms"], 3),
        "raw_sdk_cpu_added_ms": round(raw_stats["cpu_ms"] - off_stats["cpu_ms"], 3),
        "spans_exported": exported,
        "dropped": on.health.dropped(),
    }
