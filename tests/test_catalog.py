"""The catalog as published: ``kaos-otel catalog --json``, its metric rules and docs/metrics.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from kaos_otel import catalog
from kaos_otel.cli import main
from kaos_otel.exporters.health import DropReason, Signal

DOCS = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
REGENERATE = "regenerate it: kaos-otel catalog --markdown > docs/metrics.md"

# The bucket boundaries the GenAI semantic conventions prescribe for the client metrics.
CONVENTION_DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
CONVENTION_TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip


@pytest.fixture
def published(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["catalog", "--json"]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def test_catalog_json_lists_spans_metrics_and_log_events(published: dict[str, Any]) -> None:
    for section in ("spans", "metrics", "log_events"):
        assert published[section], f"empty section {section}"
    assert {span["name"] for span in published["spans"]} == {spec.name for spec in catalog.SPANS}
    assert {event["name"] for event in published["log_events"]} == {e.name for e in catalog.LOG_EVENTS}
    metrics = {metric["name"]: metric for metric in published["metrics"]}
    assert list(metrics) == [spec.name for spec in catalog.METRICS]
    for spec in catalog.METRICS:
        metric = metrics[spec.name]
        assert metric["instrument"] == spec.instrument
        assert metric["unit"] == spec.unit
        assert metric["attributes"] == list(spec.attributes)
        assert metric["prometheus"] == spec.prometheus
        assert metric["signoz"] == spec.signoz


def test_metric_labels_are_declared_and_never_ids_or_content(published: dict[str, Any]) -> None:
    declared = {attribute.key: attribute for attribute in catalog.ATTRIBUTES}
    for metric in published["metrics"]:
        for key in metric["attributes"]:
            assert key in declared, f"{metric['name']}: label {key} is not in catalog.ATTRIBUTES"
            assert key not in catalog.HIGH_CARDINALITY_KEYS, f"{metric['name']}: id {key} as a label"
            assert not declared[key].content, f"{metric['name']}: content {key} as a label"


def test_every_id_attribute_is_kept_off_metric_labels() -> None:
    """Each id the catalog declares (``*.id``) is in the list that keeps ids off metric labels."""
    ids = {spec.key for spec in catalog.ATTRIBUTES if spec.key.endswith(".id")}
    assert catalog.GEN_AI_RESPONSE_ID in ids
    assert ids <= catalog.HIGH_CARDINALITY_KEYS, sorted(ids - catalog.HIGH_CARDINALITY_KEYS)


def test_units_and_buckets() -> None:
    for spec in catalog.METRICS:
        assert spec.unit != "ms", f"{spec.name}: durations are in seconds"
        if spec.instrument == "counter":
            assert spec.buckets is None, spec.name
            continue
        assert spec.buckets, f"{spec.name}: histograms need explicit buckets"
        assert list(spec.buckets) == sorted(set(spec.buckets)), f"{spec.name}: buckets must increase"
        if spec.unit == "s" and not spec.name.startswith("gen_ai."):
            assert spec.buckets[0] <= 0.005 and spec.buckets[-1] >= 600, f"{spec.name}: 5 ms..10 min"
    by_name = catalog.METRICS_BY_NAME
    assert by_name[catalog.GEN_AI_CLIENT_OPERATION_DURATION].unit == "s"
    assert by_name[catalog.GEN_AI_CLIENT_OPERATION_DURATION].buckets == CONVENTION_DURATION_BUCKETS
    assert by_name[catalog.GEN_AI_CLIENT_TOKEN_USAGE].unit == "{token}"
    assert by_name[catalog.GEN_AI_CLIENT_TOKEN_USAGE].buckets == CONVENTION_TOKEN_BUCKETS


def test_label_set_bound_is_the_product_of_key_bounds() -> None:
    for spec in catalog.METRICS:
        bounds = dict(spec.label_value_bounds)
        assert list(bounds) == list(spec.attributes), spec.name
        assert all(bound >= 1 for bound in bounds.values()), spec.name
    tools = catalog.METRICS_BY_NAME[catalog.KAOS_TOOL_CALLS]
    # agents and tools: up to the cap plus the overflow value; outcomes: a closed set
    assert tools.max_label_sets == (catalog.LABEL_VALUE_CAP + 1) ** 2 * len(catalog.Outcome)
    memory = catalog.METRICS_BY_NAME[catalog.KAOS_MEMORY_OPERATIONS]
    # every listed operation plus "other", every scope plus "none"
    assert memory.value_bound(catalog.KAOS_MEMORY_OPERATION) == len(catalog.MEMORY_OPERATIONS) + 1
    assert memory.value_bound(catalog.KAOS_MEMORY_SCOPE) == len(catalog.MemoryScope) + 1
    duration = catalog.METRICS_BY_NAME[catalog.GEN_AI_CLIENT_OPERATION_DURATION]
    # up to the cap, the overflow value, or absent
    assert duration.value_bound(catalog.ERROR_TYPE) == catalog.LABEL_VALUE_CAP + 2


def test_backend_names_follow_the_documented_translation() -> None:
    by_name = catalog.METRICS_BY_NAME
    assert by_name[catalog.KAOS_REQUEST_DURATION].prometheus == "kaos_request_duration_seconds"
    assert by_name[catalog.KAOS_REQUESTS].prometheus == "kaos_requests_total"
    assert by_name[catalog.GEN_AI_CLIENT_TOKEN_USAGE].prometheus == "gen_ai_client_token_usage"
    assert by_name[catalog.KAOS_REQUEST_DURATION].signoz == "kaos.request.duration.bucket"
    assert by_name[catalog.KAOS_REQUESTS].signoz == "kaos.requests"
    assert catalog.prometheus_name("kaos.request.duration", "ms", monotonic=False) == (
        "kaos_request_duration_milliseconds"
    )
    assert catalog.prometheus_label(catalog.GEN_AI_AGENT_NAME) == "gen_ai_agent_name"


def test_docs_metrics_md_is_generated_from_the_catalog() -> None:
    assert DOCS.is_file(), f"docs/metrics.md is missing; {REGENERATE}"
    text = DOCS.read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(" `"): line for line in text.splitlines() if line.startswith("| `")}
    for spec in catalog.METRICS:
        row = rows.get(spec.name)
        assert row is not None, f"docs/metrics.md does not list {spec.name}; {REGENERATE}"
        assert f"`{spec.prometheus}" in row, f"{spec.name}: Prometheus name missing; {REGENERATE}"
        assert f"`{spec.signoz}`" in row, f"{spec.name}: SigNoz name missing; {REGENERATE}"
        assert f"`{spec.unit}`" in row, f"{spec.name}: unit missing; {REGENERATE}"
    assert text == catalog.metrics_markdown(), f"docs/metrics.md differs from the catalog; {REGENERATE}"


def test_markdown_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kaos_otel", "catalog", "--markdown"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == catalog.metrics_markdown()


def test_the_health_types_name_the_catalogs_values() -> None:
    """The loss counter's label values live in the catalog; the types that check them agree."""
    assert get_args(Signal) == catalog.TELEMETRY_SIGNALS
    assert get_args(DropReason) == catalog.TELEMETRY_DROP_REASONS
