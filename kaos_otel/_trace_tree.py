"""Render received spans as indented per-trace trees (used by ``kaos-otel traces show``)."""

from __future__ import annotations

import unicodedata
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

from kaos_otel import catalog

if TYPE_CHECKING:  # the receiver (gRPC server, protobuf) is not imported with kaos_otel
    from kaos_otel.receiver import ReceivedSpan

__all__ = ["format_duration", "is_startup_trace", "render_trace_trees"]

_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_CYAN = "\x1b[36m"
_GREEN = "\x1b[32m"
_RED = "\x1b[31m"
_YELLOW = "\x1b[33m"


def format_duration(seconds: float) -> str:
    """Format a duration: ``12 ms`` / ``3.4 ms`` below 0.1 s, ``0.50 s`` / ``1.23 s`` above."""
    if seconds < 0:  # a span that ends before it starts (its wall clock stepped back)
        magnitude = format_duration(-seconds)
        return magnitude if magnitude == "0.0 ms" else f"-{magnitude}"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


_BAR_WIDTH = 32
_MAX_LABEL = 88
# MCP session set-up: an agent opening its MCP sessions at start-up, before any request (mcp 2.3
# probes `server/discover` first and falls back to `initialize` on older servers).
_STARTUP_MCP_METHODS = frozenset(
    {"server/discover", "initialize", "notifications/initialized", "tools/list", "ping"}
)


def is_root(span: ReceivedSpan, ids: set[str]) -> bool:
    """Whether ``span`` is a root of the trace whose span ids are ``ids``: no parent, a parent
    that was not received, or itself as its parent."""
    parent = span.parent_span_id
    return parent is None or parent not in ids or parent == span.span_id


def is_startup_trace(spans: Sequence[ReceivedSpan]) -> bool:
    """Whether a trace is MCP session start-up that went well (every root span is
    ``server/discover``, ``initialize``..., and no span failed): the views leave those out."""
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if is_root(s, ids)]
    return (
        bool(roots)
        and all(_is_startup_method(s.attributes.get(catalog.MCP_METHOD_NAME)) for s in roots)
        and not any(s.status_code == "ERROR" for s in spans)
    )


def _is_startup_method(method: object) -> bool:
    """Whether an ``mcp.method.name`` value names session start-up (a key-value list or array,
    which OTLP allows, names nothing and cannot be looked up in a set)."""
    return isinstance(method, str) and method in _STARTUP_MCP_METHODS


_CONTROL_CHARACTERS = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))},
    # bidirectional controls: U+202E would draw the rest of the line right to left, hiding what follows
    **{
        code: f"\\u{code:04x}"
        for code in (0x61C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
    },
}


def printable(text: str) -> str:
    """``text`` with control characters (terminal escapes, line breaks) written as ``\\xNN``, and
    bidirectional ones (which reorder what a terminal shows) as ``\\uNNNN``."""
    return text.translate(_CONTROL_CHARACTERS)


def _width(text: str) -> int:
    """Terminal columns ``text`` takes: wide (CJK, emoji) characters two, combining marks and
    zero-width ones none."""
    return sum(
        0
        if unicodedata.category(c) in ("Mn", "Me", "Cf")
        else 2
        if unicodedata.east_asian_width(c) in ("W", "F")
        else 1
        for c in text
    )


def _start_order(span: ReceivedSpan) -> tuple[int, str]:
    """Sort key drawing spans by start time (span id breaks ties, so the order is stable)."""
    return span.start_time_unix_nano, span.span_id


def _break_cycles(
    spans: Sequence[ReceivedSpan], roots: list[ReceivedSpan], children: dict[str, list[ReceivedSpan]]
) -> set[str]:
    """Make spans whose parents form a cycle reachable; returns the ids of the spans made roots.

    Parent links from a span no root reaches lead into a cycle: from the earliest such span, the
    first span they meet twice is on it, and becomes a root (its descendants, the rest of the cycle
    included, then hang under it).
    """
    by_id = {span.span_id: span for span in spans}
    reached: set[str] = set()
    broken: set[str] = set()
    pending = list(roots)
    for candidate in sorted(spans, key=_start_order):
        while pending:
            span = pending.pop()
            if span.span_id not in reached:
                reached.add(span.span_id)
                pending.extend(children.get(span.span_id, []))
        if candidate.span_id in reached:
            continue
        walked: set[str] = set()
        member = candidate
        while member.span_id not in walked:
            walked.add(member.span_id)
            member = by_id[str(member.parent_span_id)]
        children[str(member.parent_span_id)].remove(member)
        roots.append(member)
        broken.add(member.span_id)
        pending.append(member)
    return broken


_LATE_NS = 10_000_000
"""How much later than its parent a span may end before it is marked (clocks of different hosts
differ by a few milliseconds)."""


def _unusual_outcome(span: ReceivedSpan) -> str | None:
    """How the operation ended when its status does not say it (``canceled``, ``degraded``,
    ``max_steps``), with its ``error.type``: a span's status is only OK, ERROR or UNSET."""
    outcome = span.attributes.get(catalog.KAOS_OUTCOME)
    if not isinstance(outcome, str) or outcome in ("success", "error"):
        return None
    error_type = span.attributes.get(catalog.ERROR_TYPE)
    return printable(f"{outcome} ({error_type})" if error_type and error_type != outcome else outcome)


def _bar(start: int, end: int, trace_start: int, trace_end: int) -> str:
    """A ``|··███···|`` bar placing [start, end] within the trace's time span."""
    total = max(trace_end - trace_start, 1)
    first = min(_BAR_WIDTH - 1, (start - trace_start) * _BAR_WIDTH // total)
    last = max(first + 1, min(_BAR_WIDTH, -(-(end - trace_start) * _BAR_WIDTH // total)))
    return "|" + "·" * first + "█" * (last - first) + "·" * (_BAR_WIDTH - last) + "|"


_Entry: TypeAlias = "tuple[ReceivedSpan, str, bool, ReceivedSpan | None, int]"
"""A span waiting to be drawn: the span, the prefix of its line, whether it is the last of its
siblings, its parent (``None`` for a root) and its depth (0 for a root)."""

_MAX_INDENT = 48
"""Levels indented at most: deeper spans keep that indentation and say their depth, so a trace
thousands of spans deep draws in lines of bounded length (not in memory growing as its square)."""


def _siblings(
    spans: list[ReceivedSpan], prefix: str, parent: ReceivedSpan | None, depth: int
) -> list[_Entry]:
    """Stack entries drawing ``spans`` in start order (the first is popped first)."""
    ordered = sorted(spans, key=_start_order, reverse=True)
    return [(span, prefix, index == 0, parent, depth) for index, span in enumerate(ordered)]


class _Renderer:
    def __init__(self, color: bool, waterfall: bool) -> None:
        self._color = color
        self._waterfall = waterfall
        self.lines: list[str] = []
        # (visible length, text, span it draws or None) of the trace being rendered
        self._rows: list[tuple[int, str, ReceivedSpan | None]] = []

    def _paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self._color else text

    def trace(self, trace_id: str, spans: list[ReceivedSpan], label: str = "") -> None:
        ids = {s.span_id for s in spans}
        children: dict[str, list[ReceivedSpan]] = defaultdict(list)
        roots: list[ReceivedSpan] = []
        for span in spans:
            if is_root(span, ids):
                roots.append(span)
            else:
                children[span.parent_span_id or ""].append(span)
        cycle_roots = _break_cycles(spans, roots, children)
        start = min(s.start_time_unix_nano for s in spans)
        end = max(s.end_time_unix_nano for s in spans)
        count = f"{len(spans)} span" + ("" if len(spans) == 1 else "s")
        root = min(roots, key=lambda s: s.start_time_unix_nano)
        if len(roots) == 1 and end - root.end_time_unix_nano > _LATE_NS:  # work went on after the request
            count += f"; its root {format_duration(root.duration_s)}"
        header = f"trace {trace_id} ({format_duration((end - start) / 1e9)}, {count}){label}"
        self.lines.append(self._paint(header, _BOLD))
        self._rows = []
        self._tree(roots, children, ids, cycle_roots)
        column = min(_MAX_LABEL, max((row[0] for row in self._rows if row[2]), default=0)) + 2
        for length, text, drawn in self._rows:
            if self._waterfall and drawn is not None:
                bar = _bar(drawn.start_time_unix_nano, drawn.end_time_unix_nano, start, end)
                colour = _RED if drawn.status_code == "ERROR" else _CYAN
                text += " " * max(1, column - length) + self._paint(bar, colour)
            self.lines.append(text)

    def _add(self, plain: str, text: str, span: ReceivedSpan | None) -> None:
        self._rows.append((_width(plain), text, span))

    def _tree(
        self,
        roots: list[ReceivedSpan],
        children: dict[str, list[ReceivedSpan]],
        ids: set[str],
        cycle_roots: set[str],
    ) -> None:
        """Draw the spans depth first, siblings by start time. An explicit stack rather than
        recursion: a trace may be thousands of spans deep."""
        stack = _siblings(roots, "", None, 0)
        while stack:
            span, prefix, last, parent, depth = stack.pop()
            marks = [f"(depth {depth})"] if depth > _MAX_INDENT else []
            if parent is None and span.parent_span_id is not None and span.parent_span_id not in ids:
                marks.append("(parent missing)")
            if span.span_id in cycle_roots:
                marks.append("(parent cycle)")
            if parent is not None and span.end_time_unix_nano - parent.end_time_unix_nano > _LATE_NS:
                marks.append("(ended after its parent)")
            self._span(span, prefix + ("└─ " if last else "├─ "), marks)
            inner = prefix + ("   " if last else "│  ")
            self._errors(span, inner)
            below = prefix if depth >= _MAX_INDENT else inner
            stack.extend(_siblings(children.get(span.span_id, []), below, span, depth + 1))

    def _span(self, span: ReceivedSpan, lead: str, marks: list[str]) -> None:
        tier = span.attributes.get(catalog.KAOS_MEMORY_TIER)
        plain = [
            printable(span.service_name or "?"),
            printable(f"{span.name} ({tier})" if tier else span.name),
            format_duration(span.duration_s),
            span.status_code,
        ]
        painted = list(plain)
        painted[0] = self._paint(plain[0], _CYAN)
        if span.status_code == "ERROR":
            painted[3] = self._paint(span.status_code, _RED + _BOLD)
        elif span.status_code == "OK":
            painted[3] = self._paint(span.status_code, _GREEN)
        outcome = _unusual_outcome(span)
        if outcome is not None:
            plain.append(outcome)
            painted.append(self._paint(outcome, _YELLOW))
        plain.extend(marks)
        painted.extend(self._paint(mark, _YELLOW) for mark in marks)
        self._add(lead + "  ".join(plain), lead + "  ".join(painted), span)

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
        for message in map(printable, messages):
            text = indent + "  " + f"! {message}"
            self._add(text, indent + "  " + self._paint(f"! {message}", _RED), None)


def render_trace_trees(
    spans: Sequence[ReceivedSpan], *, color: bool = False, waterfall: bool = False, label: str = ""
) -> str:
    """Render spans as one tree per trace (traces and siblings ordered by start time).

    Each line shows service, span name, duration and status, and an outcome the status cannot
    show (``canceled``, ``degraded``...); error spans are followed by their
    ``exception.type: exception.message``. Spans whose parent was not received are shown as roots
    marked ``(parent missing)``, and a span whose parents lead back to it as a root marked
    ``(parent cycle)``; spans that went on after their parent ended (work a request left
    behind) are marked ``(ended after its parent)``, and the header then gives the root's own
    duration next to the trace's. Duplicate spans (same trace and span id) are shown once.
    ``waterfall`` draws each span's time within its trace as a bar; ``label`` follows each header.
    """
    by_trace: dict[str, dict[str, ReceivedSpan]] = defaultdict(dict)
    for span in spans:
        by_trace[span.trace_id].setdefault(span.span_id, span)
    traces = sorted(by_trace.items(), key=lambda item: min(s.start_time_unix_nano for s in item[1].values()))
    renderer = _Renderer(color, waterfall)
    for index, (trace_id, members) in enumerate(traces):
        if index:
            renderer.lines.append("")
        renderer.trace(trace_id, list(members.values()), label)
    return "\n".join(renderer.lines) + ("\n" if renderer.lines else "")
