"""``python -m bench``: run the benchmarks, print the ratios, update ``BENCHMARKS.md``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import agent, collector, imports, mem0_bench, micro, reference_agent
from bench._harness import Comparison, machine_facts
from bench.notes import NOTES
from bench.report import console_summary, judge, render_markdown

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
SECTIONS = ("imports", "spans", "disabled", "metrics", "agent", "collector", "memory", "throughput", "mem0")


@dataclass(frozen=True)
class Plan:
    """Sizes of one run."""

    micro: micro.MicroConfig
    agent_pairs: int
    reference_pairs: int
    agent_model_latency_s: float
    down_blocks: int
    down_requests: int
    down_model_latency_s: float
    down_queue: int
    memory_spans: int
    memory_queue: int
    throughput_spans: int
    throughput_rounds: int
    mem0_pairs: int
    import_rounds: int


QUICK = Plan(
    micro=micro.MicroConfig(n=1000, reps=15),
    agent_pairs=20,
    reference_pairs=40,
    agent_model_latency_s=0.025,
    down_blocks=2,
    down_requests=50,
    down_model_latency_s=0.01,
    down_queue=256,
    memory_spans=100_000,
    memory_queue=2048,
    throughput_spans=10_000,
    throughput_rounds=2,
    mem0_pairs=150,
    import_rounds=6,
)
FULL = Plan(
    micro=micro.MicroConfig(n=2000, reps=41),
    agent_pairs=100,
    reference_pairs=200,
    agent_model_latency_s=0.025,
    down_blocks=4,
    down_requests=150,
    down_model_latency_s=0.01,
    down_queue=256,
    memory_spans=100_000,
    memory_queue=2048,
    throughput_spans=30_000,
    throughput_rounds=6,
    mem0_pairs=600,
    import_rounds=20,
)


def _ratios(comparison: Comparison, pairs: Sequence[tuple[str, str, str]]) -> dict[str, float]:
    return {key: round(comparison.ratio(name, baseline), 4) for key, name, baseline in pairs}


class Runner:
    """Runs the selected sections, collecting figures and details."""

    def __init__(self, plan: Plan, sections: Sequence[str]) -> None:
        self.plan = plan
        self.sections = sections
        self.figures: dict[str, Any] = {}
        self.details: dict[str, Any] = {}

    def section(self, name: str, run: Callable[[], None]) -> None:
        """Run one section if selected, reporting its duration on stderr."""
        if name not in self.sections:
            return
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        run()
        print(f"[bench] {name} done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)

    def imports(self) -> None:
        """Import time of kaos_otel against the SDK's tracing module."""
        result = imports.import_time(self.plan.import_rounds)
        self.figures["import_time_ratio"] = result["ratio"]
        self.details["imports"] = result

    def spans(self) -> None:
        """Per-span cost and logfire."""
        sync, async_ = micro.span_costs(self.plan.micro)
        self.figures.update(
            _ratios(
                sync,
                [
                    ("span_ratio_begin_success", "begin_success", "raw_start_as_current_span"),
                    ("span_ratio_context_manager", "context_manager", "raw_start_as_current_span"),
                    ("span_ratio_nested", "nested", "raw_nested"),
                    ("span_ratio_decorator", "decorator", "raw_decorator"),
                ],
            )
        )
        self.figures["span_ratio_decorator_async"] = round(async_.ratio("decorator_async"), 4)
        self.details["spans"] = {**sync.summary(), **async_.summary()}
        logfire = micro.logfire_costs(self.plan.micro)
        if isinstance(logfire, str):
            self.figures["logfire_span_ratio"] = logfire
        else:
            self.figures["logfire_span_ratio"] = round(logfire.ratio("logfire_span"), 4)
            self.details["logfire"] = {
                **logfire.summary(),
                "kaos_context_manager_ratio": round(logfire.ratio("context_manager"), 4),
            }

    def disabled(self) -> None:
        """The disabled path against the no-op tracer."""
        comparison = micro.disabled_costs(self.plan.micro)
        ratios = _ratios(
            comparison,
            [
                ("ratio_begin_success", "begin_success", "noop_start_as_current_span"),
                ("ratio_context_manager", "context_manager", "noop_start_as_current_span"),
                ("ratio_decorator", "decorator", "noop_decorator"),
                ("ratio_agent_helpers", "agent_helpers", "noop_start_as_current_span"),
            ],
        )
        self.figures["disabled_ratio"] = max(ratios["ratio_begin_success"], ratios["ratio_context_manager"])
        self.details["disabled"] = {**comparison.summary(), **ratios}

    def metrics(self) -> None:
        """Metric records against raw SDK instruments."""
        comparison = micro.metric_costs(self.plan.micro)
        self.figures.update(
            _ratios(
                comparison,
                [
                    ("metric_ratio_counter", "counter", "raw_counter"),
                    ("metric_ratio_histogram", "histogram", "raw_histogram"),
                    (
                        "metric_ratio_counter_and_histogram",
                        "counter_and_histogram",
                        "raw_counter_and_histogram",
                    ),
                ],
            )
        )
        self.details["metrics"] = comparison.summary()

    def agent(self) -> None:
        """Agent request overhead: the reference agent's processes, and an in-process agent loop."""
        plan = self.plan
        telemetry = micro.agent_telemetry_costs(plan.micro)
        self.figures["agent_telemetry_ratio_vs_raw_sdk"] = round(telemetry.ratio("kaos"), 4)
        self.details["agent_telemetry"] = telemetry.summary()
        simulated = agent.agent_overhead(plan.agent_pairs, plan.agent_model_latency_s)
        self.figures["agent_request_overhead_ratio_in_process"] = round(simulated["ratio"], 4)
        self.figures["agent_request_raw_sdk_ratio_in_process"] = round(simulated["raw_sdk_ratio"], 4)
        self.details["agent_in_process"] = simulated
        try:
            result = reference_agent.reference_agent_overhead(
                plan.reference_pairs, plan.agent_model_latency_s
            )
        except Exception as exc:  # the reference agent cannot run here: the in-process loop stands in
            print(f"[bench] reference agent unavailable ({type(exc).__name__}: {exc})", file=sys.stderr)
            self.details["reference_agent_error"] = f"{type(exc).__name__}: {exc}"
            self.figures["agent_request_overhead_ratio"] = round(simulated["ratio"], 4)
            return
        self.figures["agent_request_overhead_ratio"] = round(result["ratio"], 4)
        cpu = result["agent_cpu_ms_per_request"]
        self.figures["agent_cpu_ms_added_per_request"] = round(cpu["on"] - cpu["off"], 3)
        self.details["agent"] = result

    def collector(self) -> None:
        """Request latency with the collector down."""
        plan = self.plan
        result = collector.collector_down_latency(
            plan.down_blocks, plan.down_requests, plan.down_model_latency_s, plan.down_queue
        )
        self.figures["collector_down_p50_ratio"] = round(result["p50_ratio"], 4)
        self.figures["collector_down_p99_ratio"] = round(result["p99_ratio"], 4)
        self.details["collector_down"] = result

    def memory(self) -> None:
        """Memory and counted loss over many spans with the collector down."""
        result = collector.memory_with_collector_down(self.plan.memory_spans, self.plan.memory_queue)
        self.figures["collector_down_memory_bounded"] = result["bounded"]
        self.figures["collector_down_memory_mb"] = result["held_when_queue_full_mb"]
        self.figures["collector_down_loss_counted"] = result["all_loss_counted"]
        self.figures["collector_down_lost_spans_counted"] = result["lost_counted"]
        self.details["memory"] = result

    def throughput(self) -> None:
        """Spans per second to a receiver."""
        result = collector.throughput(self.plan.throughput_spans, self.plan.throughput_rounds)
        self.figures["throughput_spans_per_s"] = result["spans_per_s"]
        self.figures["throughput_ratio_to_raw_sdk"] = result["ratio_to_raw_sdk"]
        export = micro.export_costs(self.plan.micro, collector.SPAN_ATTRIBUTES)
        self.figures["export_cpu_ratio_to_raw_sdk"] = round(export.ratio("kaos"), 4)
        result["export_cpu_us_per_span"] = {
            "kaos": round(export.median_us("kaos"), 2),
            "raw_sdk": round(export.median_us("raw_sdk"), 2),
        }
        self.details["throughput"] = result

    def mem0(self) -> None:
        """Mem0 instrumented, with raw-SDK telemetry, and not at all."""
        result = mem0_bench.mem0_overhead(self.plan.mem0_pairs)
        if isinstance(result, str):
            self.figures["mem0_overhead_ratio"] = result
            self.details["mem0"] = result
            return
        self.figures["mem0_overhead_ratio"] = round(result["ratio"], 4)
        self.figures["mem0_raw_sdk_ratio"] = round(result["raw_sdk_ratio"], 4)
        self.figures["mem0_ratio_vs_raw_sdk"] = round(result["ratio_vs_raw_sdk"], 4)
        span = mem0_bench.memory_span_costs(self.plan.micro.n, self.plan.micro.reps)
        result["memory_span"] = {
            "kaos_us": round(span.median_us("kaos"), 2),
            "raw_sdk_us": round(span.median_us("raw_sdk"), 2),
            "ratio": round(span.ratio("kaos"), 4),
        }
        self.details["mem0"] = result

    def run(self) -> None:
        """Every selected section, in order."""
        for name in SECTIONS:
            self.section(name, getattr(self, name))


def _configure_logging(verbose: bool) -> None:
    """Keep library warnings (e.g. the exporter's retries with the collector down) off the output."""
    handler: logging.Handler = logging.StreamHandler() if verbose else logging.NullHandler()
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler], force=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run (about a minute)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    write = parser.add_mutually_exclusive_group()
    write.add_argument(
        "--write", dest="write", action="store_true", default=None, help="update BENCHMARKS.md"
    )
    write.add_argument("--no-write", dest="write", action="store_false", help="do not update BENCHMARKS.md")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="the markdown file to write")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections (default all: {','.join(SECTIONS)})",
    )
    parser.add_argument("--verbose", action="store_true", help="show library logging")
    args = parser.parse_args(argv)
    sections = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections: {', '.join(unknown)}")
    _configure_logging(args.verbose)
    machine = machine_facts()
    runner = Runner(QUICK if args.quick else FULL, sections)
    start = time.perf_counter()
    runner.run()
    results: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "machine": machine,
        **runner.figures,
        "targets": judge(runner.figures),
        "duration_s": round(time.perf_counter() - start, 1),
        "details": runner.details,
    }
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    else:
        print(console_summary(results))
        print(f"\n  ({results['duration_s']} s)")
    write_file = args.write if args.write is not None else not args.quick
    if write_file and set(sections) == set(SECTIONS):
        args.output.write_text(render_markdown(results, NOTES), encoding="utf-8")
        print(f"[bench] wrote {args.output}", file=sys.stderr)
    elif write_file:
        print("[bench] not writing BENCHMARKS.md: only part of the sections ran", file=sys.stderr)
    return 0
