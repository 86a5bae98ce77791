"""Summarise received metric points: one total per metric and label set (``receive``, ``traces show``)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kaos_otel._trace_tree import format_duration, printable

if TYPE_CHECKING:  # the receiver (gRPC server, protobuf) is imported only by its callers
    from kaos_otel.receiver import ReceivedMetricPoint

__all__ = ["LatestPoints", "SeriesTotal", "metrics_summary", "render_metrics_summary"]

_MAX_SERIES = 12


@dataclass(frozen=True)
class SeriesTotal:
    """A metric's total for one service and label set.

    Sums add up every counting period (restarts and delta exports included), gauges keep the last
    value, histograms add counts and sums and keep the largest maximum.
    """

    name: str
    unit: str
    kind: str
    service: str
    attributes: tuple[tuple[str, Any], ...]
    value: float | None = None
    count: int | None = None
    sum: float | None = None
    max: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "name": self.name,
            "unit": self.unit,
            "kind": self.kind,
            "service": self.service,
            "attributes": dict(self.attributes),
            "value": self.value,
            "count": self.count,
            "sum": self.sum,
            "max": self.max,
        }


def _label_value(value: Any) -> Any:
    """A label value as a key part: one holding a key-value list (a dict once decoded) as JSON text."""
    try:
        hash(value)
    except TypeError:
        return json.dumps(value, sort_keys=True, default=str)
    return value


_PeriodKey = tuple[str, str, tuple[tuple[str, Any], ...], str, int]


class LatestPoints:
    """The latest point of each counting period of each series and meter: all a summary reads.

    Cumulative exports repeat a period's running total, so a receiver that keeps only these holds
    one point per series (and process start) however long it runs; delta exports give each period
    its own start, and the same period to every meter's instruments.
    """

    def __init__(self, points: Iterable[ReceivedMetricPoint] = ()) -> None:
        self._latest: dict[_PeriodKey, ReceivedMetricPoint] = {}
        self.add(points)

    def add(self, points: Iterable[ReceivedMetricPoint]) -> None:
        """Keep each point that is the latest of its counting period so far."""
        latest = self._latest
        for point in points:
            attributes = tuple(sorted((k, _label_value(v)) for k, v in point.attributes.items()))
            key = (point.name, point.service_name, attributes, point.scope_name, point.start_time_unix_nano)
            if key not in latest or point.time_unix_nano >= latest[key].time_unix_nano:
                latest[key] = point

    def points(self) -> list[ReceivedMetricPoint]:
        """The points kept, a snapshot."""
        return list(self._latest.values())

    def items(self) -> list[tuple[_PeriodKey, ReceivedMetricPoint]]:
        """``(period key, latest point)`` pairs, a snapshot."""
        return list(self._latest.items())


def metrics_summary(points: Iterable[ReceivedMetricPoint]) -> list[SeriesTotal]:
    """Totals per (metric, service, labels), sorted by metric name then labels."""
    periods: dict[tuple[str, str, tuple[tuple[str, Any], ...]], list[ReceivedMetricPoint]] = defaultdict(list)
    for (name, service, attributes, _, _), point in LatestPoints(points).items():
        periods[name, service, attributes].append(point)
    totals: list[SeriesTotal] = []
    for (name, service, attributes), members in sorted(periods.items(), key=lambda item: repr(item[0])):
        first = members[0]
        if first.kind in ("sum", "gauge"):
            if first.kind == "gauge":
                value = max(members, key=lambda p: p.time_unix_nano).value
            else:
                value = sum(p.value or 0 for p in members)
            totals.append(SeriesTotal(name, first.unit, first.kind, service, attributes, value=value))
        else:
            maxima = [p.max for p in members if p.max is not None]
            totals.append(
                SeriesTotal(
                    name,
                    first.unit,
                    first.kind,
                    service,
                    attributes,
                    count=sum(p.count or 0 for p in members),
                    sum=sum(p.sum or 0.0 for p in members),
                    max=max(maxima) if maxima else None,
                )
            )
    return totals


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return format_duration(value)
    text = f"{value:.4g}" if isinstance(value, float) and not value.is_integer() else f"{int(value)}"
    return f"{text} {unit}" if unit and not unit.startswith("{") else text


def _line(total: SeriesTotal) -> str:
    labels = " ".join(f"{k}={v}" for k, v in total.attributes) or "(no labels)"
    if total.count is not None:
        mean = (total.sum or 0.0) / total.count if total.count else None
        figures = (
            f"count {total.count}  mean {_number(mean, total.unit)}  max {_number(total.max, total.unit)}"
        )
    else:
        figures = _number(total.value, total.unit)
    return f"    {total.service or '?'}  {labels}  {figures}"


def render_metrics_summary(points: Iterable[ReceivedMetricPoint]) -> str:
    """Human-readable metrics summary: each metric, then up to 12 of its series with their totals."""
    totals = metrics_summary(points)
    if not totals:
        return "Metrics: none received\n"
    by_metric: dict[str, list[SeriesTotal]] = defaultdict(list)
    for total in totals:
        by_metric[total.name].append(total)
    lines = [f"Metrics ({len(by_metric)} metrics, {len(totals)} series; totals since start)"]
    for name, series in by_metric.items():
        first = series[0]
        kind = "counter" if first.kind == "sum" else first.kind
        lines.append(printable(f"  {name} ({kind}{', ' + first.unit if first.unit else ''})"))
        ranked = sorted(series, key=lambda t: -(t.count if t.count is not None else abs(t.value or 0)))
        lines += [printable(_line(t)) for t in ranked[:_MAX_SERIES]]
        if len(series) > _MAX_SERIES:
            lines.append(f"    … {len(series) - _MAX_SERIES} more series")
    return "\n".join(lines) + "\n"
