"""The export pipeline never hurts the agent: dead or hanging collectors, disabled SDK, no endpoint,
host-installed providers, protocol selection and bounded flush/shutdown."""

from __future__ import annotations

import datetime
import decimal
import http.client
import json
import logging
import logging.config
import math
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, InMemoryLogRecordExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kaos_otel import KaosOtelManager, catalog, sanitized_exporter
from kaos_otel._config import OtlpProtocol, TelemetrySettings
from kaos_otel._content import ContentPolicy
from kaos_otel._logs import KaosLoggingHandler, keep_on_root, release_bridges_to, root_logging_kept
from kaos_otel.exporters.batch import BatchQueue, BatchSettings
from kaos_otel.exporters.health import TelemetryHealth
from kaos_otel.exporters.pipeline import sanitizing_metric_exporter
from kaos_otel.receiver import OtlpReceiver

PROTOCOLS = ["grpc", "http/protobuf"]
MakeOtel = Callable[..., KaosOtelManager]
SHUTDOWN_SLACK_S = 0.6


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def managers() -> Iterator[list[KaosOtelManager]]:
    """Managers built directly by a test, shut down at its end."""
    built: list[KaosOtelManager] = []
    yield built
    for manager in built:
        manager.shutdown(timeout=1)


def spans_of_request_path(otel: KaosOtelManager, count: int) -> float:
    """Seconds taken to create ``count`` spans the way a request handler would."""
    started = time.perf_counter()
    for i in range(count // 2):
        with otel.span("handle", attributes={"request.index": i}), otel.span("work"):
            pass
    return time.perf_counter() - started


def clean_env(**extra: str) -> dict[str, str]:
    """The process environment without any OTEL_* / KAOS_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KAOS_OTEL_"))}
    return {**env, **extra}


def run_python(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- a forked process ------------------------------------------------------------------------------


def test_a_child_forked_while_a_label_or_diagnostics_lock_is_held_can_take_it() -> None:
    """A thread holding the label bounds' lock or the diagnostics' lock as the process forks
    leaves it held in the child, where no thread will release it: the child gets new ones (else
    its first new tool name, or its first diagnostic, waits for ever)."""
    result = run_python(
        """
        import os, time
        from kaos_otel import LabelBounds, catalog
        from kaos_otel import _internal_log

        bounds = LabelBounds()
        with bounds._lock, _internal_log._lock:  # as another thread would hold them
            pid = os.fork()
            if pid == 0:
                named = bounds.bound(catalog.GEN_AI_TOOL_NAME, "web_search")
                _internal_log.log_once("child", "kaos-otel: a child's diagnostic")
                print("CHILD", named, flush=True)
                os._exit(0)
        deadline = time.monotonic() + 20
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                print("CHILD HUNG", flush=True)
                break
            time.sleep(0.05)
        """,
        clean_env(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["CHILD web_search"], result.stdout + result.stderr


def test_a_child_forked_while_a_queue_or_loss_count_lock_is_held_flushes_and_counts() -> None:
    """The export thread holding a queue's flush lock or its wake-up event's lock, or a request
    thread counting a dropped span, as the process forks: the child gets its own (else its exit
    flush, or its first dropped span, waits for ever)."""
    result = run_python(
        """
        import os, time
        from kaos_otel.exporters.batch import BatchQueue, BatchSettings
        from kaos_otel.exporters.health import TelemetryHealth

        health = TelemetryHealth()
        queue = BatchQueue("traces", lambda batch: None, health, BatchSettings(schedule_delay_ms=50))
        with queue._flush_lock, queue._wake._cond, health._lock:  # as those threads would hold them
            pid = os.fork()
            if pid == 0:
                queue.put(1)
                flushed = queue.force_flush(5)
                health.record_drop("traces", "queue_full")
                print("CHILD", flushed, health.dropped(), flush=True)
                os._exit(0)
        deadline = time.monotonic() + 20
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                print("CHILD HUNG", flush=True)
                break
            time.sleep(0.05)
        """,
        clean_env(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["CHILD True 1"], result.stdout + result.stderr


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_process_forked_right_after_the_manager_exports_its_own_spans(
    protocol: str, otlp_receiver: OtlpReceiver
) -> None:
    """gunicorn --preload forks workers right after the app (and its manager) is built. A module
    an export thread is importing at that moment keeps its import lock held in the child for
    ever, so the export threads import nothing as they start: what they need is imported on the
    thread that builds the manager."""
    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    result = run_python(
        """
        import importlib.abc, os, sys, threading

        importing_threads = set()

        class WatchImports(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.startswith("opentelemetry.instrumentation"):
                    importing_threads.add(threading.current_thread().name)
                return None

        sys.meta_path.insert(0, WatchImports())
        from kaos_otel import KaosOtelManager
        otel = KaosOtelManager("forked", bridge_logging=False)
        pid = os.fork()
        if pid == 0:
            with otel.span("child"):
                pass
            print("CHILD", otel.force_flush(5), otel.health.dropped(), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        print("IMPORTED ON", sorted(importing_threads))
        print("PARENT", otel.shutdown(5))
        """,
        clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL=protocol),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "IMPORTED ON ['MainThread']" in lines, result.stdout
    assert "CHILD True 0" in lines, result.stdout
    assert otlp_receiver.wait_for(lambda r: [s.name for s in r.spans()] == ["child"], 10)


def test_multiprocessing_children_forked_from_the_manager_export_their_spans(
    otlp_receiver: OtlpReceiver,
) -> None:
    """A multiprocessing child leaves with os._exit, past atexit: the spans it queued are flushed
    by multiprocessing's exit finalizers (a Process and ProcessPoolExecutor workers, fork method).
    Its metrics are not: it holds the parent's totals too, which would be counted again."""
    result = run_python(
        """
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from kaos_otel import KaosOtelManager

        otel = KaosOtelManager("forked", bridge_logging=False)
        otel.record_compaction("agent")  # the parent's, before any fork

        def work(i):
            with otel.span(f"work {i}"):
                return i

        fork = multiprocessing.get_context("fork")
        child = fork.Process(target=work, args=(0,))
        child.start()
        child.join()
        idle = fork.Process(target=print, args=("idle",))  # queues nothing: leaves at once
        idle.start()
        idle.join()
        with ProcessPoolExecutor(2, mp_context=fork) as pool:
            print("RESULTS", sorted(pool.map(work, [1, 2, 3])))
        print("PARENT", otel.shutdown(5))
        """,
        clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint),
    )
    assert result.returncode == 0, result.stderr
    assert "RESULTS [1, 2, 3]" in result.stdout, result.stdout
    names = ["work 0", "work 1", "work 2", "work 3"]
    assert otlp_receiver.wait_for(lambda r: sorted(s.name for s in r.spans()) == names, 10)
    points = otlp_receiver.metric_points()
    assert [p.value for p in points if p.name == catalog.KAOS_MEMORY_COMPACTIONS] == [1]  # the parent's


def test_a_child_of_a_plain_fork_leaving_through_atexit_exports_its_spans_not_the_parents_metrics(
    otlp_receiver: OtlpReceiver,
) -> None:
    """A child of ``os.fork()`` that ends its interpreter normally runs ``atexit``: the manager it
    inherited sends the child's spans, but not the parent's metric totals, which the child holds
    too and the parent exports (a backend would count them twice)."""
    result = run_python(
        """
        import os, sys
        from kaos_otel import KaosOtelManager

        otel = KaosOtelManager("forked", bridge_logging=False)
        otel.record_compaction("agent")  # the parent's, before the fork
        pid = os.fork()
        if pid == 0:
            with otel.span("child"):
                pass
            sys.exit(0)  # through atexit, as a script's forked child ends
        os.waitpid(pid, 0)
        print("PARENT", otel.shutdown(5))
        """,
        clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint),
    )
    assert result.returncode == 0, result.stderr
    assert "PARENT True" in result.stdout, result.stdout
    assert otlp_receiver.wait_for(lambda r: [s.name for s in r.spans()] == ["child"], 10)
    points = otlp_receiver.metric_points()
    assert [p.value for p in points if p.name == catalog.KAOS_MEMORY_COMPACTIONS] == [1]  # the parent's


def test_a_manager_made_in_a_forked_pool_worker_exports_at_the_workers_end(
    otlp_receiver: OtlpReceiver,
) -> None:
    """A manager made in a worker (a Pool initializer: no manager in the parent) is shut down by
    multiprocessing's exit finalizers, which run before the worker's os._exit: its spans and its
    metrics leave."""
    result = run_python(
        """
        import multiprocessing
        from kaos_otel import KaosOtelManager

        otel = None

        def start_worker():
            global otel
            otel = KaosOtelManager("worker", bridge_logging=False)

        def work(i):
            with otel.span(f"work {i}"):
                otel.record_compaction("agent")
            return i

        pool = multiprocessing.get_context("fork").Pool(2, initializer=start_worker)
        print("RESULTS", sorted(pool.map(work, [1, 2, 3, 4], chunksize=1)))
        pool.close()
        pool.join()
        """,
        clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint),
    )
    assert result.returncode == 0, result.stderr
    assert "RESULTS [1, 2, 3, 4]" in result.stdout, result.stdout
    names = ["work 1", "work 2", "work 3", "work 4"]
    assert otlp_receiver.wait_for(lambda r: sorted(s.name for s in r.spans()) == names, 10)
    compactions = catalog.KAOS_MEMORY_COMPACTIONS
    assert otlp_receiver.wait_for(
        lambda r: sum(p.value or 0 for p in r.metric_points() if p.name == compactions) == 4, 10
    )


# --- a dead or hanging collector -----------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dead_collector_never_blocks_and_shutdown_meets_its_deadline(
    protocol: str, closed_port: int, managers: list[KaosOtelManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = KaosOtelManager(global_providers=False, bridge_logging=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    dead = KaosOtelManager(global_providers=False, bridge_logging=False)
    managers.extend([baseline, dead])
    assert not baseline.settings.exporting and dead.settings.exporting

    # get the exporter busy retrying against the closed port before measuring
    with dead.span("warm-up"):
        pass
    spans_of_request_path(baseline, 200)
    assert dead.force_flush(timeout=0.3) is False  # still retrying: the export is in progress

    baseline_s = min(spans_of_request_path(baseline, 1000) for _ in range(2))
    dead_s = min(spans_of_request_path(dead, 1000) for _ in range(2))
    # no blocking: the dead collector costs the request path at most a small constant factor
    assert dead_s < 4 * baseline_s + 0.3, (dead_s, baseline_s)
    assert dead_s < 5.0

    started = time.monotonic()
    finished = dead.shutdown(timeout=2)
    elapsed = time.monotonic() - started
    assert finished is False
    assert elapsed < 2 + SHUTDOWN_SLACK_S, elapsed
    # every span is accounted for as lost by the time shutdown returns
    assert dead.health.dropped("traces") == 1 + 2 * 1000, dead.health.snapshot()
    started = time.monotonic()
    assert dead.shutdown(timeout=2) is False  # a second call: the first's result, at once
    assert time.monotonic() - started < SHUTDOWN_SLACK_S


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_hanging_collector_shutdown_meets_its_deadline(
    protocol: str, make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="test.pipeline")
    otlp_receiver.set_failure("hang")
    otel = make_otel(protocol)
    log = logging.getLogger("test.pipeline")
    for i in range(50):
        with otel.span("request"):
            log.info("handled %d", i)

    started = time.monotonic()
    finished = otel.shutdown(timeout=2)
    elapsed = time.monotonic() - started
    assert finished is False
    assert elapsed < 2 + SHUTDOWN_SLACK_S, elapsed
    assert otel.health.dropped("traces") == 50, otel.health.snapshot()
    assert otel.health.dropped("logs") >= 50, otel.health.snapshot()
    assert otlp_receiver.spans() == []


def test_metric_points_a_missed_shutdown_deadline_leaves_unsent_are_counted(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """The collector hanging: the final metric export is still running when the shutdown's
    deadline passes; its data points are counted as lost, as the spans are (they were not)."""
    otlp_receiver.set_failure("hang")
    otel = make_otel()
    otel.record_compaction("agent")
    with otel.span("request"):
        pass
    assert otel.shutdown(timeout=1) is False
    snapshot = otel.health.snapshot()
    # the export gets the shutdown's deadline too: it fails (export_failed) or is given up on
    # (shutdown) first, and its points are counted either way, once
    assert sum(count for (signal, _), count in snapshot.items() if signal == "metrics") > 0, snapshot
    assert snapshot.get(("traces", "shutdown"), 0) == 1, snapshot


def test_a_metric_export_given_up_on_is_counted_once() -> None:
    """The points of an export still running when a shutdown gives up on it are counted as lost
    then, and not again when the export fails later."""
    started, release = threading.Event(), threading.Event()

    class Hanging(MetricExporter):
        def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            started.set()
            release.wait(10)
            return MetricExportResult.FAILURE

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            pass

    reader = InMemoryMetricReader()
    counter = MeterProvider(metric_readers=[reader]).get_meter("test").create_counter("calls")
    for outcome in ("success", "error", "canceled"):
        counter.add(1, {"outcome": outcome})
    data = reader.get_metrics_data()
    assert data is not None
    health = TelemetryHealth()
    exporter = sanitizing_metric_exporter(Hanging, health, ContentPolicy())
    exporting = threading.Thread(target=exporter.export, args=(data,))
    exporting.start()
    assert started.wait(5)
    assert exporter.abandon() == 3
    release.set()
    exporting.join(5)
    assert health.snapshot() == {("metrics", "shutdown"): 3}


def test_a_timeout_of_no_deadline_or_not_a_number_never_raises(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """``math.inf`` (no deadline) waits as long as it takes; NaN waits for nothing. Neither
    raises into the app (``OverflowError``, ``ValueError`` from the waits and conversions)."""
    otel = make_otel()
    with otel.span("request"):
        pass
    otel.record_compaction("agent")
    assert isinstance(otel.force_flush(timeout=math.nan), bool)
    assert otel.force_flush(timeout=math.inf) is True
    assert otel.shutdown(timeout=math.inf) is True
    assert [span.name for span in otlp_receiver.spans()] == ["request"]
    assert otel.health.snapshot() == {}


def test_force_flush_after_shutdown_counts_no_loss(make_otel: MakeOtel) -> None:
    """A flush after the shutdown has nothing to send: the metric totals the shutdown exported
    are not sent again to a stopped exporter, which refused them and had them counted as lost."""
    otel = make_otel()
    otel.record_compaction("agent")
    assert otel.shutdown(timeout=5) is True
    assert otel.force_flush(timeout=5) is True
    assert otel.health.snapshot() == {}


@pytest.mark.parametrize("second_call", ["force_flush", "shutdown"])
def test_a_flush_or_shutdown_during_a_shutdown_that_misses_its_deadline_says_so(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, second_call: str
) -> None:
    """A flush or a second shutdown while another thread's shutdown waits on a hung collector
    waits for it and says that not everything left (each said ``True`` at once, and the span was
    then lost)."""
    otlp_receiver.set_failure("hang")
    otel = make_otel()
    with otel.span("held"):
        pass
    stopping = threading.Thread(target=otel.shutdown, kwargs={"timeout": 1.0})
    stopping.start()
    time.sleep(0.2)
    try:
        assert getattr(otel, second_call)(timeout=3) is False
    finally:
        stopping.join(5)
    assert otel.health.dropped("traces") == 1
    assert otlp_receiver.spans() == []


def test_a_manager_made_in_a_child_on_its_parents_providers_leaves_the_parents_totals_alone(
    otlp_receiver: OtlpReceiver,
) -> None:
    """A child forked from a process with a manager makes its own: it finds the parent's global
    providers, totals included; at its end its spans leave, the parent's metric points do not
    leave a second time."""
    result = run_python(
        """
        import multiprocessing
        from kaos_otel import KaosOtelManager

        parent = KaosOtelManager("parent", bridge_logging=False)
        parent.record_compaction("agent")

        def work():
            otel = KaosOtelManager("child", bridge_logging=False)
            with otel.span("the child's"):
                pass

        child = multiprocessing.get_context("fork").Process(target=work)
        child.start()
        child.join()
        print("PARENT", parent.shutdown(5))
        """,
        clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint),
    )
    assert result.returncode == 0, result.stderr
    assert otlp_receiver.wait_for(lambda r: [s.name for s in r.spans()] == ["the child's"], 10)
    points = otlp_receiver.metric_points()
    assert [p.value for p in points if p.name == catalog.KAOS_MEMORY_COMPACTIONS] == [1]


def test_what_a_forked_child_could_not_send_is_counted_and_said_as_it_ends(
    otlp_receiver: OtlpReceiver,
) -> None:
    """The collector hanging: a multiprocessing child's spans, already inside an export call
    (nothing left in the queue), do not leave within its exit flush; they are counted as lost and
    a warning says so, the span inside the parent's export call at the fork not among them."""
    otlp_receiver.set_failure("hang")
    result = run_python(
        """
        import multiprocessing, time
        from kaos_otel import KaosOtelManager

        otel = KaosOtelManager("forked", bridge_logging=False)
        with otel.span("the parent's"):
            pass
        time.sleep(0.5)  # the parent's export thread takes it, and hangs: not the child's to count

        def work():
            for i in range(5):
                with otel.span(f"work {i}"):
                    pass
            time.sleep(0.5)  # the export thread takes them, and hangs
            print("QUEUED", otel.queued(), flush=True)

        child = multiprocessing.get_context("fork").Process(target=work)
        child.start()
        child.join()
        print("EXIT CODE", child.exitcode)
        otel.shutdown(1)
        """,
        # OTLP/HTTP: a child forked while a gRPC call is in flight may crash (gRPC's own limit)
        clean_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.http_endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_BSP_SCHEDULE_DELAY="50",
        ),
    )
    assert result.returncode == 0, result.stderr
    assert "QUEUED 0" in result.stdout and "EXIT CODE 0" in result.stdout, result.stdout
    said = [line for line in result.stderr.splitlines() if "as this process ends" in line]
    assert said == [
        "kaos-otel: telemetry never exported as this process ends (collector slow or down): 5 traces"
    ], result.stderr


def test_managers_left_running_are_shut_down_at_exit_within_one_deadline(otlp_receiver: OtlpReceiver) -> None:
    """Three managers nobody shut down, the collector hanging: the process leaves within one
    shutdown deadline (5 s), not three in a row, and each counts what it could not send."""
    otlp_receiver.set_failure("hang")
    started = time.monotonic()
    result = run_python(
        """
        import atexit

        # registered before kaos-otel's exit handler, so it runs after it
        atexit.register(lambda: print("DROPPED", [otel.health.dropped("traces") for otel in managers]))
        from kaos_otel import KaosOtelManager

        managers = [KaosOtelManager(f"left-{i}", global_providers=False) for i in range(3)]
        for otel in managers:
            with otel.span("unsent"):
                pass
        """,
        clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint, OTEL_BSP_SCHEDULE_DELAY="50"),
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert elapsed < 5 + 3 + SHUTDOWN_SLACK_S, elapsed  # one deadline, and the interpreter's start
    assert "DROPPED [1, 1, 1]" in result.stdout, result.stdout


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_force_flush_is_bounded_and_the_pipeline_recovers(
    protocol: str, make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otlp_receiver.set_failure("hang")
    otel = make_otel(protocol)
    for _ in range(10):
        with otel.span("during-outage"):
            pass
    started = time.monotonic()
    assert otel.force_flush(timeout=1) is False
    assert time.monotonic() - started < 1 + SHUTDOWN_SLACK_S

    otlp_receiver.set_failure("ok")  # the exporter's retry delivers what was pending
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) == 10, 15), otlp_receiver.spans()
    assert otel.force_flush(timeout=5) is True
    assert otel.health.dropped("traces") == 0


def alive_flush_threads(within_s: float) -> int:
    """kaos-otel's flush threads still running once those that end do so (within ``within_s``)."""
    deadline = time.monotonic() + within_s
    threads = [t for t in threading.enumerate() if t.name.startswith("kaos-otel-force_flush")]
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return sum(thread.is_alive() for thread in threads)


def test_flushes_against_a_hung_collector_leave_one_thread_behind_not_one_each(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """An app flushing at the end of every request (a serverless handler, say) while the collector
    hangs: each flush gives up at its deadline, but the metric export it started outlives it (the
    SDK's reader exports under a lock, past its timeout). Every flush left a thread queued behind
    that lock, each to export in turn: threads grew with the requests."""
    otlp_receiver.set_failure("hang")
    otel = make_otel()
    for _ in range(30):
        with otel.span("request"):
            pass
        otel.record_compaction("agent")
        assert otel.force_flush(timeout=0.05) is False
    assert alive_flush_threads(within_s=2) <= 1  # the metric export the collector holds
    otlp_receiver.set_failure("ok")
    assert otel.force_flush(timeout=15) is True
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) == 30, 15), otlp_receiver.spans()
    points = otlp_receiver.metric_points()
    assert 30 in [p.value for p in points if p.name == catalog.KAOS_MEMORY_COMPACTIONS]


def test_full_queue_drops_are_counted(make_otel: MakeOtel, otlp_receiver: OtlpReceiver) -> None:
    otlp_receiver.set_failure("hang")
    otel = make_otel(environ={"OTEL_BSP_MAX_QUEUE_SIZE": "20", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "20"})
    started = time.perf_counter()
    for _ in range(300):
        with otel.span("burst"):
            pass
    assert time.perf_counter() - started < 5.0
    snapshot = otel.health.snapshot()
    assert snapshot.get(("traces", "queue_full"), 0) >= 300 - 2 * 20, snapshot
    assert otel.shutdown(timeout=1) is False
    # whatever did not fall out of the queue was lost at shutdown: all 300 accounted for
    assert otel.health.dropped("traces") == 300, otel.health.snapshot()


def test_a_schedule_delay_longer_than_any_wait_is_capped_and_everything_is_exported(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, unsaid_notices: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A delay or interval meant as "never on a schedule" (longer than a lock can wait) stopped the
    export threads with ``OverflowError``: no span or record was exported (only counted lost at
    shutdown), and no metric, not even at shutdown."""
    huge = "99999999999999"
    variables = ("OTEL_BSP_SCHEDULE_DELAY", "OTEL_BLRP_SCHEDULE_DELAY", "OTEL_METRIC_EXPORT_INTERVAL")
    otel = make_otel(environ=dict.fromkeys(variables, huge))
    with otel.span("request"):
        logging.getLogger("test.pipeline").warning("handled")
    assert otel.force_flush(timeout=5) is True
    assert [span.name for span in otlp_receiver.spans()] == ["request"]
    assert [log.body for log in otlp_receiver.logs()] == ["handled"]
    otel.record_compaction("agent")
    assert otel.shutdown(timeout=5) is True
    points = otlp_receiver.metric_points()
    assert [p.value for p in points if p.name == catalog.KAOS_MEMORY_COMPACTIONS] == [1]
    assert otel.health.snapshot() == {}
    for name in variables:
        assert f"{name} ({huge} ms) is longer than a wait can be" in caplog.text


class HeldExport:
    """An export function that records each batch and holds the export thread until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, batch: Sequence[int]) -> None:
        self.batches.append(list(batch))
        self.started.set()
        self.release.wait(5)


TWO_PER_BATCH = BatchSettings(max_queue_size=10, max_export_batch_size=2, schedule_delay_ms=60_000)


def test_only_full_batches_leave_early_the_rest_waits_as_in_the_sdk() -> None:
    """When the queue fills a batch, only full batches are exported (the SDK's batch processors'
    rule): an item queued while that export runs waits for the schedule delay or a flush."""
    export = HeldExport()
    queue = BatchQueue("traces", export, TelemetryHealth(), TWO_PER_BATCH)
    try:
        queue.put(0)
        queue.put(1)  # a full batch: the export thread wakes
        assert export.started.wait(5)
        queue.put(2)
        export.release.set()
        time.sleep(0.2)
        assert export.batches == [[0, 1]]
        assert len(queue) == 1
        assert queue.force_flush(5)
        assert export.batches == [[0, 1], [2]]
    finally:
        export.release.set()
        queue.shutdown(5)


def test_shutdown_during_a_full_batch_export_still_exports_the_rest() -> None:
    """Shutdown while the export thread sends a full batch: the items left behind it are exported
    before the thread ends (they were lost, uncounted: n mod the batch size at every exit)."""
    export, health = HeldExport(), TelemetryHealth()
    queue = BatchQueue("traces", export, health, TWO_PER_BATCH)
    queue.put(0)
    queue.put(1)  # a full batch: the export thread wakes and sends only full batches
    assert export.started.wait(5)
    queue.put(2)
    stopping = threading.Thread(target=queue.shutdown, args=(5,))
    stopping.start()
    time.sleep(0.1)  # shutdown() has marked the queue closed while [0, 1] is being sent
    export.release.set()
    stopping.join(5)
    assert export.batches == [[0, 1], [2]]
    assert health.dropped() == 0


# --- disabled, no endpoint, host providers -------------------------------------------------------


async def test_sdk_disabled_is_a_noop(make_otel: MakeOtel, otlp_receiver: OtlpReceiver) -> None:
    otel = make_otel(environ={"OTEL_SDK_DISABLED": "true"})
    assert otel.enabled is False
    log = logging.getLogger("test.pipeline.disabled")

    def work(x: int) -> int:
        return x

    assert otel.traced()(work) is work  # the decorator is the identity: zero overhead

    first = otel.span_begin("a", attributes={"k": "v"})
    assert otel.span_begin("b") is first  # one shared handle: nothing allocated per call
    otel.span_success(first)
    otel.span_failure(first, ValueError("x"))
    with otel.span("c") as span:
        span.set_attribute("k", "v")
        assert not trace.get_current_span().get_span_context().is_valid
    with pytest.raises(KeyError), otel.span("d"):
        raise KeyError("passes through")
    with otel.invoke_agent("agent") as run:
        with otel.agent_step(run), otel.model_call("agent", "m") as model:
            model.record_usage(1, 2)
            model.record_messages("hi", "hello")
        with otel.tool_call("agent", "t", arguments={"a": 1}), otel.delegation("agent", "sub"):
            log.warning("inside a disabled span")
    otel.record_window_tokens("agent", 10)
    started = time.perf_counter()
    for _ in range(10_000):
        with otel.span("cheap"):
            pass
    assert time.perf_counter() - started < 1.0
    assert otel.force_flush(1) is True
    assert otel.shutdown(1) is True

    # a working manager on the same receiver proves the pipeline would have delivered
    sentinel = make_otel(environ={"OTEL_SDK_DISABLED": ""})
    with sentinel.span("sentinel"):
        pass
    assert sentinel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= 1, 10)
    assert [s.name for s in otlp_receiver.spans()] == ["sentinel"]
    assert otlp_receiver.logs() == []
    # the sentinel's own health metric reports zeros; nothing came from the disabled manager
    assert {(p.name, p.value) for p in otlp_receiver.metric_points()} <= {("kaos.telemetry.dropped", 0)}


def test_no_endpoint_says_so_once_and_never_errors() -> None:
    result = run_python(
        """
        import logging, sys
        logging.basicConfig(
            level=logging.DEBUG, stream=sys.stdout, format="%(levelname)s %(name)s %(message)s"
        )
        from kaos_otel import KaosOtelManager
        first = KaosOtelManager("no-endpoint")
        second = KaosOtelManager("no-endpoint-private", global_providers=False)
        for otel in (first, second):
            with otel.invoke_agent("agent") as run, otel.agent_step(run):
                with otel.span("work"):
                    logging.getLogger("app").info("working")
            @otel.traced()
            def f():
                return 1
            assert f() == 1
        print("RESULT", first.force_flush(2), first.shutdown(2), second.shutdown(2))
        """,
        clean_env(),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "RESULT True True True" in lines, result.stdout
    notices = [line for line in lines if "no OTLP endpoint" in line]
    assert len(notices) == 1, result.stdout
    assert notices[0].startswith("WARNING kaos_otel ")  # visible even without logging configured
    assert "kaos-otel receive" in notices[0]
    others = [line for line in lines if line.startswith(("ERROR", "WARNING", "CRITICAL"))]
    assert others == notices, result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_without_a_log_exporter_python_still_prints_warnings_and_errors() -> None:
    """Nothing exports logs (no endpoint, or ``OTEL_LOGS_EXPORTER=none``): the manager adds no
    handler to the root logger, which would turn off Python's own output of warnings and errors
    to stderr in an app that configured no logging, and send them nowhere."""
    code = """
        import logging
        from kaos_otel import configure
        otel = configure(service_name="quiet")
        logging.getLogger("app").error("the app's own error")
        print("HANDLERS", len(logging.getLogger().handlers))
        otel.shutdown(2)
        """
    for environ in ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_LOGS_EXPORTER": "none"}):
        result = run_python(code, {**clean_env(), **environ})
        assert result.returncode == 0, result.stderr
        assert "the app's own error" in result.stderr, (environ, result.stderr)
        assert "HANDLERS 0" in result.stdout


def test_logging_configured_after_the_manager_works_and_keeps_the_bridge() -> None:
    """``basicConfig`` after the managers prints (it did nothing: the root had the bridges), and
    ``dictConfig`` keeps the bridges (it removed them); shutting them down, in any order, puts the
    original functions back. Python's own output stays as without the bridges: a warning no
    handler prints and a message that does not format are reported once, however many bridges."""
    result = run_python(
        """
        import logging, logging.config, sys
        from kaos_otel import KaosOtelManager
        from kaos_otel._logs import KaosLoggingHandler
        functions = lambda: (logging.basicConfig, logging.config.dictConfig, logging.config.fileConfig)
        original = functions()
        app = KaosOtelManager("late-logging", endpoint="http://127.0.0.1:9")
        library = KaosOtelManager("library", endpoint="http://127.0.0.1:9", global_providers=False)
        bridged = lambda: sum(isinstance(h, KaosLoggingHandler) for h in logging.getLogger().handlers)
        logging.getLogger("app").warning("printed once by the last resort")
        logging.getLogger("app").warning("bad format %d", "x")
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="CONSOLE %(message)s")
        logging.getLogger("app").info("after basicConfig")
        print("BRIDGED", bridged())
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": False, "root": {"handlers": []}})
        print("BRIDGED", bridged())
        app.shutdown(1)
        library.shutdown(1)
        print("RESTORED", functions() == original)
        """,
        clean_env(),
    )
    assert result.returncode == 0, result.stderr
    assert "CONSOLE after basicConfig" in result.stdout.splitlines()
    assert result.stdout.count("BRIDGED 2") == 2, result.stdout
    assert "RESTORED True" in result.stdout
    assert result.stderr.count("printed once by the last resort") == 1, result.stderr
    # a message that does not format is reported as logging reports it, once, not dropped silently
    assert result.stderr.count("--- Logging error ---") == 1, result.stderr
    assert "bad format %d" in result.stderr


@pytest.mark.parametrize(
    ("host_providers", "environ", "notice"),
    [
        ("", {}, "traces, metrics and logs are not exported"),
        ("traces", {}, "metrics and logs are not exported"),
        ("traces metrics logs", {}, None),
        # a signal with an endpoint of its own, one on the console, one turned off: the rest is named
        ("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9"}, "metrics and logs are not"),
        ("", {"OTEL_LOGS_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}, "traces are not exported"),
    ],
)
def test_no_endpoint_notice_names_only_what_the_manager_built(
    host_providers: str, environ: dict[str, str], notice: str | None
) -> None:
    """The host's own providers export as the host set them up: the notice leaves them out, and
    signals the manager exports or was told not to."""
    result = run_python(
        f"""
        import logging, sys
        logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(name)s %(message)s")
        from opentelemetry import _logs, metrics, trace
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        host = {host_providers.split()!r}
        if "traces" in host:
            trace.set_tracer_provider(TracerProvider())
        if "metrics" in host:
            metrics.set_meter_provider(MeterProvider())
        if "logs" in host:
            _logs.set_logger_provider(LoggerProvider())
        from kaos_otel import KaosOtelManager
        otel = KaosOtelManager("host-app")
        with otel.invoke_agent("agent"):
            pass
        print("RESULT", otel.shutdown(2))
        """,
        {**clean_env(), **environ},
    )
    assert result.returncode == 0, result.stderr
    flushed = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" not in environ  # that one points at a closed port
    assert f"RESULT {flushed}" in result.stdout, result.stdout
    notices = [line for line in result.stdout.splitlines() if "no OTLP endpoint" in line]
    if notice is None:
        assert notices == [], result.stdout
    else:
        assert len(notices) == 1 and f"); {notice}" in notices[0], result.stdout


@pytest.mark.parametrize(
    ("setup", "adopted", "advice", "more_advice"),
    [
        (
            "from opentelemetry.sdk.trace import TracerProvider\ntrace.set_tracer_provider(TracerProvider())",
            "traces",
            "(by opentelemetry-instrument or the application) and export as they were set up: endpoint "
            "given here not applied to them; set the OTEL_EXPORTER_OTLP_*, OTEL_BSP_* and",
            "",
        ),
        (
            "import kaos_otel\nkaos_otel.configure()",  # the distro's call
            "traces, metrics, logs",
            "(by an earlier kaos-otel manager, service.name='unknown_service",  # :python3 or :python
            "were set up: endpoint given here not applied to them; give them to that manager",
        ),
    ],
    ids=["host-tracer-provider", "configured-first"],
)
def test_an_endpoint_given_in_code_that_cannot_reach_the_host_providers_is_said(
    setup: str, adopted: str, advice: str, more_advice: str, otlp_receiver: OtlpReceiver
) -> None:
    script = [
        "import logging, sys",
        'logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(message)s")',
        "from opentelemetry import trace",
        setup,
        "from kaos_otel import KaosOtelManager",
        f'otel = KaosOtelManager("host-app", endpoint="{otlp_receiver.grpc_endpoint}")',
        'print("RESULT", otel.shutdown(2))',
    ]
    result = run_python("\n".join(script), clean_env())
    assert result.returncode == 0, result.stderr
    notices = [line for line in result.stdout.splitlines() if "export as they were set up" in line]
    assert len(notices) == 1, result.stdout
    assert f"providers of {adopted} were set up" in notices[0] and advice in notices[0]
    assert more_advice in notices[0]


def test_host_installed_providers_are_used(otlp_receiver: OtlpReceiver) -> None:
    result = run_python(
        """
        import sys
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        host = TracerProvider(resource=Resource.create({"service.name": "host-app"}))
        host.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1], insecure=True)))
        trace.set_tracer_provider(host)

        from kaos_otel import KaosOtelManager
        otel = KaosOtelManager("kaos-side", endpoint=sys.argv[1])
        assert otel.tracer_provider is host, otel.tracer_provider
        with otel.invoke_agent("agent"):
            pass
        otel.shutdown(timeout=5)  # must leave the host's provider working
        with trace.get_tracer("host").start_as_current_span("after-kaos-shutdown"):
            pass
        host.shutdown()
        print("OK")
        """.replace("sys.argv[1]", repr(otlp_receiver.grpc_endpoint)),
        clean_env(),
    )
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= 2, 10)
    spans = otlp_receiver.spans()
    assert sorted(s.name for s in spans) == ["after-kaos-shutdown", "invoke_agent agent"]
    assert {s.service_name for s in spans} == {"host-app"}  # exported once, by the host's pipeline


@pytest.mark.parametrize(
    ("span_exporter", "log_exporter", "said"),
    [
        ("ConsoleSpanExporter()", None, "traces"),
        ("sanitized_exporter(ConsoleSpanExporter())", None, None),
        ("sanitized_exporter(ConsoleSpanExporter())", "ConsoleLogRecordExporter()", "logs"),
        ("ConsoleSpanExporter()", "ConsoleLogRecordExporter()", "traces, logs"),
    ],
)
def test_host_providers_without_the_content_safety_layer_are_said(
    span_exporter: str, log_exporter: str | None, said: str | None
) -> None:
    """Spans and logs going to a host's providers whose exporters no one wrapped would leave the
    process unmasked: the manager says so once, naming the signals, with the fix; not for a
    signal whose exporter the host wrapped."""
    logs = (
        f"logs = LoggerProvider(); logs.add_log_record_processor(SimpleLogRecordProcessor({log_exporter}))\n"
        "set_logger_provider(logs)"
        if log_exporter
        else ""
    )
    result = run_python(
        f"""
        from opentelemetry import trace
        from opentelemetry._logs import set_logger_provider
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import ConsoleLogRecordExporter, SimpleLogRecordProcessor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, ConsoleSpanExporter
        from kaos_otel import KaosOtelManager, sanitized_exporter

        host = TracerProvider()
        host.add_span_processor(SimpleSpanProcessor({span_exporter}))
        trace.set_tracer_provider(host)
        LOGS
        otel = KaosOtelManager("kaos-side")
        KaosOtelManager("second")
        otel.shutdown(timeout=2)
        """.replace("LOGS", logs.replace("\n", "\n        ")),
        clean_env(),
    )
    assert result.returncode == 0, result.stderr
    notices = [line for line in result.stderr.splitlines() if "do not mask secrets" in line]
    if said is None:
        assert notices == []
    else:
        assert len(notices) == 1, result.stderr
        assert f"providers of {said} were set up" in notices[0]
        assert "by opentelemetry-instrument or the application" in notices[0]
        assert "kaos_otel.sanitized_exporter" in notices[0] and "OTEL_PYTHON_DISTRO=kaos" in notices[0]


@pytest.mark.parametrize("second_manager", [False, True])
def test_shutdown_says_what_was_never_exported(closed_port: int, second_manager: bool) -> None:
    """With the collector down the loss metric cannot leave the process either: shutdown says
    what was lost, by signal and reason, on the process's own log. A second manager on the same
    providers, shut down last, stops them: it reports (and abandons) the first one's items."""
    result = run_python(
        f"""
        import logging
        from kaos_otel import KaosOtelManager
        otel = KaosOtelManager("lossy", endpoint="http://127.0.0.1:{closed_port}")
        second = KaosOtelManager() if {second_manager} else None  # no resource of its own to report
        for i in range(20):
            with otel.span(f"s{{i}}"):
                logging.getLogger("app").warning("w %d", i)
        otel.shutdown(timeout=2)
        if second is not None:
            second.shutdown(timeout=2)
        """,
        clean_env(),
    )
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "telemetry never exported" in line]
    assert "20 traces (" in line and "20 logs (" in line, line


def test_two_managers_on_the_global_providers_export_each_log_once(otlp_receiver: OtlpReceiver) -> None:
    result = run_python(
        """
        import logging
        from kaos_otel import KaosOtelManager
        first = KaosOtelManager("app", endpoint=ENDPOINT)
        second = KaosOtelManager("library", endpoint=ENDPOINT)  # finds and uses first's providers
        assert second.tracer_provider is first.tracer_provider
        assert second.logger_provider is first.logger_provider
        logging.getLogger("app").warning("exported once")
        second.shutdown(timeout=2)  # the library goes away; the app's logging still works
        logging.getLogger("app").warning("still exported")
        first.shutdown(timeout=5)
        print("OK")
        """.replace("ENDPOINT", repr(otlp_receiver.grpc_endpoint)),
        clean_env(),
    )
    assert result.returncode == 0, result.stderr
    assert otlp_receiver.wait_for(lambda r: len(r.logs()) >= 3, 10)
    notices = [log.body for log in otlp_receiver.logs() if log.body.startswith("kaos-otel:")]
    # the second manager's service name cannot reach the providers it found, and it says whose they are
    assert len(notices) == 1 and "keep their resource: service.name given here not applied" in notices[0]
    assert "by an earlier kaos-otel manager, service.name='app'" in notices[0]
    assert "set OTEL_SERVICE_NAME" in notices[0] and "global_providers=False" in notices[0]
    bodies = sorted(log.body for log in otlp_receiver.logs() if log.body not in notices)
    assert bodies == ["exported once", "still exported"]
    assert "keep their resource" in result.stderr  # printed too: the app configured no logging


# --- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_protocol_from_environment_is_honoured(
    protocol: str, make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """Each receiver port speaks one protocol, so arrival proves the transport used."""
    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    otel = make_otel(
        environ={"OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    )
    assert {p.value for p in otel.settings.protocols.values()} == {protocol}
    with otel.span(f"via {protocol}"):
        logging.getLogger("test.pipeline").warning("a log over %s", protocol)
    assert otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) == 1 and len(r.logs()) >= 1, 10)
    assert otlp_receiver.spans()[0].name == f"via {protocol}"
    assert otel.health.dropped() == 0


@pytest.mark.parametrize(
    ("value", "exported", "protocol"),
    [
        ("otlp", True, "grpc"),
        (" OTLP , console ", True, "grpc"),
        ("otlp_proto_http", True, "http/protobuf"),  # the names opentelemetry-instrument knows
        ("otlp_proto_grpc", True, "grpc"),
        (" ", True, "grpc"),  # blank: as unset
        ("console", False, "grpc"),
        ("none", False, "grpc"),
        ("zipkin", False, "grpc"),
    ],
)
def test_exporter_variable_chooses_otlp_and_its_protocol(
    monkeypatch: pytest.MonkeyPatch, value: str, exported: bool, protocol: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)
    settings = TelemetrySettings.from_env()
    assert ("traces" in settings.endpoints) is exported
    assert settings.protocols["traces"] == protocol
    assert settings.to_console("traces") is ("console" in value)
    assert "metrics" in settings.endpoints  # other signals as they were


@pytest.mark.parametrize(
    ("exporter", "variable", "traces", "said"),
    [
        ("otlp_proto_grpc", "http/protobuf", OtlpProtocol.GRPC, "using 'otlp_proto_grpc'"),
        ("otlp_proto_http", "http/json", OtlpProtocol.HTTP_PROTOBUF, None),  # not a known protocol
    ],
)
def test_an_exporter_name_and_a_known_protocol_variable_that_disagree_are_said(
    exporter: str,
    variable: str,
    traces: OtlpProtocol,
    said: str | None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    unsaid_notices: None,
) -> None:
    """As the SDK's configurator: the exporter's name wins, and a conflict with a protocol the SDK
    knows is reported."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", exporter)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", variable)
    assert TelemetrySettings.from_env().protocols["traces"] is traces
    conflicts = [r.getMessage() for r in caplog.records if "conflicting values" in r.getMessage()]
    expected = [f"kaos-otel: conflicting values for traces OTLP exporter protocol, {said}"] if said else []
    assert conflicts == expected


def test_a_blank_endpoint_argument_counts_as_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """``endpoint=os.environ.get("COLLECTOR", "")``: the exporters read the variables themselves."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    blank = TelemetrySettings.from_env(endpoint="")
    assert blank.endpoint is None
    assert blank.endpoints == TelemetrySettings.from_env().endpoints


@pytest.mark.parametrize(
    ("environ", "overrides"),
    [({"OTEL_EXPORTER_OTLP_PROTOCOL": "HTTP/PROTOBUF"}, {}), ({}, {"protocol": "http/json"})],
)
def test_a_protocol_kaos_otel_cannot_build_is_said(
    environ: dict[str, str],
    overrides: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    unsaid_notices: None,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    settings = TelemetrySettings.from_env(**overrides)
    assert set(settings.protocols.values()) == {OtlpProtocol.GRPC}
    said = [r.getMessage() for r in caplog.records if "is not one of grpc, http/protobuf" in r.getMessage()]
    assert len(said) == 1 and [*environ.values(), *overrides.values()][0] in said[0]


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ({"span_max_queue_size": 0}, ValueError),
        ({"span_max_queue_size": -5}, ValueError),
        ({"span_schedule_delay_ms": True}, TypeError),
        ({"metric_export_interval_ms": "100"}, TypeError),
        ({"export_timeout_s": 0.0}, ValueError),
        ({"metric_export_interval_ms": float("inf")}, ValueError),
        ({"span_schedule_delay_ms": 0.4}, ValueError),  # 0 once rounded
        ({"span_max_queue_size": 10**400}, ValueError),
        ({"headers": ["ab", "cd"]}, TypeError),  # not pairs, though dict() would take them
        ({"headers": {"x-retries": 3}}, TypeError),  # gRPC refuses every export with it
        ({"headers": "api-key=abc"}, TypeError),
        ({"resource_attributes": ["team"]}, TypeError),
        ({"redactor": None}, TypeError),
    ],
)
def test_an_argument_no_exporter_could_use_is_refused_by_name(
    override: dict[str, object], error: type[Exception]
) -> None:
    (name,) = override
    with pytest.raises(error, match=f"kaos-otel: {name} must be"):
        KaosOtelManager("refused", global_providers=False, **override)  # type: ignore[arg-type]


def test_numbers_and_pairs_an_exporter_can_use_are_taken_as_before() -> None:
    message = http.client.HTTPMessage()  # keys() and [] without being a Mapping, as dict() reads it
    message["X-Tenant"] = "acme"
    settings = TelemetrySettings.from_env(
        metric_export_interval_ms=1500.0,  # interval_s * 1000
        span_max_queue_size=64.0,
        export_timeout_s=2,
        headers=message,
        resource_attributes=[("team", "search")],
    )
    assert (settings.metric_export_interval_ms, settings.span_max_queue_size) == (1500, 64)
    assert settings.export_timeout_s == 2.0
    assert settings.headers == {"x-tenant": "acme"}  # lowercased as the SDK reads the variables: gRPC
    assert settings.resource_attributes == {"team": "search"}
    assert TelemetrySettings.from_env(headers=[("API-Key", "abc")]).headers == {"api-key": "abc"}


@pytest.mark.parametrize(
    ("setting", "capture", "said"),
    [("spans", "NO_CONTENT", True), ("false", "NO_CONTENT", False), ("span_only", "SPAN_ONLY", False)],
)
def test_a_content_capture_setting_naming_no_mode_captures_nothing_and_says_so(
    setting: str,
    capture: str,
    said: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    unsaid_notices: None,
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", setting)
    assert TelemetrySettings.from_env().capture_content == capture
    assert TelemetrySettings.from_env(capture_content=setting).capture_content == capture
    notices = [r.getMessage() for r in caplog.records if "no content is captured" in r.getMessage()]
    assert len(notices) == int(said), notices


def test_disabled_false_cannot_override_sdk_disabled_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, unsaid_notices: None
) -> None:
    """The SDK's providers read OTEL_SDK_DISABLED themselves: a manager claiming to be on would
    export nothing."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert TelemetrySettings.from_env(disabled=False).disabled
    assert any("disabled=False cannot override" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("variable", "protocol", "port"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", 4317),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf", 4318),
    ],
)
def test_the_no_endpoint_notice_names_the_receive_port_of_the_protocol(
    variable: str,
    protocol: str,
    port: int,
    managers: list[KaosOtelManager],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    unsaid_notices: None,
) -> None:
    monkeypatch.setenv(variable, protocol)
    managers.append(KaosOtelManager(global_providers=False, bridge_logging=False))
    notices = [r.getMessage() for r in caplog.records if "no OTLP endpoint" in r.getMessage()]
    assert len(notices) == 1 and f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{port} " in notices[0]


@pytest.mark.parametrize(
    ("variable", "value"),
    [("OTEL_TRACES_EXPORTER", "otlp_proto_http"), ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")],
)
def test_with_protocols_that_differ_the_no_endpoint_notice_names_an_endpoint_per_signal(
    variable: str,
    value: str,
    managers: list[KaosOtelManager],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    unsaid_notices: None,
) -> None:
    """HTTP for traces alone: one endpoint for all would send the others' gRPC to the HTTP port."""
    monkeypatch.setenv(variable, value)
    managers.append(KaosOtelManager(global_providers=False, bridge_logging=False))
    (notice,) = [r.getMessage() for r in caplog.records if "no OTLP endpoint" in r.getMessage()]
    assert (
        "set OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4318/v1/traces "
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=http://127.0.0.1:4317 "
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT=http://127.0.0.1:4317 ("
    ) in notice


def test_constructor_overrides_and_per_signal_endpoints(
    make_otel: MakeOtel,
    otlp_receiver: OtlpReceiver,
    managers: list[KaosOtelManager],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the environment says gRPC at the HTTP port; the constructor's protocol wins
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.http_endpoint)
    otel = KaosOtelManager(protocol="http/protobuf", global_providers=False)
    managers.append(otel)
    with otel.span("override"):
        pass
    assert otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: [s.name for s in r.spans()] == ["override"], 10)

    # a per-signal endpoint is used as given
    otlp_receiver.clear()
    traces_only = make_otel(
        environ={
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{otlp_receiver.http_endpoint}/v1/traces",
        }
    )
    assert set(traces_only.settings.endpoints) == {"traces"}
    with traces_only.span("per-signal"):
        pass
    assert traces_only.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: [s.name for s in r.spans()] == ["per-signal"], 10)


@pytest.mark.parametrize(
    "environ",
    [
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
        {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        {"OTEL_TRACES_EXPORTER": "otlp_proto_http"},
    ],
    ids=["base-protocol", "traces-protocol", "exporter-name"],
)
def test_endpoint_argument_takes_the_path_of_the_protocol_the_environment_chose(
    environ: dict[str, str],
    otlp_receiver: OtlpReceiver,
    managers: list[KaosOtelManager],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The endpoint in code, the protocol from the environment: HTTP still posts to /v1/traces."""
    for name, value in {"OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none", **environ}.items():
        monkeypatch.setenv(name, value)
    otel = KaosOtelManager(endpoint=otlp_receiver.http_endpoint, global_providers=False)
    managers.append(otel)
    assert otel.settings.endpoints["traces"] == f"{otlp_receiver.http_endpoint}/v1/traces"
    with otel.span("endpoint in code"):
        pass
    assert otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: [s.name for s in r.spans()] == ["endpoint in code"], 10)
    assert otel.health.dropped() == 0


def test_exporter_logging_is_not_fed_back_into_the_pipeline(
    make_otel: MakeOtel,
    otlp_receiver: OtlpReceiver,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At DEBUG the HTTP exporter's urllib3 logs every request; exporting those would never end."""
    caplog.set_level(logging.DEBUG)
    for name in ("urllib3", "urllib3.connectionpool"):  # in case an earlier dictConfig disabled them
        monkeypatch.setattr(logging.getLogger(name), "disabled", False)
        caplog.set_level(logging.DEBUG, logger=name)
    otel = make_otel("http/protobuf")
    with otel.span("s"):
        logging.getLogger("app").info("the only record")
    for _ in range(3):
        assert otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: len(r.logs()) >= 1, 10)
    time.sleep(0.3)  # let a feedback loop, if any, show itself
    assert otel.force_flush(5)
    assert [log.body for log in otlp_receiver.logs()] == ["the only record"]
    assert any(r.name.startswith("urllib3") for r in caplog.records)  # they were logged locally


def test_an_added_exporters_own_logging_is_not_fed_back_either(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """An exporter the app adds to the manager's logger provider runs on the SDK's batch thread,
    which marks its exports as suppressed instrumentation: what it logs is not exported again."""
    second_backend = InMemoryLogRecordExporter()  # type: ignore[no-untyped-call]

    def export_and_log(batch: Sequence[Any]) -> Any:
        logging.getLogger("app.second_backend").warning("sent %d records", len(batch))
        return InMemoryLogRecordExporter.export(second_backend, batch)

    second_backend.export = export_and_log  # type: ignore[method-assign]
    otel = make_otel()
    added = BatchLogRecordProcessor(
        sanitized_exporter(second_backend, otel.content_policy), schedule_delay_millis=50
    )
    otel.logger_provider.add_log_record_processor(added)  # type: ignore[attr-defined]
    try:
        logging.getLogger("app").warning("the only record")
        time.sleep(0.5)  # both batch threads export; a feedback loop, if any, shows itself
        assert otel.force_flush(5)
        assert [log.body for log in otlp_receiver.logs()] == ["the only record"]
        assert len(second_backend.get_finished_logs()) == 1
    finally:
        second_backend.export = InMemoryLogRecordExporter.export.__get__(second_backend)  # type: ignore[method-assign]
        added.shutdown()  # type: ignore[no-untyped-call]


def test_extra_values_and_the_handler_level_from_the_environment(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """``extra=`` objects arrive converted, without the SDK's "Invalid type" warning in the app's
    own output; ``OTEL_PYTHON_LOG_HANDLER_LEVEL`` sets the bridge's level, as the contrib handler's."""
    caplog.set_level(logging.INFO)
    otel = make_otel(environ={"OTEL_PYTHON_LOG_HANDLER_LEVEL": "warning"})
    app = logging.getLogger("app")
    app.info("below the bridge's level")
    at = datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)
    extra = {"at": at, "total": decimal.Decimal("9.99"), "ids": (uuid.UUID(int=7),), "order": 2**64 + 5}
    app.warning("order placed", extra=extra)
    assert otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: len(r.logs()) >= 1, 10)
    (record,) = otlp_receiver.logs()
    assert record.body == "order placed"
    assert {k: record.attributes[k] for k in extra} == {
        "at": str(at), "total": "9.99", "ids": (str(uuid.UUID(int=7)),), "order": str(2**64 + 5)
    }  # fmt: skip
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")], caplog.text


def test_a_structure_logged_as_the_message_arrives_as_a_structured_body(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """A mapping or sequence logged as the message, with no arguments (structlog's event dict
    through ``ProcessorFormatter.wrap_for_formatter``), is the record's body as a structure, as
    OpenTelemetry's own handler exports it; secrets in it are masked, other objects are text."""
    otel = make_otel()
    app = logging.getLogger("app")
    key = "sk-" + "a" * 40
    event = {"event": "order placed", "order": 7, "at": datetime.date(2026, 1, 2), "api_key": key}
    app.warning(event)
    app.warning(["step", 2])
    app.warning(decimal.Decimal("9.99"))
    app.warning("%(event)s", event)  # arguments: the message formatted, as always
    assert otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: len(r.logs()) >= 4, 10)
    bodies = [record.body for record in otlp_receiver.logs()]
    assert bodies == [
        {"event": "order placed", "order": 7, "at": "2026-01-02", "api_key": "[REDACTED]"},
        ("step", 2),
        "9.99",
        "order placed",
    ]


def test_a_large_structure_logged_as_the_message_is_capped_and_its_batch_arrives(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """A structured body takes no more text than a text body may: three event dicts holding a
    conversation of 200 long messages each do not make a request the receiver refuses (4 MiB),
    which would lose the small record sent with them."""
    otel = make_otel()
    app = logging.getLogger("app")
    for _ in range(3):
        app.warning({"event": "conversation", "messages": ["m" * 8000] * 200})
    app.warning("the small one")
    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(r.logs()) >= 4, 10)
    bodies = [record.body for record in otlp_receiver.logs()]
    cap = otel.content_policy.max_value_length
    assert bodies[-1] == "the small one"
    assert all(isinstance(body, dict) and len(json.dumps(body)) < cap + 256 for body in bodies[:3])


def test_a_warning_below_the_bridges_level_still_reaches_stderr() -> None:
    """With ``OTEL_PYTHON_LOG_HANDLER_LEVEL=error`` and no logging configured, a warning is not
    exported, and Python still prints it (its last resort), as without the bridge."""
    code = """
        import logging
        from kaos_otel import KaosOtelManager
        otel = KaosOtelManager("svc", global_providers=False)
        logging.getLogger("app").warning("disk almost full")
        otel.shutdown(1)
    """
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_PYTHON_LOG_HANDLER_LEVEL="error")
    done = run_python(code, env)
    assert done.returncode == 0, done.stderr
    assert "disk almost full" in done.stderr


def test_a_private_manager_bridges_next_to_opentelemetrys_handler_on_the_global_provider(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """An OpenTelemetry handler on the root logger sends to the global provider: a private
    manager's own provider gets its records from its own bridge."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the SDK's handler, as old as the range
        from opentelemetry.sdk._logs import LoggingHandler

        theirs = LoggingHandler(logger_provider=LoggerProvider())
    root = logging.getLogger()
    root.addHandler(theirs)
    try:
        otel = make_otel()
        logging.getLogger("app").warning("to the private manager")
        assert otel.force_flush(5)
        assert otlp_receiver.wait_for(lambda r: len(r.logs()) >= 1, 10)
        assert [log.body for log in otlp_receiver.logs()] == ["to the private manager"]
    finally:
        root.removeHandler(theirs)


def test_settings_never_touch_os_environ(make_otel: MakeOtel) -> None:
    otel = make_otel(environ={"OTEL_SERVICE_NAME": "svc", "OTEL_RESOURCE_ATTRIBUTES": "a=b"})
    before = dict(os.environ)
    with otel.span("s"):
        pass
    otel.shutdown(2)
    assert dict(os.environ) == before
    assert otel.settings.resource_attributes is None  # the SDK reads OTEL_RESOURCE_ATTRIBUTES itself


def test_the_resource_hashes_once_and_like_the_sdks(
    make_otel: MakeOtel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OTLP encoders hash each exported span's resource; the SDK's recomputes it every time."""
    otel = make_otel(environ={"OTEL_SERVICE_NAME": "svc"})
    resource = otel.tracer_provider.resource  # type: ignore[attr-defined]
    plain = Resource(resource.attributes, resource.schema_url)
    assert resource == plain and hash(resource) == hash(plain)
    assert {plain: "grouped"}[resource] == "grouped"
    assert _hashes_recomputed(monkeypatch, [resource]) == 0
    otel.shutdown(2)


def test_a_host_providers_spans_are_exported_with_a_resource_hashed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``sanitized_exporter`` on a host's own provider, the exported copies carry an equal
    resource whose hash is not recomputed per span."""
    exported = InMemorySpanExporter()
    resource = Resource.create({"service.name": "host-app"})
    provider = TracerProvider(resource=resource)
    exporter = sanitized_exporter(exported)
    assert isinstance(exporter, SpanExporter)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for name in ("first", "second"):
        provider.get_tracer("host").start_span(name).end()
    spans = exported.get_finished_spans()
    assert [span.resource for span in spans] == [resource, resource]
    assert len({hash(span.resource) for span in spans}) == 1
    assert _hashes_recomputed(monkeypatch, [span.resource for span in spans]) == 0
    provider.shutdown()


def _hashes_recomputed(monkeypatch: pytest.MonkeyPatch, resources: Iterable[object]) -> int:
    """How many of ``resources`` compute the SDK's ``Resource`` hash again when hashed."""
    recomputed: list[Resource] = []

    def recomputing_hash(self: Resource) -> int:
        recomputed.append(self)
        return 0

    monkeypatch.setattr(Resource, "__hash__", recomputing_hash)
    for resource in resources:
        hash(resource)
    return len(recomputed)


def test_a_manager_after_one_that_shut_the_global_providers_down_still_exports(
    otlp_receiver: OtlpReceiver,
) -> None:
    result = run_python(
        """
        import logging, sys
        logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(name)s %(message)s")
        from kaos_otel import KaosOtelManager
        first = KaosOtelManager("first", endpoint=ENDPOINT)
        first.shutdown(5)  # a test's teardown, an app reload: the global providers stay, shut down
        second = KaosOtelManager("second", endpoint=ENDPOINT)
        with second.invoke_agent("agent"):
            logging.getLogger("app").warning("after the reload")
        print("RESULT", second.force_flush(5), second.shutdown(5))
        """.replace("ENDPOINT", repr(otlp_receiver.grpc_endpoint)),
        clean_env(),
    )
    assert result.returncode == 0, result.stderr
    assert "RESULT True True" in result.stdout, result.stdout
    assert otlp_receiver.wait_for(lambda r: bool(r.spans() and r.logs() and r.metric_points()), 10)
    assert [s.name for s in otlp_receiver.spans()] == ["invoke_agent agent"]
    assert [str(log.body) for log in otlp_receiver.logs()] == ["after the reload"]
    warnings = [line for line in result.stdout.splitlines() if "was shut down by an earlier manager" in line]
    assert len(warnings) == 3, result.stdout  # tracer, meter and logger provider, once each


def _configure_logging_until(stop: threading.Event) -> None:
    while not stop.is_set():
        logging.config.dictConfig({"version": 1, "incremental": True})


def test_a_bridge_kept_while_dictconfig_runs_stays_on_the_root() -> None:
    """A ``dictConfig`` handler factory that makes a manager (one exists already): ``dictConfig``
    then replaced the root's handlers, the new bridge with them, and the new manager's records
    were never exported."""
    code = """
        import logging, logging.config, os
        from kaos_otel import KaosOtelManager, console_handler
        from kaos_otel._logs import KaosLoggingHandler

        first = KaosOtelManager("first", global_providers=False)
        made = []

        def factory():
            made.append(KaosOtelManager("second", global_providers=False))
            return console_handler()

        logging.config.dictConfig({"version": 1, "disable_existing_loggers": False,
            "handlers": {"console": {"()": factory}}, "root": {"handlers": ["console"]}})
        bridges = [h for h in logging.getLogger().handlers if isinstance(h, KaosLoggingHandler)]
        providers = [h.logger_provider for h in bridges]
        print(len(made), sum(any(p is m.logger_provider for p in providers) for m in (first, *made)))
        os._exit(0)
        """
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KAOS_OTEL_"))}
    environ |= {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_METRICS_EXPORTER": "none"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "2"], "the second manager made, both bridges on the root"


def test_a_released_bridge_never_comes_back_through_a_concurrent_dictconfig() -> None:
    """``dictConfig`` puts back what it set aside; a bridge released meanwhile must stay out."""
    root = logging.getLogger()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows in ~1 in 5
    came_back = 0
    try:
        for _ in range(500):
            provider = LoggerProvider(shutdown_on_exit=False)
            bridge = KaosLoggingHandler(provider, ContentPolicy())
            keep_on_root(bridge)
            stop = threading.Event()

            thread = threading.Thread(target=_configure_logging_until, args=(stop,))
            thread.start()
            release_bridges_to([provider])  # what a pipeline's shutdown does
            stop.set()
            thread.join()
            if bridge in root.handlers:
                came_back += 1
                root.removeHandler(bridge)
    finally:
        sys.setswitchinterval(interval)
    assert came_back == 0


def test_root_logging_kept_undoes_what_a_block_does_to_the_root_logger() -> None:
    """An import's ``basicConfig`` (``force=True`` removes the app's handlers) is undone whole."""
    closed: list[logging.Handler] = []

    class Closing(logging.NullHandler):
        def close(self) -> None:
            closed.append(self)
            super().close()

    root = logging.getLogger()
    mine = Closing()
    level, handlers = root.level, list(root.handlers)
    root.addHandler(mine)
    try:
        with root_logging_kept():
            logging.basicConfig(level=logging.DEBUG, force=True)  # closes and removes mine
            closed.clear()
            added = Closing()
            root.addHandler(added)
        assert (root.level, root.handlers) == (level, [*handlers, mine])
        assert closed == [added]  # what the block added is closed; what it removed is back, open
    finally:
        root.removeHandler(mine)
