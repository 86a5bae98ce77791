"""The Prometheus alert rules: ``promtool check rules`` and ``promtool test rules`` pass, and the
unit tests cover every alert firing and not firing with the catalog's real histogram buckets.

promtool comes with the Debian ``prometheus`` package (``.ci/run`` installs it). Without it these
tests fail rather than skip: an untested rule file is a broken rule file.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kaos_otel import catalog
from kaos_otel._spans import ERROR_OUTCOMES

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "dashboards" / "prometheus" / "kaos-alerts.rules.yml"
UNIT_TESTS = ROOT / "dashboards" / "prometheus" / "kaos-alerts.test.yml"
EXPECTED_ALERTS = {
    "KaosRequestLatencyP95High",
    "KaosRequestErrorRateHigh",
    "KaosRequestCanceledRateHigh",
    "KaosModelCallFailureRateHigh",
    "KaosDelegationFailureRateHigh",
    "KaosMemoryLatencyP95High",
    "KaosShortTermMemoryLatencyP95High",
    "KaosMemoryFailureRateHigh",
    "KaosTelemetryDropped",
}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not installed: `apt-get install prometheus` (Debian) or run bash .ci/run",
            pytrace=False,
        )
    return path


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _load(RULES)["groups"] for rule in group["rules"]]


def test_promtool_check_rules() -> None:
    result = _run("check", "rules", str(RULES), cwd=ROOT)
    assert result.returncode == 0, f"promtool check rules failed:\n{result.stdout}\n{result.stderr}"
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


def test_promtool_test_rules() -> None:
    result = _run("test", "rules", str(UNIT_TESTS), cwd=ROOT)
    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}\n{result.stderr}"
    assert "SUCCESS" in result.stdout


def test_the_rule_file_has_the_expected_alerts() -> None:
    names = [rule["alert"] for rule in _rules()]
    assert sorted(names) == sorted(EXPECTED_ALERTS)


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in _load(UNIT_TESTS)["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert firing >= EXPECTED_ALERTS, f"never tested firing: {sorted(EXPECTED_ALERTS - firing)}"
    assert quiet >= EXPECTED_ALERTS, f"never tested quiet: {sorted(EXPECTED_ALERTS - quiet)}"


_SERIES = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>.*)\}$")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>[^"]*)"')


def test_histogram_inputs_use_the_catalog_buckets() -> None:
    """Every ``_bucket`` label set has one series per catalog bucket plus ``+Inf``, nothing else."""
    by_prometheus = {spec.prometheus + "_bucket": spec for spec in catalog.METRICS if spec.buckets}
    groups: dict[tuple[str, frozenset[tuple[str, str]]], set[str]] = {}
    for case in _load(UNIT_TESTS)["tests"]:
        for entry in case["input_series"]:
            match = _SERIES.match(entry["series"])
            assert match, f"unparsable series {entry['series']!r}"
            if not match["name"].endswith("_bucket"):
                continue
            labels = dict(_LABEL.findall(match["labels"]))
            le = labels.pop("le")
            groups.setdefault((match["name"], frozenset(labels.items())), set()).add(le)
    assert groups, "no histogram input series"
    for (name, label_set), les in groups.items():
        spec = by_prometheus.get(name)
        assert spec is not None and spec.buckets is not None, f"{name} is not a catalog histogram"
        expected = {f"{b:g}" for b in spec.buckets} | {"+Inf"}
        assert les == expected, f"{name}{dict(label_set)}: le {sorted(les)} != catalog {sorted(expected)}"


def test_input_series_use_catalog_names_and_labels() -> None:
    allowed: dict[str, set[str]] = {}
    for spec in catalog.METRICS:
        labels = {catalog.prometheus_label(k) for k in spec.attributes} | {"job", "instance"}
        if spec.instrument == "counter":
            allowed[spec.prometheus] = labels
        else:
            allowed[spec.prometheus + "_bucket"] = labels | {"le"}
            allowed[spec.prometheus + "_sum"] = labels
            allowed[spec.prometheus + "_count"] = labels
    for case in _load(UNIT_TESTS)["tests"]:
        for entry in case["input_series"]:
            match = _SERIES.match(entry["series"])
            assert match and match["name"] in allowed, f"not a catalog series: {entry['series']}"
            keys = {k for k, _ in _LABEL.findall(match["labels"])}
            assert keys <= allowed[match["name"]], (
                f"{entry['series']}: labels {keys - allowed[match['name']]}"
            )


def test_promtool_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    """Mutation check: with the latency threshold raised to 60 s, the unit tests must fail."""
    rules = RULES.read_text()
    assert "> 30\n" in rules
    (tmp_path / RULES.name).write_text(rules.replace("> 30\n", "> 60\n", 1))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = _run("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0, result.stdout
    assert "KaosRequestLatencyP95High" in result.stdout + result.stderr


GRAFANA = ROOT / "dashboards" / "grafana" / "kaos-agents.json"
RATIO_ALERTS = {
    "KaosRequestErrorRateHigh",
    "KaosRequestCanceledRateHigh",
    "KaosModelCallFailureRateHigh",
    "KaosDelegationFailureRateHigh",
    "KaosMemoryFailureRateHigh",
}


def test_ratios_are_0_not_empty_when_nothing_failed(tmp_path: Path) -> None:
    """Error-ratio panels and the ratio alerts' expressions give 0 for traffic without a failure."""
    expressions: dict[str, str] = {}
    for panel in json.loads(GRAFANA.read_text())["panels"]:
        for target in panel.get("targets", []):
            if panel["title"].endswith("%") or "%" in panel["title"]:
                expr = target["expr"].replace("$__rate_interval", "5m").replace("$__range", "10m")
                expressions[panel["title"]] = re.sub(r'=~"\$\w+"', '=~".*"', expr)
    for rule in _rules():
        if rule["alert"] in RATIO_ALERTS:
            expressions[rule["alert"]] = re.sub(r"\)\s*>\s*[0-9.]+\s*$", ")", rule["expr"].strip())
    assert len(expressions) == 11, sorted(expressions)
    ok = '{job="kaos-agent", %s, kaos_outcome="success"}'
    series = [
        "kaos_requests_total" + ok % 'gen_ai_agent_name="coordinator", kaos_request_origin="user"',
        "kaos_model_calls_total" + ok % 'gen_ai_agent_name="coordinator", gen_ai_request_model="m"',
        "kaos_delegations_total"
        + ok % 'gen_ai_agent_name="coordinator", kaos_delegation_target="researcher"',
        "kaos_memory_operations_total"
        + ok % 'kaos_memory_tier="short_term", kaos_memory_operation="search_memory", kaos_memory_scope="a"',
    ]
    unit = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": "0+10x20"} for s in series],
                # one group (non-empty), and its value 0 (max is NaN if any value is)
                "promql_expr_test": [
                    {
                        "expr": f"{func}(\n{expr}\n)",
                        "eval_time": "15m",
                        "exp_samples": [{"labels": "{}", "value": value}],
                    }
                    for expr in expressions.values()
                    for func, value in (("count", 1), ("max", 0))
                ],
            }
        ],
    }
    (tmp_path / "zero.test.yml").write_text(yaml.safe_dump(unit))
    result = _run("test", "rules", "zero.test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_steps_panel_reads_whole_steps(tmp_path: Path) -> None:
    """Every run takes 3 steps: the steps panel's p50 is 3 (bucket edges between whole numbers;
    with edges on them, ``histogram_quantile`` spread each bucket over (2, 3] and read 2.5)."""
    (panel,) = [p for p in json.loads(GRAFANA.read_text())["panels"] if p["title"].startswith("Steps")]
    p50, p95 = (
        re.sub(r'=~"\$\w+"', '=~".*"', target["expr"]).replace("$__rate_interval", "5m")
        for target in panel["targets"]
    )
    labels = 'job="kaos-agent", gen_ai_agent_name="coordinator"'
    buckets = [*(f"{edge:g}" for edge in catalog.STEP_BUCKETS), "+Inf"]
    series = [
        {
            "series": f'kaos_request_steps_bucket{{{labels}, le="{le}"}}',
            "values": "0x10" if float(le) < 3 else "0+10x10",  # ten runs a minute, each of 3 steps
        }
        for le in buckets
    ]
    expected = {"labels": '{gen_ai_agent_name="coordinator"}'}
    unit = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {"expr": p50, "eval_time": "8m", "exp_samples": [{**expected, "value": 3}]},
                    {"expr": p95, "eval_time": "8m", "exp_samples": [{**expected, "value": 3.45}]},
                ],
            }
        ],
    }
    (tmp_path / "steps.test.yml").write_text(yaml.safe_dump(unit))
    result = _run("test", "rules", "steps.test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


PROMETHEUS_CONFIG = ROOT / "collector" / "prometheus.yml"
SDK_EXPORT_INTERVAL_S = 60  # OpenTelemetry's default OTEL_METRIC_EXPORT_INTERVAL (60000 ms)


def _seconds(duration: str) -> int:
    """``15s``, ``2m``, ``1h`` -> seconds."""
    match = re.fullmatch(r"(\d+)([smh])", duration)
    assert match, f"unsupported duration {duration!r}"
    return int(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]]


def _grafana_rate_interval(panel: dict[str, Any], scrape_s: int) -> int:
    """Grafana's ``$__rate_interval`` at short time ranges (``$__interval`` is the panel's Min
    interval, or the data source's scrape interval): max($__interval + scrape, 4 * scrape)."""
    interval = _seconds(panel["interval"]) if panel.get("interval") else scrape_s
    return max(interval + scrape_s, 4 * scrape_s)


def test_grafana_rate_windows_span_two_sdk_exports(tmp_path: Path) -> None:
    """A counter pushed through the collector changes once per SDK export (every 60 s by
    default), however often Prometheus scrapes it (15 s in collector/prometheus.yml). Each
    time-series panel's ``$__rate_interval`` must span two exports: Grafana's default 1 minute
    holds one export or none, so a steady rate read 4/3 of itself or 0 and latency quantiles had
    gaps. Checked on every panel, then with promtool on a rate panel and a quantile panel at
    times that do not line up with the scrapes, as real scrapes do not."""
    scrape_s = _seconds(_load(PROMETHEUS_CONFIG)["global"]["scrape_interval"])
    panels = [p for p in json.loads(GRAFANA.read_text())["panels"] if p["type"] == "timeseries"]
    windows = {p["title"]: _grafana_rate_interval(p, scrape_s) for p in panels}
    short = {title: w for title, w in windows.items() if w < 2 * SDK_EXPORT_INTERVAL_S}
    assert not short, f"$__rate_interval (s) shorter than two SDK exports: {short}"

    def expr_of(title: str, ref: str = "A") -> str:
        (panel,) = [p for p in panels if p["title"] == title]
        (target,) = [t for t in panel["targets"] if t["refId"] == ref]
        expr = target["expr"].replace("$__rate_interval", f"{windows[title]}s")
        return re.sub(r'=~"\$\w+"', '=~".*"', expr)

    exports = 12
    per_export = 10  # requests per SDK export, all between 1 s and 2.5 s: p50 = 1.75 s
    samples_per_export = SDK_EXPORT_INTERVAL_S // scrape_s

    def stepping(count: int) -> str:
        return " ".join(str(count * (i // samples_per_export)) for i in range(exports * samples_per_export))

    labels = 'job="kaos-agent", gen_ai_agent_name="coordinator", kaos_request_origin="user", '
    labels += 'kaos_outcome="success"'
    buckets = [*(f"{edge:g}" for edge in catalog.DURATION_BUCKETS_S), "+Inf"]
    series = [{"series": f"kaos_requests_total{{{labels}}}", "values": stepping(per_export)}]
    series += [
        {
            "series": f'kaos_request_duration_seconds_bucket{{{labels}, le="{le}"}}',
            "values": stepping(per_export if le == "+Inf" or float(le) >= 2.5 else 0),
        }
        for le in buckets
    ]
    rate = expr_of("Request rate by agent and outcome")
    p50 = expr_of("Request latency p50 / p95 / p99 by agent")
    # scrapes at :00, :15, :30, :45; evaluations 7 s after each
    times = [f"9m{s}s" for s in (7, 22, 37, 52)]
    rate_labels = '{gen_ai_agent_name="coordinator", kaos_outcome="success"}'
    tests = [
        {"expr": rate, "eval_time": t, "exp_samples": [{"labels": rate_labels, "value": per_export / 60}]}
        for t in times
    ]
    tests += [
        {
            "expr": p50,
            "eval_time": t,
            "exp_samples": [{"labels": '{gen_ai_agent_name="coordinator"}', "value": 1.75}],
        }
        for t in times
    ]
    unit = {
        "evaluation_interval": f"{scrape_s}s",
        "tests": [{"interval": f"{scrape_s}s", "input_series": series, "promql_expr_test": tests}],
    }
    (tmp_path / "rate.test.yml").write_text(yaml.safe_dump(unit))
    result = _run("test", "rules", "rate.test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_runs_that_fail_as_their_spans_say_count_as_errors(tmp_path: Path) -> None:
    """A run that ends ``max_steps`` (its step budget used up without an answer) has span status
    ERROR, as ``error`` has: the request error ratios count both. An agent looping on every
    request answered no one while its error panels read 0 % and its error alert stayed quiet."""
    failed = {outcome.value for outcome in ERROR_OUTCOMES}
    expressions: dict[str, tuple[str, float]] = {}
    for panel in json.loads(GRAFANA.read_text())["panels"]:
        if panel["title"] in {"Request error %", "Request error rate % by agent"}:
            (target,) = panel["targets"]
            expr = target["expr"].replace("$__rate_interval", "5m").replace("$__range", "10m")
            expressions[panel["title"]] = (re.sub(r'=~"\$\w+"', '=~".*"', expr), 100)
    (rule,) = [r for r in _rules() if r["alert"] == "KaosRequestErrorRateHigh"]
    expressions[rule["alert"]] = (re.sub(r"\)\s*>\s*[0-9.]+\s*$", ")", rule["expr"].strip()), 1)
    assert len(expressions) == 3, sorted(expressions)
    labels = 'job="kaos-agent", gen_ai_agent_name="coordinator", kaos_request_origin="user"'
    for outcome in sorted(failed):
        unit = {
            "evaluation_interval": "1m",
            "tests": [
                {
                    "interval": "1m",
                    "input_series": [
                        {
                            "series": f'kaos_requests_total{{{labels}, kaos_outcome="success"}}',
                            "values": "0x20",
                        },
                        {
                            "series": f'kaos_requests_total{{{labels}, kaos_outcome="{outcome}"}}',
                            "values": "0+10x20",
                        },
                    ],
                    "promql_expr_test": [
                        {
                            "expr": f"max(\n{expr}\n)",
                            "eval_time": "15m",
                            "exp_samples": [{"labels": "{}", "value": value}],
                        }
                        for expr, value in expressions.values()
                    ],
                }
            ],
        }
        (tmp_path / "failed.test.yml").write_text(yaml.safe_dump(unit))
        result = _run("test", "rules", "failed.test.yml", cwd=tmp_path)
        assert result.returncode == 0, f"outcome {outcome}:\n{result.stdout}{result.stderr}"
