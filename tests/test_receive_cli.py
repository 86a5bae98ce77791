"""``kaos-otel receive`` as a user runs it: a real process, a real agent exporting to it over OTLP."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pty
import queue
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from kaos_otel import KaosOtelManager, catalog
from kaos_otel import _receive as receive_module
from kaos_otel._metrics_summary import LatestPoints, metrics_summary, render_metrics_summary
from kaos_otel._receive import CompletedTrace, TraceAssembler, _Printer
from kaos_otel._trace_tree import format_duration, is_startup_trace, render_trace_trees
from kaos_otel.cli import main as kaos_otel_main
from kaos_otel.receiver import ReceivedMetricPoint, ReceivedSpan

pytestmark = pytest.mark.timeout(60)

RECEIVE = [sys.executable, "-m", "kaos_otel", "receive", "--grpc-port", "0", "--http-port", "0"]


def _span(trace: str, span: str, parent: str | None, start: int = 0, end: int = 10) -> ReceivedSpan:
    return ReceivedSpan(
        trace, span, parent, f"op-{span}", "INTERNAL", {}, {"service.name": "svc"}, "t", "UNSET", "",
        (), (), start, end,
    )  # fmt: skip


@pytest.mark.fast
def test_a_trace_is_complete_when_its_root_has_settled() -> None:
    assembler = TraceAssembler(settle_s=1.0)
    assembler.add([_span("t1", "b", "a")], now=0.0)
    assert assembler.complete(now=1.5) == []  # no root yet: waits four times longer
    assembler.add([_span("t1", "a", None)], now=2.0)
    assert assembler.complete(now=2.9) == []
    (done,) = assembler.complete(now=3.0)
    assert (done.trace_id, {s.span_id for s in done.spans}, done.late) == ("t1", {"a", "b"}, False)
    assembler.add([_span("t1", "c", "a")], now=4.0)  # a straggler from a slower process
    (late,) = assembler.drain()
    assert (late.late, [s.span_id for s in late.spans]) == (True, ["c"])


@pytest.mark.fast
def test_a_trace_whose_root_is_elsewhere_is_printed_after_the_longer_wait() -> None:
    assembler = TraceAssembler(settle_s=1.0)
    assembler.add([_span("t2", "b", "remote-parent")], now=0.0)
    assert assembler.complete(now=3.9) == []
    assert [t.trace_id for t in assembler.complete(now=4.0)] == ["t2"]


def _point(value: int, start: int, time: int) -> ReceivedMetricPoint:
    return ReceivedMetricPoint(
        "kaos.requests", "", "{request}", "sum", True, {"kaos.outcome": "success"},
        {"service.name": "svc"}, "s", time, start, value=value,
    )  # fmt: skip


@pytest.mark.fast
def test_metric_totals_add_counting_periods_and_keep_the_latest_cumulative_value() -> None:
    # cumulative 1 then 3 in one process; a restarted process (new start time) counted 2
    points = [_point(1, start=100, time=110), _point(3, start=100, time=120), _point(2, start=200, time=210)]
    (total,) = metrics_summary(points)
    assert (total.name, total.value, dict(total.attributes)) == (
        "kaos.requests",
        5,
        {"kaos.outcome": "success"},
    )


@pytest.mark.fast
def test_receive_keeps_one_point_per_cumulative_series_and_counting_period() -> None:
    """A receiver left running keeps what its summary reads, not every point it was sent."""
    latest = LatestPoints()
    for sent in range(1, 1001):  # a process exporting its running total 1,000 times
        latest.add([_point(sent, start=100, time=100 + sent)])
    latest.add([_point(2, start=200, time=210)])  # a restarted process: a period of its own
    assert len(latest.points()) == 2
    (total,) = metrics_summary(latest.points())
    assert total.value == 1002


class _Lines:
    """Lines of a process's stdout, read on a thread, waited for with a timeout."""

    def __init__(self, stream: IO[str]) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)

    def next_json(self, event: str, timeout: float = 20.0) -> dict[str, Any]:
        """The next JSON line whose ``event`` is ``event``."""
        while True:
            line = self._queue.get(timeout=timeout)
            self.seen.append(line)
            payload: dict[str, Any] = json.loads(line)
            if payload["event"] == event:
                return payload

    def until(self, text: str, timeout: float = 20.0) -> str:
        """Lines up to and including the first that contains ``text``, joined."""
        start = len(self.seen)
        while True:
            line = self._queue.get(timeout=timeout)
            self.seen.append(line)
            if text in line:
                return "".join(self.seen[start:])


@pytest.fixture
def receive(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], _Lines, Path]]:
    out = tmp_path / "telemetry.jsonl"
    process = subprocess.Popen(
        [*RECEIVE, "--json", "--settle", "0.3", "--out", str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        yield process, _Lines(process.stdout), out
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def _run_agent(endpoint: str, protocol: str) -> str:
    """One agent run exported to ``endpoint``; returns its trace id."""
    otel = KaosOtelManager("my-agent", endpoint=endpoint, protocol=protocol, global_providers=False)
    with otel.invoke_agent("my-agent", max_steps=3) as run, otel.agent_step(run):
        with otel.model_call("my-agent", "gpt-4o", provider="openai") as call:
            call.record_usage(input_tokens=12, output_tokens=3)
        with otel.tool_call("my-agent", "search"):
            pass
        trace_id = format(run.span.get_span_context().trace_id, "032x")
    otel.shutdown(timeout=10)
    return trace_id


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_receive_prints_each_trace_summarises_metrics_and_writes_a_file_traces_show_reads(
    receive: tuple[subprocess.Popen[str], _Lines, Path], protocol: str, capsys: pytest.CaptureFixture[str]
) -> None:
    process, lines, out = receive
    listening = lines.next_json("listening")
    endpoint = listening["grpc_endpoint" if protocol == "grpc" else "http_endpoint"]
    assert endpoint.startswith("http://127.0.0.1:")
    trace_id = _run_agent(endpoint, protocol)

    trace = lines.next_json("trace")
    assert trace["trace_id"] == trace_id
    assert {s["name"] for s in trace["spans"]} == {
        "invoke_agent my-agent", "agent_step", "chat gpt-4o", "execute_tool search",
    }  # fmt: skip
    assert process.stdin is not None
    process.stdin.write("\n")  # Enter: metrics so far
    process.stdin.flush()
    series = lines.next_json("metrics")["series"]
    assert [s["value"] for s in series if s["name"] == "kaos.requests"] == [1]
    tokens = {
        s["attributes"]["gen_ai.token.type"]: s for s in series if s["name"] == "gen_ai.client.token.usage"
    }
    assert (tokens["input"]["sum"], tokens["output"]["sum"]) == (12, 3)

    process.send_signal(signal.SIGINT)
    assert lines.next_json("metrics")["series"]
    stopped = lines.next_json("stopped")
    assert (stopped["spans"], stopped["out"], "out_error" in stopped) == (4, str(out), False)
    assert process.wait(timeout=10) == 0

    assert kaos_otel_main(["traces", "show", str(out), "--no-color"]) == 0
    shown = capsys.readouterr().out
    assert f"trace {trace_id}" in shown
    assert "my-agent  execute_tool search" in shown
    assert "kaos.requests (counter, {request})" in shown


@contextlib.contextmanager
def _receive_process(*arguments: str) -> Iterator[tuple[subprocess.Popen[str], _Lines, str]]:
    """``kaos-otel receive`` with ``arguments`` (no stdin), its stdout's lines once it listens, and
    its OTLP endpoint; killed if it still runs at the end."""
    process = subprocess.Popen(
        [*RECEIVE, *arguments], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    lines = _Lines(process.stdout)
    try:
        if "--json" in arguments:
            endpoint = lines.next_json("listening")["grpc_endpoint"]
        else:
            endpoint = lines.until("export OTEL_EXPORTER_OTLP_ENDPOINT=").rsplit("=", 1)[1].strip()
        yield process, lines, endpoint
    finally:
        if process.poll() is None:
            process.kill()


def test_receive_draws_a_waterfall_and_stops_on_sigterm() -> None:
    with _receive_process("--settle", "0.3", "--no-color") as (process, lines, endpoint):
        trace_id = _run_agent(endpoint, "grpc")
        tree = lines.until("execute_tool search")
        assert f"trace {trace_id} (" in tree
        assert "└─ my-agent  invoke_agent my-agent" in tree
        assert "|" in tree.splitlines()[-1] and "█" in tree.splitlines()[-1]
        process.send_signal(signal.SIGTERM)
        assert "kaos.requests" in lines.until("Received 4 spans")
        assert process.wait(timeout=10) == 0


@pytest.mark.parametrize("json_lines", [False, True])
def test_receive_says_when_writing_its_out_file_failed(json_lines: bool) -> None:
    """A file whose writes fail (``/dev/full``, as a full disk) does not stop the receiver; its last
    line (or the ``stopped`` event's ``out_error``) says the file is incomplete, and it exits 1."""
    mode = ["--json"] if json_lines else ["--no-color"]
    with _receive_process("--settle", "0.3", *mode, "--out", "/dev/full") as (process, lines, endpoint):
        _run_agent(endpoint, "grpc")
        if json_lines:
            assert lines.next_json("trace")["spans"]  # received all the same
        else:
            lines.until("execute_tool search")  # received and drawn all the same
        process.send_signal(signal.SIGTERM)
        if json_lines:
            stopped = lines.next_json("stopped")
            assert (stopped["out"], stopped["out_error"]) == ("/dev/full", "No space left on device")
        else:
            last = lines.until("Received 4 spans")
            assert "writing /dev/full failed (No space left on device): the file is incomplete" in last
            assert "written to" not in last
        assert process.wait(timeout=10) == 1  # the file asked for is incomplete


def test_receive_names_the_port_it_cannot_bind() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "kaos_otel", "receive", "--http-port", str(port), "--grpc-port", "0"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    assert done.returncode == 1
    assert f"OTLP/HTTP on 127.0.0.1:{port}" in done.stderr
    assert "--http-port 0" in done.stderr


def test_receive_listens_on_an_ipv6_address_and_names_a_host_it_cannot_use() -> None:
    with _receive_process("--host", "::1", "--json") as (_, lines, endpoint):
        assert endpoint.startswith("http://[::1]:")
        _send_span(endpoint, {"n": 1.0})
        assert lines.next_json("trace")["spans"][0]["name"] == "measured"
    done = subprocess.run(
        [*RECEIVE, "--host", "no-such-host.invalid"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "cannot listen for OTLP/HTTP on no-such-host.invalid:0" in done.stderr
    assert "another receiver" not in done.stderr  # the host is the problem, not a taken port


@pytest.mark.fast
def test_metric_totals_take_key_value_list_labels() -> None:
    point = ReceivedMetricPoint(
        "jobs", "", "1", "sum", True, {"where": {"zone": "a"}, "tags": ({"k": 1},)},
        {"service.name": "svc"}, "s", 10, 1, value=2,
    )  # fmt: skip
    (total,) = metrics_summary([point, point])
    assert dict(total.attributes) == {"where": '{"zone": "a"}', "tags": '[{"k": 1}]'}
    assert total.value == 2


@pytest.mark.fast
@pytest.mark.parametrize(
    "arguments", [["--grpc-port", "70000"], ["--http-port", "-1"], ["--grpc-port", "4317x"]]
)
def test_receive_refuses_a_port_number_out_of_range(
    arguments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        kaos_otel_main(["receive", *arguments])
    assert exited.value.code == 2
    assert "is not a port number (0 to 65535)" in capsys.readouterr().err


@pytest.mark.fast
@pytest.mark.parametrize("settle", ["0", "nan", "inf"])
def test_receive_refuses_a_settle_time_that_is_not_a_positive_number(
    settle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kaos_otel_main(["receive", "--grpc-port", "0", "--http-port", "0", "--settle", settle]) == 1
    assert "--settle must be a positive number of seconds" in capsys.readouterr().err


def test_receive_refuses_a_directory_as_its_output_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kaos_otel_main(["receive", "--grpc-port", "0", "--http-port", "0", "--out", str(tmp_path)]) == 1
    assert f"cannot write {tmp_path}: Is a directory" in capsys.readouterr().err


def test_receive_stops_cleanly_on_sigint_sent_as_soon_as_it_listens() -> None:
    for _ in range(3):
        process = subprocess.Popen(
            [*RECEIVE, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert process.stdout is not None
            assert json.loads(process.stdout.readline())["event"] == "listening"
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 0, err
        assert [json.loads(line)["event"] for line in out.splitlines()] == ["metrics", "stopped"]
        assert "Traceback" not in err


def _send_span(endpoint: str, attributes: dict[str, float]) -> None:
    otel = KaosOtelManager("my-agent", endpoint=endpoint, protocol="grpc", global_providers=False)
    with otel.span("measured", attributes=attributes):
        pass
    otel.shutdown(timeout=10)


def test_receive_json_lines_stay_json_with_nan_and_infinity(
    receive: tuple[subprocess.Popen[str], _Lines, Path],
) -> None:
    _, lines, _ = receive
    endpoint = lines.next_json("listening")["grpc_endpoint"]
    _send_span(endpoint, {"score": float("nan"), "ceiling": float("inf"), "floor": float("-inf")})
    lines.next_json("trace")

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    trace = json.loads(lines.seen[-1], parse_constant=refuse)
    attributes = trace["spans"][0]["attributes"]
    assert [attributes[key] for key in ("score", "ceiling", "floor")] == ["NaN", "Infinity", "-Infinity"]


def test_receive_stops_quietly_when_its_reader_goes_away() -> None:
    process = subprocess.Popen(
        [*RECEIVE, "--json", "--settle", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        endpoint = json.loads(process.stdout.readline())["grpc_endpoint"]
        process.stdout.close()  # as `kaos-otel receive --json | head -1` does after its line
        _send_span(endpoint, {"n": 1.0})
        assert process.wait(timeout=20) == 0
        assert process.stderr is not None
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_every_command_stops_quietly_when_its_output_is_closed(tmp_path: Path) -> None:
    """``kaos-otel traces show FILE | head`` and the like: no BrokenPipe traceback, status 0."""
    span = {"traceId": "01" * 16, "spanId": "02" * 8, "name": "work", "startTimeUnixNano": "1",
            "endTimeUnixNano": "2", "kind": 1}  # fmt: skip
    line = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": [span]}]}]}
    telemetry = tmp_path / "telemetry.jsonl"
    telemetry.write_text(json.dumps(line) + "\n")
    for words in (["traces", "show", str(telemetry)], ["catalog", "--markdown"], ["collector", "config"]):
        reader, writer = os.pipe()
        os.close(reader)  # the reader has gone before the first write
        try:
            done = subprocess.run(
                [sys.executable, "-m", "kaos_otel", *words], stdout=writer, stderr=subprocess.PIPE,
                text=True, timeout=60, check=False,
            )  # fmt: skip
        finally:
            os.close(writer)
        assert (done.returncode, done.stderr) == (0, ""), words
        closed = subprocess.run(  # `kaos-otel ... >&-`: started with no standard output at all
            ["bash", "-c", 'exec "$@" >&-', "-", sys.executable, "-m", "kaos_otel", *words],
            stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (closed.returncode, closed.stderr) == (0, ""), words


@pytest.mark.fast
def test_a_span_that_ends_before_it_starts_shows_its_negative_duration_in_the_same_units() -> None:
    assert format_duration(-1e-9) == "0.0 ms"  # not "-0.0 ms"
    assert format_duration(-0.05) == "-50 ms"
    assert format_duration(-0.5) == "-0.50 s"  # not "-500.0 ms"
    assert format_duration(0.5) == "0.50 s"


@pytest.mark.fast
def test_spans_whose_parents_form_a_cycle_are_still_drawn() -> None:
    spans = [_span("t1", "a", "b", start=1), _span("t1", "b", "a", start=2), _span("t1", "c", "b", start=3)]
    drawn = render_trace_trees(spans)
    assert [line.split()[2] for line in drawn.splitlines()[1:]] == ["op-a", "op-b", "op-c"]


@pytest.mark.fast
def test_a_span_is_marked_parent_missing_only_when_its_parent_was_not_received() -> None:
    """One rule for a trace's roots: a span that is its own parent, or the first of a cycle, is a
    root drawn as one, and a start-up trace whose ``initialize`` is its own parent is one."""
    cycle = [_span("t1", "a", "b", start=1), _span("t1", "b", "a", start=2)]
    own_parent = dataclasses.replace(
        _span("t2", "i", "i"), attributes={catalog.MCP_METHOD_NAME: "initialize"}
    )
    drawn = render_trace_trees([*cycle, own_parent, _span("t3", "x", "remote")])
    (missing,) = [line for line in drawn.splitlines() if "(parent missing)" in line]
    assert "op-x" in missing
    assert is_startup_trace([own_parent])
    failed = dataclasses.replace(own_parent, status_code="ERROR")  # -32601 from an older server
    assert not is_startup_trace([failed])  # shown: the views hide only start-up that went well


@pytest.mark.fast
def test_control_characters_in_names_are_shown_escaped() -> None:
    span = dataclasses.replace(_span("t1", "a", None), name="clear\x1b[2Jscreen\nforged line")
    point = ReceivedMetricPoint(
        "jobs\x1b]0;title\x07", "", "1", "sum", True, {"queue": "a\rb"}, {"service.name": "svc"}, "s", 2, 1,
        value=1,
    )  # fmt: skip
    shown = render_trace_trees([span]) + render_metrics_summary([point])
    assert "\x1b" not in shown and "\r" not in shown and "\x07" not in shown
    assert "clear\\x1b[2Jscreen\\x0aforged line" in shown
    assert "jobs\\x1b]0;title\\x07" in shown and "queue=a\\x0db" in shown


@pytest.mark.fast
def test_an_outcome_the_status_does_not_show_is_drawn_next_to_it() -> None:
    """A span's status is OK, ERROR or UNSET: a canceled run or a degraded memory call says so."""
    canceled = dataclasses.replace(
        _span("t1", "a", None),
        attributes={catalog.KAOS_OUTCOME: "canceled", catalog.ERROR_TYPE: "CancelledError"},
    )
    degraded = dataclasses.replace(
        _span("t1", "b", "a", start=1), attributes={catalog.KAOS_OUTCOME: "degraded"}
    )
    fine = dataclasses.replace(_span("t1", "c", "a", start=2), attributes={catalog.KAOS_OUTCOME: "success"})
    lines = render_trace_trees([canceled, degraded, fine]).splitlines()[1:]
    assert lines[0].endswith("UNSET  canceled (CancelledError)")
    assert lines[1].endswith("UNSET  degraded")
    assert lines[2].endswith("UNSET")


@pytest.mark.fast
def test_work_that_outlived_its_request_is_marked() -> None:
    """A write left running after the request answered: the trace is longer than its root."""
    ms = 1_000_000
    root = _span("t1", "a", None, start=0, end=100 * ms)
    on_time = _span("t1", "b", "a", start=10 * ms, end=95 * ms)
    left_behind = _span("t1", "c", "a", start=50 * ms, end=3000 * ms)
    header, *lines = render_trace_trees([root, on_time, left_behind]).splitlines()
    assert header.endswith("(3.00 s, 3 spans; its root 0.10 s)"), header
    assert lines[0].endswith("UNSET") and lines[1].endswith("UNSET")
    assert lines[2].endswith("UNSET  (ended after its parent)")


@pytest.mark.fast
def test_a_trace_deeper_than_the_recursion_limit_is_drawn() -> None:
    depth = sys.getrecursionlimit() + 100
    chain = [_span("t1", f"s{i}", f"s{i - 1}" if i else None, i, depth) for i in range(depth)]
    header, *lines = render_trace_trees(chain).splitlines()
    assert header.startswith("trace t1 (") and len(lines) == depth
    # indented 48 levels at most, deeper spans saying their depth: lines of bounded length
    assert lines[48] == "   " * 48 + "└─ svc  op-s48  0.0 ms  UNSET"
    assert lines[-1] == "   " * 48 + f"└─ svc  op-s{depth - 1}  0.0 ms  UNSET  (depth {depth - 1})"
    assert max(len(line) for line in lines) < 200


@pytest.mark.fast
def test_receive_reports_a_trace_it_cannot_draw_and_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def draw(spans: tuple[ReceivedSpan, ...], **options: Any) -> str:
        if spans[0].trace_id == "bad":
            raise RuntimeError("cannot draw\nthis")
        return render_trace_trees(spans, **options)

    monkeypatch.setattr("kaos_otel._receive.render_trace_trees", draw)
    out = io.StringIO()
    printer = _Printer(out, json_mode=False, color=False)
    for trace_id in ("bad", "good"):
        printer.trace(CompletedTrace(trace_id, (_span(trace_id, "a", None),), late=False))
    assert "trace bad" not in out.getvalue() and "trace good (" in out.getvalue()
    assert capsys.readouterr().err == (
        "kaos-otel receive: error: cannot print trace bad: RuntimeError: cannot draw\\x0athis\n"
    )


@pytest.mark.fast
def test_a_method_name_that_is_a_key_value_list_or_array_is_not_start_up() -> None:
    """OTLP attribute values may be key-value lists and arrays: they name no MCP method."""
    for method in ({"a": "b"}, ({"k": 1},), ("initialize",)):
        span = dataclasses.replace(_span("t1", "a", None), attributes={catalog.MCP_METHOD_NAME: method})
        assert not is_startup_trace([span])
        assert "op-a" in render_trace_trees([span])


@pytest.mark.fast
def test_a_parent_cycle_is_broken_at_a_span_on_it_and_marked() -> None:
    """a and b are each other's parent; c, a's child, started first: a becomes the root, c stays
    its child."""
    spans = [
        _span("t1", "a", "b", start=100, end=300),
        _span("t1", "b", "a", start=200, end=300),
        _span("t1", "c", "a", start=50, end=300),
    ]
    lines = render_trace_trees(spans).splitlines()[1:]
    assert lines == [
        "└─ svc  op-a  0.0 ms  UNSET  (parent cycle)",
        "   ├─ svc  op-c  0.0 ms  UNSET",
        "   └─ svc  op-b  0.0 ms  UNSET",
    ]


def _json_span(trace_id: str, index: int, parent: int | None, attributes: list[Any]) -> dict[str, Any]:
    """An OTLP/JSON span of ``trace_id`` whose span id (and parent's) is made of ``index``."""
    return {
        "traceId": trace_id, "spanId": f"{index + 1:016x}", "name": f"step{index}",
        **({"parentSpanId": f"{parent + 1:016x}"} if parent is not None else {}),
        "startTimeUnixNano": str(1000 + index), "endTimeUnixNano": "2000000", "attributes": attributes,
    }  # fmt: skip


def test_receive_and_traces_show_draw_a_very_deep_trace_and_a_key_value_method_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Neither stops the receiver (nor ``traces show`` reading what it wrote)."""
    deep_id, odd_id, depth = "0a" * 16, "0b" * 16, sys.getrecursionlimit() + 100
    deep = [_json_span(deep_id, i, i - 1 if i else None, []) for i in range(depth)]
    method = {"key": catalog.MCP_METHOD_NAME, "value": {"kvlistValue": {"values": []}}}
    odd = [_json_span(odd_id, 0, None, [method])]
    out = tmp_path / "telemetry.jsonl"
    process = subprocess.Popen(
        [*RECEIVE, "--settle", "0.2", "--no-color", "--out", str(out)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    lines = _Lines(process.stdout)
    try:
        http_endpoint = lines.until("  HTTP  ").split()[-1]
        for spans in (deep, odd):
            document = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
            request = urllib.request.Request(
                f"{http_endpoint}/v1/traces",
                json.dumps(document).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=20) as response:
                assert response.status == 200
        lines.until(f"step{depth - 1}")
        lines.until(f"trace {odd_id} (")
        process.send_signal(signal.SIGTERM)
        lines.until(f"Received {depth + 1} spans")
        assert process.wait(timeout=10) == 0
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert kaos_otel_main(["traces", "show", str(out), "--all", "--no-color"]) == 0
    shown = capsys.readouterr().out
    assert f"trace {deep_id} (" in shown and f"trace {odd_id} (" in shown


_JOB_ON_A_TERMINAL = """
import fcntl, os, signal, subprocess, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # stdin, a pseudo-terminal, becomes this new session's terminal
job = subprocess.Popen(sys.argv[2:], process_group=0)  # a job of its own, as a shell starts one
if sys.argv[1] == "foreground":
    os.tcsetpgrp(0, job.pid)
for forwarded in (signal.SIGINT, signal.SIGUSR1):
    signal.signal(forwarded, lambda signum, frame: job.send_signal(signum))
sys.exit(job.wait())
"""
"""Runs a command as a job of a terminal session (stdin is the terminal), in the foreground or
the background (``kaos-otel receive &``); SIGINT and SIGUSR1 are passed on to it."""


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal: its controller's and its device's file descriptors (Linux has them)."""
    controller, device = pty.openpty()
    try:
        yield controller, device
    finally:
        os.close(controller)
        os.close(device)


@pytest.mark.parametrize("job", ["foreground", "background"])
def test_receive_reads_enter_on_its_terminal_only_in_the_foreground(
    terminal: tuple[int, int], job: str
) -> None:
    """In the background, reading its terminal would get the receiver stopped (SIGTTIN)."""
    controller, device = terminal
    process = subprocess.Popen(
        [sys.executable, "-c", _JOB_ON_A_TERMINAL, job, *RECEIVE, "--json"],
        stdin=device, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None
    lines = _Lines(process.stdout)
    try:
        lines.next_json("listening")
        if job == "foreground":
            os.write(controller, b"\n")  # Enter
        else:
            process.send_signal(signal.SIGUSR1)
        assert lines.next_json("metrics")["series"] == []
        process.send_signal(signal.SIGINT)
        lines.next_json("stopped")
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.mark.fast
def test_a_receiver_remembers_a_bounded_number_of_printed_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(receive_module, "_MAX_PRINTED", 2, raising=False)
    assembler = TraceAssembler(settle_s=1.0)
    for index, trace_id in enumerate(["t1", "t2", "t1", "t3"]):  # t1 printed again: the latest now
        assembler.add([_span(trace_id, f"s{index}", None)], now=float(index))
        assembler.drain()
    assert list(assembler._printed) == ["t1", "t3"]
    assembler.add([_span("t1", "late", "s0")], now=9.0)
    assert [trace.late for trace in assembler.drain()] == [True]
