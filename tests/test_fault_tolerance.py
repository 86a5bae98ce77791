"""Fault tolerance: what users fear most from a telemetry SDK, each provoked for real.

A collector killed and restarted mid-run, a collector that accepts connections and never answers,
values of 10 MB and objects that do not serialise, ten thousand spans at once across tasks and
threads, and a shutdown while an export is stuck. In each case the agent code never sees an
error, every wait is bounded, and what is lost is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from net_support import free_port
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kaos_otel import ContentPolicy, KaosOtelManager, SpanHandle, catalog, run_in_executor_in_context
from kaos_otel._logs import KaosLoggingHandler
from kaos_otel.exporters import SanitizingSpanExporter, TelemetryHealth
from kaos_otel.receiver import OtlpReceiver, ReceivedSpan

MakeManager = Callable[..., KaosOtelManager]
SPANS_PER_REQUEST = 6
TEN_MB = 10 * 2**20
VALUE_LIMIT = 8192


@pytest.fixture
def make_manager() -> Iterator[MakeManager]:
    """Private-provider managers with a fast export schedule, all shut down after the test."""
    built: list[KaosOtelManager] = []

    def make(endpoint: str, protocol: str = "grpc", **overrides: Any) -> KaosOtelManager:
        settings: dict[str, Any] = {
            "protocol": protocol,
            "span_schedule_delay_ms": 50,
            "export_timeout_s": 1.0,
            "global_providers": False,
            "bridge_logging": False,
            **overrides,
        }
        manager = KaosOtelManager("fault-tolerance", endpoint=endpoint, **settings)
        built.append(manager)
        return manager

    yield make
    for manager in built:
        manager.shutdown(timeout=1)


class Blackhole:
    """A TCP server that accepts every connection, reads what it is sent, and never answers."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.1)
        self.port = int(self._server.getsockname()[1])
        self.received = 0
        self._connections: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="blackhole", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._server.accept()
                connection.setblocking(False)
                self._connections.append(connection)
            except TimeoutError:
                pass
            for connection in list(self._connections):
                with contextlib.suppress(BlockingIOError, OSError):
                    self.received += len(connection.recv(65536))

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        self._stop.set()
        self._thread.join(timeout=5)
        for connection in self._connections:
            connection.close()
        self._server.close()


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    """A collector that accepts connections and never replies."""
    hole = Blackhole()
    yield hole
    hole.close()


def agent_request(otel: KaosOtelManager, index: int, phase: int) -> None:
    """One agent request made of the domain helpers: run, two steps, two model calls, one tool call."""
    with otel.invoke_agent(
        "fault-agent", conversation_id=f"conv-{index}", attributes={"test.phase": phase}
    ) as run:
        with otel.agent_step(run):
            with otel.model_call("fault-agent", "scripted", server_address="127.0.0.1") as call:
                call.record_usage(12, 4, finish_reasons=["tool_calls"])
            with otel.tool_call("fault-agent", "add", call_id=f"call-{index}", arguments={"a": 1, "b": 2}):
                pass
        with otel.agent_step(run), otel.model_call("fault-agent", "scripted") as call:
            call.record_usage(20, 8, finish_reasons=["stop"])


def roots_of_phase(spans: list[ReceivedSpan], phase: int) -> int:
    return sum(1 for span in spans if span.attributes.get("test.phase") == phase)


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


# --- collector killed and restarted --------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_collector_killed_and_restarted_on_the_same_port(protocol: str, make_manager: MakeManager) -> None:
    grpc_port, http_port = free_port(), free_port()
    first = OtlpReceiver(grpc_port=grpc_port, http_port=http_port).start()
    endpoint = first.grpc_endpoint if protocol == "grpc" else first.http_endpoint
    otel = make_manager(endpoint, protocol, export_timeout_s=0.5, metric_export_interval_ms=200)
    requests = 20
    try:
        for i in range(requests):
            agent_request(otel, i, phase=1)
        assert first.wait_for(lambda r: len(r.spans()) == requests * SPANS_PER_REQUEST, 10), len(
            first.spans()
        )
    finally:
        first.stop()  # the collector dies

    for i in range(requests):  # the agent carries on: no error reaches it
        agent_request(otel, i, phase=2)
    assert wait_until(lambda: otel.health.dropped("traces") > 0, 10), otel.health.snapshot()

    second = OtlpReceiver(grpc_port=grpc_port, http_port=http_port).start()  # back on the same port
    try:
        for i in range(requests):
            agent_request(otel, i, phase=3)
        # telemetry resumes
        assert second.wait_for(lambda r: roots_of_phase(r.spans(), 3) == requests, 20), len(second.spans())
        assert otel.force_flush(timeout=5)
        made = 3 * requests * SPANS_PER_REQUEST
        delivered = len(first.spans()) + len(second.spans())
        lost = otel.health.dropped("traces")
        # every span is either delivered or counted as lost, never both and never silently
        assert delivered + lost == made, (delivered, otel.health.snapshot())
        assert roots_of_phase(first.spans(), 1) == requests
        assert roots_of_phase(second.spans(), 2) < requests  # the outage did lose spans

        # ... and the loss reaches the backend itself, as kaos.telemetry.dropped{signal=traces}
        def loss_reported(receiver: OtlpReceiver) -> bool:
            return any(
                point.name == catalog.KAOS_TELEMETRY_DROPPED
                and point.attributes.get(catalog.KAOS_TELEMETRY_SIGNAL) == "traces"
                and (point.value or 0) > 0
                for point in receiver.metric_points()
            )

        assert second.wait_for(loss_reported, 10), [p.name for p in second.metric_points()]
    finally:
        second.stop()


# --- a collector that never answers --------------------------------------------------------------


@pytest.mark.parametrize(
    ("collector", "protocol"),
    [("hanging-receiver", "grpc"), ("blackhole", "grpc"), ("blackhole", "http/protobuf")],
)
def test_collector_that_never_answers_leaves_every_wait_bounded(
    collector: str,
    protocol: str,
    make_manager: MakeManager,
    otlp_receiver: OtlpReceiver,
    blackhole: Blackhole,
) -> None:
    if collector == "hanging-receiver":
        otlp_receiver.set_failure("hang")
        endpoint = otlp_receiver.grpc_endpoint
    else:
        endpoint = blackhole.endpoint
    # the exporter's own timeout is far longer than any wait below
    otel = make_manager(endpoint, protocol, export_timeout_s=30, span_max_queue_size=64)
    with otel.span("first"):
        pass
    assert otel.force_flush(timeout=0.5) is False  # the export of "first" is stuck

    started = time.monotonic()
    for i in range(250):  # spans keep being cheap: nothing waits for the collector
        agent_request(otel, i, phase=1)
    assert time.monotonic() - started < 10

    started = time.monotonic()
    assert otel.force_flush(timeout=1) is False
    assert time.monotonic() - started < 3

    started = time.monotonic()
    assert otel.shutdown(timeout=1.5) is False
    assert time.monotonic() - started < 3.5
    made = 1 + 250 * SPANS_PER_REQUEST
    assert otel.health.dropped("traces") == made, otel.health.snapshot()
    if collector == "blackhole":
        assert blackhole.received > 0  # the exporter did reach it: this was no refused connection
    else:
        assert otlp_receiver.spans() == []


def test_full_queue_drops_the_oldest_without_a_warning_per_span(
    make_manager: MakeManager, otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name.startswith(("kaos_otel", "opentelemetry.sdk")):  # not the exporter's retries
                warnings.append(record.getMessage())

    root = logging.getLogger()  # kaos-otel's own logger and the SDK's propagate here
    monkeypatch.setattr(root, "handlers", [*root.handlers, Collect(logging.WARNING)])
    otlp_receiver.set_failure("hang")
    otel = make_manager(otlp_receiver.grpc_endpoint, export_timeout_s=10, span_max_queue_size=32)
    with otel.span("stuck-in-export"):
        pass
    assert otel.force_flush(timeout=0.3) is False
    made = 500
    for i in range(made):
        with otel.span("burst", attributes={"test.index": i}):
            pass
    assert len(warnings) <= 2, warnings  # no log record built per dropped span
    assert otel.health.snapshot()[("traces", "queue_full")] == made - 32

    otlp_receiver.set_failure("ok")
    assert otel.force_flush(timeout=10)
    received = otlp_receiver.spans()
    indexes = sorted(int(span.attributes["test.index"]) for span in received if span.name == "burst")
    assert indexes == list(range(made - 32, made))  # the newest spans were kept, the oldest dropped
    assert len(received) + otel.health.dropped("traces") == made + 1


# --- huge and unserialisable values --------------------------------------------------------------


class Unprintable:
    """An object whose ``__str__`` and ``__repr__`` raise."""

    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


def test_huge_and_unserialisable_values_are_capped_and_the_batch_arrives(
    make_manager: MakeManager, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_manager(otlp_receiver.grpc_endpoint, capture_content=True, span_schedule_delay_ms=5000)
    huge = "x" * TEN_MB
    circular: list[object] = [1, 2]
    circular.append(circular)
    odd_values: dict[str, object] = {
        "test.object": object(),
        "test.set": {"a", "b"},
        "test.int_keys": {1: "one", (2, 3): "pair"},
        "test.circular": circular,
        "test.unprintable": Unprintable(),
        "test.bytes": b"\x00\xff" * 10,
        "test.mixed_list": [1, "two", 3.0, None],
        "test.generator": (i for i in range(3)),
        "test.nested_unprintable": {"inner": [Unprintable(), circular]},
    }
    with otel.span("huge-in-attributes", attributes={"test.huge": huge}) as span:
        span.set_attribute("test.huge_set", huge)
        span.span.set_attribute("test.huge_raw_sdk", huge)  # the plain OpenTelemetry API
        span.add_event("huge-event", {"test.huge_event": huge})
    with otel.span("failing-with-a-huge-message"):
        try:
            raise ValueError(huge)
        except ValueError as exc:
            otel.span_failure(otel.span_begin("recorded"), exc)
    with otel.span("odd-values", attributes=odd_values) as span:
        for key, value in odd_values.items():
            span.set_attribute(key + ".set", value)
    # enough spans with capped values for one batch of 512 to exceed a gRPC server's 4 MiB limit
    many = 4 * 2**20 // VALUE_LIMIT + 88
    for i in range(many):
        with otel.span("large", attributes={"test.large": huge, "test.index": i}):
            pass
    made = 4 + many
    assert otel.force_flush(timeout=20)

    spans = otlp_receiver.spans()
    assert len(spans) == made, (len(spans), otel.health.snapshot())  # no batch was rejected
    assert otel.health.dropped() == 0, otel.health.snapshot()
    for received in spans:
        values = list(received.attributes.values()) + [
            value for event in received.events for value in event.attributes.values()
        ]
        for value in values:
            if isinstance(value, str):
                assert len(value) <= VALUE_LIMIT, (received.name, len(value))
    by_name = {span.name: span for span in spans}
    huge_span = by_name["huge-in-attributes"]
    for key in ("test.huge", "test.huge_set", "test.huge_raw_sdk"):
        assert huge_span.attributes[key].startswith("xxxx"), key
    assert huge_span.events[0].attributes["test.huge_event"].startswith("xxxx")
    exception = by_name["recorded"].events[0]
    assert exception.name == "exception"
    assert 0 < len(exception.attributes["exception.message"]) <= VALUE_LIMIT
    odd = by_name["odd-values"].attributes
    for key in odd_values:
        for name in (key, key + ".set"):
            assert name in odd, name
            assert isinstance(odd[name], str), (name, odd[name])  # stringified (JSON or str)
    assert "unprintable" in odd["test.unprintable"].lower()


def test_a_burst_of_huge_log_records_is_not_rejected(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capped log records go out in requests a gRPC server accepts (none over its 4 MiB limit),
    however large their ``extra=`` attributes make a batch."""
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "5000")
    otel = KaosOtelManager(
        "fault-tolerance",
        endpoint=otlp_receiver.grpc_endpoint,
        global_providers=False,
        bridge_logging=False,
    )
    handler = KaosLoggingHandler(otel.logger_provider, otel.content_policy)
    logger = logging.getLogger("fault_tolerance.huge_logs")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        records = 4 * 2**20 // VALUE_LIMIT + 88
        large = {f"test.large_{n}": "z" * (TEN_MB // 10) for n in range(4)}  # 5 MiB a batch of 128
        for index in range(records):
            logger.warning("%d %s", index, "y" * (TEN_MB // 10), extra=large)
        assert otel.force_flush(timeout=20)
        assert len(otlp_receiver.logs()) == records, otel.health.snapshot()
        assert otel.health.dropped() == 0, otel.health.snapshot()
        assert all(len(str(log.body)) <= VALUE_LIMIT for log in otlp_receiver.logs())
        assert all(len(log.attributes["test.large_3"]) <= VALUE_LIMIT for log in otlp_receiver.logs())
    finally:
        logger.removeHandler(handler)
        otel.shutdown(timeout=2)


# --- ten thousand spans at once ------------------------------------------------------------------


async def test_ten_thousand_concurrent_spans_across_tasks_and_threads_keep_their_parents(
    make_manager: MakeManager, otlp_receiver: OtlpReceiver
) -> None:
    # the fixture's 1 s export deadline is for dead collectors: a loaded machine can take longer
    # to answer 10,000 spans, which the sender then counts as lost although they arrive
    otel = make_manager(otlp_receiver.grpc_endpoint, span_max_queue_size=20_000, export_timeout_s=30.0)
    tasks, steps, jobs_per_task, work_per_job = 100, 24, 1, 50
    spans_per_task = 1 + 2 * steps + jobs_per_task * (1 + work_per_job)
    assert tasks * spans_per_task == 10_000

    def span_id(handle: SpanHandle) -> str:
        return format(handle.span.get_span_context().span_id, "016x")

    def job(task: int, parent: str) -> int:
        made = 0
        with otel.span("job", attributes={"test.parent": parent, "test.task": task}) as job_span:
            made += 1
            for i in range(work_per_job):
                with otel.span("work", attributes={"test.parent": span_id(job_span), "test.index": i}):
                    made += 1
        return made

    async def task(index: int, executor: ThreadPoolExecutor) -> int:
        made = 0
        with otel.span("task", attributes={"test.task": index}) as root:
            made += 1
            parent = span_id(root)
            for step in range(steps):
                with otel.span("step", attributes={"test.parent": parent, "test.step": step}) as step_span:
                    made += 1
                    await asyncio.sleep(0)
                    with otel.span("inner", attributes={"test.parent": span_id(step_span)}):
                        made += 1
                        await asyncio.sleep(0)
                if step == steps // 2:
                    made += await run_in_executor_in_context(executor, job, index, parent)
        return made

    with ThreadPoolExecutor(max_workers=8) as executor:
        results = await asyncio.gather(*(task(i, executor) for i in range(tasks)), return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert sum(r for r in results if isinstance(r, int)) == 10_000

    assert otel.force_flush(timeout=30)
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= 10_000, 30), len(otlp_receiver.spans())
    spans = otlp_receiver.spans()
    assert len(spans) == 10_000
    assert otel.health.dropped() == 0, otel.health.snapshot()
    by_id = {span.span_id: span for span in spans}
    assert len(by_id) == 10_000
    roots = [span for span in spans if span.parent_span_id is None]
    assert sorted(span.name for span in roots) == ["task"] * tasks
    trace_of_task = {span.attributes["test.task"]: span.trace_id for span in roots}
    for span in spans:
        if span.parent_span_id is None:
            continue
        parent = by_id.get(span.parent_span_id)
        assert parent is not None, f"{span.name} lost its parent"
        assert span.parent_span_id == span.attributes["test.parent"], span.name  # the intended parent
        assert span.trace_id == parent.trace_id
    for job_span in (span for span in spans if span.name == "job"):
        assert job_span.trace_id == trace_of_task[job_span.attributes["test.task"]]


# --- shutdown while an export is in flight -------------------------------------------------------


@pytest.mark.parametrize("collector", ["hanging-receiver", "blackhole"])
def test_shutdown_while_an_export_is_in_flight_is_bounded(
    collector: str, make_manager: MakeManager, otlp_receiver: OtlpReceiver, blackhole: Blackhole
) -> None:
    if collector == "hanging-receiver":
        otlp_receiver.set_failure("hang")
        endpoint = otlp_receiver.grpc_endpoint
    else:
        endpoint = blackhole.endpoint
    otel = make_manager(endpoint, export_timeout_s=60)
    for i in range(20):
        agent_request(otel, i, phase=1)
    assert otel.force_flush(timeout=0.5) is False  # an export is in flight and stuck
    if collector == "blackhole":
        assert wait_until(lambda: blackhole.received > 0, 5)

    errors: list[BaseException] = []
    made_during = 0
    stop = threading.Event()

    def keep_working() -> None:  # the application goes on while it shuts down
        nonlocal made_during
        try:
            while not stop.is_set():
                agent_request(otel, made_during, phase=2)
                made_during += 1
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=keep_working)
    worker.start()
    try:
        time.sleep(0.05)
        started = time.monotonic()
        finished = otel.shutdown(timeout=1)
        elapsed = time.monotonic() - started
        time.sleep(0.05)
    finally:
        stop.set()
        worker.join(timeout=10)
    assert finished is False
    assert elapsed < 3, elapsed
    assert errors == []
    assert made_during > 0
    with otel.span("after-shutdown"):  # still harmless
        pass
    made = (20 + made_during) * SPANS_PER_REQUEST + 1
    assert otel.health.dropped("traces") == made, (made, otel.health.snapshot())


# --- the export path under a failing collector ---------------------------------------------------


class RecordingExporter(SpanExporter):
    """Records the size of every export request; fails them all when told to."""

    def __init__(self, fail: bool) -> None:
        self.requests: list[int] = []
        self.fail = fail

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.requests.append(len(spans))
        return SpanExportResult.FAILURE if self.fail else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_batches_go_out_in_slices_and_after_a_failed_request_a_small_probe_goes_first() -> None:
    finished = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    tracer = provider.get_tracer("slices")
    for i in range(300):
        tracer.start_span("slice", attributes={"test.index": i}).end()
    spans = finished.get_finished_spans()
    inner = RecordingExporter(fail=False)
    health = TelemetryHealth()
    exporter = SanitizingSpanExporter(inner, ContentPolicy(), health)

    def export(fail: bool) -> list[int]:
        inner.fail = fail
        inner.requests.clear()
        assert exporter.export(spans) is (SpanExportResult.FAILURE if fail else SpanExportResult.SUCCESS)
        return inner.requests

    assert export(fail=False) == [256, 44]  # the collector takes them: requests of up to 256
    assert health.dropped() == 0
    assert export(fail=True) == [256]  # the collector refused: the rest of the batch is not sent
    assert health.dropped("traces") == 300  # ... and all of it is counted as lost
    assert export(fail=True) == [64]  # after a failure, a small probe goes first
    assert health.dropped("traces") == 600
    assert export(fail=False) == [64, 236]  # the probe got through: the rest in larger requests
    assert export(fail=False) == [256, 44]  # and the next batch is sliced as before the failure
    assert health.dropped("traces") == 600

    smaller = SanitizingSpanExporter(inner, ContentPolicy(), health, max_request_spans=100)
    inner.requests.clear()
    assert smaller.export(spans) is SpanExportResult.SUCCESS
    assert inner.requests == [100, 100, 100]


class UncleanableSpan(ReadableSpan):
    """A host's span class gone wrong: reading its attributes raises."""

    @property
    def attributes(self) -> Any:
        raise RuntimeError("attributes unavailable")


def test_a_span_that_cannot_be_cleaned_is_counted_alone_and_its_batch_exported() -> None:
    finished = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    for i in range(100):
        provider.get_tracer("mixed").start_span("fine", attributes={"test.index": i}).end()
    spans = list(finished.get_finished_spans())
    spans[40] = UncleanableSpan(name="broken", context=spans[40].context)
    inner = InMemorySpanExporter()
    health = TelemetryHealth()
    assert SanitizingSpanExporter(inner, ContentPolicy(), health).export(spans) is SpanExportResult.SUCCESS
    assert len(inner.get_finished_spans()) == 99
    assert health.dropped("traces") == 1
