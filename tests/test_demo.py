"""``kaos-agent demo`` end to end: exit code, output, telemetry, and that no process survives it.

Each test runs the real command in a subprocess. Its service processes inherit a unique marker in
their environment, so a scan of ``/proc`` finds any that outlived the demo.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from instrumented_agent.demo import SCENARIOS, run_scenario
from instrumented_agent.supervisor import ServiceSpec, Supervisor
from kaos_otel import catalog
from kaos_otel.cli import main as kaos_otel_main
from kaos_otel.receiver import OtlpReceiver

pytestmark = pytest.mark.timeout(120)

MARKER = "KAOS_DEMO_TEST_MARKER"
DEMO = [sys.executable, "-m", "instrumented_agent.cli", "demo"]
SERVICES = {"coordinator", "researcher", "analyst", "mcp-echo", "mcp-calculator"}


def _env(marker: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**env, MARKER: marker, "NO_COLOR": "1", **extra}


def _marked_processes(marker: str) -> list[int]:
    """PIDs of live processes whose environment carries ``marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _run_demo(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEMO, *args], env=env, capture_output=True, text=True, timeout=90, check=False)


O = catalog.KAOS_OUTCOME  # noqa: E741


def test_demo_exports_to_the_configured_endpoint(otlp_receiver: OtlpReceiver, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    env = _env(marker, OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint)
    started = time.monotonic()
    done = _run_demo(["--json", "--workdir", str(tmp_path)], env)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60
    summary = json.loads(done.stdout)
    assert summary["ok"] is True
    assert summary["telemetry"] == {"endpoint": otlp_receiver.grpc_endpoint, "file": None}
    results = {s["name"]: s for s in summary["scenarios"]}
    assert (results["research"]["status_code"], results["failure"]["status_code"]) == (200, 502)
    assert _marked_processes(marker) == []

    spans = otlp_receiver.spans()
    research = [s for s in spans if s.trace_id == results["research"]["trace_id"]]
    assert {s.service_name for s in research} == SERVICES
    assert {s.trace_id for s in spans if s.name in ("tools/call echo", "tools/call add")} == {
        results["research"]["trace_id"]
    }
    failure = [s for s in spans if s.trace_id == results["failure"]["trace_id"]]
    (ghost,) = [s for s in failure if s.name == "invoke_agent _other"]
    assert ghost.status_code == "ERROR"
    assert any(e.name == "exception" for e in ghost.events)

    requests = {
        tuple(p.attributes[k] for k in (catalog.GEN_AI_AGENT_NAME, catalog.KAOS_REQUEST_ORIGIN, O))
        for p in otlp_receiver.metric_points()
        if p.name == catalog.KAOS_REQUESTS and p.value
    }
    # the user's two requests are the coordinator's; the researcher's run is a delegated one
    assert requests >= {
        ("coordinator", "user", "success"),
        ("coordinator", "user", "error"),
        ("researcher", "delegated", "success"),
    }
    assert not {r for r in requests if r[0] != "coordinator" and r[1] == "user"}


_PREVIOUS_RUN = json.dumps(
    {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "previous-run"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "demo"},
                        "spans": [
                            {
                                "traceId": "0af7651916cd43dd8448eb211c80319c",
                                "spanId": "b7ad6b7169203331",
                                "name": "left over",
                                "kind": 1,
                                "startTimeUnixNano": "1000000000",
                                "endTimeUnixNano": "2000000000",
                            }
                        ],
                    }
                ],
            }
        ]
    }
)
"""One span of an earlier demo run, as the receiver writes it."""


def test_demo_prints_trees_and_writes_a_file_kaos_otel_renders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = uuid.uuid4().hex
    # without OTEL_EXPORTER_OTLP_ENDPOINT everything goes to the demo's receiver, per-signal
    # endpoints and protocols left in the shell notwithstanding
    elsewhere = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
    }
    telemetry = tmp_path / "telemetry.otlp.jsonl"
    telemetry.write_text(_PREVIOUS_RUN)  # a reused workdir: only this run's telemetry is kept
    done = _run_demo(["--workdir", str(tmp_path)], _env(marker, **elsewhere))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for line in (
        "coordinator  invoke_agent researcher",
        "researcher  POST /v1/chat/completions",
        "researcher  execute_tool echo",
        "mcp-echo  tools/call echo",
        "analyst  execute_tool add",
        "mcp-calculator  tools/call add",
        "coordinator  invoke_agent _other",
        "! instrumented_agent.errors.UnknownAgentError",
    ):
        assert line in out, f"{line!r} missing from the demo output"
    assert "coordinator  error      1" in out
    assert "researcher   success    1" in out
    assert _marked_processes(marker) == []

    assert f"kaos-otel traces show {telemetry}" in out
    assert kaos_otel_main(["traces", "show", str(telemetry), "--no-color"]) == 0
    shown = capsys.readouterr().out
    assert "previous-run" not in shown
    assert "mcp-calculator  tools/call add" in shown
    assert "coordinator  invoke_agent _other" in shown


def test_demo_stops_everything_when_an_agent_fails_to_start(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    hook = tmp_path / "hook"
    hook.mkdir()
    # Imported by every Python process started with this PYTHONPATH: the analyst exits at once.
    (hook / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if sys.argv[sys.argv.index('--name') + 1 :][:1] == ['analyst'] if '--name' in sys.argv else False:\n"
        "    os._exit(3)\n"
    )
    done = _run_demo(["--workdir", str(tmp_path / "run")], _env(marker, PYTHONPATH=str(hook)))
    assert done.returncode == 2
    assert "analyst failed to start: exited with code 3" in done.stderr
    assert _marked_processes(marker) == []


def test_agent_settings_in_the_users_environment_do_not_reach_the_demos_agents(tmp_path: Path) -> None:
    """The demo wires its own system: an MCP server (unreachable here) and a fault file left in the
    shell would otherwise reach every agent without such a flag, and faults would be injected."""
    marker = uuid.uuid4().hex
    faults = tmp_path / "faults.json"
    faults.write_text('["model-errors"]')
    env = _env(
        marker,
        KAOS_MCP_SERVERS="http://127.0.0.1:1/mcp",
        KAOS_DEMO_FAULTS_FILE=str(faults),
    )
    done = _run_demo(["--json", "--workdir", str(tmp_path / "run"), "--startup-timeout", "30"], env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
    assert _marked_processes(marker) == []


def test_bad_serve_socket_and_workdir_are_one_line_errors(tmp_path: Path) -> None:
    serve = [sys.executable, "-m", "instrumented_agent.cli", "serve", "model", "--fd"]
    for fd, reason in (("99", "Bad file descriptor"), ("-1", "negative"), ("0", "non-socket")):
        done = subprocess.run(
            [*serve, fd], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 1
        assert done.stderr.startswith(f"kaos-agent: error: cannot serve on file descriptor {fd}: ")
        assert reason in done.stderr and "Traceback" not in done.stderr
    with socket.socket() as bound:  # bound but not listening: uvicorn could never accept on it
        bound.bind(("127.0.0.1", 0))
        fd = str(bound.fileno())
        done = subprocess.run(
            [*serve, fd], pass_fds=[bound.fileno()], capture_output=True, text=True, timeout=60, check=False
        )
    assert (done.returncode, done.stderr.strip()) == (
        1,
        f"kaos-agent: error: cannot serve on file descriptor {fd}: not a listening stream socket",
    )
    (tmp_path / "file").write_text("")
    done = _run_demo(["--workdir", str(tmp_path / "file" / "run")], _env(uuid.uuid4().hex))
    assert (done.returncode, done.stderr.strip()) == (
        2,
        f"kaos-agent demo: error: cannot use {tmp_path / 'file' / 'run'}: Not a directory",
    )


def test_ctrl_c_while_the_demo_is_still_importing_is_one_line(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    # Imported by every Python process started with this PYTHONPATH: Ctrl-C as the demo module loads.
    (hook / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'instrumented_agent.demo':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.meta_path.insert(0, Interrupt())\n"
    )
    with _sigint_delivered():
        done = _run_demo(["--workdir", str(tmp_path / "run")], _env(uuid.uuid4().hex, PYTHONPATH=str(hook)))
    assert (done.returncode, done.stderr) == (130, "kaos-agent: interrupted\n")


@contextmanager
def _sigint_delivered() -> Iterator[None]:
    """Let children receive SIGINT even if this process ignores it (a shell's background job does).

    An ignored signal stays ignored across exec; a handled one is reset to the default, which
    Python then replaces with its KeyboardInterrupt handler.
    """
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.timeout(300)  # a hang guard: seven Python processes start on a shared, busy machine
def test_demo_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C while a scenario is in flight (the scripted model takes 25 s to answer it)."""
    marker = uuid.uuid4().hex
    with _sigint_delivered():
        demo = subprocess.Popen(
            [*DEMO, "--workdir", str(tmp_path), "--latency-ms", "25000"],
            env=_env(marker),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert demo.stdout is not None
    try:
        # every service is ready once the demo lists them; the first scenario then waits for the model
        listed = next((line for line in demo.stdout if line.lstrip().startswith("coordinator ")), None)
        assert listed is not None, "the demo ended without listing its services"
        demo.send_signal(signal.SIGINT)
        try:
            out, err = demo.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            demo.kill()
            out, err = demo.communicate()
            pytest.fail(f"the demo was still running 120 s after Ctrl-C:\n{out}\n{err}")
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130, err
    assert "interrupted" in err
    assert "Scenario research" not in out
    assert _marked_processes(marker) == []


def test_services_stop_when_the_demo_is_killed_outright(tmp_path: Path) -> None:
    """SIGKILL gives the demo no chance to clean up: the services stop on their own (Linux)."""
    marker = uuid.uuid4().hex
    demo = subprocess.Popen(
        [*DEMO, "--workdir", str(tmp_path)],
        env=_env(marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while len(_marked_processes(marker)) < 7 and time.monotonic() < deadline:  # demo + 6 services
            time.sleep(0.05)
        assert len(_marked_processes(marker)) >= 7
        demo.kill()
        demo.wait(timeout=10)
        deadline = time.monotonic() + 20
        while _marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = _marked_processes(marker)
    finally:
        for pid in _marked_processes(marker):  # never leave one behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
    assert survivors == []


def test_a_coordinator_that_does_not_answer_is_a_failed_scenario_not_a_crash() -> None:
    """A socket that accepts but never answers: the request times out."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        result = run_scenario(url, SCENARIOS["research"], timeout_s=0.5)
    assert (result.status_code, result.ok, result.trace_id) == (0, False, None)
    assert "no answer from the coordinator: ReadTimeout" in result.text


class _ProxyError(BaseHTTPRequestHandler):
    """What a proxy in front of the coordinator may answer: HTML, not the API's JSON."""

    def do_POST(self) -> None:
        body = b"<html>502 Bad Gateway</html>"
        self.send_response(502)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def test_an_answer_that_is_not_the_apis_json_is_shown_as_it_came() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ProxyError)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = run_scenario(f"http://127.0.0.1:{server.server_address[1]}", SCENARIOS["failure"])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert (result.status_code, result.ok, result.text) == (502, False, "<html>502 Bad Gateway</html>")


def test_services_started_from_a_thread_outlive_that_thread(tmp_path: Path) -> None:
    """Linux's parent-death signal follows the thread that started a child, not its process."""
    with Supervisor(tmp_path) as supervisor:

        def start() -> None:
            supervisor.wait_ready([supervisor.spawn(ServiceSpec("model", ["model"]))])

        starter = threading.Thread(target=start)
        starter.start()
        starter.join()
        model = supervisor.services["model"]
        with pytest.raises(subprocess.TimeoutExpired):
            model.process.wait(timeout=5)  # the service stopped at once when the thread ended
        supervisor.wait_ready([model])
