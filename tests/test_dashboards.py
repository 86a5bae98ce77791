"""Dashboards and alert rules are checked against SigNoz's own schema and against the catalog.

1. The SigNoz v2 dashboard and every SigNoz alert rule validate against SigNoz's OpenAPI schemas
   (``DashboardtypesPostableDashboardV2``, ``RuletypesPostableRule``; copied into
   ``tests/data/signoz-openapi-schemas.json``), once with the documented recipe and once strictly
   (unknown fields rejected, discriminators honoured, as SigNoz's decoder does), and broken
   copies fail.
2. What the schema does not check: the 12-column grid, layout ``$ref`` targets, one query per
   panel, query names and formulas, the rule schema variant (v2alpha1 only, no v1 fields).
3. Every metric name, label key and label value in the SigNoz dashboard and rules, the Prometheus
   rules and the Grafana dashboard exists in ``kaos_otel.catalog`` and is allowed on that metric;
   units and thresholds are in seconds; SigNoz and Prometheus alerts agree.
4. Every catalog metric is on the SigNoz (and Grafana) dashboard.
5. ``kaos-otel dashboards import`` against a fake SigNoz (``httpx.MockTransport``, no network).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import sys
from collections.abc import Callable, Collection, Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from kaos_otel import _signoz_import, catalog
from kaos_otel.catalog import MetricSpec

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "dashboards"
SIGNOZ_DASHBOARD = DASHBOARDS / "signoz" / "kaos-agents.v2.json"
SIGNOZ_ALERTS = sorted((DASHBOARDS / "signoz" / "alerts").glob("*.json"))
GRAFANA_DASHBOARD = DASHBOARDS / "grafana" / "kaos-agents.json"
PROMETHEUS_RULES = DASHBOARDS / "prometheus" / "kaos-alerts.rules.yml"
OPENAPI_SUBSET = Path(__file__).resolve().parent / "data" / "signoz-openapi-schemas.json"

Json = dict[str, Any]


def _load_script(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@cache
def build() -> ModuleType:
    return _load_script("kaos_dashboards_build", DASHBOARDS / "build.py")


def importer() -> ModuleType:
    return _signoz_import


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def signoz_dashboard() -> Json:
    data: Json = _json(SIGNOZ_DASHBOARD)
    return data


def signoz_rules() -> list[Json]:
    return [_json(path) for path in SIGNOZ_ALERTS]


def prometheus_rules() -> list[Json]:
    data = yaml.safe_load(PROMETHEUS_RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def grafana_dashboard() -> Json:
    data: Json = _json(GRAFANA_DASHBOARD)
    return data


def test_generated_files_are_up_to_date() -> None:
    stale = build().stale_files()
    assert not stale, f"regenerate with `python dashboards/build.py`: stale {[str(p) for p in stale]}"


def test_the_expected_files_exist() -> None:
    assert SIGNOZ_DASHBOARD.is_file() and GRAFANA_DASHBOARD.is_file() and PROMETHEUS_RULES.is_file()
    assert {r["alert"] for r in signoz_rules()} == {r["alert"] for r in prometheus_rules()}
    assert len(SIGNOZ_ALERTS) == 9


# --- 1. SigNoz's OpenAPI schemas ----------------------------------------------------------
def _to_json_schema(node: Any, *, strict: bool) -> Any:
    """OpenAPI 3.0 -> JSON Schema 2020-12.

    Recipe (README): drop ``discriminator``, ``oneOf`` -> ``anyOf``, ``nullable`` -> an added
    ``"null"`` type, ``#/components/schemas/`` -> ``#/$defs/``. ``strict`` also rejects unknown
    properties and turns a discriminator into ``if kind == X then <schema X>``, as SigNoz's
    JSON decoding does.
    """
    if isinstance(node, list):
        return [_to_json_schema(item, strict=strict) for item in node]
    if not isinstance(node, dict):
        return node
    out: Json = {}
    for key, value in node.items():
        if key in ("discriminator", "nullable"):
            continue
        if key == "$ref":
            out[key] = value.replace("#/components/schemas/", "#/$defs/")
        elif key == "oneOf":
            out["anyOf"] = _to_json_schema(value, strict=strict)
        elif key == "properties":
            out[key] = {name: _to_json_schema(sub, strict=strict) for name, sub in value.items()}
        else:
            out[key] = _to_json_schema(value, strict=strict)
    if node.get("nullable"):
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
        elif "$ref" in out or "anyOf" in out:
            out = {"anyOf": [out, {"type": "null"}]}
    if strict:
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        discriminator = node.get("discriminator")
        if discriminator:
            prop, mapping = discriminator["propertyName"], discriminator["mapping"]
            out = {
                "type": "object",
                "required": [prop],
                "properties": {prop: {"enum": sorted(mapping)}},
                "allOf": [
                    {
                        "if": {"properties": {prop: {"const": value}}},
                        "then": {"$ref": target.replace("#/components/schemas/", "#/$defs/")},
                    }
                    for value, target in mapping.items()
                ],
            }
    return out


@cache
def validator(root: str, strict: bool) -> jsonschema.Draft202012Validator:
    schemas = _json(OPENAPI_SUBSET)["schemas"]
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": f"#/$defs/{root}",
        "$defs": {name: _to_json_schema(s, strict=strict) for name, s in schemas.items()},
    }
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(root: str, instance: Any, strict: bool) -> list[str]:
    errors = sorted(validator(root, strict).iter_errors(instance), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors]


DASHBOARD_SCHEMA = "DashboardtypesPostableDashboardV2"
RULE_SCHEMA = "RuletypesPostableRule"


@pytest.mark.parametrize("strict", [False, True], ids=["recipe", "strict"])
def test_signoz_dashboard_matches_the_openapi_schema(strict: bool) -> None:
    errors = _errors(DASHBOARD_SCHEMA, signoz_dashboard(), strict)
    assert not errors, "\n".join(errors[:20])


@pytest.mark.parametrize("strict", [False, True], ids=["recipe", "strict"])
@pytest.mark.parametrize("path", SIGNOZ_ALERTS, ids=[p.stem for p in SIGNOZ_ALERTS])
def test_signoz_alert_rule_matches_the_openapi_schema(path: Path, strict: bool) -> None:
    errors = _errors(RULE_SCHEMA, _json(path), strict)
    assert not errors, "\n".join(errors[:20])


def _first_panel(dashboard: Json) -> Json:
    panel: Json = next(iter(dashboard["spec"]["panels"].values()))
    return panel


def _first_builder(dashboard: Json) -> Json:
    for panel in dashboard["spec"]["panels"].values():
        plugin = panel["spec"]["queries"][0]["spec"]["plugin"]
        if plugin["kind"] == "signoz/BuilderQuery":
            spec: Json = plugin["spec"]
            return spec
    raise AssertionError("no builder query")


def _drop_layouts(d: Json) -> None:
    del d["spec"]["layouts"]


def _bad_panel_kind(d: Json) -> None:
    _first_panel(d)["spec"]["plugin"]["kind"] = "signoz/GaugePanel"


def _bad_space_aggregation(d: Json) -> None:
    _first_builder(d)["aggregations"][0]["spaceAggregation"] = "p95.5"


def _bad_query_kind(d: Json) -> None:
    _first_panel(d)["spec"]["queries"][0]["spec"]["plugin"]["kind"] = "signoz/Query"


def _bad_variable_signal(d: Json) -> None:
    d["spec"]["variables"][0]["spec"]["plugin"]["spec"]["signal"] = "spans"


def _unknown_top_level_field(d: Json) -> None:
    d["version"] = "v5"


def _unknown_panel_field(d: Json) -> None:
    _first_panel(d)["spec"]["widgets"] = []


@pytest.mark.parametrize(
    ("mutate", "strict_only"),
    [
        (_drop_layouts, False),
        (_bad_panel_kind, False),
        (_bad_space_aggregation, False),
        (_bad_query_kind, False),
        (_bad_variable_signal, False),
        (_unknown_top_level_field, True),
        (_unknown_panel_field, True),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else None,
)
def test_the_schema_rejects_a_broken_dashboard(mutate: Callable[[Json], None], strict_only: bool) -> None:
    broken = copy.deepcopy(signoz_dashboard())
    mutate(broken)
    assert _errors(DASHBOARD_SCHEMA, broken, True), "strict validation accepted a broken dashboard"
    if not strict_only:
        assert _errors(DASHBOARD_SCHEMA, broken, False), "recipe validation accepted a broken dashboard"


def _rule_bad_op(r: Json) -> None:
    r["condition"]["thresholds"]["spec"][0]["op"] = "greater_than"


def _rule_bad_match(r: Json) -> None:
    r["condition"]["thresholds"]["spec"][0]["matchType"] = "always"


def _rule_no_condition(r: Json) -> None:
    del r["condition"]


def _rule_bad_alert_type(r: Json) -> None:
    r["alertType"] = "METRICS_ALERT"


def _rule_bad_evaluation(r: Json) -> None:
    r["evaluation"]["spec"] = {"window": "5m"}


@pytest.mark.parametrize(
    "mutate", [_rule_bad_op, _rule_bad_match, _rule_no_condition, _rule_bad_alert_type, _rule_bad_evaluation]
)
def test_the_schema_rejects_a_broken_rule(mutate: Callable[[Json], None]) -> None:
    broken = copy.deepcopy(signoz_rules()[0])
    mutate(broken)
    assert _errors(RULE_SCHEMA, broken, True)
    assert _errors(RULE_SCHEMA, broken, False)


# --- 2. what the schema does not check ----------------------------------------------------
def _overlaps(boxes: list[tuple[int, int, int, int]]) -> list[tuple[int, int]]:
    bad = []
    for i, (x1, y1, w1, h1) in enumerate(boxes):
        for j, (x2, y2, w2, h2) in enumerate(boxes[:i]):
            if x1 < x2 + w2 and x2 < x1 + w1 and y1 < y2 + h2 and y2 < y1 + h1:
                bad.append((j, i))
    return bad


def test_signoz_grid_layout() -> None:
    spec = signoz_dashboard()["spec"]
    referenced: list[str] = []
    for layout in spec["layouts"]:
        assert layout["kind"] == "Grid"
        items = layout["spec"]["items"]
        assert 0 < len(items) <= 100
        boxes = []
        for item in items:
            x, y, width, height = item["x"], item["y"], item["width"], item["height"]
            assert x >= 0 and y >= 0 and width > 0 and height > 0, item
            assert x + width <= 12, f"{layout['spec']['display']['title']}: x + width > 12 in {item}"
            boxes.append((x, y, width, height))
            ref = item["content"]["$ref"]
            assert ref.startswith("#/spec/panels/"), ref
            key = ref.removeprefix("#/spec/panels/")
            assert key in spec["panels"], f"layout $ref to a missing panel: {ref}"
            referenced.append(key)
        assert not _overlaps(boxes), f"overlapping panels in {layout['spec']['display']['title']}"
    assert sorted(referenced) == sorted(spec["panels"]), "every panel is placed exactly once"


def _queries(panel: Json) -> list[Json]:
    """The query specs of a panel: its builder queries and formulas (``type`` set)."""
    plugin = panel["spec"]["queries"][0]["spec"]["plugin"]
    if plugin["kind"] == "signoz/BuilderQuery":
        return [{"type": "builder_query", "spec": plugin["spec"]}]
    assert plugin["kind"] == "signoz/CompositeQuery", plugin["kind"]
    envelopes: list[Json] = plugin["spec"]["queries"]
    return envelopes


def _check_query_set(where: str, envelopes: list[Json]) -> None:
    names = [e["spec"]["name"] for e in envelopes]
    assert len(names) == len(set(names)), f"{where}: duplicate query names {names}"
    builders = {e["spec"]["name"] for e in envelopes if e["type"] == "builder_query"}
    assert builders, f"{where}: no builder query"
    assert any(not e["spec"].get("disabled") for e in envelopes), f"{where}: every query is disabled"
    for envelope in envelopes:
        assert envelope["type"] in ("builder_query", "builder_formula"), f"{where}: {envelope['type']}"
        if envelope["type"] == "builder_formula":
            used = set(re.findall(r"\b[A-Z]\b", envelope["spec"]["expression"]))
            assert used and used <= builders, f"{where}: formula uses {used - builders}"


def test_signoz_panels_have_one_query_each() -> None:
    for panel in signoz_dashboard()["spec"]["panels"].values():
        title = panel["spec"]["display"]["name"]
        queries = panel["spec"]["queries"]
        assert len(queries) == 1, f"{title}: {len(queries)} queries (use signoz/CompositeQuery)"
        expected_kind = {"signoz/NumberPanel": "scalar", "signoz/TimeSeriesPanel": "time_series"}
        assert queries[0]["kind"] == expected_kind[panel["spec"]["plugin"]["kind"]], title
        envelopes = _queries(panel)
        _check_query_set(title, envelopes)
        if panel["spec"]["queries"][0]["spec"]["plugin"]["kind"] == "signoz/CompositeQuery":
            assert len(envelopes) > 1, f"{title}: a composite query with one query"


_V1_RULE_FIELDS = ("evalWindow", "frequency", "preferredChannels")
_V1_CONDITION_FIELDS = ("op", "target", "matchType", "targetUnit")
_LABEL_NAME = re.compile(r"^[a-zA-Z_.][a-zA-Z0-9_.]*$")


@pytest.mark.parametrize("path", SIGNOZ_ALERTS, ids=[p.stem for p in SIGNOZ_ALERTS])
def test_signoz_rule_semantics(path: Path) -> None:
    """What SigNoz's ``PostableRule.Validate`` checks, and one schema variant (v2alpha1) only."""
    rule = _json(path)
    assert rule["version"] == "v5"
    assert rule["schemaVersion"] == "v2alpha1"
    assert rule["alertType"] == "METRIC_BASED_ALERT" and rule["ruleType"] == "threshold_rule"
    condition = rule["condition"]
    for name in _V1_RULE_FIELDS:
        assert name not in rule, f"v1 field {name} mixed into a v2alpha1 rule"
    for name in _V1_CONDITION_FIELDS:
        assert name not in condition, f"v1 field condition.{name} mixed into a v2alpha1 rule"
    assert condition["thresholds"]["kind"] == "basic" and condition["thresholds"]["spec"]
    for threshold in condition["thresholds"]["spec"]:
        assert threshold["name"] and threshold["target"] is not None
    assert rule["evaluation"]["kind"] == "rolling"
    assert rule["notificationSettings"]["renotify"]["interval"]
    composite = condition["compositeQuery"]
    assert composite["queryType"] == "builder" and composite["panelType"] == "graph"
    envelopes = composite["queries"]
    _check_query_set(rule["alert"], envelopes)
    assert condition["selectedQueryName"] in {e["spec"]["name"] for e in envelopes}
    selected = next(e for e in envelopes if e["spec"]["name"] == condition["selectedQueryName"])
    assert not selected["spec"].get("disabled"), "the evaluated query is disabled"
    for key in [*rule["labels"], *rule["annotations"]]:
        assert _LABEL_NAME.match(key), f"invalid label/annotation name {key!r}"
    assert path.stem == build().ALERTS[[a.name for a in build().ALERTS].index(rule["alert"])].slug


# --- 3. names, labels, units against the catalog ------------------------------------------
HISTOGRAM_PARTS = ("bucket", "sum", "count", "min", "max")
QUANTILES = {"p50", "p75", "p90", "p95", "p99"}
ENUMERATED: dict[str, set[str]] = {
    catalog.KAOS_OUTCOME: {o.value for o in catalog.Outcome},
    catalog.KAOS_MEMORY_TIER: {t.value for t in catalog.MemoryTier},
    catalog.KAOS_MEMORY_OPERATION: set(catalog.MEMORY_OPERATIONS),
    catalog.KAOS_MEMORY_SCOPE: {s.value for s in catalog.MemoryScope},
    catalog.GEN_AI_TOKEN_TYPE: {"input", "output"},
}
RESOURCE_KEYS = {"service.name": "job"}
"""Resource attributes SigNoz queries may group by, and their Prometheus label."""
TIME_UNITS = {"ns", "µs", "us", "ms", "s", "m", "h", "d", "dtdurations", "dtdurationms"}


def resolve_signoz(name: str) -> tuple[MetricSpec, str]:
    """A SigNoz metric name -> (catalog spec, histogram part or "")."""
    spec = catalog.METRICS_BY_NAME.get(name)
    if spec is not None:
        assert spec.instrument == "counter", f"{name}: a histogram is queried as {name}.bucket/.sum/.count"
        return spec, ""
    base, _, part = name.rpartition(".")
    spec = catalog.METRICS_BY_NAME.get(base)
    assert spec is not None and part in HISTOGRAM_PARTS, f"{name!r} is not a catalog metric"
    assert spec.instrument == "histogram", f"{name}: .{part} of a {spec.instrument}"
    return spec, part


_CLAUSE = re.compile(r"^(?P<key>[a-zA-Z_][\w.]*)\s+(?P<op>=|!=|IN|NOT IN)\s+(?P<value>.+)$")
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'")


def _filter_clauses(expression: str) -> Iterator[tuple[str, str, list[str]]]:
    """``key IN $var AND key = 'v' AND key IN ('a', 'b')`` -> (key, op, values-or-$vars)."""
    if not expression.strip():
        return
    for clause in re.split(r"\s+AND\s+", expression.strip()):
        match = _CLAUSE.match(clause)
        assert match, f"filter clause not understood: {clause!r} in {expression!r}"
        value = match["value"].strip()
        if value.startswith("$"):
            assert re.fullmatch(r"\$[a-zA-Z_][\w.]*", value), value
            values = [value]
        elif value.startswith("("):
            assert value.endswith(")"), value
            values = _QUOTED.findall(value)
            assert values and len(values) == value.count(",") + 1, value
        else:
            values = _QUOTED.findall(value)
            assert len(values) == 1 and value == f"'{values[0]}'", value
        yield match["key"], match["op"], values


def _check_signoz_builder(where: str, spec: Json, variables: dict[str, str]) -> tuple[MetricSpec, str]:
    assert spec["signal"] == "metrics", where
    assert len(spec["aggregations"]) == 1, f"{where}: one aggregation per builder query"
    aggregation = spec["aggregations"][0]
    metric, part = resolve_signoz(aggregation["metricName"])
    time_agg, space_agg = aggregation["timeAggregation"], aggregation["spaceAggregation"]
    if part == "bucket":
        assert space_agg in QUANTILES and time_agg == "", f"{where}: histogram buckets need p50..p99"
    else:
        assert (time_agg, space_agg) in {("rate", "sum"), ("increase", "sum")}, f"{where}: {aggregation}"
    allowed = set(metric.attributes)
    keys = {g["name"] for g in spec["groupBy"]}
    for group in spec["groupBy"]:
        if group["fieldContext"] == "resource":
            assert group["name"] in RESOURCE_KEYS, f"{where}: group by resource {group['name']}"
        else:
            assert group["fieldContext"] == "attribute", group
            assert group["name"] in allowed, f"{where}: group by {group['name']} not allowed on {metric.name}"
    for key, _, values in _filter_clauses(spec["filter"]["expression"]):
        assert key in allowed, f"{where}: filter on {key} not allowed on {metric.name}"
        for value in values:
            if value.startswith("$"):
                assert variables.get(value[1:]) == key, f"{where}: {value} is not a variable over {key}"
            elif key in ENUMERATED:
                assert value in ENUMERATED[key], f"{where}: {key} is never {value!r}"
    for legend_key in re.findall(r"\{\{\s*([^}\s]+)\s*\}\}", spec.get("legend", "")):
        assert legend_key in keys, f"{where}: legend uses {legend_key}, not grouped by"
    return metric, part


def _signoz_variables(dashboard: Json) -> dict[str, str]:
    variables = {}
    for variable in dashboard["spec"]["variables"]:
        plugin = variable["spec"]["plugin"]
        assert plugin["kind"] == "signoz/DynamicVariable"
        key = plugin["spec"]["name"]
        assert key in {a.key for a in catalog.ATTRIBUTES}, f"variable over unknown attribute {key}"
        assert key not in catalog.HIGH_CARDINALITY_KEYS
        assert any(key in m.attributes for m in catalog.METRICS), f"no metric carries {key}"
        variables[variable["spec"]["name"]] = key
    return variables


def _is_percent(envelopes: list[Json]) -> bool:
    return any(e["type"] == "builder_formula" and "* 100" in e["spec"]["expression"] for e in envelopes)


_FIXED_VALUE_TERM = re.compile(r"[\w.]+ (?:= '[^']*'|IN \((?!\$)[^)]*\))")


def _filter_terms(builder: Json) -> set[str]:
    expression: str = builder["filter"]["expression"]
    return set(expression.split(" AND ")) if expression else set()


def test_signoz_panels_filtered_to_a_value_show_zero_for_groups_with_traffic() -> None:
    """A query filtered to one value (outcome, origin) is paired in a formula with the same query
    without that filter, so a group with traffic but no match shows 0, not "No data": SigNoz's
    formula evaluator takes a missing ``rate`` / ``increase`` operand as 0 (``canDefaultZero`` in
    its ``querybuildertypesv5``), which a lone filtered query never reaches. A query that is
    itself the whole of another (a percentage's denominator) has nothing to be 0 against, and a
    quantile of nothing is no number."""
    for panel in signoz_dashboard()["spec"]["panels"].values():
        title = panel["spec"]["display"]["name"]
        envelopes = _queries(panel)
        builders = [e["spec"] for e in envelopes if e["type"] == "builder_query"]
        formulas = " ".join(e["spec"]["expression"] for e in envelopes if e["type"] == "builder_formula")
        for builder in builders:
            terms = _filter_terms(builder)
            fixed = {t for t in terms if _FIXED_VALUE_TERM.fullmatch(t)}
            aggregation = builder["aggregations"][0]
            counted = aggregation["timeAggregation"] in ("rate", "increase")
            if not (fixed and counted) or any(_filter_terms(other) > terms for other in builders):
                continue
            assert builder["disabled"] and builder["name"] in formulas, f"{title}: {fixed} shown alone"
            wholes = [
                other["name"]
                for other in builders
                if other["aggregations"][0] == aggregation
                and other["groupBy"] == builder["groupBy"]
                and _filter_terms(other) < terms
                and other["name"] in formulas
            ]
            assert wholes, f"{title}: no {aggregation['metricName']} without {fixed} beside it"


def test_signoz_dashboard_uses_catalog_names_labels_and_units() -> None:
    dashboard = signoz_dashboard()
    variables = _signoz_variables(dashboard)
    assert variables.get("agent") == catalog.GEN_AI_AGENT_NAME
    for panel in dashboard["spec"]["panels"].values():
        title = panel["spec"]["display"]["name"]
        unit = panel["spec"]["plugin"]["spec"]["formatting"]["unit"]
        envelopes = _queries(panel)
        resolved = [
            _check_signoz_builder(title, e["spec"], variables)
            for e in envelopes
            if e["type"] == "builder_query"
        ]
        if _is_percent(envelopes):
            assert unit == "percent", f"{title}: a percentage shown as {unit!r}"
        elif all(part == "bucket" for _, part in resolved):
            seconds = {m.unit == "s" for m, _ in resolved}
            assert len(seconds) == 1, f"{title}: mixes units"
            if seconds == {True}:
                assert unit == "s", f"{title}: durations are in seconds, panel unit is {unit!r}"
            else:
                assert unit not in TIME_UNITS, f"{title}: {resolved[0][0].unit} shown as time ({unit})"
        else:
            assert unit not in TIME_UNITS, f"{title}: a count or rate shown as time ({unit})"


def _threshold_in_buckets(where: str, metric: MetricSpec, threshold: float) -> None:
    assert metric.unit == "s" and metric.buckets
    assert threshold in metric.buckets, (
        f"{where}: latency threshold {threshold} is not a bucket boundary of {metric.name} "
        f"(seconds: {metric.buckets}); a value in milliseconds would be far above the last bucket"
    )


@pytest.mark.parametrize("path", SIGNOZ_ALERTS, ids=[p.stem for p in SIGNOZ_ALERTS])
def test_signoz_rule_uses_catalog_names_labels_and_units(path: Path) -> None:
    rule = _json(path)
    condition = rule["condition"]
    envelopes = condition["compositeQuery"]["queries"]
    resolved = [
        _check_signoz_builder(rule["alert"], e["spec"], {}) for e in envelopes if e["type"] == "builder_query"
    ]
    unit = condition["compositeQuery"]["unit"]
    threshold = condition["thresholds"]["spec"][0]
    assert threshold["targetUnit"] == unit, "target and query in the same unit"
    if _is_percent(envelopes):
        assert unit == "percent" and 0 < threshold["target"] < 100
    elif resolved[0][1] == "bucket":
        assert unit == "s"
        _threshold_in_buckets(rule["alert"], resolved[0][0], threshold["target"])
    else:
        assert unit == ""
    group_keys = {g["name"] for e in envelopes if e["type"] == "builder_query" for g in e["spec"]["groupBy"]}
    assert set(rule["notificationSettings"]["groupBy"]) == group_keys
    for text in rule["annotations"].values():
        for key in re.findall(r'index \$labels "([^"]+)"', text):
            assert key in group_keys, f"{rule['alert']}: annotation uses {key}, not a group-by key"
        assert "$labels." not in text, 'dotted labels need {{index $labels "a.b"}}'


# PromQL: enough of a tokenizer to find metric names, label matchers and grouping labels.
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<range>\[[^\]]+\])
  | (?P<duration>\d+(?:ms|[smhdwy])\b)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<variable>\$\w+)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^(){},=<>])
    """,
    re.VERBOSE,
)
PROMQL_FUNCTIONS = {
    "sum", "avg", "min", "max", "count", "rate", "increase", "irate", "histogram_quantile",
    "clamp_min", "clamp_max", "abs", "absent", "vector", "topk", "bottomk", "label_values", "max_over_time",
}  # fmt: skip
PROMQL_KEYWORDS = {"and", "or", "unless", "offset", "bool"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def _tokens(expr: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        assert match, f"cannot tokenize PromQL at {expr[position : position + 30]!r}"
        position = match.end()
        if match.lastgroup != "ws":
            tokens.append((str(match.lastgroup), match.group()))
    return tokens


def parse_promql(expr: str) -> tuple[list[tuple[str, list[tuple[str, str, str]]]], set[str], list[float]]:
    """-> ([(metric, [(label, op, value)])], grouping labels, thresholds after ``>``)."""
    tokens = _tokens(expr)
    selectors: list[tuple[str, list[tuple[str, str, str]]]] = []
    grouping: set[str] = set()
    thresholds: list[float] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and text in GROUPING:
            assert following == "(", f"{text} without a label list in {expr}"
            i += 2
            while tokens[i][1] != ")":
                if tokens[i][0] == "ident":
                    grouping.add(tokens[i][1])
                i += 1
        elif kind == "ident" and (following == "(" or text in PROMQL_FUNCTIONS):
            assert text in PROMQL_FUNCTIONS, f"unknown function {text} in {expr}"
        elif kind == "ident" and text in PROMQL_KEYWORDS:
            pass
        elif kind == "ident":
            matchers: list[tuple[str, str, str]] = []
            if following == "{":
                i += 2
                while tokens[i][1] != "}":
                    if tokens[i][1] == ",":
                        i += 1
                        continue
                    label, op, value = tokens[i][1], tokens[i + 1][1], tokens[i + 2][1]
                    assert tokens[i + 2][0] == "string", f"bad matcher in {expr}"
                    matchers.append((label, op, json.loads(value)))
                    i += 3
            selectors.append((text, matchers))
        elif kind == "op" and text == ">" and tokens[i + 1][0] == "number":
            thresholds.append(float(tokens[i + 1][1]))
        i += 1
    return selectors, grouping, thresholds


def resolve_prometheus(name: str) -> tuple[MetricSpec, str]:
    for spec in catalog.METRICS:
        if spec.instrument == "counter" and name == spec.prometheus:
            return spec, ""
        for part in ("bucket", "sum", "count"):
            if spec.instrument == "histogram" and name == f"{spec.prometheus}_{part}":
                return spec, part
    raise AssertionError(f"{name!r} is not a catalog metric under its Prometheus name")


def _prometheus_labels(spec: MetricSpec, part: str) -> set[str]:
    labels = {catalog.prometheus_label(k) for k in spec.attributes} | {"job", "instance"}
    return labels | {"le"} if part == "bucket" else labels


_PROM_ENUMERATED = {catalog.prometheus_label(k): v for k, v in ENUMERATED.items()}


def check_promql(
    where: str, expr: str, variables: Collection[str] = frozenset()
) -> list[tuple[MetricSpec, str]]:
    """Assert every name and label in ``expr`` is the catalog's; return the metrics used."""
    selectors, grouping, _ = parse_promql(expr)
    assert selectors, f"{where}: no metric in {expr}"
    resolved = []
    common: set[str] | None = None
    for name, matchers in selectors:
        spec, part = resolve_prometheus(name)
        allowed = _prometheus_labels(spec, part)
        common = allowed if common is None else common & allowed
        for label, op, value in matchers:
            assert label in allowed, f"{where}: label {label} not allowed on {name}"
            if value.startswith("$"):
                assert value[1:] in variables, f"{where}: undefined variable {value}"
            elif label in _PROM_ENUMERATED:
                values = value.split("|") if op == "=~" else [value]
                assert set(values) <= _PROM_ENUMERATED[label], f"{where}: {label} is never {value!r}"
        resolved.append((spec, part))
    assert common is not None
    assert grouping <= common, f"{where}: grouping by {grouping - common}"
    return resolved


def test_prometheus_rules_use_catalog_names_labels_and_seconds() -> None:
    for rule in prometheus_rules():
        where = rule["alert"]
        resolved = check_promql(where, rule["expr"])
        _, grouping, thresholds = parse_promql(rule["expr"])
        assert thresholds, f"{where}: no `> threshold`"
        if "histogram_quantile" in rule["expr"]:
            spec, part = resolved[0]
            assert part == "bucket" and spec.prometheus.endswith("_seconds")
            for threshold in thresholds:
                _threshold_in_buckets(where, spec, threshold)
        elif "/" in rule["expr"]:
            assert all(0 < t < 1 for t in thresholds), f"{where}: a ratio threshold is a fraction"
        for label in re.findall(r"\$labels\.([a-zA-Z0-9_]+)", json.dumps(rule["annotations"])):
            assert label in grouping, f"{where}: annotation uses {label}, not kept by the expression"


def test_signoz_and_prometheus_alerts_agree() -> None:
    prometheus = {r["alert"]: r for r in prometheus_rules()}
    for rule in signoz_rules():
        prom = prometheus[rule["alert"]]
        threshold = rule["condition"]["thresholds"]["spec"][0]
        target = threshold["target"] / 100 if threshold["targetUnit"] == "percent" else threshold["target"]
        _, grouping, thresholds = parse_promql(prom["expr"])
        assert set(thresholds) == {target}, f"{rule['alert']}: SigNoz {target} vs Prometheus {thresholds}"
        assert threshold["name"] == rule["labels"]["severity"] == prom["labels"]["severity"]
        signoz_keys = {
            RESOURCE_KEYS.get(k) or catalog.prometheus_label(k)
            for k in rule["notificationSettings"]["groupBy"]
        }
        assert grouping - {"le"} == signoz_keys, f"{rule['alert']}: grouped differently"
        signoz_metrics = {
            resolve_signoz(e["spec"]["aggregations"][0]["metricName"])[0].name
            for e in rule["condition"]["compositeQuery"]["queries"]
            if e["type"] == "builder_query"
        }
        prom_metrics = {resolve_prometheus(name)[0].name for name, _ in parse_promql(prom["expr"])[0]}
        assert signoz_metrics == prom_metrics, rule["alert"]


def test_grafana_dashboard() -> None:
    dashboard = grafana_dashboard()
    templating = dashboard["templating"]["list"]
    datasource_variables = [v for v in templating if v["type"] == "datasource"]
    assert len(datasource_variables) == 1 and datasource_variables[0]["query"] == "prometheus"
    ds_ref = {"type": "prometheus", "uid": "${" + datasource_variables[0]["name"] + "}"}
    variables = {v["name"] for v in templating}
    for variable in templating:
        if variable["type"] == "query":
            assert variable["datasource"] == ds_ref
            match = re.fullmatch(r"label_values\((.+),\s*([a-zA-Z_]\w*)\)", variable["definition"])
            assert match, variable["definition"]
            (spec, part), *_ = check_promql(variable["name"], match[1], variables)
            assert match[2] in _prometheus_labels(spec, part)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    boxes = []
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        boxes.append((grid["x"], grid["y"], grid["w"], grid["h"]))
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == ds_ref, f"{panel['title']}: datasource is not the variable"
        unit = panel["fieldConfig"]["defaults"]["unit"]
        for target in panel["targets"]:
            assert target["datasource"] == ds_ref
            resolved = check_promql(panel["title"], target["expr"], variables)
            _, grouping, _ = parse_promql(target["expr"])
            for legend_label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
                assert legend_label in grouping, f"{panel['title']}: legend {legend_label} not grouped by"
            if target["expr"].startswith("100 *"):
                assert unit == "percent", panel["title"]
            elif "histogram_quantile" in target["expr"]:
                assert unit == ("s" if resolved[0][0].unit == "s" else "short"), panel["title"]
            else:
                assert unit not in TIME_UNITS, panel["title"]
    assert not _overlaps(boxes), "overlapping Grafana panels"


# --- 4. coverage --------------------------------------------------------------------------
def test_every_catalog_metric_is_on_the_signoz_dashboard() -> None:
    used = {
        resolve_signoz(e["spec"]["aggregations"][0]["metricName"])[0].name
        for panel in signoz_dashboard()["spec"]["panels"].values()
        for e in _queries(panel)
        if e["type"] == "builder_query"
    }
    missing = {m.name for m in catalog.METRICS} - used
    assert not missing, f"catalog metrics missing from the SigNoz dashboard: {sorted(missing)}"


def test_every_catalog_metric_is_on_the_grafana_dashboard() -> None:
    used = {
        resolve_prometheus(name)[0].name
        for panel in grafana_dashboard()["panels"]
        for target in panel.get("targets", [])
        for name, _ in parse_promql(target["expr"])[0]
    }
    missing = {m.name for m in catalog.METRICS} - used
    assert not missing, f"catalog metrics missing from the Grafana dashboard: {sorted(missing)}"


def test_percentage_descriptions_name_their_denominator() -> None:
    """A failure percentage leaves canceled operations out of its denominator; its description
    (the panel's tooltip in both backends) says so, and one of all operations does not."""
    completed = "|".join(o.value for o in catalog.Outcome if o is not catalog.Outcome.CANCELED)
    checked = 0
    for panel in grafana_dashboard()["panels"]:
        exprs = [t["expr"] for t in panel.get("targets", []) if t["expr"].startswith("100 *")]
        if not exprs:
            continue
        checked += 1
        without_canceled = f'kaos_outcome=~"{completed}"' in exprs[0].rsplit("\n/ ", 1)[1]
        said = "not canceled" in panel["description"]
        assert said == without_canceled, (
            f"{panel['title']}: denominator {'without' if without_canceled else 'with'} canceled "
            f"operations, description: {panel['description']!r}"
        )
    assert checked == 6
    signoz = {p["spec"]["display"]["name"]: p["spec"]["display"]["description"] for p in _signoz_panels()}
    for panel in grafana_dashboard()["panels"]:
        if panel["type"] != "row":
            assert signoz[panel["title"]] == panel["description"], panel["title"]


def _signoz_panels() -> list[Json]:
    return list(signoz_dashboard()["spec"]["panels"].values())


def test_memory_tiers_have_latency_and_failure_panels_and_alerts() -> None:
    titles = {p["spec"]["display"]["name"] for p in signoz_dashboard()["spec"]["panels"].values()}
    assert {"Memory latency p95 by tier", "Degraded memory operations by tier and operation"} <= titles
    by_tier = [
        r["alert"] for r in signoz_rules() if catalog.KAOS_MEMORY_TIER in r["notificationSettings"]["groupBy"]
    ]
    assert sorted(by_tier) == [
        "KaosMemoryFailureRateHigh",
        "KaosMemoryLatencyP95High",
        "KaosShortTermMemoryLatencyP95High",
    ]


def test_the_checks_catch_wrong_names() -> None:
    """The name checks are not vacuous: a millisecond name, an id label, an unknown metric fail."""
    with pytest.raises(AssertionError):
        check_promql("t", 'rate(kaos_request_duration_milliseconds_bucket{job="x"}[5m])')
    with pytest.raises(AssertionError):
        check_promql("t", "sum by (session_id) (rate(kaos_requests_total[5m]))")
    with pytest.raises(AssertionError):
        check_promql("t", 'rate(kaos_requests_total{kaos_outcome="failed"}[5m])')
    with pytest.raises(AssertionError):
        resolve_signoz("kaos.request.duration")
    with pytest.raises(AssertionError):
        _check_signoz_builder(
            "t",
            {
                "signal": "metrics",
                "aggregations": [
                    {
                        "metricName": "kaos.telemetry.dropped",
                        "timeAggregation": "rate",
                        "spaceAggregation": "sum",
                    }
                ],
                "groupBy": [],
                "filter": {"expression": "gen_ai.agent.name IN $agent"},
            },
            {"agent": catalog.GEN_AI_AGENT_NAME},
        )
    with pytest.raises(AssertionError):
        _threshold_in_buckets("t", catalog.METRICS_BY_NAME[catalog.KAOS_REQUEST_DURATION], 30000.0)


# --- 5. the import script against a fake SigNoz -------------------------------------------
API_KEY = "test-key"


class FakeSigNoz:
    """Enough of SigNoz's API for the import script; request bodies are schema-checked."""

    def __init__(self, *, dashboards: list[Json] | None = None, rules: list[Json] | None = None) -> None:
        self.dashboards = dashboards or []
        self.rules = rules or []
        self.calls: list[tuple[str, str]] = []
        self.bodies: list[Json] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        method, path = request.method, request.url.path
        self.calls.append((method, path))
        if request.headers.get("SIGNOZ-API-KEY") != API_KEY:
            return httpx.Response(
                401,
                json={
                    "status": "error",
                    "error": {
                        "type": "unauthenticated",
                        "code": "unauthenticated",
                        "message": "invalid api key",
                    },
                },
            )
        body: Json = json.loads(request.content) if request.content else {}
        self.bodies.append(body)
        if (method, path) == ("GET", "/api/v2/dashboards"):
            data = {
                "dashboards": self.dashboards,
                "total": len(self.dashboards),
                "tags": [],
                "reservedKeywords": [],
            }
            return httpx.Response(200, json={"status": "success", "data": data})
        if (method, path) == ("POST", "/api/v2/dashboards"):
            assert not _errors(DASHBOARD_SCHEMA, body, True)
            return httpx.Response(201, json={"status": "success", "data": {"id": "dash-1", **body}})
        if method == "PUT" and path.startswith("/api/v2/dashboards/"):
            assert not _errors("DashboardtypesUpdatableDashboardV2", body, True)
            return httpx.Response(200, json={"status": "success", "data": {"id": path.rsplit("/", 1)[1]}})
        if (method, path) == ("GET", "/api/v1/rules"):
            return httpx.Response(200, json={"status": "success", "data": {"rules": self.rules}})
        if (method in ("POST", "PUT") and path.startswith("/api/v1/rules")) or path == "/api/v1/testRule":
            assert not _errors(RULE_SCHEMA, body, True)
            if path == "/api/v1/testRule":
                data = {"alertCount": 0, "message": "no alerts found"}
                return httpx.Response(200, json={"status": "success", "data": data})
            return httpx.Response(200, json={"status": "success", "data": {"id": f"rule-{len(self.bodies)}"}})
        return httpx.Response(
            404, json={"status": "error", "error": {"code": "not_found", "message": "no route"}}
        )


def _transport(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


def _run_import(handler: Callable[[httpx.Request], httpx.Response], *args: str, key: str = API_KEY) -> int:
    argv = ["--url", "http://signoz.test", "--api-key", key, *args]
    code: int = importer().main(argv, transport=_transport(handler))
    return code


def test_import_dry_run_creates_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeSigNoz()
    assert _run_import(fake, "--dry-run") == 0
    writes = [c for c in fake.calls if c[0] in ("POST", "PUT", "DELETE")]
    assert writes == [("POST", "/api/v1/testRule")] * len(SIGNOZ_ALERTS)
    out = capsys.readouterr().out
    assert "would create" in out and out.count("testRule passed") == len(SIGNOZ_ALERTS)


def test_import_creates_the_dashboard_and_rules_then_skips_them() -> None:
    fake = FakeSigNoz()
    assert _run_import(fake, "--channel", "ops-slack") == 0
    assert fake.calls.count(("POST", "/api/v2/dashboards")) == 1
    assert fake.calls.count(("POST", "/api/v1/rules")) == len(SIGNOZ_ALERTS)
    assert fake.bodies[1] == signoz_dashboard()
    rules = [b for b in fake.bodies if "alert" in b]
    assert {r["alert"] for r in rules} == {r["alert"] for r in signoz_rules()}
    assert all(t["channels"] == ["ops-slack"] for r in rules for t in r["condition"]["thresholds"]["spec"])

    title = signoz_dashboard()["spec"]["display"]["name"]
    existing = FakeSigNoz(
        dashboards=[{"id": "d1", "name": "kaos", "spec": {"display": {"name": title}}}],
        rules=[{"id": f"r{i}", "alert": r["alert"]} for i, r in enumerate(signoz_rules())],
    )
    assert _run_import(existing) == 0
    assert [c for c in existing.calls if c[0] != "GET"] == [], "existing items are skipped"
    assert _run_import(existing, "--replace") == 0
    assert ("PUT", "/api/v2/dashboards/d1") in existing.calls
    assert sum(1 for m, p in existing.calls if m == "PUT" and p.startswith("/api/v1/rules/")) == len(
        SIGNOZ_ALERTS
    )


def test_import_reports_a_bad_key_and_an_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run_import(FakeSigNoz(), key="wrong") == 1
    assert "HTTP 401" in capsys.readouterr().err

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    assert _run_import(refuse, "--dry-run") == 1
    assert "cannot reach SigNoz at http://signoz.test" in capsys.readouterr().err


def test_import_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SIGNOZ_API_KEY", raising=False)
    assert importer().main(["--url", "http://signoz.test"], transport=_transport(FakeSigNoz())) == 2
    assert "SIGNOZ_API_KEY" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert _run_import(FakeSigNoz(), str(broken)) == 2
    assert "not valid JSON" in capsys.readouterr().err
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({"title": "x", "widgets": [], "layout": []}))
    assert _run_import(FakeSigNoz(), str(legacy)) == 2
    assert "legacy v1" in capsys.readouterr().err
