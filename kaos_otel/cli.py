"""The ``kaos-otel`` command line: receive, traces show, catalog, dashboards and collector.

Subcommands import what they need when they run: the core install is enough for all but
``dashboards import`` (httpx).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kaos_otel._cli_support import add_version, parse_args, port_number
from kaos_otel.catalog import catalog_as_dict, metrics_markdown

__all__ = ["main"]

_MAX_CELL = 48
_CATALOG_SECTIONS = ("spans", "attributes", "metrics", "log_events")
_METRIC_COLUMNS = ("name", "instrument", "unit", "attributes", "buckets", "prometheus", "signoz")


def _error(message: str) -> int:
    print(f"kaos-otel: error: {message}", file=sys.stderr)
    return 1


def _color(choice: bool | None) -> bool:
    return choice if choice is not None else sys.stdout.isatty() and "NO_COLOR" not in os.environ


def _receive(args: argparse.Namespace) -> int:
    from kaos_otel._receive import ReceiveOptions, run_receive

    if not 0 < args.settle < float("inf"):  # NaN fails too
        return _error("--settle must be a positive number of seconds")
    options = ReceiveOptions(
        host=args.host,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        out=args.out,
        json_mode=args.json,
        settle_s=args.settle,
        color=_color(args.color),
    )
    return run_receive(options, stdin=sys.stdin)


def _traces_show(args: argparse.Namespace) -> int:
    from kaos_otel._metrics_summary import render_metrics_summary
    from kaos_otel._trace_tree import is_startup_trace, render_trace_trees
    from kaos_otel.receiver import load_otlp_json

    path: Path = args.file
    try:
        telemetry = load_otlp_json(path)
    except OSError as exc:
        return _error(f"cannot read {path}: {exc.strerror or exc}")
    except ValueError as exc:
        return _error(str(exc))
    spans = telemetry.spans
    if args.trace_id:
        wanted = args.trace_id.lower()
        spans = [s for s in spans if s.trace_id.startswith(wanted)]
        if not spans:
            return _error(f"no trace with id {args.trace_id!r} in {path}")
    elif not spans and not telemetry.metric_points:
        return _error(f"no spans or metric points in {path}")
    by_trace: dict[str, list[Any]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    startup = {trace_id for trace_id, members in by_trace.items() if is_startup_trace(members)}
    color = _color(args.color)
    show_all = bool(args.trace_id or args.all)
    shown = spans if show_all else [s for s in spans if s.trace_id not in startup]
    if args.where or args.min_duration is not None:
        candidates = {s.trace_id for s in shown}
        kept = {
            trace_id
            for trace_id in candidates
            if _matches(by_trace[trace_id], args.where)
            and _root_duration_s(by_trace[trace_id]) >= (args.min_duration or 0.0)
        }
        shown = [s for s in shown if s.trace_id in kept]
        print(f"{len(kept)} of {len(candidates)} traces match")
    sys.stdout.write(render_trace_trees(shown, color=color, waterfall=args.waterfall))
    hidden = 0 if show_all else len(startup)
    if hidden:
        print(f"\n({hidden} MCP session start-up trace{'s' if hidden > 1 else ''} hidden; --all shows them)")
    if not args.trace_id:
        sys.stdout.write("\n" + render_metrics_summary(telemetry.metric_points))
    return 0


def _condition(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--where``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key, value


def _seconds(text: str, *, zero: bool) -> float:
    """A finite number of seconds above 0 (or from 0, with ``zero``), for ``argparse``; NaN is not."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    above_the_minimum = seconds >= 0 if zero else seconds > 0  # False for NaN
    if not above_the_minimum or seconds == math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {'' if zero else 'positive '}number of seconds")
    return seconds


def _positive_seconds(text: str) -> float:
    """An ``argparse`` type: a finite number of seconds above 0."""
    return _seconds(text, zero=False)


def _seconds_from_zero(text: str) -> float:
    """An ``argparse`` type: a finite number of seconds, 0 or more."""
    return _seconds(text, zero=True)


def _matches(spans: list[Any], conditions: list[tuple[str, str]]) -> bool:
    """Whether each condition holds on some span of the trace: its attribute (else its resource's)
    is the value, or an array attribute holds it."""

    def shown(value: object) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    def holds(span: Any, key: str, wanted: str) -> bool:
        value = span.attributes[key] if key in span.attributes else span.resource.get(key)
        if value is None:
            return False
        values = value if isinstance(value, list | tuple) else (value,)
        return any(shown(item) == wanted for item in values)

    return all(any(holds(span, key, wanted) for span in spans) for key, wanted in conditions)


def _root_duration_s(spans: list[Any]) -> float:
    """How long the trace's request took: its longest root span."""
    from kaos_otel._trace_tree import is_root

    ids = {span.span_id for span in spans}
    return max((s.duration_s for s in spans if is_root(s, ids)), default=0.0)


def _export(folder: str, directory: Path, force: bool) -> int:
    """Write ``folder``'s shipped files under ``directory``; without ``force``, only if that changes
    no file already there (one edited since an earlier export, say)."""
    from kaos_otel.assets import AssetsMissingError, asset_files, asset_root

    try:
        root = asset_root() / folder
        copies = {directory / source.relative_to(root): source.read_bytes() for source in asset_files(folder)}
        changed = [t for t, content in copies.items() if t.is_file() and t.read_bytes() != content]
        if changed and not force:
            more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
            return _error(f"{changed[0]}{more} would be overwritten; nothing written (--force overwrites)")
        for target, content in copies.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    except AssetsMissingError as exc:
        return _error(str(exc))
    except OSError as exc:
        return _error(f"cannot write {exc.filename or directory}: {exc.strerror or exc}")
    for target in copies:
        print(target)
    return 0


def _dashboards_export(args: argparse.Namespace) -> int:
    return _export("dashboards", args.directory, args.force)


def _dashboards_import(args: argparse.Namespace) -> int:
    try:
        from kaos_otel import _signoz_import
    except ImportError as exc:  # httpx is not in the core install
        return _error(f"dashboards import needs httpx ({exc.name} is missing): pip install httpx")
    return _signoz_import.run(args)


def _collector_config(args: argparse.Namespace) -> int:
    from kaos_otel.assets import AssetsMissingError, collector_config

    try:
        text = collector_config(args.profile)
    except (AssetsMissingError, ValueError) as exc:
        return _error(str(exc))
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        args.output.write_text(text, encoding="utf-8")
    except OSError as exc:
        return _error(f"cannot write {args.output}: {exc.strerror or exc}")
    print(
        f"wrote {args.output} (profile {args.profile}); run it with: otelcol-contrib --config={args.output}"
    )
    return 0


def _collector_export(args: argparse.Namespace) -> int:
    return _export("collector", args.directory, args.force)


def _cell(value: Any) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, list | tuple):
        text = ", ".join(str(v) for v in value) or "-"
    else:
        text = str(value)
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


def _rows(section: Any) -> list[dict[str, Any]]:
    """Normalise a catalog section (list of dicts/strings or mapping) to a list of row dicts."""
    if isinstance(section, Mapping):
        return [
            {"name": k, **v} if isinstance(v, Mapping) else {"name": k, "value": v}
            for k, v in section.items()
        ]
    return [dict(item) if isinstance(item, Mapping) else {"name": item} for item in section]


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> list[str]:
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return [line([c.upper() for c in columns]), line(["-" * w for w in widths]), *(line(r) for r in cells)]


def _format_catalog(catalog: Mapping[str, Any]) -> str:
    lines: list[str] = []
    for key in _CATALOG_SECTIONS:
        if key not in catalog:
            continue
        rows = _rows(catalog[key])
        if key == "metrics":
            columns: list[str] = list(_METRIC_COLUMNS)
        else:
            columns = list(dict.fromkeys(c for row in rows for c in row))
        lines += [f"{key.upper().replace('_', ' ')} ({len(rows)})", *_table(rows, columns), ""]
    for key, value in catalog.items():
        if key not in _CATALOG_SECTIONS:
            lines.append(f"{key}: {json.dumps(value)}")
    return "\n".join(lines).rstrip() + "\n"


def _catalog(args: argparse.Namespace) -> int:
    if args.markdown:
        sys.stdout.write(metrics_markdown())
        return 0
    catalog = catalog_as_dict()
    sys.stdout.write(json.dumps(catalog, indent=2) + "\n" if args.json else _format_catalog(catalog))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kaos-otel", description="kaos-otel telemetry tools")
    add_version(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    receive = commands.add_parser(
        "receive",
        help="receive OTLP locally and print each trace as it completes",
        description="A local OTLP receiver: point OTEL_EXPORTER_OTLP_ENDPOINT at it and watch your "
        "traces (as trees with a waterfall) and metrics. Enter prints a metrics summary, Ctrl-C stops.",
    )
    receive.add_argument(
        "--grpc-port", type=port_number, default=4317, help="OTLP/gRPC port (default 4317; 0: any)"
    )
    receive.add_argument(
        "--http-port", type=port_number, default=4318, help="OTLP/HTTP port (default 4318; 0: any)"
    )
    receive.add_argument(
        "--host",
        default="127.0.0.1",
        help="IPv4 or IPv6 address to listen on (default 127.0.0.1; 0.0.0.0 or ::, all)",
    )
    receive.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="also append all telemetry to FILE (OTLP/JSON Lines: traces show reads it)",
    )
    receive.add_argument("--json", action="store_true", help="JSON lines on stdout instead of trees")
    receive.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds without new spans before a trace is printed (default 2)",
    )
    receive.add_argument(
        "--color",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ANSI colours (default: if a tty)",
    )
    receive.set_defaults(handler=_receive)

    traces = commands.add_parser("traces", help="inspect traces").add_subparsers(
        dest="traces_command", required=True
    )
    show = traces.add_parser("show", help="print span trees from an OTLP/JSON Lines file")
    show.add_argument(
        "file", type=Path, metavar="FILE", help="OTLP/JSON Lines file (collector file exporter)"
    )
    show.add_argument("--trace-id", help="only this trace (full id or hex prefix)")
    show.add_argument("--all", action="store_true", help="include MCP session start-up traces")
    show.add_argument("--waterfall", action="store_true", help="draw span durations as a waterfall")
    show.add_argument(
        "--where",
        type=_condition,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only traces with a span whose attribute (or resource attribute) KEY is VALUE, e.g. "
        "kaos.outcome=error, session.id=..., service.name=researcher (repeat: all must hold)",
    )
    show.add_argument(
        "--min-duration",
        type=_seconds_from_zero,
        metavar="SECONDS",
        help="only traces whose request (root span) took at least this long",
    )
    show.add_argument(
        "--color",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ANSI colours (default: if a tty)",
    )
    show.set_defaults(handler=_traces_show)

    catalog = commands.add_parser("catalog", help="print the telemetry catalog")
    output = catalog.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="machine-readable JSON")
    output.add_argument("--markdown", action="store_true", help="the metrics reference (docs/metrics.md)")
    catalog.set_defaults(handler=_catalog)
    _add_asset_commands(commands)
    return parser


def _add_asset_commands(commands: Any) -> None:
    """``dashboards export|import`` and ``collector config|export``: the assets shipped in the wheel."""
    from kaos_otel.assets import COLLECTOR_PROFILES

    dashboards = commands.add_parser("dashboards", help="the SigNoz, Grafana and Prometheus assets")
    dashboard_commands = dashboards.add_subparsers(dest="dashboards_command", required=True)
    export = dashboard_commands.add_parser(
        "export", help="write the dashboards, SigNoz alerts and Prometheus rules to DIR"
    )
    export.add_argument("directory", type=Path, metavar="DIR")
    export.add_argument("--force", action="store_true", help="overwrite files in DIR that differ")
    export.set_defaults(handler=_dashboards_export)
    signoz = dashboard_commands.add_parser(
        "import",
        help="create the dashboard and alert rules in a running SigNoz (API key: SIGNOZ_API_KEY)",
        epilog="Environment: SIGNOZ_URL, SIGNOZ_API_KEY.",
    )
    add_signoz_import_arguments(signoz)
    signoz.set_defaults(handler=_dashboards_import)

    collector = commands.add_parser("collector", help="the OpenTelemetry Collector configuration")
    collector_commands = collector.add_subparsers(dest="collector_command", required=True)
    config = collector_commands.add_parser(
        "config", help="print otelcol-config.yaml with a backend's exporters as the defaults"
    )
    config.add_argument(
        "--profile", choices=sorted(COLLECTOR_PROFILES), default="signoz", help="backend (default signoz)"
    )
    config.add_argument("--output", "-o", type=Path, metavar="FILE", help="write FILE instead of stdout")
    config.set_defaults(handler=_collector_config)
    files = collector_commands.add_parser(
        "export", help="write the collector, builder, Jaeger and Prometheus configurations to DIR"
    )
    files.add_argument("directory", type=Path, metavar="DIR")
    files.add_argument("--force", action="store_true", help="overwrite files in DIR that differ")
    files.set_defaults(handler=_collector_export)


DEFAULT_SIGNOZ_URL = "http://localhost:8080"


def add_signoz_import_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``kaos-otel dashboards import`` (defined here: they parse without httpx, which
    the command needs only to run)."""
    parser.add_argument(
        "files", nargs="*", type=Path, help="JSON files (default: the shipped dashboard and alert rules)"
    )
    parser.add_argument(
        "--signoz",
        "--url",
        dest="url",
        metavar="URL",
        default=os.environ.get("SIGNOZ_URL", DEFAULT_SIGNOZ_URL),
        help=f"SigNoz base URL (env SIGNOZ_URL, default {DEFAULT_SIGNOZ_URL})",
    )
    parser.add_argument("--api-key", default=os.environ.get("SIGNOZ_API_KEY"), help="SigNoz API key")
    parser.add_argument("--dry-run", action="store_true", help="create nothing; test rules with testRule")
    parser.add_argument("--replace", action="store_true", help="update dashboards/rules that already exist")
    parser.add_argument("--only", choices=("dashboards", "rules"), help="import only one kind")
    parser.add_argument(
        "--channel",
        action="append",
        default=[],
        metavar="NAME",
        help="notification channel for every rule (repeatable; default: none)",
    )
    parser.add_argument(
        "--rules-api", choices=("v1", "v2"), default="v1", help="rules endpoints (default v1)"
    )
    parser.add_argument(
        "--timeout", type=_positive_seconds, default=30.0, help="seconds per request (default 30)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kaos-otel`` command; returns the exit status."""
    if sys.stdout is None:  # started with its output closed (`>&-`): as if its reader had gone
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the process's stdout, open until exit)
    try:
        args = parse_args(_parser(), argv)
        result: int = args.handler(args)
        sys.stdout.flush()  # a write that fails (a full disk) fails here, not as a warning at exit
    except BrokenPipeError:  # whoever read the output went away (`| head`): stop quietly
        _discard_output()
        return 0
    except KeyboardInterrupt:  # Ctrl-C (waiting on SigNoz, reading a large file...): no traceback
        print("kaos-otel: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as shells report it
    except OSError as exc:  # the commands report their files' errors: this is writing the output
        _discard_output()
        return _error(f"cannot write the output: {exc.strerror or exc}")
    return result


def _discard_output() -> None:
    """Point stdout at the null device: what is still buffered then goes nowhere at exit, quietly."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
