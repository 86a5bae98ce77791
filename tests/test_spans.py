"""Span lifecycle in all three styles, exported over real OTLP (gRPC and HTTP/protobuf).

Every assertion is made on what the in-process receiver got: names, kinds, attributes, resource,
parent links, status and exception events.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import logging
import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind

from kaos_otel import (
    KaosOtelManager,
    MemoryScope,
    MemoryTier,
    SpanHandle,
    catalog,
    run_in_executor_in_context,
    submit_in_context,
    wrap_in_context,
)
from kaos_otel._spans import _SpanMark
from kaos_otel.receiver import OtlpReceiver, ReceivedSpan

PROTOCOLS = ["grpc", "http/protobuf"]
DETACH_ERRORS = ("Failed to detach context", "was created in a different Context")
MakeOtel = Callable[..., KaosOtelManager]


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def collect(otel: KaosOtelManager, receiver: OtlpReceiver, count: int) -> dict[str, list[ReceivedSpan]]:
    """Flush and wait until ``count`` spans arrived; spans grouped by name."""
    assert otel.force_flush(5)
    assert receiver.wait_for(lambda r: len(r.spans()) >= count, 10), receiver.spans()
    spans = receiver.spans()
    assert len(spans) == count, sorted(s.name for s in spans)
    by_name: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    return by_name


def one(by_name: dict[str, list[ReceivedSpan]], name: str) -> ReceivedSpan:
    spans = by_name[name]
    assert len(spans) == 1, spans
    return spans[0]


def span_id(handle: SpanHandle) -> str:
    return trace.format_span_id(handle.span.get_span_context().span_id)


def current_name() -> str | None:
    """Name of the current span (``None`` outside any recording span)."""
    span = trace.get_current_span()
    return getattr(span, "name", None) if span.is_recording() else None


def assert_no_detach_errors(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        text = record.getMessage() + (record.exc_text or "")
        assert not any(err in text for err in DETACH_ERRORS), text


def assert_raised_here(exc: BaseException, function: str) -> None:
    """The traceback's innermost frame is still the one that raised (same traceback object chain)."""
    frames = traceback.extract_tb(exc.__traceback__)
    assert frames[-1].name == function, [f.name for f in frames]


# --- explicit style ---------------------------------------------------------------------------


def test_explicit_begin_success_failure(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, protocol: str
) -> None:
    otel = make_otel(
        protocol,
        environ={"OTEL_SERVICE_NAME": "svc-explicit", "OTEL_RESOURCE_ATTRIBUTES": "team=agents,region=eu-1"},
    )
    loop = otel.span_begin("agent.loop", attributes={"loop.max": 3, "loop.tags": ["a", "b"]})
    assert current_name() == "agent.loop"
    step = otel.span_begin("step", SpanKind.CLIENT, {"n": 1})
    assert current_name() == "step"
    otel.span_success(step)
    assert current_name() == "agent.loop"
    failing = otel.span_begin("failing")
    error = ValueError("model said no")
    otel.span_failure(failing, error)
    otel.span_failure(failing, RuntimeError("second end"))  # ending twice is harmless
    otel.span_success(failing)
    assert current_name() == "agent.loop"
    otel.span_success(loop)
    otel.span_success(loop)
    assert not trace.get_current_span().is_recording()

    spans = collect(otel, otlp_receiver, 3)
    root, child, failed = one(spans, "agent.loop"), one(spans, "step"), one(spans, "failing")
    assert root.parent_span_id is None
    assert child.parent_span_id == root.span_id == span_id(loop)
    assert failed.parent_span_id == root.span_id
    assert {child.trace_id, failed.trace_id} == {root.trace_id}
    assert (root.kind, child.kind, failed.kind) == ("INTERNAL", "CLIENT", "INTERNAL")
    assert root.attributes["loop.max"] == 3
    assert root.attributes["loop.tags"] == ("a", "b")
    assert child.attributes["n"] == 1
    assert (root.status_code, child.status_code) == ("UNSET", "UNSET")
    assert root.resource["service.name"] == "svc-explicit"
    assert root.resource["team"] == "agents"
    assert root.resource["region"] == "eu-1"
    assert root.scope_name == "kaos_otel"

    assert failed.status_code == "ERROR"
    assert failed.attributes["error.type"] == "ValueError"
    assert [e.name for e in failed.events] == ["exception"]  # the second failure added nothing
    event = failed.events[0]
    assert event.attributes["exception.type"] == "ValueError"
    assert "RuntimeError" not in str(failed.attributes) + str(event.attributes)


def test_explicit_resource_arguments_override_the_environment(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """Constructor arguments win over ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``; the rest stays."""
    otel = make_otel(
        environ={"OTEL_SERVICE_NAME": "svc-env", "OTEL_RESOURCE_ATTRIBUTES": "mine=1,team=env"},
        service_name="svc-arg",
        resource_attributes={"team": "arg"},
    )
    with otel.span("s"):
        pass
    span = one(collect(otel, otlp_receiver, 1), "s")
    assert span.resource["service.name"] == "svc-arg"
    assert span.resource["mine"] == "1"
    assert span.resource["team"] == "arg"


# --- context manager --------------------------------------------------------------------------


def test_context_manager_spans(make_otel: MakeOtel, otlp_receiver: OtlpReceiver, protocol: str) -> None:
    otel = make_otel(protocol)
    error = KeyError("missing")

    def raise_it() -> None:
        raise error

    with otel.span("outer", SpanKind.SERVER, {"http.route": "/run"}) as outer:
        with otel.span("inner", attributes={"obj": {"k": [1, 2]}}) as inner:
            inner.set_attribute("late", "value")
            inner.add_event("checkpoint", {"at": 1})
        with pytest.raises(KeyError) as caught, otel.span("broken"):
            raise_it()
        assert current_name() == "outer"
    assert caught.value is error
    assert caught.value.__traceback__ is error.__traceback__
    assert_raised_here(caught.value, "raise_it")
    assert outer.is_ended and inner.is_ended
    assert current_name() is None

    spans = collect(otel, otlp_receiver, 3)
    root, child, broken = one(spans, "outer"), one(spans, "inner"), one(spans, "broken")
    assert root.kind == "SERVER"
    assert root.attributes["http.route"] == "/run"
    assert child.parent_span_id == root.span_id
    assert broken.parent_span_id == root.span_id
    assert child.attributes["obj"] == '{"k": [1, 2]}'  # non-primitive stringified
    assert child.attributes["late"] == "value"
    assert [e.name for e in child.events] == ["checkpoint"]
    assert broken.status_code == "ERROR"
    assert broken.attributes["error.type"] == "KeyError"
    assert broken.events[0].name == "exception"
    assert "raise_it" in broken.events[0].attributes["exception.stacktrace"]


# --- decorator --------------------------------------------------------------------------------


async def test_decorator_all_function_kinds(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, protocol: str
) -> None:
    otel = make_otel(protocol)
    seen: dict[str, list[str | None]] = {}

    @otel.traced()
    def plain(x: int) -> int:
        seen.setdefault("plain", []).append(current_name())
        return x + 1

    @otel.traced("coroutine", kind=SpanKind.CLIENT, attributes={"fixed": "attr"})
    async def coroutine(x: int) -> int:
        await asyncio.sleep(0)
        seen.setdefault("coroutine", []).append(current_name())
        return x * 2

    @otel.traced("generator")
    def generator(n: int) -> Iterator[int]:
        for i in range(n):
            seen.setdefault("generator", []).append(current_name())
            with otel.span(f"gen-item-{i}"):
                pass
            yield i

    @otel.traced("async-generator")
    async def async_generator(n: int) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            seen.setdefault("async-generator", []).append(current_name())
            with otel.span(f"agen-item-{i}"):
                pass
            yield i

    with otel.span("caller"):
        assert plain(1) == 2
        assert await coroutine(2) == 4
        gen_out = []
        for item in generator(3):
            # between items the caller's span is current, not the generator's
            gen_out.append((item, current_name()))
            with otel.span(f"consumer-{item}"):
                pass
        agen_out = []
        async for item in async_generator(2):
            agen_out.append((item, current_name()))
        assert current_name() == "caller"

    assert gen_out == [(0, "caller"), (1, "caller"), (2, "caller")]
    assert agen_out == [(0, "caller"), (1, "caller")]
    assert seen == {
        "plain": [f"{test_decorator_all_function_kinds.__qualname__}.<locals>.plain"],
        "coroutine": ["coroutine"],
        "generator": ["generator"] * 3,
        "async-generator": ["async-generator"] * 2,
    }

    spans = collect(otel, otlp_receiver, 1 + 1 + 1 + 1 + 1 + 3 + 3 + 2)
    caller = one(spans, "caller")
    plain_span = one(spans, f"{test_decorator_all_function_kinds.__qualname__}.<locals>.plain")
    coro = one(spans, "coroutine")
    gen = one(spans, "generator")
    agen = one(spans, "async-generator")
    for span in (plain_span, coro, gen, agen):
        assert span.parent_span_id == caller.span_id
        assert span.status_code == "UNSET"
    assert coro.kind == "CLIENT"
    assert coro.attributes["fixed"] == "attr"
    for i in range(3):
        gen_item = one(spans, f"gen-item-{i}")
        assert gen_item.parent_span_id == gen.span_id  # code inside the generator sees its span
        assert gen.start_time_unix_nano <= gen_item.start_time_unix_nano
        assert gen_item.end_time_unix_nano <= gen.end_time_unix_nano  # the span covers the iteration
        assert one(spans, f"consumer-{i}").parent_span_id == caller.span_id
    assert one(spans, "consumer-2").end_time_unix_nano <= gen.end_time_unix_nano
    for i in range(2):
        agen_item = one(spans, f"agen-item-{i}")
        assert agen_item.parent_span_id == agen.span_id
        assert agen.start_time_unix_nano <= agen_item.start_time_unix_nano
        assert agen_item.end_time_unix_nano <= agen.end_time_unix_nano


def test_generator_protocol_send_throw_close_and_return(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()

    @otel.traced("echo")
    def echo() -> Generator[str, str, None]:
        received = yield "ready"
        while True:
            try:
                received = yield f"got {received}"
            except ValueError as exc:
                received = f"handled {exc}"

    @otel.traced("returns")
    def returns() -> Generator[int, None, int]:
        yield 1
        return 42

    def delegate() -> Generator[int, None, None]:
        result = yield from returns()
        yield result

    gen = echo()
    assert next(gen) == "ready"
    assert gen.send("a") == "got a"
    assert gen.throw(ValueError("boom")) == "got handled boom"
    gen.close()  # closing early ends the span canceled (not as an error)
    assert list(delegate()) == [1, 42]

    spans = collect(otel, otlp_receiver, 2)
    assert one(spans, "echo").status_code == "UNSET"
    assert one(spans, "echo").attributes[catalog.KAOS_OUTCOME] == "canceled"
    assert one(spans, "echo").attributes[catalog.ERROR_TYPE] == "GeneratorExit"
    assert one(spans, "returns").status_code == "UNSET"
    assert catalog.ERROR_TYPE not in one(spans, "returns").attributes


async def test_generator_cleanup_on_early_close_runs_inside_its_span(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    otel = make_otel()
    cleanup_saw: list[str | None] = []

    @otel.traced("gen")
    def gen() -> Iterator[int]:
        try:
            yield 1
            yield 2
        finally:
            cleanup_saw.append(current_name())
            with otel.span("gen-cleanup"):
                pass

    @otel.traced("agen")
    async def agen() -> AsyncIterator[int]:
        try:
            yield 1
            yield 2
        finally:
            cleanup_saw.append(current_name())
            with otel.span("agen-cleanup"):
                pass

    with otel.span("caller"):
        for _ in gen():
            break  # the generator is closed early
        async_gen = agen()
        await async_gen.__anext__()
        await async_gen.aclose()  # type: ignore[attr-defined]
        assert current_name() == "caller"
    assert cleanup_saw == ["gen", "agen"]

    spans = collect(otel, otlp_receiver, 5)
    assert one(spans, "gen-cleanup").parent_span_id == one(spans, "gen").span_id
    assert one(spans, "agen-cleanup").parent_span_id == one(spans, "agen").span_id
    assert one(spans, "gen").status_code == one(spans, "agen").status_code == "UNSET"
    assert_no_detach_errors(caplog)


async def test_async_generator_closed_early_ends_span(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()

    @otel.traced("stream")
    async def stream() -> AsyncIterator[int]:
        for i in range(10):
            yield i

    agen = stream()
    assert [await agen.__anext__(), await agen.__anext__()] == [0, 1]
    await agen.aclose()  # type: ignore[attr-defined]
    span = one(collect(otel, otlp_receiver, 1), "stream")
    assert span.status_code == "UNSET"
    assert span.attributes[catalog.KAOS_OUTCOME] == "canceled"  # as a `with` block closed early is
    assert span.attributes[catalog.ERROR_TYPE] == "GeneratorExit"
    assert not span.events
    assert current_name() is None


async def test_user_exceptions_pass_through_unchanged(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, protocol: str
) -> None:
    otel = make_otel(protocol)
    errors = {name: RuntimeError(name) for name in ("sync", "async", "gen", "agen", "explicit")}

    @otel.traced("sync")
    def fail_sync() -> None:
        raise errors["sync"]

    @otel.traced("async")
    async def fail_async() -> None:
        await asyncio.sleep(0)
        raise errors["async"]

    @otel.traced("gen")
    def fail_gen() -> Iterator[int]:
        yield 1
        raise errors["gen"]

    @otel.traced("agen")
    async def fail_agen() -> AsyncIterator[int]:
        yield 1
        raise errors["agen"]

    def explicit() -> None:
        span = otel.span_begin("explicit")
        try:
            raise errors["explicit"]
        except RuntimeError as exc:
            otel.span_failure(span, exc)
            raise

    with pytest.raises(RuntimeError) as caught:
        fail_sync()
    assert caught.value is errors["sync"]
    assert_raised_here(caught.value, "fail_sync")
    with pytest.raises(RuntimeError) as caught:
        await fail_async()
    assert caught.value is errors["async"]
    assert_raised_here(caught.value, "fail_async")
    with pytest.raises(RuntimeError) as caught:
        list(fail_gen())
    assert caught.value is errors["gen"]
    assert_raised_here(caught.value, "fail_gen")
    with pytest.raises(RuntimeError) as caught:
        async for _ in fail_agen():
            pass
    assert caught.value is errors["agen"]
    assert_raised_here(caught.value, "fail_agen")
    with pytest.raises(RuntimeError) as caught:
        explicit()
    assert caught.value is errors["explicit"]
    assert_raised_here(caught.value, "explicit")
    assert current_name() is None

    spans = collect(otel, otlp_receiver, 5)
    for name in errors:
        span = one(spans, name)
        assert span.status_code == "ERROR", name
        assert span.attributes["error.type"] == "RuntimeError"
        assert span.attributes["kaos.outcome"] == "error"
        (event,) = span.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "RuntimeError"
        assert event.attributes["exception.stacktrace"]


# --- context integrity ----------------------------------------------------------------------


def test_out_of_order_end_never_corrupts_context(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    otel = make_otel()
    with otel.span("outer"):
        a = otel.span_begin("a")
        b = otel.span_begin("b")
        otel.span_success(a)  # ended before its child
        assert current_name() == "b"
        c = otel.span_begin("c")
        otel.span_success(c)
        assert current_name() == "b"
        otel.span_success(b)  # a is gone: the nearest open ancestor is current again
        assert current_name() == "outer"
        d = otel.span_begin("d")
        otel.span_success(d)
        assert current_name() == "outer"
    assert current_name() is None

    spans = collect(otel, otlp_receiver, 5)
    outer = one(spans, "outer")
    assert one(spans, "a").parent_span_id == outer.span_id
    assert one(spans, "b").parent_span_id == one(spans, "a").span_id
    assert one(spans, "c").parent_span_id == one(spans, "b").span_id
    assert one(spans, "d").parent_span_id == outer.span_id
    assert_no_detach_errors(caplog)


async def test_spans_a_consumer_hands_to_other_tasks_are_freed_once_ended(make_otel: MakeOtel) -> None:
    """A long-lived task begins each message's span and hands it to a worker task that ends it,
    with messages in flight: the consumer's context must not keep every ended span reachable."""
    otel = make_otel()
    in_flight: set[asyncio.Task[None]] = set()

    async def work(span: SpanHandle) -> None:
        await asyncio.sleep(0.001)
        otel.span_success(span)

    def marks() -> int:
        gc.collect()
        return sum(isinstance(obj, _SpanMark) for obj in gc.get_objects())

    before = marks()
    for message in range(3000):
        span = otel.span_begin("process message", SpanKind.CONSUMER, parent=otel_context.Context())
        task = asyncio.create_task(work(span))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        if message % 3 == 0:
            await asyncio.sleep(0)  # the next messages arrive while earlier ones are in flight
    held = marks() - before - len(in_flight)
    await asyncio.gather(*in_flight)
    assert held < 50, f"{held} ended spans still reachable"


def test_ending_from_another_thread(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    otel = make_otel()
    in_thread: list[str | None] = []
    with otel.span("outer"):
        handle = otel.span_begin("handed-off")

        def end_elsewhere() -> None:
            in_thread.append(current_name())
            otel.span_success(handle)
            in_thread.append(current_name())
            with otel.span("thread-root"):
                pass

        worker = threading.Thread(target=end_elsewhere)
        worker.start()
        worker.join()
        assert handle.is_ended
        after = otel.span_begin("after")  # the ended span is skipped: parent is "outer"
        otel.span_success(after)
        assert current_name() == "outer"
    assert current_name() is None
    assert in_thread == [None, None]

    spans = collect(otel, otlp_receiver, 4)
    outer = one(spans, "outer")
    assert one(spans, "handed-off").parent_span_id == outer.span_id
    assert one(spans, "after").parent_span_id == outer.span_id
    assert one(spans, "thread-root").parent_span_id is None
    assert_no_detach_errors(caplog)


def test_ending_concurrently_from_two_threads_ends_once(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A watchdog failing a call while the worker succeeds it: one end, one metric count."""
    caplog.set_level(logging.WARNING)
    otel = make_otel(environ={"OTEL_BSP_MAX_QUEUE_SIZE": "10000"})
    count = 3000
    handles = [otel.tool_call("agent", "race") for _ in range(count)]
    for handle in handles:  # begun spans nest: leave the context as it was
        otel_context.attach(handle.context)
    otel_context.attach(otel_context.Context())
    start = threading.Barrier(2)

    def end_all(end: Callable[[SpanHandle], None]) -> None:
        start.wait()
        for handle in handles:
            end(handle)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # make the threads interleave as much as possible
    try:
        workers = [
            threading.Thread(target=end_all, args=(lambda h: h.success(),)),
            threading.Thread(target=end_all, args=(lambda h: h.failure(TimeoutError()),)),
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(switch)

    assert otel.force_flush(10)
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= count, 10)
    assert len(otlp_receiver.spans()) == count

    def calls(r: OtlpReceiver) -> float:
        """Tool calls counted: the latest cumulative value of each label set, summed."""
        latest: dict[tuple[tuple[str, object], ...], float] = {}
        for point in r.metric_points():
            if point.name == "kaos.tool.calls":
                labels = tuple(sorted(point.attributes.items()))
                latest[labels] = max(latest.get(labels, 0), point.value or 0)
        return sum(latest.values())

    assert otlp_receiver.wait_for(lambda r: calls(r) >= count, 10)
    assert calls(otlp_receiver) == count
    assert not [r for r in caplog.records if "ended span" in r.getMessage()]
    assert otel.health.dropped() == 0


async def test_ending_from_another_task(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    otel = make_otel()
    with otel.span("outer"):
        handle = otel.span_begin("handed-off")

        async def end_elsewhere() -> str | None:
            otel.span_success(handle)  # this task's context had it current: restored here only
            return current_name()

        assert await asyncio.create_task(end_elsewhere()) == "outer"
        child = otel.span_begin("after")
        otel.span_success(child)
    assert current_name() is None

    spans = collect(otel, otlp_receiver, 3)
    outer = one(spans, "outer")
    assert one(spans, "handed-off").parent_span_id == outer.span_id
    assert one(spans, "after").parent_span_id == outer.span_id
    assert_no_detach_errors(caplog)


async def test_work_that_outlives_its_span_stays_under_it(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A span that ended where it began stays the parent of what was started under it and runs on
    (a task, a pool job), for kaos-otel's spans, another library's spans and the current span log
    records read, as OpenTelemetry's own spans do; a span another library begins there is the
    parent of kaos-otel's spans in it; an explicit parent is taken as given, ended or not."""
    caplog.set_level(logging.DEBUG)
    otel = make_otel()
    other_library = otel.tracer_provider.get_tracer("other-library")
    pool = ThreadPoolExecutor(max_workers=1)
    pool_busy = threading.Event()
    pool.submit(pool_busy.wait)
    seen: dict[str, str] = {}  # the current span's id, as the logging bridge reads it

    def current_span_id() -> str:
        return trace.format_span_id(trace.get_current_span().get_span_context().span_id)

    async def runs_on() -> None:
        await asyncio.sleep(0.01)  # the request has ended
        seen["task"] = current_span_id()
        with otel.span("task-first"):
            pass
        with otel.span("task-second"), other_library.start_as_current_span("GET /cache"), otel.span("parse"):
            pass

    def pool_job() -> None:
        seen["job"] = current_span_id()
        with otel.span("job"):
            pass

    with otel.span("request") as request:
        task = asyncio.create_task(runs_on())
        job = submit_in_context(pool, pool_job)
    with otel.span("queued", parent=request.context):
        pass
    pool_busy.set()
    await task
    job.result()
    pool.shutdown()

    spans = collect(otel, otlp_receiver, 7)
    request_id = one(spans, "request").span_id
    assert seen == {"task": request_id, "job": request_id}
    for name in ("task-first", "task-second", "job", "queued"):
        assert one(spans, name).parent_span_id == request_id, name
    assert one(spans, "parse").parent_span_id == one(spans, "GET /cache").span_id
    assert_no_detach_errors(caplog)


async def test_a_span_left_current_is_skipped_only_where_it_was_made_current(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A handle ended in a task or a ``Context.run`` copy, or out of order, stays current where
    it was begun: kaos-otel's spans there skip it and the enclosing ``with`` block still restores
    its context; a task started under it (a copy) keeps it as parent, as does work started inside
    a decorated generator."""
    caplog.set_level(logging.DEBUG)
    otel = make_otel()
    tasks: list[asyncio.Task[None]] = []

    async def runs_on(name: str) -> None:
        await asyncio.sleep(0.01)
        with otel.span(name):
            pass

    async def end_in_a_task(handle: SpanHandle) -> None:
        otel.span_success(handle)

    @otel.traced("generator")
    async def stream() -> AsyncIterator[int]:
        tasks.append(asyncio.create_task(runs_on("under-generator")))
        yield 1

    with otel.span("request"):
        tasks.append(asyncio.create_task(runs_on("under-request")))  # before the handle below
        handed = otel.span_begin("handed-to-a-task")
        await asyncio.create_task(end_in_a_task(handed))
        with otel.span("after-handed"):
            pass
        ran = otel.span_begin("ended-in-a-copy")
        contextvars.copy_context().run(otel.span_success, ran)
        with otel.span("after-copy"):
            pass
        first = otel.span_begin("ended-first")
        tasks.append(asyncio.create_task(runs_on("under-ended-first")))  # a copy: keeps it
        second = otel.span_begin("ended-second")
        otel.span_success(first)
        otel.span_success(second)
        with otel.span("after-out-of-order"):
            pass
        async for _ in stream():
            pass
    assert current_name() is None  # the request's block restored its context despite the handles
    await asyncio.gather(*tasks)

    spans = collect(otel, otlp_receiver, 12)
    parent_of = {name: one(spans, name).parent_span_id for name in spans}
    name_of = {one(spans, name).span_id: name for name in spans}
    assert {name: name_of.get(parent) for name, parent in parent_of.items() if parent} == {
        "handed-to-a-task": "request",
        "after-handed": "request",
        "ended-in-a-copy": "request",
        "after-copy": "request",
        "ended-first": "request",
        "ended-second": "ended-first",
        "after-out-of-order": "request",
        "under-request": "request",
        "under-ended-first": "ended-first",
        "generator": "request",
        "under-generator": "generator",
    }
    assert_no_detach_errors(caplog)


def test_a_copy_keeps_a_parent_left_current_where_it_was_begun(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Out-of-order ends inside a copy of a context (a task's) that holds a span left current
    where it was begun: the copy skips its own such span, not the one it was started under."""
    caplog.set_level(logging.DEBUG)
    otel = make_otel()
    started_under = otel.span_begin("started-under")
    copy = contextvars.copy_context()  # what a task started now runs in
    later = otel.span_begin("later")
    otel.span_success(started_under)  # out of order, where it was begun
    otel.span_success(later)

    def in_the_copy() -> None:
        first = otel.span_begin("first")
        second = otel.span_begin("second")
        otel.span_success(first)
        otel.span_success(second)
        with otel.span("after"):
            pass

    copy.run(in_the_copy)
    with otel.span("here-after"):
        pass
    spans = collect(otel, otlp_receiver, 6)
    name_of = {one(spans, name).span_id: name for name in spans}
    assert {name: name_of.get(one(spans, name).parent_span_id or "") for name in spans} == {
        "started-under": None, "later": "started-under", "first": "started-under", "second": "first",
        "after": "started-under", "here-after": None,
    }  # fmt: skip
    assert_no_detach_errors(caplog)


async def test_nested_tasks_keep_their_parents(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    otel = make_otel(protocol)

    async def leaf(name: str) -> None:
        with otel.span(name):
            await asyncio.sleep(0.01)

    async def branch(name: str) -> None:
        span = otel.span_begin(name)
        try:
            # interleaved with the sibling branch: each keeps its own current span
            await asyncio.sleep(0.005)
            await asyncio.gather(leaf(f"{name}.leaf1"), asyncio.create_task(leaf(f"{name}.leaf2")))
            assert current_name() == name
        finally:
            otel.span_success(span)

    with otel.span("request"):
        await asyncio.gather(asyncio.create_task(branch("b1")), asyncio.create_task(branch("b2")))
        assert current_name() == "request"

    spans = collect(otel, otlp_receiver, 7)
    request = one(spans, "request")
    for name in ("b1", "b2"):
        branch_span = one(spans, name)
        assert branch_span.parent_span_id == request.span_id
        for leaf_name in (f"{name}.leaf1", f"{name}.leaf2"):
            assert one(spans, leaf_name).parent_span_id == branch_span.span_id
            assert one(spans, leaf_name).trace_id == request.trace_id
    assert_no_detach_errors(caplog)


def _trace_seen_in_a_worker(label: str) -> tuple[str, str, int, str]:
    """The trace and parent span a process pool's worker runs in, the worker's pid, and ``label``."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x"), os.getpid(), label


async def test_process_pool_work_runs_in_the_callers_trace(make_otel: MakeOtel) -> None:
    """A process pool cannot take a context along (``Context`` does not pickle): the helpers hand
    its worker the caller's trace context as W3C headers instead, so the spans a worker makes
    (with a manager of its own) are children of the caller's span; before, the call failed."""
    otel = make_otel()
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool, otel.span("request") as request:
        caller = request.span.get_span_context()
        expected = (format(caller.trace_id, "032x"), format(caller.span_id, "016x"))
        submitted = submit_in_context(pool, _trace_seen_in_a_worker, "submit").result(timeout=60)
        awaited = await run_in_executor_in_context(pool, _trace_seen_in_a_worker, "run-in-executor")
        plain = pool.submit(_trace_seen_in_a_worker, "plain").result(timeout=60)
    assert submitted[:2] == awaited[:2] == expected
    assert submitted[2] != os.getpid()  # run in the worker, with its arguments
    assert (submitted[3], awaited[3]) == ("submit", "run-in-executor")
    assert plain[0] == "0" * 32  # without the helpers the worker is in no trace


async def test_thread_pool_work_keeps_its_parent(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, protocol: str
) -> None:
    otel = make_otel(protocol)

    def work(name: str) -> str | None:
        parent = current_name()
        with otel.span(name):
            pass
        return parent

    with ThreadPoolExecutor(max_workers=2) as pool, otel.span("request"):
        assert submit_in_context(pool, work, "submitted").result() == "request"
        assert await run_in_executor_in_context(pool, work, "run-in-executor") == "request"
        assert await run_in_executor_in_context(None, work, "default-executor") == "request"
        assert await asyncio.to_thread(work, "to-thread") == "request"
        # without the helpers a pool thread does not see the caller's span
        assert pool.submit(work, "plain-submit").result() is None

    spans = collect(otel, otlp_receiver, 6)
    request = one(spans, "request")
    for name in ("submitted", "run-in-executor", "default-executor", "to-thread"):
        assert one(spans, name).parent_span_id == request.span_id, name
        assert one(spans, name).trace_id == request.trace_id
    assert one(spans, "plain-submit").parent_span_id is None


async def test_a_span_a_traced_generator_opens_before_a_yield_is_current_again_after_it(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    otel = make_otel()

    @otel.traced("gen")
    def numbers() -> Iterator[str | None]:
        with otel.span("inner"):
            yield current_name()
            with otel.span("after"):
                pass
            yield current_name()

    @otel.traced("agen")
    async def anumbers() -> AsyncIterator[str | None]:
        with otel.span("ainner"):
            yield current_name()
            with otel.span("aafter"):
                pass
            yield current_name()

    with otel.span("caller"):
        generator = numbers()
        assert next(generator) == "inner"
        assert current_name() == "caller"  # the generator's span is not the caller's meanwhile
        assert list(generator) == ["inner"]
        agenerator = anumbers()
        assert await agenerator.__anext__() == "ainner"
        assert current_name() == "caller"
        assert [item async for item in agenerator] == ["ainner"]

    spans = collect(otel, otlp_receiver, 7)
    for child, parent in (("after", "inner"), ("inner", "gen"), ("aafter", "ainner"), ("ainner", "agen")):
        assert one(spans, child).parent_span_id == one(spans, parent).span_id, child
    assert_no_detach_errors(caplog)


def test_a_function_bound_to_the_context_runs_concurrently_and_leaves_nothing_behind(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    marker: contextvars.ContextVar[str | None] = contextvars.ContextVar("marker", default=None)
    barrier = threading.Barrier(4)

    def work(index: int) -> tuple[str | None, str | None]:
        seen = marker.get()
        marker.set(f"call {index}")
        if index < 4:
            barrier.wait(timeout=10)  # the first four calls inside the bound context at once
        with otel.span(f"work {index}"):
            return current_name(), seen

    with otel.span("request"), ThreadPoolExecutor(max_workers=4) as pool:
        bound = wrap_in_context(work)
        assert list(pool.map(bound, range(4))) == [(f"work {index}", None) for index in range(4)]
        assert bound(4) == ("work 4", None)  # an earlier call's variables are not seen by a later one

    spans = collect(otel, otlp_receiver, 6)
    request = one(spans, "request")
    assert all(one(spans, f"work {index}").parent_span_id == request.span_id for index in range(5))


def test_an_exception_class_an_error_type_and_a_key_that_are_not_what_they_should_be(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """An exception class given for an exception names itself as ``error.type`` (not ``type``)
    and a cancellation's class ends the span canceled,
    an ``error_type`` that is not text is made text, and an attribute key whose ``str()`` raises
    does not fail the call."""

    class BadKey:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    otel = make_otel()
    failed = otel.span_begin("failed")
    otel.span_failure(failed, ValueError)  # type: ignore[arg-type]
    cancelled = otel.span_begin("cancelled")
    otel.span_failure(cancelled, asyncio.CancelledError)  # type: ignore[arg-type]
    with otel.span("degraded") as degraded:
        degraded.set_outcome("degraded", error_type=503)  # type: ignore[arg-type]
        degraded.set_attributes({BadKey(): 1, "kept": 2})  # type: ignore[dict-item]
    spans = collect(otel, otlp_receiver, 3)
    assert one(spans, "failed").attributes[catalog.ERROR_TYPE] == "ValueError"
    # a cancellation's class ends the span as the cancellation would: canceled, status unset
    ended = one(spans, "cancelled")
    assert ended.attributes[catalog.KAOS_OUTCOME] == "canceled"
    assert ended.attributes[catalog.ERROR_TYPE] == "CancelledError" and ended.status_code == "UNSET"
    kept = one(spans, "degraded").attributes
    assert kept[catalog.ERROR_TYPE] == "503" and kept["kept"] == 2


class _StartedNames(SpanProcessor):
    """Names the spans started, as they start."""

    def __init__(self, started: list[str]) -> None:
        self.started = started

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started.append(span.name)


async def test_a_traced_generator_given_arguments_it_refuses_starts_no_span(make_otel: MakeOtel) -> None:
    """The arguments are bound before the span starts: refused (a TypeError at the first step, as
    the wrapper is a generator function itself), they leave no span open for ever."""
    otel = make_otel()
    started: list[str] = []
    provider = otel.tracer_provider
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(_StartedNames(started))

    @otel.traced("numbers")
    def numbers(n: int) -> Iterator[int]:
        yield from range(n)

    @otel.traced("async-numbers")
    async def async_numbers(n: int) -> AsyncIterator[int]:
        yield n

    with pytest.raises(TypeError):
        next(numbers(1, 2))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        await anext(async_numbers(1, 2))  # type: ignore[call-arg]
    assert started == []
    assert list(numbers(2)) == [0, 1] and started == ["numbers"]


class _AsyncConstruction(type):
    """A metaclass whose ``__call__`` is async: calling the class returns a coroutine."""

    async def __call__(cls, *args: Any) -> Any:
        await asyncio.sleep(0)
        return super().__call__(*args)


@pytest.mark.parametrize("shape", ["instance", "partial", "metaclass"])
async def test_an_object_with_an_async_call_is_traced_while_it_runs(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, shape: str
) -> None:
    """``inspect.iscoroutinefunction`` says no of an instance whose ``__call__`` is async, of a
    partial of one, and of a class whose metaclass's ``__call__`` is: traced as a plain function,
    its span ended when the coroutine was returned, before the work ran."""
    otel = make_otel()

    class ModelCall:
        async def __call__(self, prompt: str) -> str:
            with otel.span("inside"):
                await asyncio.sleep(0)
            raise RuntimeError(f"no answer to {prompt}")

    class Refusal(metaclass=_AsyncConstruction):
        def __init__(self, prompt: str) -> None:
            with otel.span("inside"):
                raise RuntimeError(f"no answer to {prompt}")

    targets: dict[str, Callable[..., Any]] = {
        "instance": ModelCall(),
        "partial": functools.partial(ModelCall(), "hi"),
        "metaclass": Refusal,
    }
    target = targets[shape]
    traced = otel.traced("model")(target)
    with pytest.raises(RuntimeError, match="no answer to hi"):
        await (traced() if shape == "partial" else traced("hi"))
    spans = collect(otel, otlp_receiver, 2)
    model = one(spans, "model")
    assert model.status_code == "ERROR" and one(spans, "inside").parent_span_id == model.span_id


async def test_a_partial_and_a_generator_object_are_traced_as_the_function_they_call(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """A partial's span is named after its function (not ``partial``), and an object whose
    ``__call__`` is a generator or an async generator (a partial of one too) is traced while it
    iterates, its inner spans under it, not ended when the generator was returned."""
    otel = make_otel()

    def lookup(table: str, key: str) -> str:
        return f"{table}.{key}"

    class Pages:
        def __call__(self, count: int) -> Iterator[int]:
            for page in range(count):
                with otel.span("page"):
                    yield page

    class AsyncPages:
        async def __call__(self, count: int) -> AsyncIterator[int]:
            for page in range(count):
                with otel.span("async page"):
                    await asyncio.sleep(0)
                    yield page

    assert otel.traced(functools.partial(lookup, "users"))("ada") == "users.ada"
    assert list(otel.traced("pages")(Pages())(2)) == [0, 1]
    assert [page async for page in otel.traced("async pages")(functools.partial(AsyncPages(), 2))()] == [0, 1]
    spans = collect(otel, otlp_receiver, 7)
    assert "partial" not in spans and one(spans, lookup.__qualname__).parent_span_id is None
    for outer, inner in (("pages", "page"), ("async pages", "async page")):
        parent = one(spans, outer)
        assert [span.parent_span_id for span in spans[inner]] == [parent.span_id] * 2


def test_bare_decorator_traces_and_disabled_decorator_keeps_behaviour(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()

    @otel.traced
    def add_one(value: int) -> int:
        return value + 1

    disabled = make_otel(environ={"OTEL_SDK_DISABLED": "true"})

    @disabled.traced
    def add_two(value: int) -> int:
        return value + 2

    assert add_one(1) == 2
    assert add_two(1) == 3
    assert otel.force_flush(5)
    assert otlp_receiver.wait_for(lambda r: any(s.name.endswith("add_one") for s in r.spans()), 5)
    assert not any(s.name.endswith("add_two") for s in otlp_receiver.spans())


async def test_traced_above_staticmethod_and_classmethod_keeps_the_descriptor(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()

    class Agent:
        @otel.traced()
        @staticmethod
        async def plan(goal: str) -> str:
            await asyncio.sleep(0)
            return f"plan for {goal}: {current_name()}"

        @otel.traced
        @classmethod
        def build(cls, name: str) -> str:
            return f"{cls.__name__} {name}: {current_name()}"

    assert await Agent().plan("x") == f"plan for x: {Agent.plan.__qualname__}"
    assert await Agent.plan("y") == f"plan for y: {Agent.plan.__qualname__}"
    assert Agent.build("z") == f"Agent z: {Agent.build.__qualname__}"
    assert Agent().build("w") == f"Agent w: {Agent.build.__qualname__}"
    spans = collect(otel, otlp_receiver, 4)
    expected = {Agent.plan.__qualname__: 2, Agent.build.__qualname__: 2}
    assert {name: len(named) for name, named in spans.items()} == expected
    disabled = make_otel(environ={"OTEL_SDK_DISABLED": "true"})

    class Quiet:
        @disabled.traced
        @classmethod
        def build(cls) -> str:
            return cls.__name__

    assert Quiet.build() == "Quiet"


def test_a_with_span_begins_when_the_block_is_entered(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    scope = otel.span("entered-later")
    assert not trace.get_current_span().get_span_context().is_valid  # nothing began yet
    entered = time.time_ns()
    with scope as span:
        assert current_name() == "entered-later"
        assert span.span.get_span_context().is_valid
    assert not trace.get_current_span().get_span_context().is_valid
    received = one(collect(otel, otlp_receiver, 1), "entered-later")
    assert received.start_time_unix_nano >= entered


async def test_one_with_scope_entered_by_two_tasks_at_once_ends_each_entrys_own_span(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    fetch = otel.span("fetch")  # one scope, kept and entered by every task
    first_in, second_in = asyncio.Event(), asyncio.Event()

    async def first() -> tuple[str, str | None]:
        async with fetch as span:
            first_in.set()
            await second_in.wait()  # the second task enters while this one is inside
        return span_id(span), current_name()

    async def second() -> tuple[str, str | None]:
        await first_in.wait()
        async with fetch as span:
            second_in.set()
            await asyncio.sleep(0.01)  # and leaves after the first one left
        return span_id(span), current_name()

    (first_id, after_first), (second_id, after_second) = await asyncio.gather(first(), second())
    with fetch as outer:  # and nested in one task, the inner span ended by hand
        with fetch as inner:
            inner.success()
        assert current_name() == "fetch" and not outer.is_ended
    assert (after_first, after_second) == (None, None)

    def in_a_thread() -> None:
        for _ in range(200):
            with fetch as span:
                span.success()

    threads = [threading.Thread(target=in_a_thread) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fetch._entered == []  # every entry left: none held
    by_name = collect(otel, otlp_receiver, 4 + 800)
    ended = {span.span_id: span for span in by_name["fetch"]}
    assert {first_id, second_id, span_id(outer), span_id(inner)} <= set(ended)
    assert ended[span_id(inner)].parent_span_id == span_id(outer)
    # each span ended when its own entry left: the second one last, the outer after the inner
    assert ended[first_id].end_time_unix_nano < ended[second_id].end_time_unix_nano
    assert ended[span_id(inner)].end_time_unix_nano < ended[span_id(outer)].end_time_unix_nano


def test_an_ended_span_is_freed_without_the_garbage_collector(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    """A handle and the context it makes current do not reference each other, so an ended span
    (and what it holds) is freed as soon as nothing uses it, not at the next collection."""
    otel = make_otel()

    @otel.traced("decorated")
    def decorated() -> None:
        pass

    def spans_in_every_style() -> None:
        with otel.span("outer"):
            first = otel.span_begin("first")
            second = otel.span_begin("second")
            otel.span_success(first)  # out of order
            otel.span_success(second)
            decorated()
        with otel.invoke_agent("agent", conversation_id="c-1") as run:
            with otel.agent_step(run, 1):
                with otel.model_call("agent", "model") as call:
                    call.record_usage(10, 5)
                with otel.tool_call("agent", "echo", call_id="t-1", arguments={"text": "hi"}):
                    pass
            with otel.memory_operation(MemoryTier.SHORT_TERM, "search_memory", scope=MemoryScope.SESSION):
                pass
        with otel.delegation("agent", "helper"), otel.invoke_agent("helper"):  # a sub-agent in process
            pass

    spans_in_every_style()  # first calls may cache what later calls reuse
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what a collection finds unreachable, to look at it
    try:
        spans_in_every_style()
        gc.collect()
        left_for_the_collector = [o for o in gc.garbage if isinstance(o, SpanHandle)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left_for_the_collector == []
    assert len(collect(otel, otlp_receiver, 22)) == 10  # the delegation and its run share a name


def test_a_disabled_managers_handles_offer_every_public_field_of_the_real_ones(make_otel: MakeOtel) -> None:
    enabled = make_otel()
    disabled = make_otel(environ={"OTEL_SDK_DISABLED": "true"})  # set for the rest of the test
    assert enabled.enabled and not disabled.enabled
    pairs = [
        (enabled.invoke_agent("agent"), disabled.invoke_agent("agent")),
        (enabled.model_call("agent", "m"), disabled.model_call("agent", "m")),
    ]
    for real, noop in pairs:
        with real, noop:
            fields = {name for cls in type(real).__mro__ for name in getattr(cls, "__slots__", ())}
            public = sorted(name for name in fields if not name.startswith("_") and name != "span")
            assert public and {name: type(getattr(noop, name)) for name in public} == {
                name: type(getattr(real, name)) for name in public
            }


# --- input that is not what the signature says: logged, replaced, the span kept -----------------


def test_a_span_kind_given_by_name_is_that_kind_and_the_batch_still_exports(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    with otel.span("good"):
        pass
    for name, kind in [("client", "client"), ("server", " SERVER "), ("unknown", "bogus"), ("number", 3)]:
        otel.span_success(otel.span_begin(name, kind=kind))  # type: ignore[arg-type]
    spans = collect(otel, otlp_receiver, 5)  # one wrong kind used to lose the whole batch
    kinds = {name: one(spans, name).kind for name in spans}
    expected = {"good": "INTERNAL", "client": "CLIENT", "server": "SERVER", "unknown": "INTERNAL"}
    assert kinds == {**expected, "number": "INTERNAL"}


def test_a_parent_given_as_a_handle_or_a_span_is_taken_as_its_context(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    with otel.span("outer") as outer:
        run = otel.span_begin("run")
        otel.span_success(run)
        with otel.span("under-handle", parent=run):  # type: ignore[arg-type]
            assert current_name() == "under-handle"
        with otel.span("under-span", parent=run.span):  # type: ignore[arg-type]
            pass
        with otel.span("under-nothing", parent=object()):  # type: ignore[arg-type]
            pass
        assert current_name() == "outer"
    spans = collect(otel, otlp_receiver, 5)
    assert one(spans, "under-handle").parent_span_id == span_id(run)
    assert one(spans, "under-span").parent_span_id == span_id(run)
    assert one(spans, "under-nothing").parent_span_id == span_id(outer)  # the current context


async def test_attributes_that_are_no_mapping_and_links_that_are_no_links_are_left_out(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    pairs: Any = [("a", 1)]  # not a mapping
    linked = otel.span_begin("linked")
    otel.span_success(linked)
    links: Any = [linked.span.get_span_context(), "x"]  # a span context, and no link at all
    begun = otel.span_begin("begun", attributes=pairs, links=links)
    begun.set_attributes(pairs)
    begun.add_event("event", pairs)
    otel.span_success(begun)
    no_links: Any = "not links"
    with otel.span("scoped", attributes=pairs, links=no_links):
        pass

    class Ambiguous:  # as a numpy array: its truth raises
        def __bool__(self) -> bool:
            raise ValueError("the truth value of an array is ambiguous")

    ambiguous: Any = Ambiguous()
    generated: Any = (link for link in [links[0]])  # an iterable, not a sequence
    with otel.span("array", attributes=ambiguous, links=generated) as array:
        array.set_attributes(ambiguous)
        array.add_event("event", ambiguous)

    @otel.traced("decorated", attributes=pairs)
    async def decorated() -> int:
        return 1

    assert await decorated() == 1
    spans = collect(otel, otlp_receiver, 5)
    assert len(one(spans, "array").links) == 1  # links given as any iterable
    received = one(spans, "begun")
    assert received.trace_id  # recorded, not replaced by a non-recording span
    assert [(link.trace_id, link.span_id) for link in received.links] == [
        (one(spans, "linked").trace_id, span_id(linked))
    ]
    assert [event.name for event in received.events] == ["event"]
    assert all("a" not in one(spans, name).attributes for name in ("begun", "scoped", "decorated"))


def test_set_outcome_reads_any_case_and_keeps_the_outcome_for_a_value_naming_none(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    with otel.span("capitalised") as capitalised:
        capitalised.set_outcome("Error")
    with otel.span("typo") as typo:
        typo.set_outcome("degraded", "BackendDown")
        typo.set_outcome("bogus")
        assert typo.outcome == "degraded"
    spans = collect(otel, otlp_receiver, 2)
    errored = one(spans, "capitalised")
    assert (errored.attributes["kaos.outcome"], errored.attributes["error.type"]) == ("error", "error")
    assert errored.status_code == "ERROR"
    kept = one(spans, "typo")
    assert (kept.attributes["kaos.outcome"], kept.attributes["error.type"]) == ("degraded", "BackendDown")


def test_integers_beyond_64_bits_are_exported_as_text(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    with otel.span("big", attributes={"given": 2**70, "small": 2**63 - 1}) as span:
        span.set_attribute("set", -(2**63) - 1)
        span.add_event("event", {"in_event": 2**64})
        span.set_attribute("listed", [1, 2**70])  # a list holding one: every item as text
    received = one(collect(otel, otlp_receiver, 1), "big")
    assert received.attributes == {
        "given": str(2**70),
        "small": 2**63 - 1,
        "set": str(-(2**63) - 1),
        "listed": ("1", str(2**70)),
    }
    assert received.events[0].attributes == {"in_event": str(2**64)}
