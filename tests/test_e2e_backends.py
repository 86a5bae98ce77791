"""End to end against real backends: the live demo with faults through our collector.

What runs (all on loopback, stopped by PID): the collector built by ``collector/build.sh`` with
``collector/otelcol-config.yaml``; Jaeger v2 built from its Go module by
``collector/build-jaeger.sh`` with ``collector/jaeger-config.yaml``; Debian's Prometheus scraping
the collector every 2 s and evaluating a test copy of ``dashboards/prometheus/kaos-alerts.rules.yml``;
and ``kaos-agent demo --duration ... --fault ...`` sending to the collector.

The test copy of the rules only shortens time: rate windows of 5m become 30s and ``for:`` becomes
10s, so an alert can fire and resolve within a run of a few minutes. Thresholds and expressions
are unchanged.

Checked afterwards: every PromQL expression of every Grafana panel and every alert rule returns
data (a finite value; a non-zero one wherever the run produced the events it counts); the
memory-latency and memory-failure alerts reach ``firing`` while their fault is on and leave it
after the fault is off; the research trace read back from Jaeger's ``/api/v3/traces/{id}`` holds
all five services and no orphan; logs at the collector carry trace ids of spans of the same
trace; and every metric and attribute the SigNoz dashboard and alerts use is found in this run's
telemetry under its SigNoz storage name.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from net_support import free_port
from test_collector import PROD_CONFIG, REPO, Collector, http_get, start_collector, stop_collector

from kaos_otel import catalog
from kaos_otel.receiver import ReceivedTelemetry, load_otlp_json

pytestmark = pytest.mark.timeout(1200)

JAEGER_BUILD = REPO / "collector" / "build-jaeger.sh"
JAEGER_CONFIG = REPO / "collector" / "jaeger-config.yaml"
RULES = REPO / "dashboards" / "prometheus" / "kaos-alerts.rules.yml"
GRAFANA = REPO / "dashboards" / "grafana" / "kaos-agents.json"
SIGNOZ_DASHBOARD = REPO / "dashboards" / "signoz" / "kaos-agents.v2.json"
SIGNOZ_ALERTS = REPO / "dashboards" / "signoz" / "alerts"
SERVICES = {"coordinator", "researcher", "analyst", "mcp-echo", "mcp-calculator"}

DURATION_S = 155
RATE_RPS = 1.0
# (fault, on at, off at) in seconds into the traffic. A memory alert fires about 20 s after its
# fault is on (2 s export, scrape and evaluation, for: 10s) and resolves about 35 s after it is off.
FAULTS = (
    ("memory-latency", 10, 50),
    ("memory-errors", 55, 90),
    ("model-errors", 95, 115),
    ("model-latency", 95, 115),
    ("subagent-down", 117, 140),
)
ALERT_FAULTS = {"KaosMemoryLatencyP95High": "memory-latency", "KaosMemoryFailureRateHigh": "memory-errors"}
TEST_WINDOW, TEST_FOR = "30s", "10s"
# Panels counting what only exists when something goes wrong: a finite 0 is the true answer here.
ZERO_IS_DATA = {"Telemetry items dropped by signal and reason", "KaosTelemetryDropped"}


# --------------------------------------------------------------------------- processes
@dataclass
class Process:
    """A started backend process and its log."""

    process: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def start_process(command: list[str], env: Mapping[str, str], log: Path, ready_url: str) -> Process:
    """Start ``command`` and wait until ``ready_url`` answers 200."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=dict(env), stdout=out, stderr=subprocess.STDOUT, cwd=log.parent
        )
    started = Process(process, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{command[0]} exited with {process.returncode}:\n{started.tail()}")
        if http_get(ready_url, timeout=1)[0] == 200:
            return started
        time.sleep(0.2)
    started.stop()
    pytest.fail(f"{command[0]} not ready at {ready_url}:\n{started.tail()}")


def jaeger_binary() -> Path:
    """The Jaeger v2 binary (built into the cache outside the repository; a no-op when present)."""
    done = subprocess.run(
        ["bash", str(JAEGER_BUILD)], capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"bash collector/build-jaeger.sh failed:\n{done.stderr[-3000:]}", pytrace=False)
    return Path(done.stdout.strip().splitlines()[-1])


def get_json(url: str) -> Any:
    status, body = http_get(url, timeout=10)
    assert status == 200, (url, status, body[:500])
    return json.loads(body)


def shortened_rules(text: str) -> str:
    """The alert rules with test timings: 30s rate windows and ``for: 10s`` (nothing else changes)."""
    text = text.replace("[5m]", f"[{TEST_WINDOW}]").replace("offset 5m", f"offset {TEST_WINDOW}")
    return re.sub(r"for: \d+[smh]", f"for: {TEST_FOR}", text)


# --------------------------------------------------------------------------- the run
@dataclass
class Run:
    """Everything one end-to-end run left for the checks."""

    prometheus: str
    jaeger: str
    telemetry: ReceivedTelemetry
    summary: dict[str, Any]
    traffic_s: float
    alert_log: list[tuple[float, set[str]]] = field(default_factory=list)
    """(seconds since the traffic started, names of firing alerts) per poll."""
    figures: dict[str, Any] = field(default_factory=dict)


def _firing(prometheus: str) -> set[str]:
    alerts = get_json(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
    return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    started = time.monotonic()
    tmp = tmp_path_factory.mktemp("e2e")
    jaeger_bin = jaeger_binary()
    names = "j_grpc j_http j_query j_query_grpc j_health j_telemetry"
    names += " c_grpc c_http c_health c_prom c_telemetry"
    ports = {name: free_port() for name in [*names.split(), "prometheus"]}
    prometheus_url = f"http://127.0.0.1:{ports['prometheus']}"
    base_env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", str(tmp))}
    jaeger_env = {
        **base_env,
        "JAEGER_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['j_grpc']}",
        "JAEGER_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['j_http']}",
        "JAEGER_QUERY_HTTP_ENDPOINT": f"127.0.0.1:{ports['j_query']}",
        "JAEGER_QUERY_GRPC_ENDPOINT": f"127.0.0.1:{ports['j_query_grpc']}",
        "JAEGER_HEALTH_ENDPOINT": f"127.0.0.1:{ports['j_health']}",
        "JAEGER_TELEMETRY_HOST": "127.0.0.1",
        "JAEGER_TELEMETRY_PORT": str(ports["j_telemetry"]),
        "JAEGER_PROMETHEUS_URL": prometheus_url,
    }
    jaeger = start_process(
        [str(jaeger_bin), "--config", str(JAEGER_CONFIG)],
        jaeger_env,
        tmp / "jaeger.log",
        f"http://127.0.0.1:{ports['j_health']}/status",
    )
    collector: Collector | None = None
    prometheus: Process | None = None
    try:
        telemetry_file = tmp / "collector-telemetry.jsonl"
        collector = start_collector(
            PROD_CONFIG,
            {
                "OTELCOL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['c_grpc']}",
                "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['c_http']}",
                "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{ports['c_health']}",
                "OTELCOL_PROMETHEUS_ENDPOINT": f"127.0.0.1:{ports['c_prom']}",
                "OTELCOL_TELEMETRY_PORT": str(ports["c_telemetry"]),
                "OTELCOL_SPANMETRICS_FLUSH_INTERVAL": "2s",
                "JAEGER_OTLP_ENDPOINT": f"127.0.0.1:{ports['j_grpc']}",
                "FILE_EXPORT_PATH": str(telemetry_file),
                "KAOS_TRACES_EXPORTERS": "[otlp_grpc/jaeger, file]",
                "KAOS_METRICS_EXPORTERS": "[prometheus, file]",
                "KAOS_LOGS_EXPORTERS": "[file]",
            },
            tmp / "collector.log",
            f"http://127.0.0.1:{ports['c_health']}/",
        )
        rules = tmp / "kaos-alerts.rules.yml"
        rules.write_text(shortened_rules(RULES.read_text()))
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 2s\n"
            f"rule_files: ['{rules}']\n"
            "scrape_configs:\n"
            "  - job_name: kaos-otelcol\n    honor_labels: true\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{ports['c_prom']}']}}]\n"
            "  - job_name: kaos-otelcol-internal\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{ports['c_telemetry']}']}}]\n"
        )
        check = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        prometheus = start_process(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
                "--log.level=warn",
            ],
            base_env,
            tmp / "prometheus.log",
            f"{prometheus_url}/-/ready",
        )

        demo_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        demo_env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{ports['c_grpc']}"
        command = [sys.executable, "-m", "instrumented_agent.cli", "demo", "--json"]
        command += ["--workdir", str(tmp / "demo"), "--duration", str(DURATION_S), "--rate", str(RATE_RPS)]
        for fault, on, off in FAULTS:
            command += ["--fault", f"{fault}@{on}-{off}"]
        with (tmp / "demo.out").open("wb") as out, (tmp / "demo.err").open("wb") as err:
            demo = subprocess.Popen(command, env=demo_env, stdout=out, stderr=err)
        alert_log: list[tuple[float, set[str]]] = []
        traffic_started: float | None = None
        try:
            while demo.poll() is None:
                if traffic_started is None and b"Sending" in (tmp / "demo.err").read_bytes():
                    traffic_started = time.monotonic()
                if traffic_started is not None:
                    alert_log.append((time.monotonic() - traffic_started, _firing(prometheus_url)))
                time.sleep(2)
        finally:
            if demo.poll() is None:
                demo.terminate()
                demo.wait(timeout=60)
        assert demo.returncode == 0, (tmp / "demo.err").read_text(errors="replace")[-4000:]
        assert traffic_started is not None
        summary = json.loads((tmp / "demo.out").read_text())
        # after the traffic: alerts leave firing as their windows empty
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and _firing(prometheus_url) & set(ALERT_FAULTS):
            alert_log.append((time.monotonic() - traffic_started, _firing(prometheus_url)))
            time.sleep(2)
        alert_log.append((time.monotonic() - traffic_started, _firing(prometheus_url)))
        traffic_s = time.monotonic() - traffic_started
        time.sleep(3)  # the collector's batch and file exporter flush
        yield Run(
            prometheus_url,
            f"http://127.0.0.1:{ports['j_query']}",
            load_otlp_json(telemetry_file),
            summary,
            traffic_s,
            alert_log,
            {"setup_and_run_s": round(time.monotonic() - started, 1)},
        )
    finally:
        for process in (prometheus, jaeger):
            if process is not None:
                process.stop()
        if collector is not None:
            stop_collector(collector)


# --------------------------------------------------------------------------- PromQL
def _instant(prometheus: str, expr: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr})
    answer = get_json(f"{prometheus}/api/v1/query?{query}")
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _values(result: list[dict[str, Any]]) -> list[float]:
    return [float(series["value"][1]) for series in result]


def grafana_expressions(window: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, with the dashboard's variables set to "All"."""
    dashboard = json.loads(GRAFANA.read_text())
    expressions = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", window).replace("$__range", window)
            expr = re.sub(r'=~"\$\w+"', '=~".*"', expr)
            expressions.append((panel["title"], expr))
    return expressions


def alert_expressions(window: str) -> list[tuple[str, str]]:
    """(alert, its expression over ``window`` without the threshold comparison).

    The telemetry-dropped rule keeps its first clause (``increase``); its second one only finds
    a counter's first appearance.
    """
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    found = []
    for rule in rules:
        expr = rule["expr"].strip().replace("[5m]", f"[{window}]").split("\nor\n")[0]
        found.append((rule["alert"], re.sub(r"\s*>\s*[0-9.]+\s*$", "", expr)))
    return found


def test_every_panel_and_alert_expression_returns_data(run: Run) -> None:
    window = f"{math.ceil(run.traffic_s) + 30}s"  # the whole run
    checked = [*grafana_expressions(window), *alert_expressions(window)]
    empty, only_zero_or_nan = [], []
    for name, expr in checked:
        values = _values(_instant(run.prometheus, expr))
        finite = [v for v in values if math.isfinite(v)]
        if not values:
            empty.append((name, expr))
        elif not any(finite) and not (finite and name in ZERO_IS_DATA):
            only_zero_or_nan.append((name, expr, values[:5]))
    panels = {name for name, _ in grafana_expressions(window)}
    run.figures["panels"] = len(panels)
    run.figures["expressions"] = len(checked)
    print(f"\ne2e figures: {json.dumps(run.figures)}")
    assert empty == [], f"expressions with no series: {empty}"
    assert only_zero_or_nan == [], f"expressions with only 0 or NaN: {only_zero_or_nan}"


def test_headline_numbers_count_each_user_request_once(run: Run) -> None:
    """User requests in Prometheus equal the requests the demo sent; failed ones its HTTP errors."""
    requests = _prom_name(catalog.KAOS_REQUESTS)
    origin, outcome = (
        catalog.prometheus_label(catalog.KAOS_REQUEST_ORIGIN),
        catalog.prometheus_label(catalog.KAOS_OUTCOME),
    )
    user = _values(_instant(run.prometheus, f'sum({requests}{{{origin}="user"}})'))
    failed = _values(_instant(run.prometheus, f'sum({requests}{{{origin}="user", {outcome}="error"}})'))
    every_run = _values(_instant(run.prometheus, f"sum({requests})"))
    live = run.summary["live"]
    # a failed run is an HTTP error, or an error event in a stream that was already answered 200
    http_errors = sum(n for status, n in live["by_status"].items() if status != "200")
    http_errors += live["failed_streams"]
    run.figures["user_requests"] = {"sent": live["sent"], "prometheus": user, "all_runs": every_run}
    run.figures["user_errors"] = {"http": http_errors, "prometheus": failed}
    print(f"\ne2e headline: {json.dumps(run.figures)}")
    assert user == [live["sent"]]
    assert failed == [http_errors] and http_errors > 0
    assert every_run[0] > 2 * live["sent"]  # each user request also ran delegated runs


def _prom_name(name: str) -> str:
    """The Prometheus series name of a catalog metric."""
    return catalog.METRICS_BY_NAME[name].prometheus


def test_memory_alerts_fire_while_their_fault_is_on_and_resolve_after(run: Run) -> None:
    seen: dict[str, list[float]] = {name: [] for name in ALERT_FAULTS}
    for at, firing in run.alert_log:
        for name in ALERT_FAULTS:
            if name in firing:
                seen[name].append(at)
    windows = {fault: (on, off) for fault, on, off in FAULTS}
    last_firing = run.alert_log[-1][1]
    for name, fault in ALERT_FAULTS.items():
        on, off = windows[fault]
        assert seen[name], f"{name} never fired ({fault} on from {on} to {off} s): {run.alert_log}"
        assert any(on <= at <= off for at in seen[name]), f"{name} did not fire while {fault} was on"
        assert any(at > max(seen[name]) for at, _ in run.alert_log), f"{name} never left firing"
        assert name not in last_firing
        run.figures[f"{name}_firing_s"] = [round(min(seen[name]), 1), round(max(seen[name]), 1)]
    print(f"\ne2e alert timeline: {json.dumps(run.figures)}")


def test_the_research_trace_from_jaeger_has_all_services_and_no_orphans(run: Run) -> None:
    trace_id = run.summary["live"]["research_trace_id"]
    assert trace_id
    spans: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = http_get(f"{run.jaeger}/api/v3/traces/{trace_id}", timeout=10)
        if status == 200:
            spans = [
                {**span, "service": _service(resource["resource"])}
                for resource in json.loads(body)["result"]["resourceSpans"]
                for scope in resource["scopeSpans"]
                for span in scope["spans"]
            ]
            if {s["service"] for s in spans} >= SERVICES:
                break
        time.sleep(1)
    ids = {span["spanId"] for span in spans}
    orphans = [s for s in spans if s.get("parentSpanId") and s["parentSpanId"] not in ids]
    run.figures["jaeger_trace"] = {"spans": len(spans), "services": len({s["service"] for s in spans})}
    run.figures["jaeger_orphans"] = len(orphans)
    print(f"\ne2e Jaeger: {json.dumps(run.figures)}")
    assert {s["service"] for s in spans} == SERVICES
    assert orphans == []
    assert len([s for s in spans if not s.get("parentSpanId")]) == 1


def _service(resource: Mapping[str, Any]) -> str:
    for attribute in resource.get("attributes", []):
        if attribute["key"] == "service.name":
            return str(attribute["value"]["stringValue"])
    return "?"


def test_logs_at_the_collector_carry_trace_ids_of_the_same_trace(run: Run) -> None:
    spans_by_trace: dict[str, set[str]] = {}
    for span in run.telemetry.spans:
        spans_by_trace.setdefault(span.trace_id, set()).add(span.span_id)
    with_ids = [log for log in run.telemetry.logs if log.trace_id]
    assert len(with_ids) >= run.summary["live"]["sent"]  # at least a line per request
    unmatched = [
        (log.service_name, log.body)
        for log in with_ids
        if log.span_id not in spans_by_trace.get(log.trace_id or "", set())
    ]
    run.figures["logs_with_ids"] = len(with_ids)
    run.figures["logs_unmatched"] = len(unmatched)
    print(f"\ne2e logs: {json.dumps(run.figures)}")
    assert unmatched == []


# --------------------------------------------------------------------------- SigNoz names
def _signoz_uses() -> dict[str, set[str]]:
    """metricName -> attribute keys, over the SigNoz dashboard and every SigNoz alert rule."""
    documents = [json.loads(SIGNOZ_DASHBOARD.read_text())]
    documents += [json.loads(p.read_text()) for p in sorted(SIGNOZ_ALERTS.glob("*.json"))]
    uses: dict[str, set[str]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            aggregations = node.get("aggregations")
            if isinstance(aggregations, list) and aggregations and "metricName" in aggregations[0]:
                keys = {g["name"] for g in node.get("groupBy") or []}
                expression = (node.get("filter") or {}).get("expression") or ""
                keys |= set(re.findall(r"([a-z_][a-z0-9_.]*)\s+(?:IN|=|!=)", expression))
                for aggregation in aggregations:
                    uses.setdefault(aggregation["metricName"], set()).update(keys)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for document in documents:
        walk(document)
    return uses


def signoz_storage_name(metric: str, instrument: str) -> list[str]:
    """Names SigNoz stores an OTLP metric under: a histogram as ``.bucket``/``.sum``/``.count``."""
    if instrument == "histogram":
        return [f"{metric}.bucket", f"{metric}.sum", f"{metric}.count"]
    return [metric]


def test_every_signoz_metric_and_attribute_is_in_this_runs_telemetry(run: Run) -> None:
    stored: dict[str, set[str]] = {}
    for point in run.telemetry.metric_points:
        keys = set(point.attributes) | {"service.name"}  # resource attribute, as SigNoz stores it
        for name in signoz_storage_name(point.name, point.kind):
            stored.setdefault(name, set()).update(keys)
    uses = _signoz_uses()
    assert uses, "no builder queries found in the SigNoz files"
    missing_metrics = sorted(name for name in uses if name not in stored)
    missing_keys = {
        name: sorted(keys - stored[name]) for name, keys in uses.items() if keys - stored.get(name, keys)
    }
    run.figures["signoz_metrics"] = len(uses)
    print(f"\ne2e SigNoz: {json.dumps(run.figures)}")
    assert missing_metrics == []
    assert missing_keys == {}
    catalog_names = {n for spec in catalog.METRICS for n in signoz_storage_name(spec.name, spec.instrument)}
    assert set(uses) <= catalog_names
