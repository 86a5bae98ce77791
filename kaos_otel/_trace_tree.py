"""Render received spans as indented per-trace trees (used by ``kaos-otel traces show``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from kaos_otel import catalog
from kaos_otel.receiver import ReceivedSpan

__all__ = ["format_duration", "render_trace_trees"]

_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_CYAN = "\x1b[36m"
_GREEN = "\x1b[32m"
_RED = "\x1b[31m"
_YELLOW = "\x1b[33m"


def format_duration(seconds: float) -> str:
    """Format a duration: ``12 ms`` / ``3.4 ms`` below 0.1 s, ``0.50 s`` / ``1.23 s`` above."""
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


class _Renderer:
    def __init__(self, color: bool) -> None:
        self._color = color
        self.lines: list[str] = []

    def _paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self._color else text

    def trace(self, trace_id: str, spans: list[ReceivedSpan]) -> None:
        ids = {s.span_id for s in spans}
        children: dict[str, list[ReceivedSpan]] = defaultdict(list)
        roots: list[ReceivedSpan] = []
        for span in spans:
            parent = span.parent_span_id
            if parent is None or parent not in ids or parent == span.span_id:
                roots.append(span)
            else:
                children[parent].append(span)
        start = min(s.start_time_unix_nano for s in spans)
        end = max(s.end_time_unix_nano for s in spans)
        count = f"{len(spans)} span" + ("" if len(spans) == 1 else "s")
        header = f"trace {trace_id} ({format_duration((end - start) / 1e9)}, {count})"
        self.lines.append(self._paint(header, _BOLD))
        self._level(roots, children, "")

    def _level(self, spans: list[ReceivedSpan], children: dict[str, list[ReceivedSpan]], prefix: str) -> None:
        ordered = sorted(spans, key=lambda s: (s.start_time_unix_nano, s.span_id))
        for i, span in enumerate(ordered):
            last = i == len(ordered) - 1
            orphan = not prefix and span.parent_span_id is not None
            self._span(span, prefix + ("└─ " if last else "├─ "), orphan)
            inner = prefix + ("   " if last else "│  ")
            self._errors(span, inner)
            self._level(children.get(span.span_id, []), children, inner)

    def _span(self, span: ReceivedSpan, lead: str, orphan: bool) -> None:
        status = span.status_code
        if status == "ERROR":
            status = self._paint(status, _RED + _BOLD)
        elif status == "OK":
            status = self._paint(status, _GREEN)
        tier = span.attributes.get(catalog.KAOS_MEMORY_TIER)
        parts = [
            self._paint(span.service_name or "?", _CYAN),
            f"{span.name} ({tier})" if tier else span.name,
            format_duration(span.duration_s),
            status,
        ]
        if orphan:
            parts.append(self._paint("(parent missing)", _YELLOW))
        self.lines.append(lead + "  ".join(parts))

    def _errors(self, span: ReceivedSpan, indent: str) -> None:
        if span.status_code != "ERROR":
            return
        messages = [
            ": ".join(
                str(part)
                for part in (
                    e.attributes.get("exception.type", "exception"),
                    e.attributes.get("exception.message"),
                )
                if part
            )
            for e in span.events
            if e.name == "exception"
        ]
        if not messages and span.status_message:
            messages = [span.status_message]
        for message in messages:
            self.lines.append(indent + "  " + self._paint(f"! {message}", _RED))


def render_trace_trees(spans: Sequence[ReceivedSpan], *, color: bool = False) -> str:
    """Render spans as one tree per trace (traces and siblings ordered by start time).

    Each line shows service, span name, duration and status; error spans are followed by their
    ``exception.type: exception.message``. Spans whose parent was not received are shown as roots
    marked ``(parent missing)``. Duplicate spans (same trace and span id) are shown once.
    """
    by_trace: dict[str, dict[str, ReceivedSpan]] = defaultdict(dict)
    for span in spans:
        by_trace[span.trace_id].setdefault(span.span_id, span)
    traces = sorted(by_trace.items(), key=lambda item: min(s.start_time_unix_nano for s in item[1].values()))
    renderer = _Renderer(color)
    for index, (trace_id, members) in enumerate(traces):
        if index:
            renderer.lines.append("")
        renderer.trace(trace_id, list(members.values()))
    return "\n".join(renderer.lines) + ("\n" if renderer.lines else "")
