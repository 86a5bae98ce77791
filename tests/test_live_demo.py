"""``kaos-agent demo --duration``: live traffic with faults, long-term memory on, and no detached spans.

The demo runs as a user runs it (a subprocess, its own receiver writing the OTLP JSON file); the
file is then read back: every span that starts during the traffic is in a request's trace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from test_demo import DEMO, _env, _marked_processes, _sigint_delivered

from instrumented_agent.demo import _missing_live_memory
from instrumented_agent.faults import Fault, FaultSwitch, ScheduledFault, parse_fault
from kaos_otel import catalog
from kaos_otel.receiver import ReceivedSpan, load_otlp_json

pytestmark = pytest.mark.timeout(240)

SERVICES = {"coordinator", "researcher", "analyst", "mcp-echo", "mcp-calculator"}


def detached_spans(spans: list[ReceivedSpan], since_ns: int) -> list[ReceivedSpan]:
    """Spans begun at or after ``since_ns`` that start a trace of their own with no link to another.

    A request's SERVER span is the one legitimate root of the traffic.
    """
    return [
        s
        for s in spans
        if s.parent_span_id is None
        and not s.links
        and s.kind != "SERVER"
        and s.start_time_unix_nano >= since_ns
    ]


def test_parse_fault() -> None:
    assert parse_fault("memory-latency", 20) == ScheduledFault(Fault.MEMORY_LATENCY, 20)
    assert parse_fault("subagent-down@5", 20) == ScheduledFault(Fault.SUBAGENT_DOWN, 5)
    assert parse_fault("model-errors@5-9.5", 20) == ScheduledFault(Fault.MODEL_ERRORS, 5, 9.5)
    bad_times = ("memory-errors@nan", "memory-errors@1-nan", "memory-errors@1-inf", "memory-errors@inf")
    for bad in ("disk-full", "memory-errors@x", "memory-errors@9-5", "memory-errors@-1", *bad_times):
        with pytest.raises(ValueError):
            parse_fault(bad, 20)


def test_live_demo_with_long_term_memory_leaves_no_span_detached(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    command = [sys.executable, "-m", "instrumented_agent.cli", "demo", "--json", "--workdir", str(tmp_path)]
    command += ["--duration", "14", "--rate", "1.5", "--fault", "memory-errors@4-8"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    live = summary["live"]
    assert live["sent"] >= 15 and live["by_status"].get("200", 0) == live["sent"]  # memory degrades only
    assert live["failed_streams"] == 0
    assert [c["active"] for c in live["fault_changes"]] == [["memory-errors"], []]

    telemetry = load_otlp_json(tmp_path / "telemetry.otlp.jsonl")
    spans = telemetry.spans
    requests = [s for s in spans if s.kind == "SERVER" and s.service_name == "coordinator"]
    traffic_start = min(s.start_time_unix_nano for s in requests)
    assert detached_spans(spans, traffic_start) == []

    request_traces = {s.trace_id for s in requests}
    extracted = [
        s
        for s in spans
        if s.name == "create_memory" and s.attributes.get(catalog.KAOS_MEMORY_TIER) == "long_term"
    ]
    assert extracted and all(s.trace_id in request_traces for s in extracted)
    by_id = {s.span_id: s for s in spans}
    queued = [by_id[s.parent_span_id or ""] for s in extracted]  # each waited its turn in its own span
    assert {s.name for s in queued} == {"long-term extraction"}
    assert {by_id[s.parent_span_id or ""].name.split()[0] for s in queued} == {"invoke_agent"}
    outcomes = Counter(
        s.attributes.get(catalog.KAOS_OUTCOME) for s in spans if catalog.KAOS_MEMORY_TIER in s.attributes
    )
    assert outcomes["degraded"] > 0  # the fault was on

    research = [s for s in spans if s.trace_id == live["research_trace_id"]]
    assert {s.service_name for s in research} == SERVICES
    assert [s for s in research if s.parent_span_id and s.parent_span_id not in by_id] == []

    users = {
        (p.attributes[catalog.GEN_AI_AGENT_NAME], p.attributes[catalog.KAOS_REQUEST_ORIGIN])
        for p in telemetry.metric_points
        if p.name == catalog.KAOS_REQUESTS
    }
    assert users == {("coordinator", "user"), ("researcher", "delegated"), ("analyst", "delegated")}


def test_ctrl_c_stops_live_traffic_and_every_service_with_requests_in_flight(tmp_path: Path) -> None:
    """Ctrl-C while the researcher holds requests (subagent-down): exit 130, nothing left running."""
    marker = uuid.uuid4().hex
    command = [*DEMO, "--workdir", str(tmp_path), "--duration", "120", "--fault", "subagent-down@0"]
    with _sigint_delivered():
        demo = subprocess.Popen(
            command, env=_env(marker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    assert demo.stdout is not None
    try:
        switched = next((line for line in demo.stdout if "faults on: subagent-down" in line), None)
        assert switched is not None, "the live traffic never started"
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=90)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130, err
    assert "interrupted" in err
    assert json.loads((tmp_path / "faults.json").read_text()) == []  # the fault is switched off
    assert _marked_processes(marker) == []


def test_a_fault_hits_every_call_of_a_request_not_the_same_ones(tmp_path: Path) -> None:
    """Requests making four memory calls each: ``one_in(2)`` fails each of the four sometimes (a
    counter failed the first and third of every request, so two tiers never failed)."""
    switch = FaultSwitch(tmp_path / "faults.json")
    failures = [0, 0, 0, 0]
    for _ in range(200):
        for call in range(4):
            failures[call] += switch.one_in(2)
    assert all(60 <= count <= 140 for count in failures), failures


def test_live_traffic_without_mem0_is_told_its_long_term_memory_will_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Live traffic runs the agents with long-term memory on Mem0, which the ``agent`` extra does
    not install: the demo says so on the console, not only in each agent's own log file."""
    assert _missing_live_memory() is None  # installed here
    monkeypatch.setitem(sys.modules, "mem0", None)  # as if not installed
    missing = _missing_live_memory()
    assert missing is not None and "kaos-otel[agent,mem0]" in missing
