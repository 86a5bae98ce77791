"""Capacity of one gateway collector, and what the agent tier costs, measured with telemetrygen.

``python -m bench.gateway [--seconds 20] [--agent-rate 5000]`` prints the figures as JSON.

Needs the collector (``bash collector/build.sh``) and telemetrygen, the collector project's load
generator at the same release (``bash collector/build.sh telemetrygen``, run by this module).

1. **Gateway, load steps**: telemetrygen (4 workers) sends agent-like spans (the attributes our
   agents set, a 200-character string for the redaction patterns to scan) at each ``--rates``
   step to one gateway running the production configuration plus tail sampling (``otelcol-config.yaml`` +
   ``otelcol-gateway.yaml``; exporters ``debug``, so no backend limits it). Figures per step: spans/s
   the gateway accepted and refused, and its CPU time per span, which gives spans/s per core
   independently of how busy the shared machine was (the load generator shares the machine, so
   the highest step it reaches is a floor, not the gateway's limit).
2. **Agent tier at a fixed rate**: telemetrygen -> agent-tier collector (``otelcol-agent.yaml``,
   ``load_balancing`` by trace id) -> the gateway, at ``--agent-rate`` spans/s. Figure: the agent
   tier's CPU time per span (and per second at that rate).

CPU times come from ``/proc/<pid>/stat`` (user + system) of each collector process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench._harness import machine_facts
from bench.collector import closed_port as free_port

REPO = Path(__file__).resolve().parents[1]
COLLECTOR = REPO / "collector"
SPAN_ATTRIBUTES = {
    "gen_ai.operation.name": "chat",
    "gen_ai.agent.name": "coordinator",
    "gen_ai.request.model": "scripted-model",
    "gen_ai.provider.name": "openai",
    "kaos.outcome": "success",
    "app.note": "the user asked about the opening hours of the library " * 4,
}
"""Attributes of every generated span: those of an agent's model-call span, and some text."""
CHILD_SPANS = 6
"""Children per trace: with the root, 7 spans per trace, as a small agent request."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric_total(url: str, name: str) -> float:
    """Sum of every sample of counter ``name`` (with or without ``_total``) at a Prometheus endpoint."""
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:_total)?(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(body))


@dataclass
class Collector:
    """A running collector and the URL of its own metrics."""

    process: subprocess.Popen[bytes]
    telemetry_url: str
    otlp: str

    def cpu(self) -> float:
        return cpu_seconds(self.process.pid)

    def accepted_spans(self) -> float:
        return metric_total(self.telemetry_url, "otelcol_receiver_accepted_spans")

    def refused_spans(self) -> float:
        return metric_total(self.telemetry_url, "otelcol_receiver_refused_spans")


@contextmanager
def collector(configs: list[Path], env: Mapping[str, str], log: Path) -> Iterator[Collector]:
    """Run the built collector with ``configs``; wait for its health check; stop it by PID."""
    binary = os.environ.get("KAOS_OTELCOL_BIN", str(COLLECTOR / "_build" / "kaos-otelcol"))
    grpc, http, health, telemetry = (free_port() for _ in range(4))
    full_env = {
        "PATH": os.environ.get("PATH", ""),
        "OTELCOL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc}",
        "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http}",
        "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{health}",
        "OTELCOL_TELEMETRY_PORT": str(telemetry),
        "OTELCOL_PROMETHEUS_ENDPOINT": f"127.0.0.1:{free_port()}",
        **env,
    }
    args = [binary] + [a for c in configs for a in ("--config", str(c))]
    with log.open("wb") as out:
        process = subprocess.Popen(args, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"collector did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield Collector(process, f"http://127.0.0.1:{telemetry}/metrics", f"127.0.0.1:{grpc}")
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def telemetrygen_binary() -> str:
    done = subprocess.run(
        ["bash", str(COLLECTOR / "build.sh"), "telemetrygen"], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def generate(telemetrygen: str, endpoint: str, seconds: float, spans_per_s: float, workers: int) -> None:
    """telemetrygen traces to ``endpoint``, ``spans_per_s`` in all, from ``workers`` workers."""
    args = [
        telemetrygen,
        "traces",
        "--otlp-endpoint",
        endpoint,
        "--otlp-insecure",
        "--duration",
        f"{seconds}s",
        "--workers",
        str(workers),
        "--rate",  # per worker; telemetrygen paces every span, children included
        str(spans_per_s / workers),
        "--child-spans",
        str(CHILD_SPANS),
        "--service",
        "bench-agent",
    ]
    for key, value in SPAN_ATTRIBUTES.items():
        args += ["--telemetry-attributes", f'{key}="{value}"']
    subprocess.run(args, capture_output=True, check=True, timeout=seconds + 120)


@dataclass(frozen=True)
class Window:
    """Spans a collector accepted and CPU it used over one load run."""

    spans: float
    refused: float
    cpu_s: float
    wall_s: float

    def as_json(self) -> dict[str, float]:
        return {
            "spans": self.spans,
            "refused": self.refused,
            "spans_per_s": round(self.spans / self.wall_s),
            "cpu_us_per_span": round(1e6 * self.cpu_s / self.spans, 2) if self.spans else 0.0,
            "cores_used": round(self.cpu_s / self.wall_s, 2),
            "spans_per_s_per_core": round(self.spans / self.cpu_s) if self.cpu_s else 0.0,
        }


def measure(target: Collector, run: Callable[[], None]) -> Window:
    """Accepted spans and CPU of ``target`` while ``run()`` generates load (then it settles)."""
    spans, refused, cpu = target.accepted_spans(), target.refused_spans(), target.cpu()
    start = time.monotonic()
    run()
    wall = time.monotonic() - start
    return Window(target.accepted_spans() - spans, target.refused_spans() - refused, target.cpu() - cpu, wall)


def run(seconds: float, rates: list[float], agent_rate: float) -> dict[str, Any]:
    """Every load step against one gateway, then the agent tier at ``agent_rate``."""
    telemetrygen = telemetrygen_binary()
    facts = machine_facts()
    gateway_env = {
        "KAOS_TRACES_EXPORTERS": "[debug]",
        "KAOS_METRICS_EXPORTERS": "[debug]",
        "KAOS_LOGS_EXPORTERS": "[debug]",
        "OTELCOL_MEMORY_LIMIT_MIB": "1024",
        "KAOS_TAIL_WAIT_AFTER_ROOT": "2s",
        "KAOS_TAIL_DECISION_WAIT": "10s",
    }
    results: dict[str, Any] = {"machine": facts, "seconds": seconds, "spans_per_trace": CHILD_SPANS + 1}
    with tempfile.TemporaryDirectory(prefix="kaos-bench-gateway-") as tmp:
        work = Path(tmp)
        gateway_configs = [COLLECTOR / "otelcol-config.yaml", COLLECTOR / "otelcol-gateway.yaml"]
        with collector(gateway_configs, gateway_env, work / "gateway.log") as gateway:
            steps = []
            for rate in rates:
                window = measure(gateway, partial(generate, telemetrygen, gateway.otlp, seconds, rate, 4))
                steps.append({"offered_spans_per_s": rate, **window.as_json()})
            results["gateway_steps"] = steps
            agent_env = {"KAOS_GATEWAYS": f"[{gateway.otlp}]"}
            with collector([COLLECTOR / "otelcol-agent.yaml"], agent_env, work / "agent.log") as agent:
                spans_before, cpu_before = gateway.accepted_spans(), gateway.cpu()
                agent_window = measure(
                    agent, partial(generate, telemetrygen, agent.otlp, seconds, agent_rate, 2)
                )
                gateway_spans = max(1.0, gateway.accepted_spans() - spans_before)
                results["agent_tier"] = {
                    "offered_spans_per_s": agent_rate,
                    **agent_window.as_json(),
                    "gateway_cpu_us_per_span_at_this_rate": round(
                        1e6 * (gateway.cpu() - cpu_before) / gateway_spans, 2
                    ),
                }
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each load run")
    parser.add_argument(
        "--rates",
        default="2000,5000,10000,20000",
        help="spans/s offered to the gateway, one load run each (comma-separated)",
    )
    parser.add_argument("--agent-rate", type=float, default=5000.0, help="spans/s offered to the agent tier")
    args = parser.parse_args(argv)
    rates = [float(rate) for rate in args.rates.split(",") if rate.strip()]
    results = run(args.seconds, rates, args.agent_rate)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
