"""A request to the reference agent (``instrumented_agent``), with telemetry on and disabled.

Two processes of the same reference agent (the researcher: a scripted model call, an MCP
``echo`` tool call, a second model call and the answer) serve side by side: one exporting over
OTLP/gRPC to a receiver process, one started with ``OTEL_SDK_DISABLED=true``. They share the
scripted model process (answering after a realistic latency) and the MCP server. Requests go to
the two agents in alternation (ABBA) from this process, over HTTP, as a client would send them.
Besides latency, the CPU time each agent process spends over the run per request
(``/proc/<pid>/stat``: all of its threads, the export thread included) is compared.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench._servers import ServerProcess
from bench.agent import LatencySamples, timed

SPAN_SCHEDULE_DELAY_S = 5.0
"""The telemetry-on agent's span batch delay: the SDK's default (no ``OTEL_*`` variable is passed on)."""


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reference_agent_overhead(pairs: int, model_latency_s: float) -> dict[str, Any]:
    """Latency and agent-process CPU per request, telemetry on vs disabled."""
    from instrumented_agent.supervisor import ServiceSpec, Supervisor
    from instrumented_agent.system import agent_spec

    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KAOS_"))}
    disabled_env = {**base_env, "OTEL_SDK_DISABLED": "true"}
    with (
        tempfile.TemporaryDirectory(prefix="kaos-bench-agent-") as workdir,
        ServerProcess("receiver") as receiver,
    ):
        on_dir, off_dir = Path(workdir, "on"), Path(workdir, "off")
        on_dir.mkdir()
        off_dir.mkdir()
        on_env = {
            **base_env,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        }
        with Supervisor(off_dir, env=disabled_env) as shared, Supervisor(on_dir, env=on_env) as telemetry:
            latency_ms = f"{model_latency_s * 1000:g}"
            model = shared.spawn(ServiceSpec("model", ["model", "--latency-ms", latency_ms]))
            echo = shared.spawn(ServiceSpec("mcp-echo", ["mcp", "echo"]))
            off = shared.spawn(agent_spec("researcher", model, mcp=[echo]))
            on = telemetry.spawn(agent_spec("researcher", model, mcp=[echo]))
            shared.wait_ready([model, echo, off])
            telemetry.wait_ready([on])
            pids = {"on": on.pid, "off": off.pid}
            cpu_before = {mode: _process_cpu_s(pid) for mode, pid in pids.items()}
            samples = asyncio.run(_alternate({"on": on.url, "off": off.url}, pairs))
            # let the last span batch leave the telemetry-on agent, then read both processes' CPU
            _wait_for_last_batch(receiver, SPAN_SCHEDULE_DELAY_S + 2)
            cpu = {mode: _process_cpu_s(pid) - cpu_before[mode] for mode, pid in pids.items()}
            exported = receiver.span_count()
    on_stats, off_stats = samples.stats("on"), samples.stats("off")
    return {
        "agent": "the instrumented_agent researcher (model call, MCP echo tool call, model call)",
        "model_latency_ms": model_latency_s * 1000,
        "on": on_stats,
        "off": off_stats,
        "ratio": on_stats["p50_ms"] / off_stats["p50_ms"],
        "added_ms_p50": round(on_stats["p50_ms"] - off_stats["p50_ms"], 3),
        "agent_cpu_ms_per_request": {
            mode: round(seconds * 1000 / (pairs + 3), 3) for mode, seconds in cpu.items()
        },
        "spans_exported": exported,
    }


def _wait_for_last_batch(receiver: ServerProcess, timeout_s: float) -> None:
    """Wait until more spans arrive (a batch queued when the requests ended goes out within one
    batch delay) and their count settles, or ``timeout_s`` passes (nothing was left to send)."""
    if not receiver.wait_for_spans(receiver.span_count() + 1, timeout_s):
        return
    count = -1
    while (now := receiver.span_count()) != count:  # a batch may go out as several requests
        count = now
        time.sleep(0.5)


async def _alternate(urls: dict[str, str], pairs: int) -> LatencySamples:
    samples = LatencySamples()
    body = {"model": "researcher", "messages": [{"role": "user", "content": "Find the opening hours."}]}
    async with httpx.AsyncClient(timeout=60, trust_env=False) as client:

        async def request(mode: str) -> None:
            response = await client.post(f"{urls[mode]}/v1/chat/completions", json=body)
            response.raise_for_status()

        for _ in range(3):  # warm up both agents
            for mode in urls:
                await request(mode)
        names = list(urls)
        for i in range(pairs):
            for mode in names if i % 2 == 0 else names[::-1]:
                await timed(samples, mode, request(mode))
    return samples
