"""Beyond one collector: two agent-tier collectors, three gateways with tail sampling, on loopback.

What runs (real binaries built by ``collector/build.sh``, stopped by PID):

    node-a SDK --> agent-tier A --\\                       /--> gateway 1 --> receiver 1
                                   load_balancing(traceID) ---> gateway 2 --> receiver 2
    node-b SDK --> agent-tier B --/   (static resolver)    \\--> gateway 3 --> receiver 3

Agent tiers run ``collector/otelcol-agent.yaml`` (plus a test overlay that also writes every span
to a file: the ground truth); gateways run ``collector/otelcol-config.yaml`` with the
``collector/otelcol-gateway.yaml`` overlay. Every trace spans both nodes (a coordinator on node-a
delegates to a researcher on node-b over W3C trace context), so its spans enter through BOTH
agent tiers and must still meet at one gateway.

Traffic is a fixed mix of outcomes: success, slow, error, max_steps, degraded, a failed memory
operation (the agent carries on) and a canceled memory operation. Phase A runs with every
gateway up and checks that no trace is split, that every failing and slow trace is kept whole,
that exactly the successful traces the gateways' trace-id hash selects are kept (the configured
share, within a stated tolerance), and that request and error counts (span metrics and the SDK's
own metrics) are exact. Phase B keeps traffic flowing while gateway 3 is SIGKILLed and restarted
on the same address, and measures what is lost and how fast routing recovers.

A last fixture runs the live demo (``kaos-agent demo --duration`` with memory errors, model
errors and a slow model switched on mid-run; five services) through one agent tier into three
gateways and checks the same rules on its traces, with the tap as ground truth.

The figures are written to ``scale-report.json`` in the test's directory and printed (``-s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml
from net_support import free_port
from opentelemetry import context as otel_context
from prometheus_client.parser import text_string_to_metric_families
from test_collector import (
    COLLECTOR_DIR,
    PROD_CONFIG,
    REPO,
    Collector,
    collector_binary,
    http_get,
    run_validate,
    start_collector,
    stop_collector,
)

from kaos_otel import KaosOtelManager, MemoryTier, Outcome, RequestOrigin, catalog
from kaos_otel.propagation import extract_incoming, inject_headers
from kaos_otel.receiver import OtlpReceiver, ReceivedSpan, load_otlp_json

# The first test of each fixture also pays for its set-up (collectors, traffic, the live demo's
# seven Python processes), which is slow on a busy machine.
pytestmark = pytest.mark.timeout(600)

AGENT_CONFIG = COLLECTOR_DIR / "otelcol-agent.yaml"
GATEWAY_OVERLAY = COLLECTOR_DIR / "otelcol-gateway.yaml"
TAP_OVERLAY = REPO / "tests" / "data" / "otelcol-agent-tap.yaml"

SLOW_MS = 1000
"""KAOS_TAIL_SLOW_MS for the gateways; slow traces last SLOW_S."""
SLOW_S = 1.3
KEEP_PERCENT = 25
SHARE_TOLERANCE = 0.16
"""Allowed gap between the kept share of successful traces and KEEP_PERCENT (absolute). The hash
makes the share a binomial draw over the random trace ids: with 130 successful traces at 25 % the
standard deviation is 3.8 points, so 0.16 is over 4 of them. The exact set is checked as well,
which does not depend on chance."""
HASH_SALT = "default-hash-seed"
"""The probabilistic policy's FNV-1a salt when none is configured (tail_sampling v0.161)."""
DECISION_WAIT_S = 8
AFTER_ROOT_S = 1
PHASE_A_TRACES = 200
PHASE_B_SECONDS = 22.0
PHASE_B_INTERVAL_S = 0.05
KILL_AT_S = 3.0
RESTART_AT_S = 6.0
RECONNECT_S = 10.0
"""After a gateway is back, every agent tier has retried towards it within this time (the agent
tier's backoff: 1 s growing by 1.5x up to 5 s, plus up to 50 % jitter, plus batching)."""
WAIT_S = 90.0
SPANS_PER_TRACE = 7
COORDINATOR, RESEARCHER, MODEL = "coordinator", "researcher", "scripted-model"
NODE_A, NODE_B = "scale-node-a", "scale-node-b"
COORDINATOR_SPAN = f"invoke_agent {COORDINATOR}"
TRACES_ON_MEMORY = "otelcol_processor_tail_sampling_sampling_traces_on_memory"
FAILED_OUTCOMES = frozenset({"error", "max_steps", "degraded"})


class Kind(Enum):
    """What one generated request does."""

    SUCCESS = "success"
    SLOW = "slow"
    ERROR = "error"
    MAX_STEPS = "max_steps"
    DEGRADED = "degraded"
    MEMORY_ERROR = "memory_error"
    MEMORY_CANCELED = "memory_canceled"


# One cycle of 20 requests: 13 successful, 2 slow, 5 failing in five different ways.
MIX = (
    (Kind.SUCCESS,) * 13
    + (Kind.SLOW,) * 2
    + (
        Kind.ERROR,
        Kind.MAX_STEPS,
        Kind.DEGRADED,
        Kind.MEMORY_ERROR,
        Kind.MEMORY_CANCELED,
    )
)
RUN_OUTCOME = {
    Kind.ERROR: Outcome.ERROR,
    Kind.MAX_STEPS: Outcome.MAX_STEPS,
    Kind.DEGRADED: Outcome.DEGRADED,
}
"""The coordinator run's outcome per kind (success for the others: memory failures are survived)."""


class ModelFailedError(RuntimeError):
    """The error the ERROR kind raises inside the coordinator's run."""


# --------------------------------------------------------------------------- traffic


@dataclass(frozen=True)
class Sent:
    """One generated request: its trace, kind and wall-clock start."""

    trace_id: str
    kind: Kind
    started: float


def emit_request(node_a: KaosOtelManager, node_b: KaosOtelManager, kind: Kind) -> Sent:
    """A coordinator run on node-a that delegates to a researcher on node-b: 7 spans, two nodes."""
    started = time.time()
    with contextlib.suppress(ModelFailedError), node_a.invoke_agent(COORDINATOR, max_steps=4) as run:
        trace_id = format(run.span.get_span_context().trace_id, "032x")
        with node_a.agent_step(run):
            with node_a.model_call(COORDINATOR, MODEL):
                if kind is Kind.SLOW:
                    time.sleep(SLOW_S)
            with node_a.delegation(COORDINATOR, RESEARCHER):
                research(node_b, extract_incoming(inject_headers()).parent, kind)
            if kind is Kind.ERROR:
                raise ModelFailedError("the model answered 500")
        if kind in RUN_OUTCOME:
            run.set_outcome(RUN_OUTCOME[kind])
    return Sent(trace_id, kind, started)


def research(node_b: KaosOtelManager, parent: otel_context.Context, kind: Kind) -> None:
    """The delegated run on node-b, continuing the caller's trace (as after an HTTP hop)."""
    token = otel_context.attach(parent)
    try:
        with node_b.invoke_agent(RESEARCHER, origin=RequestOrigin.DELEGATED):
            # The researcher carries on without memory when the store fails.
            with (
                contextlib.suppress(ConnectionError),
                node_b.memory_operation(MemoryTier.LONG_TERM, "search_memory") as memory,
            ):
                if kind is Kind.MEMORY_ERROR:
                    raise ConnectionError("memory store unreachable")
                if kind is Kind.MEMORY_CANCELED:
                    memory.set_outcome(Outcome.CANCELED)
            with node_b.model_call(RESEARCHER, MODEL):
                pass
    finally:
        otel_context.detach(token)


def make_node(service: str, agent_tier: str) -> KaosOtelManager:
    """A node's SDK exporting OTLP/gRPC to its agent-tier collector; metrics leave on flush only."""
    return KaosOtelManager(
        service,
        endpoint=f"http://{agent_tier}",
        protocol="grpc",
        global_providers=False,
        bridge_logging=False,
        metric_export_interval_ms=600_000,
        span_schedule_delay_ms=100,
    )


# --------------------------------------------------------------------------- collectors


@dataclass
class Gateway:
    """One gateway collector, its sink and the addresses it was started with."""

    name: str
    env: dict[str, str]
    log: Path
    grpc: str
    health_url: str
    prometheus_url: str
    telemetry_url: str
    sink: OtlpReceiver
    collector: Collector | None = None

    def start(self) -> None:
        self.collector = start_collector(PROD_CONFIG, self.env, self.log, self.health_url, [GATEWAY_OVERLAY])

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is flushed."""
        assert self.collector is not None
        self.collector.process.send_signal(signal.SIGKILL)
        self.collector.process.wait(timeout=10)

    def stop(self) -> None:
        if self.collector is not None:
            stop_collector(self.collector)


def gateway(name: str, tmp: Path, after_root_s: float = AFTER_ROOT_S) -> Gateway:
    sink = OtlpReceiver().start()
    grpc, http, health, prom, telemetry = (free_port() for _ in range(5))
    env = {
        "OTELCOL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc}",
        "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http}",
        "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{health}",
        "OTELCOL_PROMETHEUS_ENDPOINT": f"127.0.0.1:{prom}",
        "OTELCOL_TELEMETRY_PORT": str(telemetry),
        "OTELCOL_MEMORY_LIMIT_MIB": "256",
        "OTELCOL_MEMORY_SPIKE_LIMIT_MIB": "64",
        "OTELCOL_SPANMETRICS_FLUSH_INTERVAL": "1s",
        "OTLP_HTTP_ENDPOINT": sink.http_endpoint,
        "KAOS_TRACES_EXPORTERS": "[otlp_http/generic]",
        "KAOS_METRICS_EXPORTERS": "[otlp_http/generic]",
        "KAOS_LOGS_EXPORTERS": "[otlp_http/generic]",
        "KAOS_TAIL_SLOW_MS": str(SLOW_MS),
        "KAOS_TAIL_KEEP_PERCENT": str(KEEP_PERCENT),
        "KAOS_TAIL_DECISION_WAIT": f"{DECISION_WAIT_S}s",
        "KAOS_TAIL_WAIT_AFTER_ROOT": f"{after_root_s}s",
        "KAOS_TAIL_NUM_TRACES": "20000",
    }
    return Gateway(
        name,
        env,
        tmp / f"{name}.log",
        f"127.0.0.1:{grpc}",
        f"http://127.0.0.1:{health}/",
        f"http://127.0.0.1:{prom}/metrics",
        f"http://127.0.0.1:{telemetry}/metrics",
        sink,
    )


def start_agent_tier(name: str, tmp: Path, gateways: list[Gateway]) -> tuple[Collector, Path, str]:
    """An agent-tier collector routing to ``gateways``; returns it, its tap file and telemetry URL."""
    grpc, http, health, telemetry = (free_port() for _ in range(4))
    tap = tmp / f"{name}-tap.jsonl"
    env = {
        "OTELCOL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc}",
        "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http}",
        "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{health}",
        "OTELCOL_TELEMETRY_PORT": str(telemetry),
        "KAOS_GATEWAYS": "[" + ", ".join(g.grpc for g in gateways) + "]",
        "KAOS_TEST_TAP_PATH": str(tap),
    }
    collector = start_collector(
        AGENT_CONFIG, env, tmp / f"{name}.log", f"http://127.0.0.1:{health}/", [TAP_OVERLAY]
    )
    collector.grpc_endpoint = f"127.0.0.1:{grpc}"
    return collector, tap, f"http://127.0.0.1:{telemetry}/metrics"


def read_tap(path: Path) -> list[ReceivedSpan]:
    """Spans in the complete lines of a tap file (the collector may be writing the last one)."""
    raw = path.read_bytes() if path.exists() else b""
    complete = path.with_name(path.name + ".complete")
    complete.write_bytes(raw[: raw.rfind(b"\n") + 1])
    return load_otlp_json(complete).spans


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name from a Prometheus endpoint (empty if it does not answer)."""
    status, body = http_get(url)
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    if status == 200:
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                samples[sample.name].append((dict(sample.labels), float(sample.value)))
    return samples


def total(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` at ``url`` whose labels include ``labels``."""
    return sum(v for lab, v in scrape(url).get(name, []) if all(lab.get(k) == w for k, w in labels.items()))


def wait_for(predicate: Callable[[], bool], what: str, logs: list[Path], poll_s: float = 0.2) -> float:
    """Poll until ``predicate`` holds (returns when, as time.time()), else fail with the logs."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            tails = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists()
            )
            pytest.fail(f"timed out waiting for {what}\n{tails}")
        time.sleep(poll_s)
    return time.time()


def wait_for_gateways_to_settle(gateways: list[Gateway], logs: list[Path]) -> None:
    """Until no gateway holds a trace awaiting its decision and the sinks stopped growing."""
    last_counts: list[int] = []

    def settled() -> bool:
        nonlocal last_counts
        counts = [len(g.sink.spans()) for g in gateways]
        pending = [scrape(g.telemetry_url).get(TRACES_ON_MEMORY) for g in gateways]
        idle = all(p is not None and sum(v for _, v in p) == 0 for p in pending)
        stable, last_counts = counts == last_counts, counts
        return idle and stable

    wait_for(settled, "every gateway to decide and export what it holds", logs, poll_s=1.5)


# --------------------------------------------------------------------------- ground truth


def kept_by_hash(trace_id: str, percent: int) -> bool:
    """The probabilistic policy's choice: FNV-1a 64 of salt + trace id bytes <= percent of 2^64-1."""
    value = 0xCBF29CE484222325
    for byte in HASH_SALT.encode() + bytes.fromhex(trace_id):
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value <= (2**64 - 1) * percent // 100


def trace_class(spans: list[ReceivedSpan]) -> str:
    """``failing``, ``slow`` or ``other``, by the gateway policies' own rules."""
    for span in spans:
        outcome = span.attributes.get(catalog.KAOS_OUTCOME)
        memory_failed = catalog.KAOS_MEMORY_OPERATION in span.attributes and outcome not in (None, "success")
        if span.status_code == "ERROR" or outcome in FAILED_OUTCOMES or memory_failed:
            return "failing"
    duration_ns = max(s.end_time_unix_nano for s in spans) - min(s.start_time_unix_nano for s in spans)
    return "slow" if duration_ns >= SLOW_MS * 1_000_000 else "other"


def by_trace(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    grouped: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for span in spans:
        grouped[span.trace_id].append(span)
    return grouped


# --------------------------------------------------------------------------- the run


@dataclass
class ScaleRun:
    """Everything the checks read: what was sent, what the tiers saw, what each gateway kept."""

    phase_a: list[Sent]
    phase_b: list[Sent]
    truth: dict[str, list[ReceivedSpan]]
    """Every span the agent tiers received, by trace id."""
    delivered: dict[str, dict[str, list[ReceivedSpan]]]
    """Per gateway, the spans it exported, by trace id."""
    spanmetrics_a: dict[str, float]
    sdk_requests: Counter[tuple[str, str]]
    kill_at: float
    restarted_at: float
    recovered_at: float
    report: dict[str, Any] = field(default_factory=dict)

    def gateways_of(self, trace_id: str) -> list[str]:
        return [name for name, traces in self.delivered.items() if trace_id in traces]

    def delivered_spans(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for traces in self.delivered.values() for s in traces.get(trace_id, [])]

    def complete(self, trace_id: str) -> bool:
        return {s.span_id for s in self.delivered_spans(trace_id)} == {
            s.span_id for s in self.truth[trace_id]
        }


def sdk_request_counts(gateways: list[Gateway]) -> Counter[tuple[str, str]]:
    """kaos.requests per (agent, outcome): the newest cumulative value of each stream, summed."""
    newest: dict[tuple[Any, ...], tuple[int, float]] = {}
    for g in gateways:
        for p in g.sink.metric_points():
            if p.name != catalog.KAOS_REQUESTS or p.value is None:
                continue
            key = (p.service_name, tuple(sorted(p.attributes.items())))
            if key not in newest or newest[key][0] < p.time_unix_nano:
                newest[key] = (p.time_unix_nano, float(p.value))
    counts: Counter[tuple[str, str]] = Counter()
    for (_, attributes), (_, value) in newest.items():
        attrs = dict(attributes)
        counts[(str(attrs[catalog.GEN_AI_AGENT_NAME]), str(attrs[catalog.KAOS_OUTCOME]))] += int(value)
    return counts


def expected_request_counts(sent: list[Sent]) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for s in sent:
        counts[(COORDINATOR, RUN_OUTCOME.get(s.kind, Outcome.SUCCESS).value)] += 1
        counts[(RESEARCHER, Outcome.SUCCESS.value)] += 1
    return counts


def decided_traces(gateways: list[Gateway]) -> float:
    """Traces the gateways' tail samplers have decided on (sampled or not), summed."""
    name = "otelcol_processor_tail_sampling_global_count_traces_sampled_total"
    return sum(total(g.telemetry_url, name) for g in gateways)


@pytest.fixture(scope="module")
def scale_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleRun]:
    collector_binary()
    tmp = tmp_path_factory.mktemp("scale")
    gateways = [gateway(f"gateway-{i}", tmp) for i in (1, 2, 3)]
    agents: list[Collector] = []
    nodes: list[KaosOtelManager] = []
    try:
        for g in gateways:
            g.start()
        agent_a, tap_a, telemetry_a = start_agent_tier("agent-a", tmp, gateways)
        agents.append(agent_a)
        agent_b, tap_b, telemetry_b = start_agent_tier("agent-b", tmp, gateways)
        agents.append(agent_b)
        logs = [g.log for g in gateways] + [a.log for a in agents]
        node_a = make_node(NODE_A, agent_a.grpc_endpoint)
        node_b = make_node(NODE_B, agent_b.grpc_endpoint)
        nodes += [node_a, node_b]
        for node in nodes:
            node.register_known_names(COORDINATOR, models=[MODEL], targets=[RESEARCHER])
            node.register_known_names(RESEARCHER, models=[MODEL])

        # Phase A: all gateways up.
        with ThreadPoolExecutor(max_workers=6) as pool:
            phase_a = list(
                pool.map(lambda i: emit_request(node_a, node_b, MIX[i % len(MIX)]), range(PHASE_A_TRACES))
            )
        for node in nodes:
            node.force_flush()

        def tap_spans() -> list[ReceivedSpan]:
            return read_tap(tap_a) + read_tap(tap_b)

        expected_spans = SPANS_PER_TRACE * len(phase_a)
        wait_for(
            lambda: len(tap_spans()) >= expected_spans, f"{expected_spans} spans at the agent tiers", logs
        )
        wait_for(lambda: decided_traces(gateways) >= len(phase_a), "a decision on every phase A trace", logs)
        truth_a = by_trace(tap_spans())
        expected_kept = {
            t
            for t, spans in truth_a.items()
            if trace_class(spans) != "other" or kept_by_hash(t, KEEP_PERCENT)
        }

        def all_kept_arrived() -> bool:
            arrived = {s.trace_id for g in gateways for s in g.sink.spans()}
            return expected_kept <= arrived

        wait_for(all_kept_arrived, "every trace the policies keep at the gateways' sinks", logs)
        coordinator_calls = {"name": "traces_span_metrics_calls_total", "span_name": COORDINATOR_SPAN}

        def spanmetrics_total(**labels: str) -> float:
            return sum(total(g.prometheus_url, **coordinator_calls, **labels) for g in gateways)

        wait_for(lambda: spanmetrics_total() >= len(phase_a), "span metrics for every phase A request", logs)
        spanmetrics_a = {
            "requests": spanmetrics_total(),
            "errors": spanmetrics_total(status_code="STATUS_CODE_ERROR"),
        }

        # Phase B: steady traffic; gateway 3 crashes and comes back on the same address.
        phase_b: list[Sent] = []
        stop = threading.Event()

        def traffic() -> None:
            with ThreadPoolExecutor(max_workers=4) as pool:
                futures = []
                i = 0
                while not stop.is_set():
                    futures.append(pool.submit(emit_request, node_a, node_b, MIX[i % len(MIX)]))
                    i += 1
                    stop.wait(PHASE_B_INTERVAL_S)
                phase_b.extend(f.result() for f in futures)

        driver = threading.Thread(target=traffic, name="scale-traffic")
        begin = time.monotonic()
        driver.start()
        victim = gateways[2]
        time.sleep(KILL_AT_S)
        kill_at = time.time()
        victim.kill()
        time.sleep(RESTART_AT_S - KILL_AT_S)
        before_restart = len(victim.sink.spans())
        victim.start()
        restarted_at = time.time()
        recovered_at = wait_for(
            lambda: len(victim.sink.spans()) > before_restart, "spans at the restarted gateway", logs
        )
        time.sleep(max(0.0, PHASE_B_SECONDS - (time.monotonic() - begin)))
        stop.set()
        driver.join()
        for node in nodes:
            node.force_flush()

        def queues_empty() -> bool:
            return all(total(url, "otelcol_exporter_queue_size") == 0 for url in (telemetry_a, telemetry_b))

        expected_spans = SPANS_PER_TRACE * (len(phase_a) + len(phase_b))
        wait_for(
            lambda: len(tap_spans()) >= expected_spans, f"{expected_spans} spans at the agent tiers", logs
        )
        wait_for(queues_empty, "the agent tiers' queues to the gateways to drain", logs)
        # Done when no gateway holds a trace awaiting its decision and the sinks stopped growing
        # (decided traces leave the tail sampler's memory: the decision caches remember them).
        wait_for_gateways_to_settle(gateways, logs)
        delivered = {g.name: by_trace(g.sink.spans()) for g in gateways}
        run = ScaleRun(
            phase_a=phase_a,
            phase_b=phase_b,
            truth=by_trace(tap_spans()),
            delivered=delivered,
            spanmetrics_a=spanmetrics_a,
            sdk_requests=sdk_request_counts(gateways),
            kill_at=kill_at,
            restarted_at=restarted_at,
            recovered_at=recovered_at,
        )
        yield run
        report_path = tmp / "scale-report.json"
        report_path.write_text(json.dumps(run.report, indent=2, sort_keys=True))
        print(f"\nscale report ({report_path}):\n{json.dumps(run.report, indent=2, sort_keys=True)}")
    finally:
        for node in nodes:
            node.shutdown(timeout=5)
        for collector in agents:
            stop_collector(collector)
        for g in gateways:
            g.stop()
            g.sink.stop()


# --------------------------------------------------------------------------- checks


def test_build_has_the_scale_components_and_configs_validate() -> None:
    """load_balancing and tail_sampling are in the build; both tiers' configurations validate."""
    components = subprocess.run(
        [str(collector_binary()), "components"], capture_output=True, text=True, timeout=60, check=False
    )
    assert "name: load_balancing\n" in components.stdout and "name: tail_sampling\n" in components.stdout
    agent = run_validate(AGENT_CONFIG, {"KAOS_GATEWAYS": "[gw-1:4317, gw-2:4317, gw-3:4317]"})
    assert agent.returncode == 0, agent.stderr
    config_args = ["--config", str(PROD_CONFIG), "--config", str(GATEWAY_OVERLAY)]
    gateway_check = subprocess.run(
        [str(collector_binary()), "validate", *config_args],
        env={"PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gateway_check.returncode == 0, gateway_check.stderr


def test_gateway_pipeline_is_the_production_one_plus_tail_sampling() -> None:
    """The overlay repeats the production traces pipeline (lists are replaced, not merged): it must
    stay that list with tail_sampling after the probe filter, or gateways would silently lose (or
    keep a stale copy of) a production processor."""
    prod = yaml.safe_load(PROD_CONFIG.read_text())["service"]["pipelines"]["traces"]["processors"]
    overlay = yaml.safe_load(GATEWAY_OVERLAY.read_text())["service"]["pipelines"]["traces"]["processors"]
    at = prod.index("filter/probes") + 1
    assert overlay == [*prod[:at], "tail_sampling", *prod[at:]]


def test_no_trace_is_split_across_gateways(scale_run: ScaleRun) -> None:
    """Spans of one trace enter through two agent tiers; all that arrive, arrive at ONE gateway."""
    split = [t for t in scale_run.truth if len(scale_run.gateways_of(t)) > 1]
    per_gateway = {name: len(traces) for name, traces in scale_run.delivered.items()}
    scale_run.report["split_traces"] = len(split)
    scale_run.report["kept_traces_per_gateway"] = per_gateway
    assert not split, f"{len(split)} traces reached more than one gateway, e.g. {split[:3]}"
    assert all(per_gateway.values()), f"a gateway got nothing: {per_gateway}"


def shares(run: ScaleRun, sent: list[Sent]) -> dict[str, dict[str, int]]:
    """Per class: traces sent, kept whole, kept partly."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"sent": 0, "kept": 0, "partial": 0})
    for s in sent:
        cls = trace_class(run.truth[s.trace_id])
        out[cls]["sent"] += 1
        if run.complete(s.trace_id):
            out[cls]["kept"] += 1
        elif run.delivered_spans(s.trace_id):
            out[cls]["partial"] += 1
    return dict(out)


def test_every_failing_and_slow_trace_is_kept_whole(scale_run: ScaleRun) -> None:
    """Phase A: 100 % of failing and of slow traces reach a backend with every span."""
    run = scale_run
    assert all(len(run.truth[s.trace_id]) == SPANS_PER_TRACE for s in run.phase_a)
    per_class = shares(run, run.phase_a)
    run.report["phase_a_classes"] = per_class
    kinds = Counter(s.kind.value for s in run.phase_a)
    run.report["phase_a_kinds"] = dict(kinds)
    failing_kinds = {Kind.ERROR, Kind.MAX_STEPS, Kind.DEGRADED, Kind.MEMORY_ERROR, Kind.MEMORY_CANCELED}
    assert per_class["failing"]["sent"] == sum(1 for s in run.phase_a if s.kind in failing_kinds)
    assert per_class["slow"]["sent"] >= kinds[Kind.SLOW.value]
    for cls in ("failing", "slow"):
        assert per_class[cls]["kept"] == per_class[cls]["sent"], (cls, per_class[cls])
    lost = [s for s in run.phase_a if s.kind in failing_kinds and not run.complete(s.trace_id)]
    assert not lost, f"failing traces not kept whole: {[(s.kind.value, s.trace_id) for s in lost[:5]]}"


def test_successful_traces_are_kept_at_the_configured_share(scale_run: ScaleRun) -> None:
    """Phase A: exactly the successful traces the trace-id hash selects are kept (whole), which
    is KEEP_PERCENT of them within SHARE_TOLERANCE; none of the others."""
    run = scale_run
    others = [s.trace_id for s in run.phase_a if trace_class(run.truth[s.trace_id]) == "other"]
    chosen = {t for t in others if kept_by_hash(t, KEEP_PERCENT)}
    kept = {t for t in others if run.delivered_spans(t)}
    share = len(kept) / len(others)
    run.report["phase_a_success_share"] = {"kept": len(kept), "of": len(others), "share": round(share, 3)}
    assert kept == chosen, (
        f"kept but not chosen: {len(kept - chosen)}, chosen but not kept: {len(chosen - kept)}"
    )
    assert all(run.complete(t) for t in kept)
    assert abs(share - KEEP_PERCENT / 100) <= SHARE_TOLERANCE, share


def test_request_and_error_counts_are_exact(scale_run: ScaleRun) -> None:
    """Span metrics (computed on the gateways before sampling) count every phase A request and
    error; the SDK's own kaos.requests arrive exact for both phases, gateway crash included."""
    run = scale_run
    errors_a = sum(1 for s in run.phase_a if s.kind in (Kind.ERROR, Kind.MAX_STEPS))
    run.report["phase_a_span_metrics"] = run.spanmetrics_a
    assert run.spanmetrics_a == {"requests": len(run.phase_a), "errors": errors_a}
    expected = expected_request_counts(run.phase_a + run.phase_b)
    run.report["sdk_requests"] = {f"{a}/{o}": n for (a, o), n in sorted(run.sdk_requests.items())}
    assert run.sdk_requests == expected


def test_a_gateway_crash_loses_only_what_it_held(scale_run: ScaleRun) -> None:
    """Phase B: gateway 3 is SIGKILLed mid-traffic and restarted. No trace is split. What is lost
    or cut is limited to the crash window: traces with spans in the crashed gateway's memory
    (begun at most a decision wait before the crash), and traces begun during the outage or until
    both agent tiers reconnected whose spans, queued by BOTH agent tiers, came back at different
    retry times and met a decision made on part of the trace (the test's wait after the root span,
    1 s, is below the agent tier's retry interval; production's is 10 s). Every trace begun after
    that is handled as in phase A: routing recovered (the agent tier queued and retried the
    gateway's share)."""
    run = scale_run
    lost: list[Sent] = []
    partial: list[Sent] = []
    for s in run.phase_b:
        expected = trace_class(run.truth[s.trace_id]) != "other" or kept_by_hash(s.trace_id, KEEP_PERCENT)
        if not expected:
            continue
        if not run.delivered_spans(s.trace_id):
            lost.append(s)
        elif not run.complete(s.trace_id):
            partial.append(s)
    lost_spans = sum(
        len(run.truth[s.trace_id]) - len(run.delivered_spans(s.trace_id)) for s in lost + partial
    )
    run.report["gateway_loss"] = {
        "phase_b_traces": len(run.phase_b),
        "phase_b_classes": shares(run, run.phase_b),
        "kept_traces_lost": len(lost),
        "kept_traces_cut": len(partial),
        "spans_lost_from_kept_traces": lost_spans,
        "lost_kinds": dict(Counter(s.kind.value for s in lost + partial)),
        "lost_begun_before_crash": sum(1 for s in lost + partial if s.started < run.kill_at),
        "lost_begun_during_outage": sum(
            1 for s in lost + partial if run.kill_at <= s.started <= run.restarted_at
        ),
        "lost_begun_after_restart": sum(1 for s in lost + partial if s.started > run.restarted_at),
        "outage_s": round(run.restarted_at - run.kill_at, 2),
        "first_spans_after_restart_s": round(run.recovered_at - run.restarted_at, 2),
    }
    split = [s for s in run.phase_b if len(run.gateways_of(s.trace_id)) > 1]
    assert not split
    window = (run.kill_at - DECISION_WAIT_S - 2, run.restarted_at + RECONNECT_S)
    outside = [s for s in lost + partial if not window[0] <= s.started <= window[1]]
    assert not outside, [(s.kind.value, round(s.started - run.kill_at, 2)) for s in outside]
    after_recovery = [s for s in run.phase_b if s.started > window[1]]
    assert after_recovery and all(
        run.complete(s.trace_id)
        for s in after_recovery
        if trace_class(run.truth[s.trace_id]) != "other" or kept_by_hash(s.trace_id, KEEP_PERCENT)
    )


# --------------------------------------------------------------------------- live demo traffic

DEMO_SECONDS = 12
DEMO_RATE = 3
DEMO_FAULTS = ("memory-errors@2-8", "model-errors@4-7", "model-latency@8-10")
DEMO_AFTER_ROOT_S = 3


@dataclass
class DemoRun:
    """The live demo through one agent tier into the three gateways."""

    summary: dict[str, Any]
    truth: dict[str, list[ReceivedSpan]]
    delivered: dict[str, dict[str, list[ReceivedSpan]]]
    sdk_requests: Counter[tuple[str, str]]
    coordinator_spans_counted: float


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """``kaos-agent demo --duration`` with faults (5 services, one agent tier) into 3 gateways."""
    collector_binary()
    tmp = tmp_path_factory.mktemp("scale-demo")
    gateways = [gateway(f"gateway-{i}", tmp, DEMO_AFTER_ROOT_S) for i in (1, 2, 3)]
    agent: Collector | None = None
    try:
        for g in gateways:
            g.start()
        agent, tap, telemetry = start_agent_tier("agent", tmp, gateways)
        logs = [g.log for g in gateways] + [agent.log]
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{agent.grpc_endpoint}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_BLRP_SCHEDULE_DELAY": "200",
        }
        faults = [arg for fault in DEMO_FAULTS for arg in ("--fault", fault)]
        command = [
            sys.executable,
            "-m",
            "instrumented_agent.cli",
            "demo",
            "--json",
            "--workdir",
            str(tmp / "demo"),
        ]
        command += ["--duration", str(DEMO_SECONDS), "--rate", str(DEMO_RATE), *faults]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=420, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout)

        def tap_spans() -> list[ReceivedSpan]:
            return read_tap(tap)

        def queues_empty() -> bool:
            return total(telemetry, "otelcol_exporter_queue_size") == 0

        wait_for(lambda: bool(tap_spans()) and queues_empty(), "the agent tier to forward everything", logs)
        wait_for_gateways_to_settle(gateways, logs)
        counted = sum(
            total(g.prometheus_url, "traces_span_metrics_calls_total", span_name=COORDINATOR_SPAN)
            for g in gateways
        )
        yield DemoRun(
            summary=summary,
            truth=by_trace(tap_spans()),
            delivered={g.name: by_trace(g.sink.spans()) for g in gateways},
            sdk_requests=sdk_request_counts(gateways),
            coordinator_spans_counted=counted,
        )
    finally:
        if agent is not None:
            stop_collector(agent)
        for g in gateways:
            g.stop()
            g.sink.stop()


def test_live_demo_traffic_is_routed_and_sampled_by_the_same_rules(demo_run: DemoRun) -> None:
    """Live demo traffic with faults (memory errors, model errors, slow model): no trace split,
    every failing and slow trace kept whole, exactly the hash-chosen share of the rest, and the
    coordinator's request count identical in the SDK's metrics, the span metrics and the demo's
    own report."""
    run = demo_run
    split = [t for t in run.truth if sum(t in traces for traces in run.delivered.values()) > 1]
    classes: dict[str, dict[str, int]] = defaultdict(lambda: {"sent": 0, "kept": 0})
    missing: list[tuple[str, str]] = []
    for trace_id, spans in run.truth.items():
        cls = trace_class(spans)
        got = {s.span_id for traces in run.delivered.values() for s in traces.get(trace_id, [])}
        wanted = cls != "other" or kept_by_hash(trace_id, KEEP_PERCENT)
        classes[cls]["sent"] += 1
        classes[cls]["kept"] += bool(got)
        if wanted and got != {s.span_id for s in spans}:
            missing.append((cls, trace_id))
        if not wanted:
            assert not got, f"trace {trace_id} kept though no policy keeps it"
    sent = run.summary["live"]["sent"]
    user_requests = sum(n for (agent, _), n in run.sdk_requests.items() if agent == COORDINATOR)
    print(f"\nlive demo: {sent} requests, {len(run.truth)} traces, classes {dict(classes)}")
    assert not split
    assert classes["failing"]["sent"] > 0 and classes["slow"]["sent"] > 0, dict(classes)
    assert not missing, f"{len(missing)} traces the policies keep were not kept whole: {missing[:5]}"
    assert user_requests == sent == run.coordinator_spans_counted
