"""The catalog's Prometheus names, checked against a real Prometheus scraping the SDK.

The SDK's metrics are served by ``PrometheusMetricReader`` on a meter provider built with
:func:`kaos_otel.metric_views`; the Debian ``prometheus`` binary (installed by ``.ci/run``)
scrapes them every second. Every catalog metric must appear under ``MetricSpec.prometheus``
(with ``_bucket``/``_count``/``_sum`` for histograms) with exactly the label names
``catalog.prometheus_label`` gives, and nothing else may appear.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from net_support import free_port
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, start_http_server
from test_e2e_backends import grafana_expressions

from kaos_otel import AgentTelemetry, MemoryScope, MemoryTier, Outcome, catalog, metric_views
from kaos_otel.catalog import MetricSpec
from kaos_otel.exporters import TelemetryHealth

SCRAPE_TIMEOUT_S = 30.0
# Series Prometheus itself adds for every scrape, and the exporter's resource info.
SCRAPE_SERIES = {
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
    "target_info",
}
# Labels Prometheus or the exporter add to every series: target, bucket bound, meter scope.
ADDED_LABELS = {"__name__", "job", "instance", "le"}
SCOPE_LABEL_PREFIX = "otel_scope_"


class ModelError(Exception):
    """The model failed."""


def series_names(spec: MetricSpec) -> set[str]:
    if spec.instrument == "histogram":
        return {f"{spec.prometheus}_{suffix}" for suffix in ("bucket", "count", "sum")}
    return {spec.prometheus}


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def exercise_every_metric(otel: AgentTelemetry, health: TelemetryHealth) -> None:
    otel.register_known_names("planner", tools=["web_search"], models=["gpt-4o-mini"], targets=["researcher"])
    with otel.invoke_agent("planner", session_id="sess-1", user_id="u-1", max_steps=4) as run:
        with otel.agent_step(run):
            with otel.memory_operation(MemoryTier.LONG_TERM, "search_memory", scope=MemoryScope.USER):
                pass
            with otel.model_call("planner", "gpt-4o-mini", stream=True) as call:
                call.record_first_chunk()
                call.record_usage(100, 20)
            try:
                with otel.model_call("planner", "gpt-4o-mini"):
                    raise ModelError("HTTP 500")  # puts error.type on gen_ai.client.operation.duration
            except ModelError:
                pass
            with otel.tool_call("planner", "web_search"):
                pass
            with otel.delegation("planner", "researcher"):
                pass
        otel.record_window_tokens("planner", 2048)
        otel.record_compaction("planner")
        otel.record_extraction_lag("planner", 3.5, Outcome.SUCCESS)
    health.record_drop("traces", "queue_full", 2)


@pytest.fixture
def sdk_metrics_port() -> Iterator[int]:
    """A port serving the SDK's metrics (every catalog metric recorded once) in Prometheus format."""
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    provider = MeterProvider(
        metric_readers=[reader],
        views=metric_views(),
        resource=Resource.create({"service.name": "prometheus-test"}),
        shutdown_on_exit=False,
    )
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    health = TelemetryHealth()
    exercise_every_metric(AgentTelemetry.from_providers(tracer_provider, provider, health=health), health)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        provider.shutdown()
        tracer_provider.shutdown()


@contextmanager
def running_prometheus(tmp_path: Path, scrape_configs: str) -> Iterator[str]:
    """A real Prometheus (scraping every second) with ``scrape_configs`` (YAML list items);
    yields its URL and is stopped by PID afterwards."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            "the `prometheus` binary is not on PATH: .ci/run installs it "
            "(apt-get install --no-install-recommends prometheus); this test needs a real Prometheus"
        )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n" + scrape_configs,
        encoding="utf-8",
    )
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        log.close()


@pytest.fixture
def prometheus_url(tmp_path: Path, sdk_metrics_port: int) -> Iterator[str]:
    """A real Prometheus scraping the SDK every second; stopped by PID afterwards."""
    scrape = (
        f"  - job_name: kaos-otel\n    static_configs:\n      - targets: ['127.0.0.1:{sdk_metrics_port}']\n"
    )
    with running_prometheus(tmp_path, scrape) as url:
        yield url


def wait_for_target_up(base: str, log: Path) -> None:
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    last: object = None
    while time.monotonic() < deadline:
        try:
            targets = get_json(f"{base}/api/v1/targets")["data"]["activeTargets"]
            last = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
            if targets and all(t["health"] == "up" for t in targets):
                return
        except OSError as exc:  # not listening yet
            last = exc
        time.sleep(0.25)
    pytest.fail(f"Prometheus never scraped the SDK: {last}\n{log.read_text(errors='replace')[-2000:]}")


def metric_names(base: str, expected: set[str]) -> set[str]:
    """``__name__`` values, once all expected ones are there (or the deadline passes)."""
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    names: set[str] = set()
    while time.monotonic() < deadline:
        names = set(get_json(f"{base}/api/v1/label/__name__/values")["data"])
        if expected <= names:
            break
        time.sleep(0.25)
    return names


def label_names(base: str, series: str) -> set[str]:
    query = urllib.parse.urlencode({"match[]": series})
    found = get_json(f"{base}/api/v1/series?{query}")["data"]
    return {key for labels in found for key in labels}


def test_catalog_prometheus_names_match_a_real_prometheus(prometheus_url: str, tmp_path: Path) -> None:
    wait_for_target_up(prometheus_url, tmp_path / "prometheus.log")
    expected = {name for spec in catalog.METRICS for name in series_names(spec)}
    names = metric_names(prometheus_url, expected)

    assert expected - names == set(), f"catalog series missing in Prometheus; it has {sorted(names)}"
    assert names - expected - SCRAPE_SERIES == set(), "series the catalog does not document"

    for spec in catalog.METRICS:
        documented = {catalog.prometheus_label(key) for key in spec.attributes}
        required = {catalog.prometheus_label(key) for key in spec.required_attributes}
        for series in series_names(spec):
            labels = label_names(prometheus_url, series)
            own = {label for label in labels - ADDED_LABELS if not label.startswith(SCOPE_LABEL_PREFIX)}
            assert required <= own <= documented, (
                f"{series}: labels {sorted(own)}, catalog {sorted(documented)}"
            )
            if series.endswith("_bucket"):
                assert "le" in labels, series
    # error.type was recorded once, so its label must show up where the catalog allows it.
    duration = catalog.METRICS_BY_NAME[catalog.GEN_AI_CLIENT_OPERATION_DURATION]
    assert catalog.prometheus_label(catalog.ERROR_TYPE) in label_names(
        prometheus_url, f"{duration.prometheus}_count"
    )


def instant_query(base: str, expr: str) -> list[dict[str, Any]]:
    """The series an instant query returns."""
    answer = get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def test_every_grafana_panel_has_a_series_for_what_was_recorded(prometheus_url: str, tmp_path: Path) -> None:
    """A panel filtered to an outcome nothing had (``degraded``) shows 0, not "No data"."""
    wait_for_target_up(prometheus_url, tmp_path / "prometheus.log")
    requests = catalog.METRICS_BY_NAME[catalog.KAOS_REQUESTS].prometheus
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    while not instant_query(prometheus_url, f"count_over_time({requests}[1m]) >= 2"):  # rate() needs 2
        assert time.monotonic() < deadline, "Prometheus did not scrape the SDK twice"
        time.sleep(0.25)
    empty = [
        (title, expr) for title, expr in grafana_expressions("1m") if not instant_query(prometheus_url, expr)
    ]
    assert empty == [], f"panels without a series: {empty}"


# --------------------------------------------------------------------------- span metrics
LONG_RUN_S = 300.0
"""An agent run of five minutes: longer than any model call, well inside the catalog's buckets."""


def send_long_agent_runs(grpc_endpoint: str, service: str, seconds: float, count: int) -> None:
    """``count`` finished ``invoke_agent`` spans of ``seconds`` each, sent with the plain SDK."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=grpc_endpoint, insecure=True)))
    tracer = provider.get_tracer("prometheus-test")
    end = time.time_ns()
    for _ in range(count):
        span = tracer.start_span(
            "invoke_agent coordinator",
            start_time=end - int(seconds * 1e9),
            attributes={catalog.GEN_AI_OPERATION_NAME: "invoke_agent"},
        )
        span.end(end_time=end)
    provider.shutdown()


def test_span_metrics_latency_of_a_long_agent_run_is_not_capped(tmp_path: Path) -> None:
    """The production collector's span metrics (Jaeger's Monitor tab, through Prometheus) read a
    five-minute agent run as minutes: its buckets reach the catalog's 10 minutes. With buckets
    ending at 60 s every longer run fell into ``+Inf`` and ``histogram_quantile`` read 60 s."""
    from test_collector import start_production_collector, stop_collector

    collector, ports = start_production_collector(
        None,
        tmp_path,
        KAOS_TRACES_EXPORTERS="[debug]",
        KAOS_METRICS_EXPORTERS="[prometheus]",
        KAOS_LOGS_EXPORTERS="[debug]",
    )
    try:
        send_long_agent_runs(f"127.0.0.1:{ports['grpc']}", "long-agent", LONG_RUN_S, 4)
        scrape = (  # as collector/prometheus.yml scrapes the collector's prometheus exporter
            "  - job_name: kaos-otelcol\n"
            "    honor_labels: true\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{ports['prom']}']\n"
        )
        with running_prometheus(tmp_path, scrape) as base:
            wait_for_target_up(base, tmp_path / "prometheus.log")
            selector = (
                'traces_span_metrics_duration_milliseconds_bucket{job="long-agent", '
                'service_name="long-agent", span_name="invoke_agent coordinator"}'
            )
            expr = f"histogram_quantile(0.5, sum by (le) ({selector}))"
            deadline = time.monotonic() + SCRAPE_TIMEOUT_S
            result = instant_query(base, expr)
            while not result and time.monotonic() < deadline:
                time.sleep(0.25)
                result = instant_query(base, expr)
            assert result, f"no span metrics for the long runs in Prometheus: {expr}"
            les = {series["metric"]["le"] for series in instant_query(base, selector)}
    finally:
        stop_collector(collector)
    p50_ms = float(result[0]["value"][1])
    top_ms = max(float(le) for le in les if le != "+Inf")
    assert 120_000 < p50_ms <= 600_000, f"a {LONG_RUN_S:g} s run reads as {p50_ms} ms"
    assert top_ms >= catalog.DURATION_BUCKETS_S[-1] * 1000, f"span metric buckets end at {top_ms} ms"
