"""``kaos-otel receive``: a local OTLP receiver printing each trace as it completes.

Nothing beyond the core install is needed: the receiver is :class:`kaos_otel.receiver.OtlpReceiver`.
A trace is complete when its root span has arrived and no span of it arrived for ``settle``
seconds (or, for a trace whose root is elsewhere, for four times that); spans that arrive later
are printed as a continuation of the trace.
"""

from __future__ import annotations

import errno
import json
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from kaos_otel._metrics_summary import LatestPoints, metrics_summary, render_metrics_summary
from kaos_otel._trace_tree import format_duration, is_startup_trace, printable, render_trace_trees
from kaos_otel.receiver import OtlpReceiver, ReceivedSpan, ReceivedTelemetry

__all__ = ["CompletedTrace", "TraceAssembler", "run_receive"]

_POLL_S = 0.1
_MAX_PRINTED = 100_000
"""Ids of printed traces remembered to label spans arriving later: the latest, so a receiver
running for days does not grow with every trace it printed."""


@dataclass(frozen=True)
class CompletedTrace:
    """A trace ready to print; ``late`` when part of it was printed before."""

    trace_id: str
    spans: tuple[ReceivedSpan, ...]
    late: bool


@dataclass
class _Pending:
    spans: dict[str, ReceivedSpan] = field(default_factory=dict)
    last_arrival: float = 0.0


class TraceAssembler:
    """Groups spans by trace and says which traces are complete (by quiet time after the root)."""

    def __init__(self, settle_s: float) -> None:
        self._settle_s = settle_s
        self._pending: dict[str, _Pending] = {}
        self._printed: dict[str, None] = {}  # insertion-ordered: the oldest is forgotten first
        self._lock = threading.Lock()

    def add(self, spans: list[ReceivedSpan], now: float) -> None:
        """Take spans that just arrived."""
        with self._lock:
            for span in spans:
                pending = self._pending.setdefault(span.trace_id, _Pending())
                pending.spans.setdefault(span.span_id, span)
                pending.last_arrival = now

    def complete(self, now: float) -> list[CompletedTrace]:
        """Remove and return the traces that are complete at ``now``."""
        with self._lock:
            done = [
                trace_id
                for trace_id, pending in self._pending.items()
                if now - pending.last_arrival >= self._settle_s * (1 if _has_root(pending) else 4)
            ]
            return [self._pop(trace_id) for trace_id in done]

    def drain(self) -> list[CompletedTrace]:
        """Remove and return every pending trace (at exit)."""
        with self._lock:
            return [self._pop(trace_id) for trace_id in list(self._pending)]

    def _pop(self, trace_id: str) -> CompletedTrace:
        pending = self._pending.pop(trace_id)
        late = trace_id in self._printed
        self._printed.pop(trace_id, None)
        self._printed[trace_id] = None
        if len(self._printed) > _MAX_PRINTED:
            del self._printed[next(iter(self._printed))]
        spans = sorted(pending.spans.values(), key=lambda s: s.start_time_unix_nano)
        return CompletedTrace(trace_id, tuple(spans), late)


def _has_root(pending: _Pending) -> bool:
    """Whether the span with no parent at all has arrived. Not :func:`is_root`: a span whose parent
    was not received yet may be waiting for it (children end, and are exported, first)."""
    return any(span.parent_span_id is None for span in pending.spans.values())


def _span_dict(span: ReceivedSpan) -> dict[str, Any]:
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "name": span.name,
        "kind": span.kind,
        "service": span.service_name,
        "start_time_unix_nano": span.start_time_unix_nano,
        "end_time_unix_nano": span.end_time_unix_nano,
        "duration_s": span.duration_s,
        "status": span.status_code,
        "status_message": span.status_message,
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in span.attributes.items()},
    }


def _json_safe(value: Any) -> Any:
    """``value`` with NaN and the infinities as the strings OTLP/JSON uses, so every line is JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


class _Printer:
    """Writes completed traces and summaries, as text or as JSON lines, one at a time."""

    def __init__(self, out: TextIO, json_mode: bool, color: bool) -> None:
        self._out = out
        self._json = json_mode
        self._color = color
        self._lock = threading.Lock()

    def event(self, payload: dict[str, Any], text: str) -> None:
        with self._lock:
            self._out.write(json.dumps(_json_safe(payload), default=str) + "\n" if self._json else text)
            self._out.flush()

    def trace(self, trace: CompletedTrace) -> None:
        """Print ``trace``; one that cannot be drawn is reported on stderr and skipped, so the
        receiver goes on with the others."""
        try:
            payload, text = self._trace_event(trace)
        except Exception as exc:
            message = printable(f"{type(exc).__name__}: {exc}")
            print(
                f"kaos-otel receive: error: cannot print trace {printable(trace.trace_id)}: {message}",
                file=sys.stderr,
                flush=True,
            )
            return
        self.event(payload, text)

    def _trace_event(self, trace: CompletedTrace) -> tuple[dict[str, Any], str]:
        """The JSON payload and the text (a tree, only drawn when it is shown) of ``trace``."""
        startup = is_startup_trace(trace.spans)
        payload = {
            "event": "trace",
            "trace_id": trace.trace_id,
            "late": trace.late,
            "startup": startup,
            "spans": [_span_dict(s) for s in trace.spans],
        }
        if self._json:
            return payload, ""
        label = " late spans" if trace.late else ""
        label += " [MCP session start-up]" if startup else ""
        return payload, render_trace_trees(trace.spans, color=self._color, waterfall=True, label=label) + "\n"


@dataclass
class ReceiveOptions:
    """What ``kaos-otel receive`` was asked for."""

    host: str = "127.0.0.1"
    grpc_port: int = 4317
    http_port: int = 4318
    out: Path | None = None
    json_mode: bool = False
    settle_s: float = 2.0
    color: bool = False


def run_receive(options: ReceiveOptions, stdin: TextIO | None = None) -> int:
    """Receive until SIGINT/SIGTERM; print traces as they complete; returns the exit status.

    Enter on ``stdin`` (or SIGUSR1) prints the metrics summary so far; it is printed at exit too.
    """
    assembler = TraceAssembler(options.settle_s)
    counts = {"spans": 0, "points": 0, "logs": 0}
    points = LatestPoints()  # a summary reads only these: all points would grow without end
    points_lock = threading.Lock()

    def on_receive(received: ReceivedTelemetry) -> None:
        assembler.add(received.spans, time.monotonic())
        with points_lock:
            points.add(received.metric_points)
            counts["spans"] += len(received.spans)
            counts["points"] += len(received.metric_points)
            counts["logs"] += len(received.logs)

    if options.out is not None:
        try:
            options.out.parent.mkdir(parents=True, exist_ok=True)
            options.out.open("a", encoding="utf-8").close()  # a directory or read-only file fails here
        except OSError as exc:
            print(
                f"kaos-otel receive: error: cannot write {options.out}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 1
    receiver = OtlpReceiver(
        options.out,
        grpc_port=options.grpc_port,
        http_port=options.http_port,
        host=options.host,
        on_receive=on_receive,
        keep=False,  # on_receive takes all of it: kept, it would grow for as long as the receiver runs
    )
    try:
        receiver.start()
    except OSError as exc:
        # gRPC reports no errno: its port is bound after HTTP's on the same host, so taken too
        cause = exc.__cause__
        port_taken = not isinstance(cause, OSError) or cause.errno == errno.EADDRINUSE
        hint = " (another receiver or collector? --grpc-port 0 --http-port 0 picks free ports)"
        print(f"kaos-otel receive: error: {exc}{hint if port_taken else ''}", file=sys.stderr)
        return 1
    printer = _Printer(sys.stdout, options.json_mode, options.color)
    stop = threading.Event()
    summary_wanted = threading.Event()
    # handlers first: a script may send SIGINT as soon as it reads the announcement
    restore = _install_signals(stop, summary_wanted)

    def summary() -> None:
        with points_lock:
            snapshot = points.points()
        printer.event(
            {"event": "metrics", "series": [t.as_dict() for t in metrics_summary(snapshot)]},
            "\n" + render_metrics_summary(snapshot) + "\n",
        )

    try:
        _announce(printer, receiver, options)
        if stdin is not None:
            threading.Thread(target=_watch_enter, args=(stdin, summary_wanted), daemon=True).start()
        while not stop.wait(_POLL_S):
            for trace in assembler.complete(time.monotonic()):
                printer.trace(trace)
            if summary_wanted.is_set():
                summary_wanted.clear()
                summary()
    finally:
        receiver.stop()
        restore()
    for trace in assembler.drain():
        printer.trace(trace)
    summary()
    totals = f"{counts['spans']} spans, {counts['points']} metric points, {counts['logs']} log records"
    stopped: dict[str, Any] = {"event": "stopped", **counts}
    failed = receiver.json_write_error
    if options.out and failed is not None:
        error = str(failed.strerror or failed)
        stopped |= {"out": str(options.out), "out_error": error}
        where = f"; writing {options.out} failed ({error}): the file is incomplete"
    elif options.out:
        stopped["out"] = str(options.out)
        where = f"; written to {options.out} (kaos-otel traces show {options.out})"
    else:
        where = ""
    printer.event(stopped, f"Received {totals}{where}\n")
    return 1 if failed is not None else 0  # the file asked for is incomplete


def _announce(printer: _Printer, receiver: OtlpReceiver, options: ReceiveOptions) -> None:
    grpc_endpoint, http_endpoint = receiver.grpc_endpoint, receiver.http_endpoint
    text = (
        f"kaos-otel receive: listening for OTLP\n"
        f"  gRPC  {grpc_endpoint}\n"
        f"  HTTP  {http_endpoint}\n"
        f"Point your agent at it (kaos-otel sends OTLP/gRPC unless OTEL_EXPORTER_OTLP_PROTOCOL says so):\n"
        f"  export OTEL_EXPORTER_OTLP_ENDPOINT={grpc_endpoint}\n"
        f"Each trace is printed when it completes ({format_duration(options.settle_s)} after its root span); "
        f"Enter prints a metrics summary, Ctrl-C stops.\n\n"
    )
    printer.event(
        {"event": "listening", "grpc_endpoint": grpc_endpoint, "http_endpoint": http_endpoint}, text
    )


def _install_signals(stop: threading.Event, summary_wanted: threading.Event) -> Callable[[], None]:
    def on_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    def on_summary(signum: int, frame: FrameType | None) -> None:
        summary_wanted.set()

    handlers: dict[int, Callable[[int, FrameType | None], None]] = {
        signal.SIGINT: on_stop,
        signal.SIGTERM: on_stop,
    }
    if hasattr(signal, "SIGUSR1"):
        handlers[signal.SIGUSR1] = on_summary
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def _watch_enter(stdin: TextIO, summary_wanted: threading.Event) -> None:
    """Set ``summary_wanted`` for each line of ``stdin``. A terminal is read only while that cannot
    stop the process: reading its terminal from the background (``kaos-otel receive &``) would get
    the whole receiver stopped by the kernel (SIGTTIN), with exporters waiting on it."""
    try:
        terminal = stdin.isatty() and hasattr(os, "tcgetpgrp")  # Windows has no job control
        while True:
            if terminal and not _terminal_line_ready(stdin.fileno()):
                continue
            if not stdin.readline():
                return  # end of input
            summary_wanted.set()
    except (OSError, ValueError):  # stdin closed or not readable: no summaries on demand
        return


def _terminal_line_ready(fd: int) -> bool:
    """Wait up to ``_POLL_S`` for input on terminal ``fd``; whether it is there and may be read."""
    if not _may_read_terminal(fd):
        time.sleep(_POLL_S)
        return False
    return bool(select.select([fd], [], [], _POLL_S)[0]) and _may_read_terminal(fd)


def _may_read_terminal(fd: int) -> bool:
    """Whether reading terminal ``fd`` cannot stop the process: it is not the process's controlling
    terminal, or the process is in its foreground process group."""
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:  # not this process's controlling terminal: no job control applies
        return True
