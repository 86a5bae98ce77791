"""Figures, targets and the rendering of ``BENCHMARKS.md`` and the console summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """A figure's target: ``value <= limit`` (or ``value is True`` for booleans)."""

    key: str
    label: str
    limit: float | None
    text: str
    at_least: bool = False
    """The target is ``value >= limit`` (a throughput) rather than ``value <= limit``."""

    def met(self, value: object) -> bool | None:
        """Whether ``value`` meets the target (``None`` when there is nothing to judge)."""
        if isinstance(value, bool):
            return value
        if isinstance(value, int | float) and self.limit is not None:
            return value >= self.limit if self.at_least else value <= self.limit
        return None


TARGETS: tuple[Target, ...] = (
    Target("span_ratio_begin_success", "span_begin / span_success vs raw span", 1.15, "<= 1.15"),
    Target("span_ratio_context_manager", "context manager vs raw span", 1.15, "<= 1.15"),
    Target("span_ratio_nested", "parent + 3 children vs raw", 1.15, "<= 1.15"),
    Target("span_ratio_decorator", "decorator (sync) vs raw decorator", 1.25, "<= 1.25"),
    Target("span_ratio_decorator_async", "decorator (async) vs raw decorator", 1.25, "<= 1.25"),
    Target("disabled_ratio", "disabled (OTEL_SDK_DISABLED) vs no-op tracer", 1.5, "<= 1.5"),
    Target("agent_request_overhead_ratio", "agent request, telemetry on vs disabled", 1.02, "<= 1.02"),
    Target("collector_down_p99_ratio", "request p99, collector down vs up", 1.05, "<= 1.05"),
    Target(
        "collector_down_memory_bounded", "memory over 100,000 spans bounded by the queue", None, "bounded"
    ),
    Target("collector_down_loss_counted", "loss counted by the telemetry-health metric", None, "all"),
    Target("mem0_overhead_ratio", "Mem0 operation instrumented vs not", 1.05, "<= 1.05"),
    Target("throughput_ratio_to_raw_sdk", "throughput vs raw SDK pipeline", 0.9, ">= 0.9", at_least=True),
)
REPORTED: tuple[tuple[str, str], ...] = (
    ("logfire_span_ratio", "logfire.span vs raw span"),
    ("metric_ratio_counter", "counter record vs raw SDK counter"),
    ("metric_ratio_histogram", "histogram record vs raw SDK histogram"),
    ("metric_ratio_counter_and_histogram", "tool-call record (counter + histogram) vs raw"),
    ("agent_telemetry_ratio_vs_raw_sdk", "agent request telemetry vs raw SDK doing the same"),
    ("agent_request_overhead_ratio_in_process", "in-process agent loop, on vs disabled"),
    ("agent_request_raw_sdk_ratio_in_process", "in-process agent loop, raw SDK vs disabled (the floor)"),
    ("agent_cpu_ms_added_per_request", "agent CPU ms added per request"),
    ("collector_down_p50_ratio", "request p50, collector down vs up"),
    ("mem0_raw_sdk_ratio", "Mem0: raw-SDK telemetry in place vs none (the floor)"),
    ("mem0_ratio_vs_raw_sdk", "Mem0: instrumented vs raw-SDK telemetry in place"),
    ("throughput_spans_per_s", "spans/s exported to a receiver, no drops"),
    ("export_cpu_ratio_to_raw_sdk", "export-thread CPU per span vs the raw SDK's OTLP encoding"),
    ("import_time_ratio", "import kaos_otel vs import opentelemetry.sdk.trace (fresh interpreter)"),
)


def judge(figures: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each target with its measured value and whether it is met."""
    return {
        target.key: {
            "target": target.text,
            "value": figures.get(target.key),
            "met": target.met(figures.get(target.key)),
        }
        for target in TARGETS
    }


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "n/a" if value is None else str(value)


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "-"}[met]


def console_summary(results: Mapping[str, Any]) -> str:
    """A plain-text table of every figure for the terminal."""
    lines = [f"kaos-otel benchmarks ({results['mode']} run, {results['machine']['date']})", ""]
    width = max(len(target.label) for target in TARGETS) + 2
    for target in TARGETS:
        value = results.get(target.key)
        verdict = {True: "ok", False: "MISSED", None: ""}[target.met(value)]
        lines.append(f"  {target.label:<{width}} {_fmt(value):>14}   target {target.text:<9} {verdict}")
    for key, label in REPORTED:
        lines.append(f"  {label:<{width}} {_fmt(results.get(key)):>14}")
    return "\n".join(lines)


def _table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def _us(comparison: Mapping[str, float], name: str) -> str:
    value = comparison.get(name)
    return f"{value:.2f}" if isinstance(value, int | float) else "n/a"


def render_markdown(results: Mapping[str, Any], notes: str) -> str:
    """``BENCHMARKS.md``: the machine, every figure against its target, details and notes."""
    machine = results["machine"]
    details = results["details"]
    packages = ", ".join(f"{name} {version}" for name, version in machine["packages"].items())
    summary_rows = [
        (
            target.label,
            f"`{target.key}`",
            _fmt(results.get(target.key)),
            target.text,
            _verdict(target.met(results.get(target.key))),
        )
        for target in TARGETS
    ] + [(label, f"`{key}`", _fmt(results.get(key)), "reported", "-") for key, label in REPORTED]
    spans = details.get("spans", {})
    disabled = details.get("disabled", {})
    metrics = details.get("metrics", {})
    span_rows = [
        ("raw SDK `start_as_current_span`", _us(spans, "raw_start_as_current_span"), "1"),
        (
            "`span_begin` + `span_success`",
            _us(spans, "begin_success"),
            _fmt(results.get("span_ratio_begin_success")),
        ),
        (
            "`with otel.span(...)`",
            _us(spans, "context_manager"),
            _fmt(results.get("span_ratio_context_manager")),
        ),
        ("raw parent + 3 children (per span)", _us(spans, "raw_nested"), "1"),
        ("kaos parent + 3 children (per span)", _us(spans, "nested"), _fmt(results.get("span_ratio_nested"))),
        ("raw `@tracer.start_as_current_span`", _us(spans, "raw_decorator"), "1"),
        ("`@otel.traced`", _us(spans, "decorator"), _fmt(results.get("span_ratio_decorator"))),
        ("raw decorator, async", _us(spans, "raw_decorator_async"), "1"),
        (
            "`@otel.traced`, async",
            _us(spans, "decorator_async"),
            _fmt(results.get("span_ratio_decorator_async")),
        ),
    ]
    disabled_rows = [
        ("API `NoOpTracer().start_as_current_span`", _us(disabled, "noop_start_as_current_span"), "1"),
        (
            "disabled `span_begin` + `span_success`",
            _us(disabled, "begin_success"),
            _fmt(disabled.get("ratio_begin_success")),
        ),
        (
            "disabled `with otel.span(...)`",
            _us(disabled, "context_manager"),
            _fmt(disabled.get("ratio_context_manager")),
        ),
        (
            "disabled `@otel.traced` (vs no-op decorator)",
            _us(disabled, "decorator"),
            _fmt(disabled.get("ratio_decorator")),
        ),
        (
            "disabled agent helpers (per span)",
            _us(disabled, "agent_helpers"),
            _fmt(disabled.get("ratio_agent_helpers")),
        ),
    ]
    metric_rows = [
        ("raw SDK counter `add`", _us(metrics, "raw_counter"), "1"),
        (
            "kaos counter (`record_compaction`)",
            _us(metrics, "counter"),
            _fmt(results.get("metric_ratio_counter")),
        ),
        ("raw SDK histogram `record`", _us(metrics, "raw_histogram"), "1"),
        (
            "kaos histogram (`record_extraction_lag`)",
            _us(metrics, "histogram"),
            _fmt(results.get("metric_ratio_histogram")),
        ),
        ("raw SDK counter + histogram", _us(metrics, "raw_counter_and_histogram"), "1"),
        (
            "kaos `record_tool_call` (counter + histogram)",
            _us(metrics, "counter_and_histogram"),
            _fmt(results.get("metric_ratio_counter_and_histogram")),
        ),
    ]
    sections = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench` (full run); `python -m bench --quick` is the short version and",
        "does not rewrite this file unless given `--write`. Every figure is a ratio measured in the same",
        "run against the raw OpenTelemetry SDK (or against telemetry disabled) on this machine. Targets",
        "are reported here and never asserted in tests.",
        "",
        "## Machine",
        "",
        _table(
            [
                ("date", machine["date"]),
                ("run", results["mode"]),
                ("CPU", f"{machine['cpu_model']}, {machine['cores']} cores"),
                ("OS", machine["os"]),
                ("Python", f"{machine['implementation']} {machine['python']}"),
                ("load average at start", ", ".join(str(x) for x in machine["load_average_at_start"])),
                ("packages", packages),
            ],
            ("", ""),
        ),
        "",
        "## Summary",
        "",
        _table(summary_rows, ("figure", "JSON key", "measured", "target", "")),
        "",
        "## Per-span cost",
        "",
        "Same `TracerProvider`, same `BatchSpanProcessor` into a null exporter, two attributes per",
        "span; the raw and kaos-otel variants alternate within each repetition (rotating order, a",
        "`gc.collect()` before each timed run); each ratio is the median over repetitions of the",
        "ratio within a repetition (so a ratio need not equal the quotient of the two medians shown).",
        "Times are medians in microseconds per span.",
        "",
        _table(span_rows, ("variant", "us/span", "ratio")),
        "",
        f"`logfire.span`: {_fmt(results.get('logfire_span_ratio'))}"
        + (
            " (the `bench` extra, `pip install kaos-otel[bench]`)."
            if isinstance(results.get("logfire_span_ratio"), str)
            else " x the raw span."
        ),
        "",
        "## Disabled path",
        "",
        "`KaosOtelManager` built from `OTEL_SDK_DISABLED=true` against the API's `NoOpTracer`.",
        "`disabled_ratio` is the worse of `span_begin`/`span_success` and the context manager.",
        "",
        _table(disabled_rows, ("variant", "us/span", "ratio")),
        "",
        "## Metric records",
        "",
        "One kaos-otel record (label bounding, catalog Views) against the raw SDK instrument with the",
        "same name and label set on a plain `MeterProvider` (one in-memory reader each).",
        "",
        _table(metric_rows, ("variant", "us/record", "ratio")),
        "",
        "## Agent request",
        "",
        _agent_section(
            details.get("agent"),
            details.get("agent_in_process"),
            details.get("reference_agent_error"),
            details.get("agent_telemetry"),
        ),
        "",
        "## Collector down",
        "",
        _collector_section(details.get("collector_down"), details.get("memory")),
        "",
        "## Throughput",
        "",
        _throughput_section(details.get("throughput")),
        "",
        "## Mem0",
        "",
        _mem0_section(details.get("mem0")),
        "",
        notes.strip(),
        "",
    ]
    return "\n".join(sections)


def _para(*pieces: str) -> str:
    """One markdown paragraph from pieces joined by spaces."""
    return " ".join(piece.strip() for piece in pieces)


def _latency_rows(result: Mapping[str, Any]) -> list[tuple[str, ...]]:
    modes = [("telemetry on", result["on"]), ("disabled", result["off"])]
    if "raw_sdk" in result:
        modes.append(("raw SDK, same telemetry", result["raw_sdk"]))
    return [
        (mode, _fmt(s["p50_ms"]), _fmt(s["p90_ms"]), _fmt(s["p99_ms"]), _fmt(s["mean_ms"]))
        for mode, s in modes
    ]


def _agent_section(
    reference: Mapping[str, Any] | None,
    in_process: Mapping[str, Any] | None,
    error: str | None,
    telemetry: Mapping[str, float] | None,
) -> str:
    header = ("", "p50 ms", "p90 ms", "p99 ms", "mean ms")
    parts: list[str] = []
    if reference:
        cpu = reference["agent_cpu_ms_per_request"]
        parts += [
            _para(
                f"Reference agent: {reference['agent']}. Two agent processes side by side, one exporting",
                "over OTLP/gRPC to a receiver process, one started with `OTEL_SDK_DISABLED=true`; the",
                f"scripted model process answers after {reference['model_latency_ms']:g} ms per call.",
                f"{reference['on']['n']} requests to each, alternating, over HTTP.",
            ),
            "",
            _table(_latency_rows(reference), header),
            "",
            _para(
                f"`agent_request_overhead_ratio` (p50 on / p50 off) = {_fmt(reference['ratio'])}",
                f"({_fmt(reference['added_ms_p50'])} ms). CPU of the agent process per request, all",
                f"threads (export included): {_fmt(cpu['on'])} ms on, {_fmt(cpu['off'])} ms disabled.",
                f"Spans received: {_fmt(reference['spans_exported'])}.",
            ),
            "",
        ]
    elif error:
        parts += [f"The reference agent could not run ({error}); the in-process loop below stands in.", ""]
    if telemetry:
        parts += [
            _para(
                "What one request's telemetry costs, without any I/O: nine spans and 23 metric points",
                "through the domain helpers, against the raw SDK creating the same spans (names, kinds,",
                "attributes, nesting) and recording the same points with the same label sets:",
                f"{_us(telemetry, 'kaos')} us with kaos-otel, {_us(telemetry, 'raw_sdk')} us with the raw",
                "SDK (request-thread CPU, medians).",
            ),
            "",
        ]
    if in_process:
        parts += [
            _para(
                "In-process agent loop (the reference agent's shape written with the domain helpers:",
                "`invoke_agent` > `agent_step` > `chat` over real HTTP > `execute_tool`;",
                f"{in_process['spans_per_request']} spans and the catalog metrics per request), telemetry",
                "on exporting to a receiver process vs a",
                "disabled manager vs the same loop recording the same spans and metric points on the",
                "raw SDK (a `BatchSpanProcessor` and a periodic reader, exporting over OTLP/gRPC to the",
                f"same receiver), in the same process, {in_process['on']['n']} requests each, in rotation,",
                f"model latency {in_process['model_latency_ms']:g} ms:",
            ),
            "",
            _table(_latency_rows(in_process), header),
            "",
            _para(
                f"Ratio {_fmt(in_process['ratio'])} (`agent_request_overhead_ratio_in_process`), raw SDK",
                f"{_fmt(in_process['raw_sdk_ratio'])} (`agent_request_raw_sdk_ratio_in_process`, the floor);",
                f"request-thread CPU added: {_fmt(in_process['cpu_added_ms'])} ms per request with kaos-otel",
                f"({_fmt(in_process['on']['cpu_ms'])} vs {_fmt(in_process['off']['cpu_ms'])} ms),",
                f"{_fmt(in_process['raw_sdk_cpu_added_ms'])} ms with the raw SDK.",
            ),
        ]
    return "\n".join(parts) if parts else "Not run."


def _collector_section(down: Mapping[str, Any] | None, memory: Mapping[str, Any] | None) -> str:
    parts: list[str] = []
    if down:
        rows = [
            (mode, _fmt(s["p50_ms"]), _fmt(s["p90_ms"]), _fmt(s["p99_ms"]), str(s["n"]))
            for mode, s in (("collector up", down["up"]), ("collector down", down["down"]))
        ]
        shutdown, lost = down["shutdown_max_s"], down["spans_dropped_counted"]
        parts += [
            _para(
                f"The same agent request (model latency {down['model_latency_ms']:g} ms) exporting to a",
                "receiver process (up) or to a closed port (down), in alternating blocks with a fresh",
                f"manager each; span queue {down['span_max_queue_size']}, warmed up until the down",
                "manager's queue is full, so every later span takes the queue-full path.",
            ),
            "",
            _table(rows, ("", "p50 ms", "p90 ms", "p99 ms", "requests")),
            "",
            _para(
                f"p50 ratio {_fmt(down['p50_ratio'])}, p99 ratio {_fmt(down['p99_ratio'])}.",
                f"Longest `shutdown(timeout=2)`: {_fmt(shutdown['up'])} s up, {_fmt(shutdown['down'])} s",
                f"down. Spans counted as lost: {_fmt(lost['down'])} down, {_fmt(lost['up'])} up.",
            ),
            "",
        ]
    if memory:
        memory_rows = [
            (f"{int(k):,}", _fmt(v["rss_growth_mb"]), _fmt(v["live_spans"]), _fmt(v["queued"]))
            for k, v in memory["checkpoints"].items()
        ]
        spans = f"{memory['spans']:,}"
        reasons = ", ".join(f"{k}: {v:,}" for k, v in memory["lost_by_reason"].items())
        parts += [
            _para(
                f"Memory: {spans} spans (three attributes, about 300 bytes of values) with the collector",
                f"down and `span_max_queue_size={memory['span_max_queue_size']}`. With the queue full the",
                f"pipeline holds {_fmt(memory['held_when_queue_full_mb'])} MB of Python memory",
                f"(tracemalloc), {_fmt(memory['per_queued_span_kb'])} KB per queued span; an unbounded",
                f"buffer would hold about {_fmt(memory['unbounded_equivalent_mb'])} MB after {spans} spans.",
                "Then, without tracemalloc:",
            ),
            "",
            _table(memory_rows, ("spans made", "RSS growth MB", "span objects alive", "queued")),
            "",
            _para(
                f"Bounded: {_fmt(memory['bounded'])} (span objects alive stay within the queue plus the",
                "batches in flight: the one being exported and its cleaned copies, at most three batches).",
                "Loss counted by `kaos.telemetry.dropped` (`otel.health`):",
                f"{_fmt(memory['lost_counted'])} of {spans} spans ({reasons});",
                f"{_fmt(memory['lost_counted_before_shutdown'])} before shutdown, the rest when the queued",
                f"spans failed their export during `shutdown` ({_fmt(memory['shutdown_s'])} s).",
            ),
        ]
    return "\n".join(parts) if parts else "Not run."


def _throughput_section(result: Mapping[str, Any] | None) -> str:
    if not result:
        return "Not run."
    return _para(
        f"{result['spans_per_round']:,} spans per round, {result['rounds']} rounds alternating with the",
        "raw SDK (BatchSpanProcessor into the OTLP/gRPC exporter), into a receiver process. The producer",
        "waits while the queue is near capacity, so nothing is dropped; the rate counts until the",
        f"receiver holds every span. kaos-otel: {_fmt(result['spans_per_s'])} spans/s (all received:",
        f"{_fmt(result['all_received'])}, dropped: {_fmt(result['dropped'])}); raw SDK:",
        f"{_fmt(result['raw_sdk_spans_per_s'])} spans/s (all received:",
        f"{_fmt(result.get('raw_sdk_all_received'))}; medians); ratio {_fmt(result['ratio_to_raw_sdk'])},",
        "the median of the ratios within a round (per round, kaos-otel / raw SDK:",
        ", ".join(
            _fmt(round(k / r, 3))
            for k, r in zip(result["samples"]["kaos"], result["samples"]["raw_sdk"], strict=True)
        )
        + "). kaos-otel also cleans every exported string (secret redaction, size caps) on the export",
        "thread, which shares the GIL with the producer; the receiver process decoding the spans",
        "shares the same two cores, which makes single rounds vary by tens of percent.",
        *(
            [
                "Export-thread CPU per span, measured on its own (512 ended spans, cleaning then OTLP",
                f"encoding vs OTLP encoding alone): {_fmt(cpu['kaos'])} us with kaos-otel,",
                f"{_fmt(cpu['raw_sdk'])} us with the raw SDK.",
            ]
            if (cpu := result.get("export_cpu_us_per_span"))
            else []
        ),
    )


def _mem0_section(result: Mapping[str, Any] | str | None) -> str:
    if result is None:
        return "Not run."
    if isinstance(result, str):
        return f"Mem0: {result}."
    parts = [
        _para(
            f"Operation: {result['operation']}. {result['pairs']} operations each way, rotating between",
            "instrumented (`Mem0Instrumentor().instrument(telemetry=...)`, null exporter), not (the",
            "original methods the instrumentor wrapped, on the same `Memory`) and raw-SDK telemetry around",
            "those originals. Median request-thread CPU",
            f"time per operation: {_fmt(result['instrumented_us'])} us instrumented,",
            f"{_fmt(result['uninstrumented_us'])} us not; `mem0_overhead_ratio` {_fmt(result['ratio'])}.",
            f"Spans exported: {_fmt(result['spans_exported'])} of {_fmt(result['spans_expected'])} expected.",
        )
    ]
    per_call = (result["instrumented_us"] - result["uninstrumented_us"]) / 3
    raw_per_call = (result["raw_sdk_us"] - result["uninstrumented_us"]) / 3
    parts += [
        "",
        _para(
            "The floor, measured in place: the same originals, each call inside the telemetry a minimal",
            "instrumentation written on the raw SDK records (the same CLIENT span and attributes, the",
            f"same two metric points): {_fmt(result['raw_sdk_us'])} us per operation,",
            f"`mem0_raw_sdk_ratio` {_fmt(result['raw_sdk_ratio'])}; the instrumentor against it:",
            f"`mem0_ratio_vs_raw_sdk` {_fmt(result['ratio_vs_raw_sdk'])}. Per Mem0 call, the telemetry adds",
            f"{_fmt(round(per_call, 1))} us with the instrumentor and {_fmt(round(raw_per_call, 1))} us",
            "with the raw SDK.",
        ),
    ]
    span = result.get("memory_span")
    if span:
        parts += [
            "",
            _para(
                "In a tight loop (warm caches) one memory span as the instrumentor records it costs",
                f"{_us(span, 'kaos_us')} us and its raw-SDK equivalent {_us(span, 'raw_sdk_us')} us",
                f"(ratio {_fmt(span['ratio'])}): in place, between Mem0's own work, the same telemetry",
                f"costs {per_call / span['kaos_us']:.1f} times as much.",
            ),
        ]
    return "\n".join(parts)
