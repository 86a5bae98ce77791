"""``kaos-agent demo``: run the reference system locally and show its traces and metrics.

``kaos-agent demo --duration SECONDS [--rate RPS] [--fault NAME[@START[-END]]]...`` keeps a steady
stream of user requests going instead (:mod:`instrumented_agent.live`), exports metrics every 2 s
and switches the named faults on and off mid-run, so dashboards fill and alerts fire.

Its agents remember (short- and medium-term memory in a SQLite file in the work dir), so the trees
show memory spans too. Telemetry goes to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set; otherwise
to a receiver inside the demo that writes OTLP JSON lines to a file (``kaos-otel traces show FILE``
renders it later).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import httpx

from instrumented_agent import config
from instrumented_agent.config import USER_ID_HEADER
from instrumented_agent.faults import ENV_FAULTS_FILE, FaultSwitch
from instrumented_agent.live import LiveReport, LiveTraffic, describe, run_live
from instrumented_agent.server import TRACE_ID_HEADER
from instrumented_agent.supervisor import StartupError, Supervisor
from instrumented_agent.system import System, otlp_env, start_system
from kaos_otel import catalog, render_trace_trees
from kaos_otel.receiver import OtlpReceiver, ReceivedMetricPoint, ReceivedSpan

__all__ = ["SCENARIOS", "Scenario", "ScenarioResult", "request_counts", "run_demo", "run_scenario"]

DEMO_USER = "demo-user"
EXIT_OK, EXIT_SCENARIO_FAILED, EXIT_STARTUP_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 130
_REQUEST_TIMEOUT_S = 90.0
"""Above an agent's default runtime budget (60 s), so its own budget error is what comes back."""


@dataclass(frozen=True)
class Scenario:
    """A request to the coordinator and what a correct system answers."""

    name: str
    prompt: str
    expected_status: int
    expected_fragments: tuple[str, ...]


SCENARIOS: dict[str, Scenario] = {
    "research": Scenario(
        "research",
        "Research the AI chip market and add the market shares of the top two vendors: 45 and 30.",
        200,
        ("Search results: echo: Find sources on the AI chip market.", "The sum of 45 and 30 is 75."),
    ),
    "failure": Scenario(
        "failure",
        "We are testing exception tracking: delegate this task to the non-existent agent ghost.",
        502,
        ("unknown agent 'ghost'",),
    ),
}


@dataclass(frozen=True)
class ScenarioResult:
    """What the coordinator answered for one scenario."""

    name: str
    status_code: int
    text: str
    trace_id: str | None
    duration_s: float
    ok: bool


def run_scenario(
    coordinator_url: str, scenario: Scenario, timeout_s: float = _REQUEST_TIMEOUT_S
) -> ScenarioResult:
    """Send the scenario's prompt to the coordinator and check the answer (or error message).

    No answer in ``timeout_s`` seconds, a broken connection or an answer that is not the API's JSON
    is a failed scenario (status 0 when there was no answer), not an exception.
    """
    body = {"model": "coordinator", "messages": [{"role": "user", "content": scenario.prompt}]}
    started = time.perf_counter()
    try:
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            response = client.post(
                f"{coordinator_url}/v1/chat/completions", json=body, headers={USER_ID_HEADER: DEMO_USER}
            )
    except httpx.HTTPError as exc:
        reason = f"no answer from the coordinator: {type(exc).__name__}: {exc}"
        return ScenarioResult(scenario.name, 0, reason, None, time.perf_counter() - started, False)
    duration = time.perf_counter() - started
    text = _answer_text(response)
    ok = response.status_code == scenario.expected_status and all(
        f in text for f in scenario.expected_fragments
    )
    return ScenarioResult(
        scenario.name, response.status_code, text, response.headers.get(TRACE_ID_HEADER), duration, ok
    )


def _answer_text(response: httpx.Response) -> str:
    """The answer of a 200, the error message otherwise; the raw body if it is not the API's JSON."""
    try:
        payload = response.json()
        if response.status_code == 200:
            return str(payload["choices"][0]["message"]["content"])
        return str(payload["error"]["message"])
    except (ValueError, LookupError, TypeError):
        return response.text


def request_counts(points: Sequence[ReceivedMetricPoint]) -> dict[tuple[str, str], int]:
    """``kaos.requests`` totals by (agent, outcome), from the latest cumulative point of each series."""
    latest: dict[tuple[str, str, str, str], ReceivedMetricPoint] = {}
    for point in points:
        if point.name != catalog.KAOS_REQUESTS:
            continue
        agent = str(point.attributes.get(catalog.GEN_AI_AGENT_NAME, "?"))
        outcome = str(point.attributes.get(catalog.KAOS_OUTCOME, "?"))
        key = (point.service_name, agent, outcome, str(point.start_time_unix_nano))
        if key not in latest or point.time_unix_nano >= latest[key].time_unix_nano:
            latest[key] = point
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for (_, agent, outcome, _), point in latest.items():
        totals[agent, outcome] += int(point.value or 0)
    return dict(sorted(totals.items()))


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C, so the same cleanup runs."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _default_workdir() -> Path:
    return Path(".kaos") / "demo" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


class _Output:
    """Human-readable progress on stdout, or on stderr when stdout carries the JSON summary."""

    def __init__(self, json_mode: bool) -> None:
        self.stream: TextIO = sys.stderr if json_mode else sys.stdout

    def say(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)


def run_demo(
    scenario_names: Sequence[str],
    *,
    json_mode: bool = False,
    workdir: Path | None = None,
    startup_timeout_s: float = 40.0,
    model_latency_ms: float = 0.0,
    live: LiveTraffic | None = None,
) -> int:
    """Start the system, run the scenarios (or ``live`` traffic), stop everything and report.

    Returns the exit code.
    """
    out = _Output(json_mode)
    workdir = (workdir or _default_workdir()).resolve()
    telemetry_file = workdir / "telemetry.otlp.jsonl"
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        telemetry_file.unlink(missing_ok=True)  # the receiver appends: a reused workdir's old run
    except OSError as exc:
        print(f"kaos-agent demo: error: cannot use {workdir}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_STARTUP_FAILED
    env = _system_env(os.environ)
    switch = FaultSwitch(workdir / "faults.json")
    if live is not None:
        if (missing := _missing_live_memory()) is not None:
            print(f"kaos-agent demo: warning: {missing}", file=sys.stderr)
        env[ENV_FAULTS_FILE] = str(switch.path)
        env.setdefault("OTEL_METRIC_EXPORT_INTERVAL", str(LIVE_METRIC_INTERVAL_MS))
    external = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    receiver: OtlpReceiver | None = None
    if not external:
        receiver = OtlpReceiver(json_path=telemetry_file).start()
        env = otlp_env(receiver.grpc_endpoint, env)
    results: list[ScenarioResult] = []
    report: LiveReport | None = None
    supervisor = Supervisor(workdir, env=env, startup_timeout_s=startup_timeout_s)
    try:
        with _sigterm_as_interrupt(), supervisor:
            out.say(f"Starting the scripted model, 2 MCP servers and 3 agents (logs in {workdir})")
            agent_args = _memory_args(workdir) + (_LIVE_AGENT_ARGS if live is not None else [])
            system = start_system(supervisor, model_latency_ms=model_latency_ms, agent_args=agent_args)
            for service in system.services.values():
                out.say(f"  {service.name:<15} {service.url}  pid {service.pid}")
            if live is not None:
                out.say(
                    f"\nSending {live.rate_rps:g} requests/s for {live.duration_s:g} s "
                    f"({describe(live.faults)})"
                )
                report = run_live(system.coordinator_url, live, switch, out.say)
            for name in scenario_names if live is None else ():
                result = run_scenario(system.coordinator_url, SCENARIOS[name])
                results.append(result)
                _report_scenario(out, result)
            out.say("Stopping all processes (they flush their telemetry on the way out)")
    except StartupError as exc:
        print(f"kaos-agent demo: error: {exc}", file=sys.stderr)
        if exc.log_tail:
            print(f"--- last lines of {exc.name}'s log ---\n{exc.log_tail}", file=sys.stderr)
        return EXIT_STARTUP_FAILED
    except KeyboardInterrupt:
        return _interrupted()
    finally:
        if receiver is not None:
            receiver.stop()
    # Ctrl-C can come at any moment, also once every process has stopped and the report is printed
    try:
        spans = receiver.spans() if receiver is not None else []
        points = receiver.metric_points() if receiver is not None else []
        summary = _summary(results, spans, points, system, receiver is not None, telemetry_file, external)
        if report is not None:
            summary["live"] = report.as_json()
            summary["ok"] = report.by_status[200] > 0
        if json_mode:
            print(json.dumps(summary, indent=2))
        else:
            if report is not None:
                statuses = ", ".join(f"HTTP {k}: {v}" for k, v in sorted(report.by_status.items()))
                out.say(f"\nLive traffic: {report.sent} requests ({statuses})")
                if report.failed_streams:
                    out.say(f"  of the streams answered 200, {report.failed_streams} ended in an error event")
                out.say(f"A research trace from before the faults: {report.research_trace_id or '?'}")
            ids = [r.trace_id for r in results] + [report.research_trace_id if report else None]
            shown = {trace_id for trace_id in ids if trace_id}
            _report_telemetry(out, shown, spans, points, telemetry_file, external)
    except KeyboardInterrupt:
        return _interrupted()
    return EXIT_OK if summary["ok"] else EXIT_SCENARIO_FAILED


_SYSTEM_SETTINGS = frozenset(
    [getattr(config, name) for name in config.__all__ if name.startswith("ENV_")] + [ENV_FAULTS_FILE]
)
"""Variables that configure an agent or the demo's faults: the demo sets up its system itself."""


def _system_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without :data:`_SYSTEM_SETTINGS`: an agent's ``KAOS_MCP_SERVERS``, say, left in the
    shell would otherwise reach every agent of the demo that has no such flag."""
    return {name: value for name, value in environ.items() if name not in _SYSTEM_SETTINGS}


def _interrupted() -> int:
    print("kaos-agent demo: interrupted; all processes stopped", file=sys.stderr)
    return EXIT_INTERRUPTED


LIVE_METRIC_INTERVAL_MS = 2000
"""Metric export interval of a live demo's services (unless OTEL_METRIC_EXPORT_INTERVAL is set)."""
_LIVE_AGENT_ARGS = [
    "--memory-long-term",  # long-term extraction runs (and is traced) in the background
    "--memory-window-tokens",
    "200",  # small: windows compact every few turns of a session
    "--max-runtime",
    "30",  # delegations time out after 15 s (subagent-down)
]


def _missing_live_memory() -> str | None:
    """Why live traffic's long-term memory will not run here (Mem0 not installed), if it will not."""
    if importlib.util.find_spec("mem0") is not None:
        return None
    return (
        "live traffic runs the agents' long-term memory on Mem0, which is not installed: every "
        "request will end degraded (pip install 'kaos-otel[agent,mem0]')"
    )


def _memory_args(workdir: Path) -> list[str]:
    """The demo's agents remember in one SQLite store in the work dir (long-term tier off: fast start)."""
    return ["--memory-url", f"sqlite:///{workdir / 'memory.db'}"]


def _report_scenario(out: _Output, result: ScenarioResult) -> None:
    verdict = "as expected" if result.ok else "UNEXPECTED"
    out.say(
        f"\nScenario {result.name}: HTTP {result.status_code} in {result.duration_s:.2f} s ({verdict}), "
        f"trace {result.trace_id or '?'}"
    )
    out.say(f"  {'answer' if result.status_code == 200 else 'error'}: {result.text}")


def _report_telemetry(
    out: _Output,
    trace_ids: set[str],
    spans: Sequence[ReceivedSpan],
    points: Sequence[ReceivedMetricPoint],
    telemetry_file: Path,
    external: str | None,
) -> None:
    if external:
        out.say(f"\nTelemetry was sent to {external}; look the trace ids above up in your backend.")
        return
    color = out.stream.isatty() and "NO_COLOR" not in os.environ
    out.say("\nTraces")
    out.say(render_trace_trees([s for s in spans if s.trace_id in trace_ids], color=color).rstrip())
    out.say("\nRequests by agent and outcome (kaos.requests)")
    for (agent, outcome), count in request_counts(points).items():
        out.say(f"  {agent:<12} {outcome:<10} {count}")
    out.say(f"\nTelemetry (OTLP JSON lines): {telemetry_file}")
    out.say(f"Render it again with: kaos-otel traces show {telemetry_file}")


def _summary(
    results: Sequence[ScenarioResult],
    spans: Sequence[ReceivedSpan],
    points: Sequence[ReceivedMetricPoint],
    system: System,
    embedded: bool,
    telemetry_file: Path,
    external: str | None,
) -> dict[str, Any]:
    traces: list[dict[str, Any]] = []
    for result in results:
        members = [s for s in spans if s.trace_id == result.trace_id]
        traces.append(
            {
                "scenario": result.name,
                "trace_id": result.trace_id,
                "span_count": len(members),
                "services": sorted({s.service_name for s in members}),
                "error_spans": sorted({s.name for s in members if s.status_code == "ERROR"}),
            }
        )
    return {
        "ok": all(r.ok for r in results),
        "scenarios": [asdict(r) for r in results],
        "traces": traces if embedded else [],
        "requests": [
            {"agent": agent, "outcome": outcome, "count": count}
            for (agent, outcome), count in request_counts(points).items()
        ],
        "processes": [{"name": s.name, "pid": s.pid, "url": s.url} for s in system.services.values()],
        "telemetry": {"endpoint": external, "file": None if external else str(telemetry_file)},
    }
