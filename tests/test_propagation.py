"""Trace context across HTTP in one process: a FastAPI app behind TraceContextMiddleware, served by
uvicorn on loopback, called by httpx clients that inject trace context.

Everything is checked at the OTLP receiver: parents, trace ids, links, and the ids on log records.
"""

from __future__ import annotations

import asyncio
import io
import logging
import logging.handlers
import multiprocessing
import queue
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import BackgroundTasks, FastAPI, Request
from fastapi.responses import StreamingResponse
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context

from kaos_otel import (
    KaosOtelManager,
    TraceContextFilter,
    TrustPolicy,
    catalog,
    console_handler,
    run_in_executor_in_context,
    submit_in_context,
)
from kaos_otel.instrumentation.asgi import TraceContextMiddleware
from kaos_otel.propagation import (
    async_inject_request_hook,
    extract_incoming,
    inject_headers,
    inject_request_hook,
)
from kaos_otel.receiver import OtlpReceiver, ReceivedLog, ReceivedSpan

MakeOtel = Callable[..., KaosOtelManager]
APP_LOGGER = "test.propagation.app"
VALID_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
VALID_SPAN = "00f067aa0ba902b7"
VALID_PARENT = f"00-{VALID_TRACE}-{VALID_SPAN}-01"


def build_app(otel: KaosOtelManager, **middleware: Any) -> FastAPI:
    app = FastAPI()
    app.add_middleware(TraceContextMiddleware, otel=otel, **middleware)
    log = logging.getLogger(APP_LOGGER)

    def current_ids() -> dict[str, str]:
        ctx = trace.get_current_span().get_span_context()
        return {"trace_id": trace.format_trace_id(ctx.trace_id), "span_id": trace.format_span_id(ctx.span_id)}

    @app.post("/run")
    async def run(request: Request) -> dict[str, Any]:
        case = request.query_params.get("case", "")
        with otel.invoke_agent("worker", attributes={"test.case": case}):
            log.info("handling case %s", case)
            await asyncio.sleep(0)
            return {**current_ids(), "baggage": dict(baggage.get_all())}

    @app.post("/fail")
    async def fail() -> dict[str, Any]:
        with otel.invoke_agent("worker"):
            try:
                explode()
            except ValueError:
                log.exception("step failed")
            return current_ids()

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        agent = otel.invoke_agent("streamer")

        async def body() -> AsyncIterator[str]:
            try:
                for i in range(3):
                    await asyncio.sleep(0.01)
                    yield f"chunk {i}\n"
                log.info("last chunk")
                with otel.span("last-chunk-work"):
                    await asyncio.sleep(0.01)
                yield "done\n"
            finally:
                otel.span_success(agent)

        return StreamingResponse(body(), media_type="text/plain")

    @app.post("/background")
    async def background(tasks: BackgroundTasks) -> dict[str, str]:
        def pool_work() -> None:
            with otel.span("pool-work"):
                log.info("from the pool")

        async def task_work() -> None:
            await asyncio.sleep(0.01)
            with otel.span("task-work"):
                log.info("from a task")

        def after_response() -> None:
            with otel.span("after-response"):
                log.info("after the response")

        with otel.invoke_agent("worker"):
            await run_in_executor_in_context(None, pool_work)
            task = asyncio.create_task(task_work())
            tasks.add_task(after_response)
            await task
            return current_ids()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def explode() -> None:
    raise ValueError("bad tool output")


@pytest.fixture
def serve() -> Iterator[Callable[[FastAPI], str]]:
    """Serve apps with uvicorn on 127.0.0.1 in a thread; returns the base URL."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app: FastAPI) -> str:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_config=None, log_level="warning", lifespan="off"
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        servers.append((server, thread))
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(autouse=True)
def app_logging() -> Iterator[None]:
    logger = logging.getLogger(APP_LOGGER)
    previous = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(previous)


def flush_until(
    otel: KaosOtelManager, receiver: OtlpReceiver, predicate: Callable[[OtlpReceiver], bool]
) -> None:
    assert otel.force_flush(5)
    assert receiver.wait_for(predicate, 10), ([s.name for s in receiver.spans()], receiver.logs())


def by_id(receiver: OtlpReceiver) -> dict[str, ReceivedSpan]:
    return {span.span_id: span for span in receiver.spans()}


def named(receiver: OtlpReceiver, name: str) -> list[ReceivedSpan]:
    return [span for span in receiver.spans() if span.name == name]


def logs_with(receiver: OtlpReceiver, text: str) -> list[ReceivedLog]:
    return [log for log in receiver.logs() if text in str(log.body)]


# --- continuing, starting and streaming traces ----------------------------------------------------


def test_server_span_continues_the_caller_and_parents_the_agent(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str]
) -> None:
    otel = make_otel()
    base = serve(build_app(otel))
    with httpx.Client(event_hooks={"request": [inject_request_hook]}, trust_env=False) as client:
        delegation = otel.delegation("caller", "worker")
        answer = client.post(f"{base}/run").json()
        otel.span_success(delegation)

    flush_until(otel, otlp_receiver, lambda r: len(r.spans()) >= 3 and bool(logs_with(r, "handling case")))
    (client_span,) = [s for s in otlp_receiver.spans() if s.kind == "CLIENT"]
    (server_span,) = [s for s in otlp_receiver.spans() if s.kind == "SERVER"]
    (agent_span,) = [s for s in named(otlp_receiver, "invoke_agent worker") if s.kind == "INTERNAL"]
    assert client_span.span_id == trace.format_span_id(delegation.span.get_span_context().span_id)
    assert server_span.trace_id == client_span.trace_id == agent_span.trace_id
    assert server_span.parent_span_id == client_span.span_id  # continues the caller
    assert agent_span.parent_span_id == server_span.span_id  # child, not sibling
    assert server_span.name == "POST /run"
    assert server_span.attributes["http.response.status_code"] == 200
    assert server_span.attributes["kaos.trace.trust"] == "trusted"
    assert answer["trace_id"] == agent_span.trace_id and answer["span_id"] == agent_span.span_id
    (log,) = logs_with(otlp_receiver, "handling case")
    assert (log.trace_id, log.span_id) == (agent_span.trace_id, agent_span.span_id)


async def test_async_client_hook_and_no_incoming_context(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str]
) -> None:
    otel = make_otel()
    base = serve(build_app(otel))
    async with httpx.AsyncClient(
        event_hooks={"request": [async_inject_request_hook]}, trust_env=False
    ) as client:
        with otel.span("async-caller"):
            await client.post(f"{base}/run", params={"case": "with-context"})
        # outside any span the hook sends nothing: the server span must be a root
        await client.post(f"{base}/run", params={"case": "no-context"})
        await client.get(f"{base}/health")  # excluded from tracing

    flush_until(otel, otlp_receiver, lambda r: len(r.spans()) >= 5)
    spans = by_id(otlp_receiver)
    agents = {s.attributes["test.case"]: s for s in named(otlp_receiver, "invoke_agent worker")}
    caller = named(otlp_receiver, "async-caller")[0]
    with_ctx = spans[agents["with-context"].parent_span_id or ""]
    assert with_ctx.kind == "SERVER" and with_ctx.parent_span_id == caller.span_id
    assert with_ctx.trace_id == caller.trace_id
    root = spans[agents["no-context"].parent_span_id or ""]
    assert root.kind == "SERVER"
    assert root.parent_span_id is None  # the server span is the root...
    assert agents["no-context"].trace_id == root.trace_id != caller.trace_id  # ...and the agent its child
    assert len([s for s in otlp_receiver.spans() if s.kind == "SERVER"]) == 2  # /health not traced


def test_streaming_response_keeps_context_until_the_last_chunk(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str]
) -> None:
    otel = make_otel()
    base = serve(build_app(otel))
    client = httpx.Client(event_hooks={"request": [inject_request_hook]}, trust_env=False)
    with client, otel.span("stream-caller") as caller, client.stream("GET", f"{base}/stream") as response:
        chunks = list(response.iter_lines())
    assert chunks == ["chunk 0", "chunk 1", "chunk 2", "done"]

    flush_until(otel, otlp_receiver, lambda r: len(r.spans()) >= 4 and bool(logs_with(r, "last chunk")))
    caller_id = trace.format_span_id(caller.span.get_span_context().span_id)
    (server,) = [s for s in otlp_receiver.spans() if s.kind == "SERVER"]
    (agent,) = named(otlp_receiver, "invoke_agent streamer")
    (last,) = named(otlp_receiver, "last-chunk-work")
    assert server.parent_span_id == caller_id
    assert agent.parent_span_id == server.span_id
    assert last.parent_span_id == agent.span_id
    assert {server.trace_id, agent.trace_id, last.trace_id} == {
        named(otlp_receiver, "stream-caller")[0].trace_id
    }
    assert server.end_time_unix_nano >= last.end_time_unix_nano  # the server span outlives the body
    (log,) = logs_with(otlp_receiver, "last chunk")
    assert (log.trace_id, log.span_id) == (agent.trace_id, agent.span_id)


def test_thread_pool_tasks_and_background_work_keep_the_trace(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str]
) -> None:
    otel = make_otel()
    base = serve(build_app(otel))
    with httpx.Client(trust_env=False) as client:
        answer = client.post(f"{base}/background", headers={"traceparent": VALID_PARENT}).json()
    assert answer["trace_id"] == VALID_TRACE

    texts = ("from the pool", "from a task", "after the response")
    flush_until(otel, otlp_receiver, lambda r: len(r.spans()) >= 5 and all(logs_with(r, t) for t in texts))
    spans = by_id(otlp_receiver)
    (server,) = [s for s in otlp_receiver.spans() if s.kind == "SERVER"]
    (agent,) = named(otlp_receiver, "invoke_agent worker")
    assert server.parent_span_id == VALID_SPAN and agent.parent_span_id == server.span_id
    assert named(otlp_receiver, "pool-work")[0].parent_span_id == agent.span_id
    assert named(otlp_receiver, "task-work")[0].parent_span_id == agent.span_id
    assert named(otlp_receiver, "after-response")[0].parent_span_id == server.span_id
    for text in texts:
        (log,) = logs_with(otlp_receiver, text)
        assert log.trace_id == VALID_TRACE, text
        assert log.span_id in spans, text  # the id of a span that exists
        assert spans[log.span_id or ""].trace_id == VALID_TRACE


# --- hostile headers and trust policies ---------------------------------------------------------

HOSTILE_HEADERS: list[tuple[str, dict[str, str]]] = [
    ("too-short", {"traceparent": "00-abc-def-01"}),
    ("trace-id-31", {"traceparent": f"00-{VALID_TRACE[:-1]}-{VALID_SPAN}-01"}),
    ("trace-id-33", {"traceparent": f"00-{VALID_TRACE}a-{VALID_SPAN}-01"}),
    ("span-id-15", {"traceparent": f"00-{VALID_TRACE}-{VALID_SPAN[:-1]}-01"}),
    ("bad-hex-trace", {"traceparent": f"00-{'zz' + VALID_TRACE[2:]}-{VALID_SPAN}-01"}),
    ("bad-hex-span", {"traceparent": f"00-{VALID_TRACE}-{'g' + VALID_SPAN[1:]}-01"}),
    ("zero-trace-id", {"traceparent": f"00-{'0' * 32}-{VALID_SPAN}-01"}),
    ("zero-span-id", {"traceparent": f"00-{VALID_TRACE}-{'0' * 16}-01"}),
    ("version-ff", {"traceparent": f"ff-{VALID_TRACE}-{VALID_SPAN}-01"}),
    ("version-bad-hex", {"traceparent": f"0x-{VALID_TRACE}-{VALID_SPAN}-01"}),
    ("version-one-char", {"traceparent": f"0-{VALID_TRACE}-{VALID_SPAN}-01"}),
    ("version-00-extra-field", {"traceparent": f"{VALID_PARENT}-extra"}),
    ("uppercase", {"traceparent": VALID_PARENT.upper()}),
    ("bad-flags", {"traceparent": f"00-{VALID_TRACE}-{VALID_SPAN}-zz"}),
    ("no-dashes", {"traceparent": f"00{VALID_TRACE}{VALID_SPAN}01"}),
    ("empty", {"traceparent": ""}),
    ("only-separators", {"traceparent": "- - -"}),
    ("leading-junk", {"traceparent": f"x{VALID_PARENT}"}),
    ("huge-traceparent", {"traceparent": f"{VALID_PARENT}-{'a' * 10_000}"}),
    ("inner-tab", {"traceparent": f"00-\t{VALID_TRACE}-{VALID_SPAN}-01"}),
    ("huge-flags", {"traceparent": f"{VALID_PARENT}{'0' * 9_000}"}),
    ("tracestate-only-garbage", {"tracestate": "=,,,a==b,=c,k=v=w,@@@=1"}),
    ("huge-tracestate-only", {"tracestate": ",".join(f"k{i}=v{i}" for i in range(1500))}),
    ("bad-traceparent-good-tracestate", {"traceparent": "00-xyz", "tracestate": "vendor=abc"}),
    ("baggage-only-garbage", {"baggage": "=;;;%%%,k,=v,%zz=1"}),
    ("huge-baggage", {"baggage": ",".join(f"k{i}=v{i}" for i in range(1200))}),
    ("all-hostile", {"traceparent": "00-" + "f" * 60, "tracestate": "=" * 300, "baggage": "%" * 300}),
]


def test_hostile_headers_get_a_normal_response_and_a_new_root(
    make_otel: MakeOtel,
    otlp_receiver: OtlpReceiver,
    serve: Callable[[FastAPI], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert len(HOSTILE_HEADERS) >= 20
    caplog.set_level(logging.WARNING)
    otel = make_otel(environ={"KAOS_OTEL_BAGGAGE_ALLOWLIST": "k1,k"})
    base = serve(build_app(otel))
    with httpx.Client(trust_env=False) as client:
        for case, headers in HOSTILE_HEADERS:
            response = client.post(f"{base}/run", params={"case": case}, headers=headers)
            assert response.status_code == 200, (case, response.text)

    count = len(HOSTILE_HEADERS)
    flush_until(otel, otlp_receiver, lambda r: len(r.spans()) >= 2 * count)
    spans = by_id(otlp_receiver)
    agents = {s.attributes["test.case"]: s for s in named(otlp_receiver, "invoke_agent worker")}
    assert set(agents) == {case for case, _ in HOSTILE_HEADERS}
    trace_ids = set()
    for case, _ in HOSTILE_HEADERS:
        server = spans[agents[case].parent_span_id or ""]
        assert server.kind == "SERVER", case
        assert server.parent_span_id is None, case  # a new root...
        assert server.links == (), case
        assert server.status_code == "UNSET", case
        assert server.trace_id != VALID_TRACE, case
        trace_ids.add(server.trace_id)
    assert len(trace_ids) == count  # ...of its own for every request
    problems = [
        r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith(("kaos", "uvicorn"))
    ]
    assert problems == []


def test_a_future_traceparent_version_is_parsed_as_w3c_requires(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str]
) -> None:
    """Unknown versions below ff with a well-formed prefix are continued (W3C trace-context §3.2.4)."""
    otel = make_otel()
    base = serve(build_app(otel))
    with httpx.Client(trust_env=False) as client:
        headers = {"traceparent": f"cc-{VALID_TRACE}-{VALID_SPAN}-01-future-field"}
        assert client.post(f"{base}/run", headers=headers).status_code == 200
    flush_until(otel, otlp_receiver, lambda r: len(r.spans()) >= 2)
    (server,) = [s for s in otlp_receiver.spans() if s.kind == "SERVER"]
    assert (server.trace_id, server.parent_span_id) == (VALID_TRACE, VALID_SPAN)


@pytest.mark.parametrize("configured_by", ["argument", "environment"])
def test_link_mode_links_instead_of_parenting(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str], configured_by: str
) -> None:
    if configured_by == "argument":
        otel = make_otel()
        app = build_app(otel, trust="link")
    else:
        otel = make_otel(environ={"KAOS_OTEL_TRUST": "link"})
        app = build_app(otel)
    base = serve(app)
    with httpx.Client(trust_env=False) as client:
        client.post(f"{base}/run", headers={"traceparent": VALID_PARENT, "tracestate": "vendor=1"})
    flush_until(otel, otlp_receiver, lambda r: len(r.spans()) >= 2)
    (server,) = [s for s in otlp_receiver.spans() if s.kind == "SERVER"]
    (agent,) = named(otlp_receiver, "invoke_agent worker")
    assert server.parent_span_id is None
    assert server.trace_id != VALID_TRACE
    assert [(link.trace_id, link.span_id) for link in server.links] == [(VALID_TRACE, VALID_SPAN)]
    assert server.links[0].attributes["kaos.trace.trust"] == "link"
    assert server.attributes["kaos.trace.trust"] == "link"
    assert agent.parent_span_id == server.span_id


@pytest.mark.parametrize("trust", [TrustPolicy.LINK, "link", " Link "])
def test_extract_incoming_takes_a_trust_policy_by_name(trust: TrustPolicy | str) -> None:
    incoming = extract_incoming({"traceparent": VALID_PARENT}, trust=trust, baggage_allowlist="tenant")
    assert incoming.trust is TrustPolicy.LINK
    assert [(f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in incoming.links] == [
        (VALID_TRACE, VALID_SPAN)
    ]
    assert trace.get_current_span(incoming.parent).get_span_context().is_valid is False


def test_ignore_mode_discards_the_callers_context(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str]
) -> None:
    otel = make_otel()
    base = serve(build_app(otel, trust="ignore", baggage_allowlist=["tenant"]))
    with httpx.Client(trust_env=False) as client:
        answer = client.post(
            f"{base}/run", headers={"traceparent": VALID_PARENT, "baggage": "tenant=acme"}
        ).json()
    assert answer["baggage"] == {}
    flush_until(otel, otlp_receiver, lambda r: len(r.spans()) >= 2)
    (server,) = [s for s in otlp_receiver.spans() if s.kind == "SERVER"]
    assert server.parent_span_id is None and server.links == ()
    assert server.trace_id != VALID_TRACE
    assert server.attributes["kaos.trace.trust"] == "ignore"


def test_baggage_is_dropped_unless_allow_listed(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str]
) -> None:
    otel = make_otel()
    open_base = serve(build_app(otel))
    listed_base = serve(build_app(otel, baggage_allowlist=["tenant"]))
    one_key_base = serve(build_app(otel, baggage_allowlist="tenant"))  # one key, not t, e, n, a
    sent = {"traceparent": VALID_PARENT, "baggage": "tenant=acme,user.id=mallory,role=admin,t=x,e=y"}
    with httpx.Client(trust_env=False) as client:
        assert client.post(f"{open_base}/run", headers=sent).json()["baggage"] == {}
        assert client.post(f"{listed_base}/run", headers=sent).json()["baggage"] == {"tenant": "acme"}
        assert client.post(f"{one_key_base}/run", headers=sent).json()["baggage"] == {"tenant": "acme"}

    # outgoing: baggage is only injected when asked for
    token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        with otel.span("outgoing"):
            assert "baggage" not in inject_headers()
            assert inject_headers(baggage=True)["baggage"] == "tenant=acme"
            assert inject_headers()["traceparent"].startswith("00-")
    finally:
        otel_context.detach(token)


# --- logs ------------------------------------------------------------------------------------------


def test_logs_carry_their_span_and_exceptions_their_stack(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str]
) -> None:
    otel = make_otel()
    base = serve(build_app(otel))
    log = logging.getLogger(APP_LOGGER)
    log.info("outside any span")
    with httpx.Client(trust_env=False) as client:
        answer = client.post(f"{base}/fail").json()
    flush_until(otel, otlp_receiver, lambda r: bool(logs_with(r, "step failed") and logs_with(r, "outside")))
    (failed,) = logs_with(otlp_receiver, "step failed")
    (agent,) = named(otlp_receiver, "invoke_agent worker")
    assert (
        (failed.trace_id, failed.span_id)
        == (agent.trace_id, agent.span_id)
        == (answer["trace_id"], answer["span_id"])
    )
    assert failed.severity_text == "ERROR"
    assert failed.attributes["exception.type"] == "ValueError"
    stack = failed.attributes["exception.stacktrace"]
    assert "Traceback (most recent call last)" in stack
    assert "explode" in stack and "fail" in stack  # the frames, innermost included
    (outside,) = logs_with(otlp_receiver, "outside any span")
    assert outside.trace_id is None and outside.span_id is None
    assert failed.resource["service.name"] == "kaos-test"


def test_console_format_shows_trace_ids(make_otel: MakeOtel) -> None:
    otel = make_otel()
    stream = io.StringIO()
    handler = console_handler()
    handler.setStream(stream)  # type: ignore[attr-defined]
    logger = logging.getLogger("test.propagation.console")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        with otel.span("console") as span:
            logger.info("inside")
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    ctx = span.span.get_span_context()
    inside, outside = stream.getvalue().splitlines()
    assert (
        f"trace_id={trace.format_trace_id(ctx.trace_id)} span_id={trace.format_span_id(ctx.span_id)}"
        in inside
    )
    assert inside.endswith("test.propagation.console: inside")
    assert re.search(r"\[trace_id=0 span_id=0\] test\.propagation\.console: outside$", outside)


def test_console_lines_behind_a_queue_listener_show_the_ids_stamped_where_records_were_made(
    make_otel: MakeOtel,
) -> None:
    otel = make_otel()
    stream = io.StringIO()
    handler = console_handler()
    handler.setStream(stream)  # type: ignore[attr-defined]
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    queue_handler = logging.handlers.QueueHandler(records)
    queue_handler.addFilter(TraceContextFilter())  # stamps the ids on the logging thread
    listener = logging.handlers.QueueListener(records, handler)  # its thread has no current span
    logger = logging.getLogger("test.propagation.queued")
    logger.addHandler(queue_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    listener.start()
    try:
        with otel.span("queued") as span:
            logger.info("inside")
        logger.info("outside")
    finally:
        listener.stop()
        logger.removeHandler(queue_handler)
    ctx = span.span.get_span_context()
    inside, outside = stream.getvalue().splitlines()
    ids = f"trace_id={trace.format_trace_id(ctx.trace_id)} span_id={trace.format_span_id(ctx.span_id)}"
    assert ids in inside
    assert "[trace_id=0 span_id=0]" in outside


def test_a_stream_the_client_cuts_ends_canceled_on_the_server_span_and_the_run(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str]
) -> None:
    otel = make_otel()
    app = FastAPI()
    app.add_middleware(TraceContextMiddleware, otel=otel)

    @app.get("/endless")
    async def endless() -> StreamingResponse:
        async def body() -> AsyncIterator[str]:
            async with otel.invoke_agent("streamer"):
                yield "first\n"
                await asyncio.Event().wait()  # the rest of the answer never comes
                yield "never\n"

        return StreamingResponse(body(), media_type="text/plain")

    base = serve(app)
    with (
        httpx.Client(timeout=10, trust_env=False) as client,
        client.stream("GET", f"{base}/endless") as response,
    ):
        assert next(response.iter_lines()) == "first"  # then the client goes away

    flush_until(otel, otlp_receiver, lambda r: any(s.kind == "SERVER" for s in r.spans()))
    (server,) = [s for s in otlp_receiver.spans() if s.kind == "SERVER"]
    (run,) = named(otlp_receiver, "invoke_agent streamer")
    assert server.attributes["http.response.status_code"] == 200
    assert (server.attributes[catalog.KAOS_OUTCOME], server.attributes[catalog.ERROR_TYPE]) == (
        "canceled",
        "client_disconnect",
    )
    assert server.status_code != "ERROR"
    assert run.attributes[catalog.KAOS_OUTCOME] == "canceled"
    flush_until(  # the run has ended, so its request is recorded: flush it out
        otel,
        otlp_receiver,
        lambda r: any(
            p.name == catalog.KAOS_REQUESTS and p.attributes[catalog.KAOS_OUTCOME] == "canceled"
            for p in r.metric_points()
        ),
    )


def test_repeated_header_fields_are_combined_as_rfc_9110_says(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, serve: Callable[[FastAPI], str]
) -> None:
    """Over real HTTP: tracestate and baggage lines are joined in order; two traceparents restart."""
    otel = make_otel()
    base = serve(build_app(otel, baggage_allowlist=["tenant", "region"]))
    other = f"00-{'a' * 32}-{'b' * 16}-01"
    with httpx.Client(trust_env=False) as client:
        split = [
            ("traceparent", VALID_PARENT),
            ("tracestate", "congo=1"),
            ("tracestate", "rojo=2"),
            ("baggage", "tenant=acme"),
            ("baggage", "region=eu"),
        ]
        joined = client.post(f"{base}/run", params={"case": "split"}, headers=split).json()
        twice = [("traceparent", VALID_PARENT), ("traceparent", other)]
        restarted = client.post(f"{base}/run", params={"case": "twice"}, headers=twice).json()
    assert joined["trace_id"] == VALID_TRACE
    assert joined["baggage"] == {"tenant": "acme", "region": "eu"}
    assert restarted["trace_id"] not in (VALID_TRACE, "a" * 32)
    flush_until(otel, otlp_receiver, lambda r: len(r.spans()) >= 4)
    servers = {s.trace_id: s for s in otlp_receiver.spans() if s.kind == "SERVER"}
    assert servers[VALID_TRACE].parent_span_id == VALID_SPAN
    assert servers[restarted["trace_id"]].parent_span_id is None


@pytest.mark.parametrize(
    ("setting", "policy"),
    [
        (None, TrustPolicy.TRUSTED),
        ("", TrustPolicy.TRUSTED),
        ("IGNORE", TrustPolicy.IGNORE),
        (" Link ", TrustPolicy.LINK),
        ("ingore", TrustPolicy.IGNORE),
        ("all", TrustPolicy.IGNORE),
    ],
)
@pytest.mark.usefixtures("unsaid_notices")
def test_a_trust_setting_is_read_in_any_case_and_an_unknown_one_trusts_nothing(
    setting: str | None, policy: TrustPolicy, make_otel: MakeOtel, caplog: pytest.LogCaptureFixture
) -> None:
    environ = {} if setting is None else {"KAOS_OTEL_TRUST": setting}
    with caplog.at_level(logging.WARNING, logger="kaos_otel"):
        assert make_otel(environ=environ).settings.trust is policy
        assert TrustPolicy.from_setting(setting) is policy
    unknown = setting is not None and setting.strip().lower() not in ("", "trusted", "link", "ignore")
    warned = [r.getMessage() for r in caplog.records if "is not trusted, link or ignore" in r.getMessage()]
    assert bool(warned) == unknown, warned


# --- executors ------------------------------------------------------------------------------------


def keywords_seen(**kwargs: str) -> dict[str, str]:
    """The keyword arguments a worker was called with (a process pool's, by name)."""
    return kwargs


def test_work_may_take_keywords_named_as_the_helpers_own_parameters() -> None:
    """As ``Executor.submit`` passes them: ``fn=``, ``executor=`` and ``self=`` go to the work,
    in a thread pool and a process pool (before, a TypeError in the caller)."""
    sent = {"fn": "f", "executor": "e", "self": "s"}
    with (
        ThreadPoolExecutor(max_workers=1) as threads,
        ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as processes,
    ):
        assert submit_in_context(threads, keywords_seen, **sent).result(timeout=60) == sent
        assert submit_in_context(processes, keywords_seen, **sent).result(timeout=60) == sent
