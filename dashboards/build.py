"""Generate the dashboards and alert rules in this folder from the telemetry catalog.

One panel list and one alert list below are rendered three ways: the SigNoz v2 (Perses) dashboard
and SigNoz alert rules (OTel names: ``kaos.request.duration.bucket``, label ``gen_ai.agent.name``),
and the Grafana dashboard and Prometheus rules (Prometheus names: ``kaos_request_duration_seconds_bucket``,
label ``gen_ai_agent_name``). Every name comes from :mod:`kaos_otel.catalog`, so a convention rename
is one catalog edit plus ``python dashboards/build.py``; ``tests/test_dashboards.py`` fails while the
committed files are stale.

Usage::

    python dashboards/build.py           # rewrite the generated files
    python dashboards/build.py --check   # exit 1 if a generated file is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kaos_otel import catalog as c
from kaos_otel._spans import ERROR_OUTCOMES

HERE = Path(__file__).resolve().parent
SIGNOZ_DASHBOARD = HERE / "signoz" / "kaos-agents.v2.json"
SIGNOZ_ALERTS = HERE / "signoz" / "alerts"
GRAFANA_DASHBOARD = HERE / "grafana" / "kaos-agents.json"
PROMETHEUS_RULES = HERE / "prometheus" / "kaos-alerts.rules.yml"

_UUID_NAMESPACE = uuid.UUID("5b0c3e64-6f0e-4d55-9c1a-3f4c1f3b7a10")
JsonObj = dict[str, Any]


# --- the model: what a panel or an alert computes, independent of the backend -----------------
@dataclass(frozen=True)
class Rate:
    """Per-second rate of a counter (or of a histogram's ``sum`` with ``part="sum"``)."""

    metric: str
    by: tuple[str, ...] = ()
    where: tuple[tuple[str, tuple[str, ...]], ...] = ()
    part: Literal["", "sum", "count"] = ""


@dataclass(frozen=True)
class Increase:
    """Items counted per interval (SigNoz step, Prometheus ``$__rate_interval``)."""

    metric: str
    by: tuple[str, ...] = ()
    where: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Quantiles:
    """Histogram quantiles, e.g. ``("p50", "p95", "p99")``."""

    metric: str
    quantiles: tuple[str, ...]
    by: tuple[str, ...] = ()
    where: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Percent:
    """``100 * rate(metric{where, within}) / rate(metric{within})``, grouped by ``by``; 0 with no match."""

    metric: str
    where: tuple[tuple[str, tuple[str, ...]], ...]
    by: tuple[str, ...] = ()
    within: tuple[tuple[str, tuple[str, ...]], ...] = ()


Query = Rate | Increase | Quantiles | Percent


@dataclass(frozen=True)
class Panel:
    """One dashboard panel: a title, a query and the unit its values are in."""

    title: str
    description: str
    query: Query
    unit: str
    kind: Literal["timeseries", "stat"] = "timeseries"
    width: int = 6
    height: int = 6


@dataclass(frozen=True)
class Section:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Alert:
    """One alert, rendered as a SigNoz rule (``query``) and a Prometheus rule (``promql``)."""

    name: str
    slug: str
    severity: Literal["warning", "critical"]
    summary: str
    description: str
    query: Query
    threshold: float
    """In the unit of ``unit``: seconds for latency, percent for ratios, items for counts."""
    unit: Literal["s", "percent", ""]
    for_: str
    signoz_eval_window: str
    signoz_match: Literal["on_average", "in_total", "all_the_times", "at_least_once", "last"]
    promql: str | None = None
    """The Prometheus expression; ``> threshold`` is appended unless it holds ``{threshold}``.
    Ratios are fractions there (5 % is 0.05). ``None`` for a :class:`Percent` query: its ratio
    per job over 5 minutes (:func:`ratio_promql`)."""
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def prometheus_threshold(self) -> float:
        return self.threshold / 100 if self.unit == "percent" else self.threshold

    @property
    def prometheus_expr(self) -> str:
        threshold = f"{self.prometheus_threshold:g}"
        if self.promql is not None:
            promql = self.promql
        else:
            assert isinstance(self.query, Percent), f"{self.name}: promql is needed for this query"
            promql = ratio_promql(self.query)
        if "{threshold}" in promql:
            return promql.replace("{threshold}", threshold)
        if "\n" in promql:
            inner = "\n".join("  " + line for line in promql.splitlines())
            return f"(\n{inner}\n) > {threshold}"
        return f"{promql} > {threshold}"


# --- units --------------------------------------------------------------------------------
def _unit_for(query: Query, rate_unit: str = "ops") -> str:
    """The panel unit (SigNoz and Grafana share these ids) a query's values are in."""
    spec = c.METRICS_BY_NAME[query.metric]
    if isinstance(query, Percent):
        return "percent"
    if isinstance(query, Quantiles):
        return "s" if spec.unit == "s" else "short"
    if isinstance(query, Rate):
        return rate_unit
    return "short"


# --- the panels ---------------------------------------------------------------------------
A = c.GEN_AI_AGENT_NAME
O = c.KAOS_OUTCOME  # noqa: E741 (a name, not a number)
MODEL = c.GEN_AI_REQUEST_MODEL
TIER = c.KAOS_MEMORY_TIER
TARGET = c.KAOS_DELEGATION_TARGET
ERROR = ((O, ("error",)),)
FAILED_RUN = ((O, tuple(o.value for o in c.Outcome if o in ERROR_OUTCOMES)),)
"""Runs that failed, as their spans say (status ERROR): an error, or the step budget used up
without an answer (``max_steps``: a run that loops answers no one, and must page as errors do)."""
CANCELED = ((O, (c.Outcome.CANCELED.value,)),)
COMPLETED = ((O, tuple(o.value for o in c.Outcome if o is not c.Outcome.CANCELED)),)
"""Operations that ran to an end: the share that failed is of these, so that cancellations (a
client giving up, a timeout cutting a call off) neither dilute nor hide it; they have their own
panel and alert."""
USER = ((c.KAOS_REQUEST_ORIGIN, (c.RequestOrigin.USER.value,)),)
"""User requests only: headline panels count each user request once, not every delegated run."""
FAILED_MEMORY = ((O, ("error", "degraded")),)


def _panel(title: str, description: str, query: Query, **kwargs: Any) -> Panel:
    rate_unit = "reqps" if query.metric == c.KAOS_REQUESTS else "ops"
    if isinstance(query, Rate) and query.part == "sum":
        rate_unit = "short"
    return Panel(title, description, query, kwargs.pop("unit", _unit_for(query, rate_unit)), **kwargs)


SECTIONS: tuple[Section, ...] = (
    Section(
        "Overview",
        (
            _panel(
                "Requests",
                "User requests in the selected time range (delegated and autonomous runs not counted).",
                Increase(c.KAOS_REQUESTS, where=USER),
                kind="stat",
                width=4,
                height=4,
            ),
            _panel(
                "Request error %",
                "Share of user requests that failed (outcome error or max_steps), of those not "
                "canceled (0 when none failed).",
                Percent(c.KAOS_REQUESTS, FAILED_RUN, within=(*USER, *COMPLETED)),
                kind="stat",
                width=4,
                height=4,
            ),
            _panel(
                "Request latency p95",
                "95th percentile of user request duration (seconds).",
                Quantiles(c.KAOS_REQUEST_DURATION, ("p95",), where=USER),
                kind="stat",
                width=4,
                height=4,
            ),
        ),
    ),
    Section(
        "Requests",
        (
            _panel(
                "Request rate by agent and outcome",
                "Agent requests per second, by agent and outcome (success, error, max_steps, "
                "canceled, degraded).",
                Rate(c.KAOS_REQUESTS, (A, O)),
            ),
            _panel(
                "Request error rate % by agent",
                "Requests that failed (outcome error or max_steps) as a percentage of the requests "
                "not canceled. Alert: above 5 %.",
                Percent(c.KAOS_REQUESTS, FAILED_RUN, (A,), COMPLETED),
            ),
            _panel(
                "Request canceled % by agent",
                "Requests with outcome=canceled as a percentage of all requests: clients giving up, "
                "timeouts enforced with asyncio. Alert: above 20 %.",
                Percent(c.KAOS_REQUESTS, CANCELED, (A,)),
            ),
            _panel(
                "Request latency p50 / p95 / p99 by agent",
                "Agent request duration percentiles in seconds. Alert: p95 above 30 s.",
                Quantiles(c.KAOS_REQUEST_DURATION, ("p50", "p95", "p99"), (A,)),
            ),
            _panel(
                "Steps per request p50 / p95 by agent",
                "Agentic-loop steps one request took.",
                Quantiles(c.KAOS_REQUEST_STEPS, ("p50", "p95"), (A,)),
            ),
        ),
    ),
    Section(
        "Model calls",
        (
            _panel(
                "Model calls by model and outcome",
                "Model calls per second, by requested model and outcome.",
                Rate(c.KAOS_MODEL_CALLS, (MODEL, O)),
            ),
            _panel(
                "Model call failures % by model",
                "Model calls with outcome=error as a percentage of the model calls not canceled. "
                "Alert: above 1 %.",
                Percent(c.KAOS_MODEL_CALLS, ERROR, (MODEL,), COMPLETED),
            ),
            _panel(
                "Model call latency p50 / p95 / p99 by model",
                "Model call duration percentiles in seconds (kaos.model.duration).",
                Quantiles(c.KAOS_MODEL_DURATION, ("p50", "p95", "p99"), (MODEL,)),
            ),
            _panel(
                "GenAI operation duration p50 / p95 by model",
                "The OpenTelemetry GenAI convention metric gen_ai.client.operation.duration, in seconds.",
                Quantiles(c.GEN_AI_CLIENT_OPERATION_DURATION, ("p50", "p95"), (MODEL,)),
            ),
            _panel(
                "Time to first chunk p50 / p95 by model",
                "Streamed answers only: seconds from the request to its first chunk "
                "(gen_ai.client.operation.time_to_first_chunk).",
                Quantiles(c.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK, ("p50", "p95"), (MODEL,)),
                width=12,
            ),
            _panel(
                "Tokens per second by model and type",
                "Input and output tokens per second (sum of gen_ai.client.token.usage).",
                Rate(c.GEN_AI_CLIENT_TOKEN_USAGE, (MODEL, c.GEN_AI_TOKEN_TYPE), part="sum"),
                width=12,
            ),
        ),
    ),
    Section(
        "Tools and delegation",
        (
            _panel(
                "Tool calls by tool and outcome",
                "Tool calls per second, by tool and outcome.",
                Rate(c.KAOS_TOOL_CALLS, (c.GEN_AI_TOOL_NAME, O)),
            ),
            _panel(
                "Tool call latency p50 / p95 by tool",
                "Tool call duration percentiles in seconds.",
                Quantiles(c.KAOS_TOOL_DURATION, ("p50", "p95"), (c.GEN_AI_TOOL_NAME,)),
            ),
            _panel(
                "Delegations by target and outcome",
                "Delegations to sub-agents per second, by target agent and outcome.",
                Rate(c.KAOS_DELEGATIONS, (TARGET, O)),
            ),
            _panel(
                "Delegation latency p50 / p95 by target",
                "Delegation duration percentiles in seconds.",
                Quantiles(c.KAOS_DELEGATION_DURATION, ("p50", "p95"), (TARGET,)),
            ),
            _panel(
                "Delegation failures % by agent and target",
                "Delegations with outcome=error as a percentage of one agent's delegations to one "
                "sub-agent not canceled. Alert: above 5 %.",
                Percent(c.KAOS_DELEGATIONS, ERROR, (A, TARGET), COMPLETED),
                width=12,
            ),
        ),
    ),
    Section(
        "Memory",
        (
            _panel(
                "Memory operations by tier, operation and outcome",
                "Memory operations per second on the short_term, medium_term and long_term tiers.",
                Rate(c.KAOS_MEMORY_OPERATIONS, (TIER, c.KAOS_MEMORY_OPERATION, O)),
            ),
            _panel(
                "Memory latency p95 by tier",
                "95th percentile of memory operation duration in seconds. Alerts: above 250 ms (short_term), "
                "2.5 s (medium_term, long_term).",
                Quantiles(c.KAOS_MEMORY_OPERATION_DURATION, ("p95",), (TIER,)),
            ),
            _panel(
                "Memory error + degraded % by tier",
                "Memory operations with outcome error or degraded as a percentage of the memory "
                "operations not canceled. Alert: above 5 %.",
                Percent(c.KAOS_MEMORY_OPERATIONS, FAILED_MEMORY, (TIER,), COMPLETED),
            ),
            _panel(
                "Degraded memory operations by tier and operation",
                "Memory operations per second that fell back to a degraded answer (outcome=degraded).",
                Rate(c.KAOS_MEMORY_OPERATIONS, (TIER, c.KAOS_MEMORY_OPERATION), ((O, ("degraded",)),)),
            ),
            _panel(
                "Short-term window tokens p50 / p95 by agent",
                "Size of the short-term memory window after a turn, in tokens.",
                Quantiles(c.KAOS_MEMORY_WINDOW_TOKENS, ("p50", "p95"), (A,)),
            ),
            _panel(
                "Compactions by agent and outcome",
                "Short-term window compactions per second.",
                Rate(c.KAOS_MEMORY_COMPACTIONS, (A, O)),
            ),
            _panel(
                "Extraction lag p50 / p95 by agent",
                "Delay from a compaction to the end of long-term extraction, in seconds.",
                Quantiles(c.KAOS_MEMORY_EXTRACTION_LAG, ("p50", "p95"), (A,)),
                width=12,
            ),
        ),
    ),
    Section(
        "Telemetry health",
        (
            _panel(
                "Telemetry items dropped by signal and reason",
                "Spans, metric points and log records the SDK dropped or failed to export "
                "(queue_full, export_failed, shutdown). Alert: any.",
                Increase(c.KAOS_TELEMETRY_DROPPED, (c.KAOS_TELEMETRY_SIGNAL, c.KAOS_TELEMETRY_REASON)),
                width=12,
            ),
        ),
    ),
)


# --- the alerts ---------------------------------------------------------------------------
def _p(key: str) -> str:
    return c.prometheus_label(key)


def _prom(name: str) -> str:
    return c.METRICS_BY_NAME[name].prometheus


def _prom_bucket(name: str) -> str:
    return c.METRICS_BY_NAME[name].prometheus + "_bucket"


def zero_filled_ratio(part: str, whole: str, scale: str = "") -> str:
    """``part / whole`` that is 0, not empty, for the groups of ``whole`` that ``part`` lacks.

    ``part`` has no series at all while nothing failed, and a plain division would then show
    "No data" where the truth is 0 %.
    """
    return f"{scale}(\n  {part}\n  or 0 * {whole}\n)\n/ {whole}"


def ratio_promql(query: Percent) -> str:
    """An alert's ratio: ``query``'s share of its metric's rate over 5 minutes, per job and the
    query's labels, as a fraction (0, not empty, for groups where nothing matched)."""
    series = c.METRICS_BY_NAME[query.metric].prometheus
    by = _by(query.by, ("job",))
    part = _prom_selector(query.metric, (*query.within, *query.where), series, variables=False)
    whole = _prom_selector(query.metric, query.within, series, variables=False)
    return zero_filled_ratio(f"sum{by} (rate({part}[5m]))", f"sum{by} (rate({whole}[5m]))")


def _prom_selector(
    metric: str, where: Iterable[tuple[str, tuple[str, ...]]], series: str, *, variables: bool = True
) -> str:
    """``series`` with matchers for ``where`` and, for a dashboard, its variables."""
    matchers = []
    if variables:
        allowed = c.METRICS_BY_NAME[metric].attributes
        matchers.append('job=~"$job"')
        matchers += [f'{c.prometheus_label(v.key)}=~"${v.name}"' for v in VARIABLES if v.key in allowed]
    for key, values in dict(where).items():  # a label given twice: the later (narrower) matcher
        label = c.prometheus_label(key)
        matchers.append(f'{label}="{values[0]}"' if len(values) == 1 else f'{label}=~"{"|".join(values)}"')
    return f"{series}{{{', '.join(matchers)}}}" if matchers else series


SHORT_TERM_TIER = ((TIER, (c.MemoryTier.SHORT_TERM.value,)),)
LASTING_TIERS = ((TIER, (c.MemoryTier.MEDIUM_TERM.value, c.MemoryTier.LONG_TERM.value)),)
"""The memory tiers each latency alert watches: the short-term window takes milliseconds, the
others may wait seconds on a store or an embedder (one threshold would leave a short-term
slowdown of 250 times silent)."""


def _memory_latency_alert(
    name: str,
    slug: str,
    tiers: tuple[tuple[str, tuple[str, ...]], ...],
    threshold_s: float,
    summary: str,
    description: str,
) -> Alert:
    """A warning on the p95 of memory operation latency per job, tier and operation over 5
    minutes, on ``tiers``, above ``threshold_s`` for 10 minutes."""
    series = _prom_bucket(c.KAOS_MEMORY_OPERATION_DURATION)
    selector = _prom_selector(c.KAOS_MEMORY_OPERATION_DURATION, tiers, series, variables=False)
    return Alert(
        name=name,
        slug=slug,
        severity="warning",
        summary=summary,
        description=description,
        query=Quantiles(c.KAOS_MEMORY_OPERATION_DURATION, ("p95",), (TIER, c.KAOS_MEMORY_OPERATION), tiers),
        threshold=threshold_s,
        unit="s",
        promql=(
            f"histogram_quantile(0.95, sum by (le, job, {_p(TIER)}, {_p(c.KAOS_MEMORY_OPERATION)}) "
            f"(rate({selector}[5m])))"
        ),
        for_="10m",
        signoz_eval_window="10m",
        signoz_match="on_average",
    )


ALERTS: tuple[Alert, ...] = (
    Alert(
        name="KaosRequestLatencyP95High",
        slug="request-latency-p95",
        severity="warning",
        summary="Agent {agent} ({service}): p95 request latency is above 30 s",
        description=(
            "The 95th percentile of kaos.request.duration for one agent stayed above 30 seconds. "
            "Look at model call latency, tool latency and delegations of that agent."
        ),
        query=Quantiles(c.KAOS_REQUEST_DURATION, ("p95",), (A,)),
        threshold=30.0,
        unit="s",
        promql=(
            f"histogram_quantile(0.95, sum by (le, job, {_p(A)}) "
            f"(rate({_prom_bucket(c.KAOS_REQUEST_DURATION)}[5m])))"
        ),
        for_="10m",
        signoz_eval_window="10m",
        signoz_match="on_average",
    ),
    Alert(
        name="KaosRequestErrorRateHigh",
        slug="request-error-rate",
        severity="critical",
        summary="Agent {agent} ({service}): error rate is above 5 %",
        description=(
            "More than 5 % of one agent's requests not canceled failed: outcome error, or "
            "max_steps (the step budget used up without an answer). Degraded requests are not "
            "counted; canceled requests have their own alert. Check the traces with status ERROR."
        ),
        query=Percent(c.KAOS_REQUESTS, FAILED_RUN, (A,), COMPLETED),
        threshold=5.0,
        unit="percent",
        for_="10m",
        signoz_eval_window="10m",
        signoz_match="on_average",
    ),
    Alert(
        name="KaosRequestCanceledRateHigh",
        slug="request-canceled-rate",
        severity="warning",
        summary="Agent {agent} ({service}): more than 20 % of requests are canceled",
        description=(
            "More than 20 % of one agent's requests ended with outcome=canceled: clients give up "
            "waiting, or a timeout enforced with asyncio cancels the run (a backend that hangs "
            "shows here before it shows as errors). The error rates leave canceled requests out."
        ),
        query=Percent(c.KAOS_REQUESTS, CANCELED, (A,)),
        threshold=20.0,
        unit="percent",
        for_="10m",
        signoz_eval_window="10m",
        signoz_match="on_average",
    ),
    Alert(
        name="KaosModelCallFailureRateHigh",
        slug="model-call-failures",
        severity="warning",
        summary="Agent {agent} ({service}): more than 1 % of {model} calls fail",
        description=(
            "More than 1 % of the model calls not canceled (kaos.model.calls) for one agent and "
            "model ended with outcome=error: provider errors, timeouts the client raises or rate "
            "limits. A call cut off by an asyncio timeout around it is canceled, not failed."
        ),
        query=Percent(c.KAOS_MODEL_CALLS, ERROR, (A, MODEL), COMPLETED),
        threshold=1.0,
        unit="percent",
        for_="10m",
        signoz_eval_window="10m",
        signoz_match="on_average",
    ),
    Alert(
        name="KaosDelegationFailureRateHigh",
        slug="delegation-failures",
        severity="warning",
        summary="Agent {agent} ({service}): more than 5 % of delegations to {target} fail",
        description=(
            "More than 5 % of one agent's delegations to one sub-agent (kaos.delegations) not "
            "canceled ended with outcome=error: the sub-agent is down, too slow for the delegation "
            "timeout, or "
            "failing. The delegating agent's own error alert fires too; this one names the "
            "sub-agent."
        ),
        query=Percent(c.KAOS_DELEGATIONS, ERROR, (A, TARGET), COMPLETED),
        threshold=5.0,
        unit="percent",
        for_="10m",
        signoz_eval_window="10m",
        signoz_match="on_average",
    ),
    _memory_latency_alert(
        "KaosMemoryLatencyP95High",
        "memory-latency-p95",
        LASTING_TIERS,
        2.5,
        "{service}: {tier} memory p95 latency of {operation} is above 2.5 s",
        "The 95th percentile of kaos.memory.operation.duration for one medium- or long-term "
        "memory operation stayed above 2.5 seconds. Long-term operations wait on the embedder "
        "and the vector store, medium-term ones on the relational store.",
    ),
    _memory_latency_alert(
        "KaosShortTermMemoryLatencyP95High",
        "short-term-memory-latency-p95",
        SHORT_TERM_TIER,
        0.25,
        "{service}: short_term memory p95 latency of {operation} is above 250 ms",
        "The 95th percentile of kaos.memory.operation.duration for one short-term memory "
        "operation stayed above 250 ms. The session window is read and written on every turn "
        "and should take milliseconds: the relational store is slow or locked.",
    ),
    Alert(
        name="KaosMemoryFailureRateHigh",
        slug="memory-failures",
        severity="warning",
        summary="{service}: more than 5 % of {tier} memory operations failed or degraded",
        description=(
            "More than 5 % of the memory operations not canceled on one tier ended with outcome "
            "error or degraded (the agent answered without that memory tier). Check the memory "
            "store."
        ),
        query=Percent(c.KAOS_MEMORY_OPERATIONS, FAILED_MEMORY, (TIER,), COMPLETED),
        threshold=5.0,
        unit="percent",
        for_="10m",
        signoz_eval_window="10m",
        signoz_match="on_average",
    ),
    Alert(
        name="KaosTelemetryDropped",
        slug="telemetry-dropped",
        severity="warning",
        summary="{service}: {signal} telemetry dropped ({reason})",
        description=(
            "The kaos-otel SDK dropped telemetry items or failed to export them in the last 5 "
            "minutes (kaos.telemetry.dropped > 0): the collector is down or slow, or the queue "
            "is too small. Traces and metrics from that service are incomplete."
        ),
        query=Increase(c.KAOS_TELEMETRY_DROPPED, (c.KAOS_TELEMETRY_SIGNAL, c.KAOS_TELEMETRY_REASON)),
        threshold=0.0,
        unit="",
        # ``increase`` needs two samples of a series, so the first drops of a process (the
        # counter appears with its first value) are caught by the second clause: a series with
        # no sample in the hour before the last 5 minutes (not one a scrape gap hid for a while).
        promql=(
            f"sum by (job, {_p(c.KAOS_TELEMETRY_SIGNAL)}, {_p(c.KAOS_TELEMETRY_REASON)}) "
            f"(increase({_prom(c.KAOS_TELEMETRY_DROPPED)}[5m])) > {{threshold}}\n"
            f"or\n"
            f"sum by (job, {_p(c.KAOS_TELEMETRY_SIGNAL)}, {_p(c.KAOS_TELEMETRY_REASON)}) "
            f"({_prom(c.KAOS_TELEMETRY_DROPPED)} unless max_over_time({_prom(c.KAOS_TELEMETRY_DROPPED)}[1h] "
            f"offset 5m)) > {{threshold}}"
        ),
        for_="0m",
        signoz_eval_window="5m",
        signoz_match="in_total",
    ),
)

SERVICE = "service.name"
"""The resource attribute SigNoz alerts group by; Prometheus calls it ``job``."""

_TEMPLATE_KEYS = {
    "service": SERVICE,
    "agent": A,
    "model": MODEL,
    "target": TARGET,
    "tier": TIER,
    "operation": c.KAOS_MEMORY_OPERATION,
    "signal": c.KAOS_TELEMETRY_SIGNAL,
    "reason": c.KAOS_TELEMETRY_REASON,
}


# --- SigNoz -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variable:
    """A dashboard variable over one attribute; applied to every metric that carries it."""

    name: str
    key: str
    description: str


VARIABLES: tuple[Variable, ...] = (
    Variable("agent", A, "Agent name (gen_ai.agent.name)"),
    Variable("model", MODEL, "Requested model (gen_ai.request.model)"),
    Variable("tier", TIER, "Memory tier: short_term, medium_term, long_term"),
)


def _signoz_metric(query: Query) -> str:
    spec = c.METRICS_BY_NAME[query.metric]
    if isinstance(query, Quantiles):
        return spec.signoz
    if isinstance(query, Rate) and query.part:
        return f"{spec.name}.{query.part}"
    return spec.name


def _quote(value: str) -> str:
    return "'" + value.replace("'", "\\'") + "'"


def _signoz_filter(
    metric: str, where: Iterable[tuple[str, tuple[str, ...]]], variables: Sequence[Variable]
) -> str:
    allowed = c.METRICS_BY_NAME[metric].attributes
    parts = [f"{v.key} IN ${v.name}" for v in variables if v.key in allowed]
    for key, values in where:  # a key given twice: both (a part's filter holds its whole's)
        if len(values) == 1:
            parts.append(f"{key} = {_quote(values[0])}")
        else:
            parts.append(f"{key} IN ({', '.join(_quote(v) for v in values)})")
    return " AND ".join(parts)


def _group_by(keys: Iterable[str]) -> list[JsonObj]:
    return [
        {
            "name": k,
            "signal": "",
            "fieldContext": "resource" if k == SERVICE else "attribute",
            "fieldDataType": "string",
        }
        for k in keys
    ]


def _legend(by: Sequence[str], prefix: str = "") -> str:
    text = " ".join("{{" + k + "}}" for k in by)
    return f"{prefix} {text}".strip() if prefix else text


def _builder(
    name: str,
    metric_name: str,
    *,
    time_aggregation: str,
    space_aggregation: str,
    reduce_to: str,
    by: Sequence[str],
    filter_expression: str,
    legend: str,
    disabled: bool = False,
) -> JsonObj:
    return {
        "name": name,
        "signal": "metrics",
        "source": "",
        "stepInterval": 60,
        "aggregations": [
            {
                "metricName": metric_name,
                "temporality": "",
                "timeAggregation": time_aggregation,
                "spaceAggregation": space_aggregation,
                "reduceTo": reduce_to,
            }
        ],
        "disabled": disabled,
        "filter": {"expression": filter_expression},
        "groupBy": _group_by(by),
        "order": [],
        "having": {"expression": ""},
        "functions": [],
        "legend": legend,
    }


def _formula(name: str, expression: str, legend: str) -> JsonObj:
    return {
        "name": name,
        "expression": expression,
        "disabled": False,
        "having": {"expression": ""},
        "legend": legend,
    }


def signoz_queries(
    query: Query, variables: Sequence[Variable], *, scalar: bool, by_service: bool = False
) -> list[JsonObj]:
    """The query envelopes (``builder_query`` / ``builder_formula``) computing ``query``.

    ``by_service`` also groups by the ``service.name`` resource attribute (alerts do).
    """
    by = (SERVICE, *query.by) if by_service else query.by
    metric = _signoz_metric(query)
    reduce_to = "sum" if scalar and isinstance(query, Increase | Percent) else "avg"
    if isinstance(query, Quantiles):
        return [
            {
                "type": "builder_query",
                "spec": _builder(
                    chr(ord("A") + i),
                    metric,
                    time_aggregation="",
                    space_aggregation=q,
                    reduce_to=reduce_to,
                    by=by,
                    filter_expression=_signoz_filter(query.metric, query.where, variables),
                    legend=_legend(by, q) if len(query.quantiles) > 1 or by else q,
                ),
            }
            for i, q in enumerate(query.quantiles)
        ]
    if isinstance(query, Percent):
        time_aggregation = "increase" if scalar else "rate"
        common: dict[str, Any] = {
            "time_aggregation": time_aggregation,
            "space_aggregation": "sum",
            "reduce_to": reduce_to,
            "by": by,
            "legend": "",
            "disabled": True,
        }
        return [
            {
                "type": "builder_query",
                "spec": _builder(
                    "A",
                    metric,
                    filter_expression=_signoz_filter(query.metric, (*query.within, *query.where), variables),
                    **common,
                ),
            },
            {
                "type": "builder_query",
                "spec": _builder(
                    "B",
                    metric,
                    filter_expression=_signoz_filter(query.metric, query.within, variables),
                    **common,
                ),
            },
            {"type": "builder_formula", "spec": _formula("F1", "A / B * 100", _legend(by) or "%")},
        ]
    counted: dict[str, Any] = {
        "time_aggregation": "rate" if isinstance(query, Rate) else "increase",
        "space_aggregation": "sum",
        "reduce_to": reduce_to,
        "by": by,
    }
    if not query.where:
        return [
            {
                "type": "builder_query",
                "spec": _builder(
                    "A",
                    metric,
                    filter_expression=_signoz_filter(query.metric, (), variables),
                    legend=_legend(by),
                    **counted,
                ),
            }
        ]
    # e.g. outcome="degraded": 0 for the groups with traffic, not "No data". SigNoz's formula
    # evaluator takes a rate or increase operand that has no value as 0, so A + 0 * B is A where
    # it matched and 0 for the other groups B (the same metric, unfiltered) has.
    return [
        {
            "type": "builder_query",
            "spec": _builder(
                "A",
                metric,
                filter_expression=_signoz_filter(query.metric, query.where, variables),
                legend="",
                disabled=True,
                **counted,
            ),
        },
        {
            "type": "builder_query",
            "spec": _builder(
                "B",
                metric,
                filter_expression=_signoz_filter(query.metric, (), variables),
                legend="",
                disabled=True,
                **counted,
            ),
        },
        {"type": "builder_formula", "spec": _formula("F1", "A + 0 * B", _legend(by))},
    ]


def _signoz_panel_plugin(panel: Panel) -> JsonObj:
    formatting = {"unit": panel.unit, "decimalPrecision": "2"}
    if panel.kind == "stat":
        return {
            "kind": "signoz/NumberPanel",
            "spec": {
                "visualization": {"timePreference": "global_time"},
                "formatting": formatting,
                "thresholds": None,
            },
        }
    return {
        "kind": "signoz/TimeSeriesPanel",
        "spec": {
            "visualization": {"timePreference": "global_time", "fillSpans": False},
            "formatting": formatting,
            "chartAppearance": {
                "lineInterpolation": "spline",
                "showPoints": False,
                "lineStyle": "solid",
                "fillMode": "none",
                "spanGaps": {"fillOnlyBelow": False, "fillLessThan": ""},
            },
            "axes": {"softMin": 0, "softMax": 0, "isLogScale": False},
            "legend": {"position": "bottom", "mode": "list", "customColors": None},
            "thresholds": None,
        },
    }


def _signoz_query(panel: Panel) -> JsonObj:
    scalar = panel.kind == "stat"
    envelopes = signoz_queries(panel.query, VARIABLES, scalar=scalar)
    kind = "scalar" if scalar else "time_series"
    if len(envelopes) == 1:
        spec = envelopes[0]["spec"]
        return {
            "kind": kind,
            "spec": {"name": spec["name"], "plugin": {"kind": "signoz/BuilderQuery", "spec": spec}},
        }
    return {
        "kind": kind,
        "spec": {"plugin": {"kind": "signoz/CompositeQuery", "spec": {"queries": envelopes}}},
    }


def panel_id(panel: Panel) -> str:
    """A stable panel key, so regenerating does not churn the JSON."""
    return str(uuid.uuid5(_UUID_NAMESPACE, panel.title))


def _grid(panels: Sequence[Panel], columns: int) -> list[tuple[Panel, int, int, int, int]]:
    """Place panels left to right, top to bottom: (panel, x, y, width, height)."""
    placed: list[tuple[Panel, int, int, int, int]] = []
    x = y = row_height = 0
    scale = columns // 12
    for panel in panels:
        width = panel.width * scale
        if x + width > columns:
            x, y, row_height = 0, y + row_height, 0
        placed.append((panel, x, y, width, panel.height))
        x += width
        row_height = max(row_height, panel.height)
    return placed


def signoz_dashboard() -> JsonObj:
    panels: dict[str, JsonObj] = {}
    layouts: list[JsonObj] = []
    for section in SECTIONS:
        items = []
        for panel, x, y, width, height in _grid(section.panels, 12):
            key = panel_id(panel)
            panels[key] = {
                "kind": "Panel",
                "spec": {
                    "display": {"name": panel.title, "description": panel.description},
                    "plugin": _signoz_panel_plugin(panel),
                    "queries": [_signoz_query(panel)],
                    "links": [],
                },
            }
            items.append(
                {
                    "x": x,
                    "y": y,
                    "width": width,
                    "height": height,
                    "content": {"$ref": f"#/spec/panels/{key}"},
                }
            )
        layouts.append(
            {
                "kind": "Grid",
                "spec": {"display": {"title": section.title, "collapse": {"open": True}}, "items": items},
            }
        )
    variables = [
        {
            "kind": "ListVariable",
            "spec": {
                "name": v.name,
                "display": {"name": v.name, "description": v.description},
                "allowAllValue": True,
                "allowMultiple": True,
                "customAllValue": "",
                "capturingRegexp": "",
                "sort": "alphabetical-asc",
                "plugin": {"kind": "signoz/DynamicVariable", "spec": {"name": v.key, "signal": "metrics"}},
            },
        }
        for v in VARIABLES
    ]
    return {
        "schemaVersion": "v6",
        "generateName": True,
        "image": "",
        "tags": [{"key": "tag", "value": t} for t in ("kaos-otel", "agents", "genai", "memory")],
        "spec": {
            "display": {
                "name": "kaos-otel: agents, models, tools and memory",
                "description": (
                    "Requests, errors and latency of kaos-otel agents; model calls, tokens, tools, "
                    "delegations; memory tiers (short_term, medium_term, long_term); dropped telemetry. "
                    "Generated from the kaos-otel catalog by dashboards/build.py."
                ),
            },
            "variables": variables,
            "panels": panels,
            "layouts": layouts,
            "duration": "",
            "refreshInterval": "",
            "links": [],
        },
    }


def _signoz_template(text: str) -> str:
    for name, key in _TEMPLATE_KEYS.items():
        text = text.replace("{" + name + "}", '{{index $labels "' + key + '"}}')
    return text


def signoz_rule(alert: Alert) -> JsonObj:
    """A ``RuletypesPostableRule`` in the ``v2alpha1`` schema (thresholds + evaluation envelope)."""
    queries = signoz_queries(alert.query, (), scalar=False, by_service=True)
    selected = queries[-1]["spec"]["name"]  # the formula when there is one
    group = [SERVICE, *alert.query.by]
    return {
        "alert": alert.name,
        "alertType": "METRIC_BASED_ALERT",
        "ruleType": "threshold_rule",
        "version": "v5",
        "schemaVersion": "v2alpha1",
        "description": alert.description,
        "condition": {
            "compositeQuery": {
                "queryType": "builder",
                "panelType": "graph",
                "unit": alert.unit,
                "queries": queries,
            },
            "selectedQueryName": selected,
            "thresholds": {
                "kind": "basic",
                "spec": [
                    {
                        "name": alert.severity,
                        "target": alert.threshold,
                        "targetUnit": alert.unit,
                        "matchType": alert.signoz_match,
                        "op": "above",
                        "channels": [],
                    }
                ],
            },
        },
        "evaluation": {
            "kind": "rolling",
            "spec": {"evalWindow": alert.signoz_eval_window, "frequency": "1m"},
        },
        "notificationSettings": {
            "groupBy": group,
            "renotify": {"enabled": True, "interval": "4h", "alertStates": ["firing"]},
            "usePolicy": False,
        },
        "labels": {"severity": alert.severity, "app": "kaos-otel", **alert.labels},
        "annotations": {
            "summary": _signoz_template(alert.summary),
            "description": alert.description + " Current value: {{$value}}, threshold: {{$threshold}}.",
        },
        "disabled": False,
    }


# --- Prometheus ---------------------------------------------------------------------------
def _prom_template(text: str) -> str:
    for name, key in _TEMPLATE_KEYS.items():
        label = "job" if key == SERVICE else c.prometheus_label(key)
        text = text.replace("{" + name + "}", "{{ $labels." + label + " }}")
    return text


def prometheus_rules() -> str:
    """The Prometheus rule file (YAML written by hand to keep block-style expressions)."""
    lines = [
        "# Generated by dashboards/build.py from kaos_otel/catalog.py: edit ALERTS there, then run",
        "# `python dashboards/build.py`. Unit tests: kaos-alerts.test.yml (promtool test rules).",
        "groups:",
        "  - name: kaos-otel",
        "    rules:",
    ]
    for alert in ALERTS:
        lines += [f"      - alert: {alert.name}", "        expr: |"]
        lines += [f"          {line}" for line in alert.prometheus_expr.splitlines()]
        if alert.for_ != "0m":
            lines.append(f"        for: {alert.for_}")
        lines += ["        labels:", f"          severity: {alert.severity}", "          app: kaos-otel"]
        lines += [f"          {k}: {json.dumps(v)}" for k, v in alert.labels.items()]
        value = "{{ $value | humanizePercentage }}" if alert.unit == "percent" else "{{ $value | humanize }}"
        unit = "s" if alert.unit == "s" else ""
        lines += [
            "        annotations:",
            f"          summary: {json.dumps(_prom_template(alert.summary))}",
            f"          description: {json.dumps(f'{alert.description} Current value: {value}{unit}.')}",
        ]
    return "\n".join(lines) + "\n"


# --- Grafana ------------------------------------------------------------------------------
_GRAFANA_VARIABLE_SOURCE = {A: c.KAOS_REQUESTS, MODEL: c.KAOS_MODEL_CALLS, TIER: c.KAOS_MEMORY_OPERATIONS}


def _by(keys: Iterable[str], extra: Sequence[str] = ()) -> str:
    labels = [*extra, *(c.prometheus_label(k) for k in keys)]
    return f" by ({', '.join(labels)})" if labels else ""


def grafana_targets(query: Query, *, stat: bool) -> list[JsonObj]:
    """PromQL targets for ``query``; a stat panel aggregates over the whole time range."""
    spec = c.METRICS_BY_NAME[query.metric]
    window = "$__range" if stat else "$__rate_interval"
    legend = " ".join("{{" + c.prometheus_label(k) + "}}" for k in query.by)
    if isinstance(query, Quantiles):
        targets = []
        for i, q in enumerate(query.quantiles):
            series = _prom_selector(query.metric, query.where, spec.prometheus + "_bucket")
            expr = (
                f"histogram_quantile({int(q[1:]) / 100:g}, sum{_by(query.by, ('le',))} "
                f"(rate({series}[{window}])))"
            )
            targets.append(
                {"expr": expr, "legendFormat": f"{q} {legend}".strip(), "refId": chr(ord("A") + i)}
            )
        return targets
    if isinstance(query, Percent):
        func = "increase" if stat else "rate"
        part = _prom_selector(query.metric, (*query.within, *query.where), spec.prometheus)
        within = _prom_selector(query.metric, query.within, spec.prometheus)
        whole = f"sum{_by(query.by)} ({func}({within}[{window}]))"
        expr = zero_filled_ratio(f"sum{_by(query.by)} ({func}({part}[{window}]))", whole, "100 * ")
        return [{"expr": expr, "legendFormat": legend or "%", "refId": "A"}]
    func = "rate" if isinstance(query, Rate) else "increase"
    name = spec.prometheus
    if isinstance(query, Rate) and query.part:
        name = spec.prometheus.removesuffix("_total") + f"_{query.part}"
    expr = f"sum{_by(query.by)} ({func}({_prom_selector(query.metric, query.where, name)}[{window}]))"
    if query.where:  # e.g. outcome="degraded": 0 for the groups with traffic, not "No data"
        whole = _prom_selector(query.metric, (), name)
        expr = f"{expr}\nor 0 * sum{_by(query.by)} ({func}({whole}[{window}]))"
    return [{"expr": expr, "legendFormat": legend, "refId": "A"}]


SDK_METRIC_EXPORT_INTERVAL_S = 60
"""OpenTelemetry's default ``OTEL_METRIC_EXPORT_INTERVAL``: a series pushed through the collector
changes once a minute, however often Prometheus scrapes it."""
GRAFANA_MIN_INTERVAL = f"{2 * SDK_METRIC_EXPORT_INTERVAL_S}s"
"""Min interval of the Grafana time-series panels, so that ``$__rate_interval`` (the larger of
``$__interval`` + scrape interval and 4 scrape intervals) spans two SDK exports. Without it,
Grafana's 1 minute (a 15 s scrape) holds one export or none: a steady rate read 4/3 of itself
three times in four and 0 the fourth, and a latency quantile had gaps (0 / 0)."""


def grafana_dashboard() -> JsonObj:
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    panels: list[JsonObj] = []
    next_id = 1
    y_offset = 0
    for section in SECTIONS:
        panels.append(
            {
                "id": next_id,
                "type": "row",
                "title": section.title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y_offset, "w": 24, "h": 1},
                "panels": [],
            }
        )
        next_id += 1
        y_offset += 1
        bottom = y_offset
        for panel, x, y, width, height in _grid(section.panels, 24):
            stat = panel.kind == "stat"
            entry: JsonObj = {
                "id": next_id,
                "type": "stat" if stat else "timeseries",
                "title": panel.title,
                "description": panel.description,
                "datasource": datasource,
                "gridPos": {"x": x, "y": y_offset + y, "w": width, "h": height},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "options": (
                    {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
                    if stat
                    else {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
                ),
                "targets": [
                    {"datasource": datasource, "range": True, **t}
                    for t in grafana_targets(panel.query, stat=stat)
                ],
            }
            if stat:
                entry["targets"] = [{**t, "range": False, "instant": True} for t in entry["targets"]]
            else:
                entry["interval"] = GRAFANA_MIN_INTERVAL
            panels.append(entry)
            next_id += 1
            bottom = max(bottom, y_offset + y + height)
        y_offset = bottom
    templating: list[JsonObj] = [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
        },
        {
            "name": "job",
            "label": "Service (job)",
            "type": "query",
            "datasource": datasource,
            "query": {"query": f"label_values({_prom(c.KAOS_REQUESTS)}, job)", "refId": "job"},
            "definition": f"label_values({_prom(c.KAOS_REQUESTS)}, job)",
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {},
            "refresh": 2,
            "sort": 1,
            "regex": "",
        },
    ]
    for v in VARIABLES:
        source = _prom(_GRAFANA_VARIABLE_SOURCE[v.key])
        definition = f'label_values({source}{{job=~"$job"}}, {c.prometheus_label(v.key)})'
        templating.append(
            {
                "name": v.name,
                "label": v.description,
                "type": "query",
                "datasource": datasource,
                "query": {"query": definition, "refId": v.name},
                "definition": definition,
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "current": {},
                "refresh": 2,
                "sort": 1,
                "regex": "",
            }
        )
    return {
        "uid": "kaos-otel-agents",
        "title": "kaos-otel: agents, models, tools and memory",
        "description": "Generated from the kaos-otel catalog by dashboards/build.py (Prometheus names).",
        "tags": ["kaos-otel", "agents", "genai", "memory"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": templating},
        "panels": panels,
    }


# --- output -------------------------------------------------------------------------------
def _json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def generated_files() -> dict[Path, str]:
    """Every generated file and its content."""
    files = {
        SIGNOZ_DASHBOARD: _json(signoz_dashboard()),
        GRAFANA_DASHBOARD: _json(grafana_dashboard()),
        PROMETHEUS_RULES: prometheus_rules(),
    }
    for alert in ALERTS:
        files[SIGNOZ_ALERTS / f"{alert.slug}.json"] = _json(signoz_rule(alert))
    return files


def stale_files() -> list[Path]:
    """Generated files whose content on disk differs, plus stray SigNoz rule files."""
    files = generated_files()
    stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
    stale += sorted(p for p in SIGNOZ_ALERTS.glob("*.json") if p not in files)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for path in stale:
            print(f"stale: {path.relative_to(HERE.parent)}", file=sys.stderr)
        return 1 if stale else 0
    files = generated_files()
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(HERE.parent)}")
    for path in SIGNOZ_ALERTS.glob("*.json"):
        if path not in files:
            path.unlink()
            print(f"removed {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
