"""Work a request leaves running after it answers stays in that request's trace.

Long-term extraction starts after a compaction and usually ends after the request's spans have
ended; its spans must still be children of the run that started it (no detached traces).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from opentelemetry import trace

from instrumented_agent.memory import LongTermMemory, MemoryService, RelationalStore, Turn
from kaos_otel import KaosOtelManager, catalog, create_background_task
from kaos_otel.receiver import OtlpReceiver


async def test_a_background_task_stays_under_the_span_that_started_it_after_that_span_ended(
    make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    release = asyncio.Event()

    async def later() -> None:
        await release.wait()
        with otel.span("background"):
            pass

    with otel.span("request") as request:
        task = create_background_task(later())
    release.set()  # the request span has ended before the background span begins
    await task
    with otel.span("next request"):
        pass
    otel.force_flush()

    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= 3, timeout=10)
    spans = {s.name: s for s in otlp_receiver.spans()}
    request_id = format(request.span.get_span_context().span_id, "016x")
    assert spans["background"].parent_span_id == request_id
    assert spans["background"].trace_id == spans["request"].trace_id
    assert spans["next request"].parent_span_id is None  # the pin does not leak into the caller


async def test_long_term_extraction_after_the_request_ended_is_a_child_of_its_run(
    make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    otel = make_otel()
    long_term = LongTermMemory(otel, "http://127.0.0.1:9/v1")  # facts stored verbatim, no LLM call
    memory = MemoryService("librarian", otel, RelationalStore("sqlite://"), long_term, window_tokens=10)
    await memory.start()
    owner = memory.owner("dave", "s1")
    with otel.invoke_agent("librarian") as run:
        turns = [Turn("user", f"dave prefers region eu-west-{i} for everything") for i in range(3)]
        await memory.remember(owner, turns)  # over the window budget: compaction, then extraction
    assert run.is_ended
    await memory.drain()
    await memory.aclose()
    otel.force_flush()

    run_context = run.span.get_span_context()
    assert otlp_receiver.wait_for(
        lambda r: any(
            s.name == "create_memory" and s.attributes.get(catalog.KAOS_MEMORY_TIER) == "long_term"
            for s in r.spans()
        ),
        timeout=10,
    )
    extracted = [
        s
        for s in otlp_receiver.spans()
        if s.name == "create_memory" and s.attributes.get(catalog.KAOS_MEMORY_TIER) == "long_term"
    ]
    assert extracted
    by_id = {s.span_id: s for s in otlp_receiver.spans()}
    for span in extracted:
        assert span.trace_id == trace.format_trace_id(run_context.trace_id)
        queued = by_id[span.parent_span_id or ""]  # the span the call waited its turn in
        assert queued.name == "long-term extraction"
        assert queued.parent_span_id == trace.format_span_id(run_context.span_id)
