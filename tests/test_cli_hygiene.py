"""Both command lines as a new user meets them: versions, usage on a bad flag, errors naming the file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import unicodedata
from importlib import metadata
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kaos_otel import catalog
from kaos_otel.cli import main as kaos_otel_main
from kaos_otel.receiver import to_otlp_json

pytestmark = pytest.mark.fast

CLIS = {
    "kaos-otel": [sys.executable, "-m", "kaos_otel"],
    "kaos-agent": [sys.executable, "-m", "instrumented_agent.cli"],
    "python -m kaos_otel.receiver": [sys.executable, "-m", "kaos_otel.receiver"],
}


@pytest.mark.parametrize("name", ["kaos-otel", "kaos-agent"])
def test_version(name: str) -> None:
    done = subprocess.run([*CLIS[name], "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert done.stdout.strip() == f"{name} {metadata.version('kaos-otel')}"


@pytest.mark.parametrize(
    ("name", "words", "usage"),
    [
        ("kaos-agent", ["demo", "--bogus"], "usage: kaos-agent demo "),
        ("kaos-agent", ["serve", "model", "--bogus"], "usage: kaos-agent serve model "),
        ("kaos-otel", ["traces", "show", "f", "--bogus"], "usage: kaos-otel traces show "),
        ("kaos-otel", ["receive", "--bogus"], "usage: kaos-otel receive "),
        ("python -m kaos_otel.receiver", ["--bogus"], "usage: kaos-otel receive "),
    ],
)
def test_a_bad_flag_shows_the_subcommands_usage(name: str, words: list[str], usage: str) -> None:
    done = subprocess.run([*CLIS[name], *words], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith(usage)
    assert "unrecognized arguments: --bogus" in done.stderr


def test_traces_show_names_a_binary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "telemetry.pb"
    binary.write_bytes(b"\x0a\x8f\xff\xfe\x00binary")
    assert kaos_otel_main(["traces", "show", str(binary)]) == 1
    err = capsys.readouterr().err
    assert f"kaos-otel: error: {binary}: not an OTLP/JSON Lines file" in err


def _telemetry_file(path: Path, *, with_spans: bool = True) -> None:
    """Three traces (two MCP session start-ups, mcp 2.3's and an older server's, and a request) and a
    counter, as `receive --out` writes; only the counter without ``with_spans``."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=Resource.create({"service.name": "coordinator"}))
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = tracer_provider.get_tracer("test")
    for method in ("server/discover", "initialize"):
        with tracer.start_as_current_span(
            f"MCP send {method}", kind=SpanKind.CLIENT, attributes={catalog.MCP_METHOD_NAME: method}
        ):
            pass
    with tracer.start_as_current_span("invoke_agent coordinator"), tracer.start_as_current_span("agent_step"):
        pass
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(
        metric_readers=[reader], resource=Resource.create({"service.name": "coordinator"})
    )
    meter_provider.get_meter("test").create_counter(catalog.KAOS_REQUESTS).add(
        2, {catalog.KAOS_OUTCOME: "success"}
    )
    metrics = reader.get_metrics_data()
    assert metrics is not None
    lines = [to_otlp_json(encode_spans(spans.get_finished_spans()))] if with_spans else []
    lines.append(to_otlp_json(encode_metrics(metrics)))
    path.write_text("\n".join(lines) + "\n")


def test_traces_show_hides_start_up_traces_and_prints_the_metrics_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    telemetry = tmp_path / "telemetry.jsonl"
    _telemetry_file(telemetry)
    assert kaos_otel_main(["traces", "show", str(telemetry), "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "invoke_agent coordinator" in out
    assert "MCP send server/discover" not in out and "MCP send initialize" not in out
    assert "(2 MCP session start-up traces hidden; --all shows them)" in out
    assert "kaos.requests (counter)" in out
    assert "coordinator  kaos.outcome=success  2" in out

    assert kaos_otel_main(["traces", "show", str(telemetry), "--no-color", "--all"]) == 0
    shown = capsys.readouterr().out
    assert "MCP send server/discover" in shown and "MCP send initialize" in shown


def test_traces_show_prints_the_metrics_summary_of_a_file_without_spans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    telemetry = tmp_path / "metrics.jsonl"
    _telemetry_file(telemetry, with_spans=False)
    assert kaos_otel_main(["traces", "show", str(telemetry), "--no-color"]) == 0
    assert "coordinator  kaos.outcome=success  2" in capsys.readouterr().out
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert kaos_otel_main(["traces", "show", str(empty)]) == 1
    assert f"no spans or metric points in {empty}" in capsys.readouterr().err


def test_demo_refuses_a_workdir_that_is_a_file(tmp_path: Path) -> None:
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    done = subprocess.run(
        [*CLIS["kaos-agent"], "demo", "--workdir", str(taken)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert done.stderr.startswith("usage: kaos-agent demo ")
    assert f"{taken} exists and is not a directory" in done.stderr
    assert taken.read_text() == "mine"


@pytest.mark.parametrize(
    ("flag", "value", "reason"),
    [
        ("--duration", "nan", "is not a finite number"),
        ("--rate", "nan", "is not a finite number"),
        ("--rate", "0", "is not above 0"),
        ("--startup-timeout", "nan", "is not a finite number"),
        ("--latency-ms", "-5", "is below 0"),
    ],
)
def test_demo_refuses_numbers_it_cannot_use(tmp_path: Path, flag: str, value: str, reason: str) -> None:
    """``nan`` compares false with everything: a run that never sends, a wait that never ends."""
    workdir = tmp_path / "run"
    command = [*CLIS["kaos-agent"], "demo", "--workdir", str(workdir), "--duration", "5", flag, value]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: kaos-agent demo ")
    assert f"argument {flag}: {value} {reason}" in done.stderr
    assert not workdir.exists()  # refused before anything started


@pytest.mark.parametrize(
    ("argv", "environ", "said"),
    [
        (["--latency-ms", "nan"], {}, "nan is not a finite number"),
        ([], {"KAOS_MODEL_LATENCY_MS": "-40"}, "-40 is below 0"),
        ([], {"KAOS_MODEL_LATENCY_MS": "slow"}, "slow is not a number"),
    ],
)
def test_the_scripted_model_refuses_a_latency_it_cannot_use(
    argv: list[str], environ: dict[str, str], said: str
) -> None:
    """A latency from the flag or the variable: NaN never waited, a malformed variable became 0."""
    command = [*CLIS["kaos-agent"], "serve", "model", "--port", "0", *argv]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=60, env={**os.environ, **environ}
    )
    assert done.returncode == 2
    assert f"kaos-agent serve model: error: argument --latency-ms: {said}" in done.stderr


def test_the_demo_stops_quietly_when_its_output_is_closed(tmp_path: Path) -> None:
    """``kaos-agent demo | head``: no BrokenPipe traceback, status 0, as for ``kaos-otel``."""
    reader, writer = os.pipe()
    os.close(reader)  # the reader has gone before the first write
    try:
        done = subprocess.run(
            [*CLIS["kaos-agent"], "demo", "--workdir", str(tmp_path)],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (0, "")


def test_traces_show_names_a_line_nested_too_deeply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    assert kaos_otel_main(["traces", "show", str(deep)]) == 1
    assert f"{deep}:1: not an OTLP/JSON export request: nested too deeply" in capsys.readouterr().err


def test_kaos_agent_on_the_core_install_names_the_agent_extra(tmp_path: Path) -> None:
    """The core install ships the ``kaos-agent`` command, not the reference system's dependencies."""
    probe = (
        "import sys\n"
        "sys.modules['httpx'] = None  # as on the core install\n"
        "from instrumented_agent.cli import main\n"
        f"sys.exit(main(['demo', '--workdir', {str(tmp_path / 'demo')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "kaos-agent: error: httpx is not installed; the reference system needs the agent extra: "
        "pip install 'kaos-otel[agent]'\n"
    )


def test_traces_show_keeps_the_traces_asked_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On call: the failed request of one user, the slow ones; a condition holds on any span."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=Resource.create({"service.name": "coordinator"}))
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = tracer_provider.get_tracer("test")
    second = 1_000_000_000
    for user, outcome, seconds in (("alice", "success", 1), ("bob", "error", 2), ("carol", "success", 40)):
        root = tracer.start_span(
            f"invoke_agent for {user}", attributes={catalog.USER_ID: user}, start_time=second
        )
        with trace.use_span(root, end_on_exit=False):
            step = tracer.start_span(
                "agent_step",
                attributes={
                    catalog.KAOS_OUTCOME: outcome,
                    catalog.GEN_AI_RESPONSE_FINISH_REASONS: (outcome, "x"),
                },
                start_time=second,
            )
            step.end(end_time=2 * second)
        root.end(end_time=(1 + seconds) * second)
    telemetry = tmp_path / "telemetry.jsonl"
    telemetry.write_text(to_otlp_json(encode_spans(spans.get_finished_spans())) + "\n")

    def shown(*words: str) -> str:
        assert kaos_otel_main(["traces", "show", str(telemetry), "--no-color", *words]) == 0
        return capsys.readouterr().out

    failed = shown("--where", "kaos.outcome=error")
    assert "1 of 3 traces match" in failed and "for bob" in failed and "for alice" not in failed
    assert "for bob" in shown("--where", "kaos.outcome=error", "--where", "user.id=bob")
    assert "0 of 3 traces match" in shown("--where", "kaos.outcome=error", "--where", "user.id=alice")
    assert "for bob" in shown("--where", f"{catalog.GEN_AI_RESPONSE_FINISH_REASONS}=error")  # one of an array
    assert "0 of 3 traces match" in shown("--where", "no.such.key=None")
    assert "for carol" in shown("--where", "service.name=coordinator", "--min-duration", "30")
    slow = shown("--min-duration", "30")
    assert "1 of 3 traces match" in slow and "for bob" not in slow
    with pytest.raises(SystemExit):
        kaos_otel_main(["traces", "show", str(telemetry), "--where", "no-equals-sign"])
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_ctrl_c_stops_a_command_with_one_line_not_a_traceback() -> None:
    """Ctrl-C while ``dashboards import`` waits on a SigNoz that does not answer."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        process = subprocess.Popen(
            [*CLIS["kaos-otel"], "dashboards", "import", "--signoz", url],
            env={**os.environ, "SIGNOZ_API_KEY": "key"}, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            connection, _ = silent.accept()  # the command now waits for an answer
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=30)
            connection.close()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    assert (process.returncode, err) == (130, "kaos-otel: interrupted\n")


@pytest.mark.parametrize(
    "words",
    [["traces", "show", "{dir}/telemetry.jsonl"], ["catalog"], ["collector", "config", "-o", "{dir}/c.yaml"]],
)
def test_output_to_a_full_disk_is_one_line_not_a_traceback(words: list[str], tmp_path: Path) -> None:
    _telemetry_file(tmp_path / "telemetry.jsonl")
    words = [word.format(dir=tmp_path) for word in words]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [*CLIS["kaos-otel"], *words], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
            check=False,
        )  # fmt: skip
    assert (done.returncode, done.stderr) == (
        1, "kaos-otel: error: cannot write the output: No space left on device\n",
    )  # fmt: skip


def test_traces_show_lines_up_the_waterfall_of_wide_names_and_escapes_bidi_controls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CJK and emoji take two columns, combining accents none: the bars still start in one column;
    a right-to-left override in a name is shown escaped, not left to reorder the line."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=Resource.create({"service.name": "coordinator"}))
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("检索知识库 🤖"):
        for name in ("plain name", "e\u0301e\u0301e\u0301", "rtl \u202etxt.exe"):
            with tracer.start_as_current_span(name):
                pass
    telemetry = tmp_path / "telemetry.jsonl"
    telemetry.write_text(to_otlp_json(encode_spans(spans.get_finished_spans())) + "\n")
    assert kaos_otel_main(["traces", "show", str(telemetry), "--no-color", "--waterfall"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.endswith("|")]
    assert len(lines) == 4 and "rtl \\u202etxt.exe" in lines[3] and "\u202e" not in lines[3]

    def bar_column(line: str) -> int:
        before = line[: line.index(" |")]
        wide = sum(unicodedata.east_asian_width(c) in "WF" for c in before)
        return len(before) + wide - sum(unicodedata.combining(c) > 0 for c in before)

    assert len({bar_column(line) for line in lines}) == 1
