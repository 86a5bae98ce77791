"""The agent's HTTP API: OpenAI-compatible ``POST /v1/chat/completions`` plus ``/health`` and ``/ready``.

Trace context: :class:`~kaos_otel.instrumentation.asgi.TraceContextMiddleware` makes one SERVER
span per request (continuing the caller's trace under the configured trust policy) that is the
parent of the run's ``invoke_agent`` span and stays open until the last streamed chunk. A client
that disconnects before its answer cancels the run, streaming or not (no more model, tool or
delegation calls for no one; the run and the server span end ``canceled``, status 499). Outgoing
model and delegation requests carry ``traceparent`` through an httpx request hook, without extra
HTTP client spans: the ``chat`` and delegation spans are the client spans.

Streaming: the streamed content is the answer a non-streaming request gets, streamed as it is said
(what the model says alongside a tool call comes first, a paragraph of the answer; see
:meth:`~instrumented_agent.agent.Agent.run`).

Identity: the user id comes only from the :data:`~instrumented_agent.config.USER_ID_HEADER` header
that a trusted gateway sets, never from the body or the model; autonomous runs use the agent's own
(``agent:<name>``, passed on to sub-agents with a session issued to the agent, as only agents can).
The session comes from :data:`~instrumented_agent.config.SESSION_ID_HEADER` (generated when absent
and returned in the response headers); anonymous requests get session scope only, in a session the
server issued (:mod:`instrumented_agent.identity` has the gateway contract).

Memory (with ``--memory-url``): runs recall at the scope of the
:data:`~instrumented_agent.config.MEMORY_SCOPE_HEADER` header (default ``session``, at most the
agent's ceiling) and ``DELETE /v1/memory`` forgets that scope across all three tiers, here and at
every sub-agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import trace
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from instrumented_agent.agent import Agent, Identity, RunResult
from instrumented_agent.config import (
    DELEGATED_BY_HEADER,
    MEMORY_SCOPE_HEADER,
    SESSION_ID_HEADER,
    USER_ID_HEADER,
    AgentConfig,
)
from instrumented_agent.errors import AgentError
from instrumented_agent.faults import DOWN_AGENT, Fault, FaultSwitch
from instrumented_agent.identity import AGENT_USER_PREFIX, IdentityError, SessionIssuer, identity_values
from instrumented_agent.limits import BodyLimitMiddleware, InvalidInputError, check_messages
from instrumented_agent.mcp_client import McpToolbox
from instrumented_agent.memory import (
    LongTermMemory,
    MemoryScopeError,
    MemoryService,
    RelationalStore,
    parse_scope,
)
from instrumented_agent.model_client import ModelClient
from instrumented_agent.openai_api import (
    SSE_DONE,
    ChatMessage,
    ChatRequest,
    Completion,
    chunk,
    completion_body,
    error_body,
    new_completion_id,
    sse,
    usage_chunk,
)
from kaos_otel import KaosOtelManager, MemoryScope
from kaos_otel.instrumentation.asgi import FASTAPI_NATIVE_TELEMETRY_OFF, TraceContextMiddleware
from kaos_otel.propagation import async_inject_request_hook

__all__ = ["CONVERSATION_ID_HEADER", "TRACE_ID_HEADER", "create_agent_app"]

CONVERSATION_ID_HEADER = "x-kaos-conversation-id"
TRACE_ID_HEADER = "x-kaos-trace-id"
"""Response header naming the trace the request was recorded in; absent when the sampler did not
record it (a trace a gateway drops later is still named)."""

_log = logging.getLogger(__name__)
_StreamItem = str | RunResult | BaseException


def _error(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """HTTP status and OpenAI-style body for a failed run."""
    if isinstance(exc, AgentError):
        return exc.status_code, error_body(str(exc), exc.error_type)
    return 500, error_body("internal error", "internal_error")


def _error_response(exc: BaseException) -> JSONResponse:
    status, body = _error(exc)
    return JSONResponse(body, status_code=status, headers=_trace_headers())


def _trace_headers() -> dict[str, str]:
    span_context = trace.get_current_span().get_span_context()
    if not (span_context.is_valid and span_context.trace_flags.sampled):
        return {}
    return {TRACE_ID_HEADER: trace.format_trace_id(span_context.trace_id)}


_AUTONOMOUS_TOOLS_WAIT_S = 30.0
"""How long an autonomous run waits for MCP servers that are not connected (at startup, say)
before it goes on without their tools (and ends ``degraded``)."""


async def _autonomous_loop(
    agent: Agent, toolbox: McpToolbox, goal: str, interval_s: float, issuer: SessionIssuer
) -> None:
    """Run ``goal`` every ``interval_s`` seconds with the agent's own identity, each in a new trace
    and a new session (issued to the agent, so its sub-agents accept the identity)."""
    while True:
        identity = Identity.of_agent(agent.name, issuer)
        await toolbox.wait_until_ready(_AUTONOMOUS_TOOLS_WAIT_S)
        try:
            await agent.run([ChatMessage(role="user", content=goal)], identity)
        except AgentError:
            pass  # already recorded: failed span, error outcome and a log line inside the run
        except Exception:
            _log.exception("autonomous run crashed")
        await asyncio.sleep(interval_s)


T = TypeVar("T")

CLIENT_CLOSED_REQUEST = 499
"""The status a request gets when its client disconnected before the answer (as nginx logs it)."""


async def _until_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the request body is read already); never if the
    server's ``receive`` fails."""
    with contextlib.suppress(Exception):
        while (await receive())["type"] != "http.disconnect":
            pass
        return
    await asyncio.Event().wait()


async def _unless_disconnected(work: asyncio.Future[T], receive: Receive) -> T | None:
    """``work``'s result, or ``None`` once it is cancelled because the client disconnected first
    (a cancellation of this task cancels ``work`` too, and still propagates)."""
    disconnect = asyncio.ensure_future(_until_disconnect(receive))
    pending: set[asyncio.Future[Any]] = {work, disconnect}
    try:
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
        if not work.done():  # the client went away, or this request was cancelled
            work.cancel()
            await asyncio.wait({work})
    return None if work.cancelled() else work.result()


class _RunStream(StreamingResponse):
    """A run's SSE answer that cancels the run if the response ends before the run did: also when
    the server cannot even start it (an ASGI 2.4 server raises once the client is gone), so the
    events are never read and the run would wait for a reader forever."""

    def __init__(self, run: asyncio.Task[None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._run.done():
                self._run.cancel()
                await asyncio.wait({self._run})


class _AgentService:
    """What the routes need once the app has started."""

    def __init__(self, agent: Agent, toolbox: McpToolbox) -> None:
        self.agent = agent
        self.toolbox = toolbox

    async def complete(
        self,
        body: ChatRequest,
        identity: Identity,
        conversation_id: str | None,
        scope: MemoryScope,
        delegated: bool,
        receive: Receive,
    ) -> Response:
        """The answer; a client that disconnects first cancels the run (it ends ``canceled``)."""
        run = asyncio.ensure_future(
            self.agent.run(
                body.messages,
                identity,
                conversation_id=conversation_id,
                memory_scope=scope,
                delegated=delegated,
            )
        )
        try:
            result = await _unless_disconnected(run, receive)
        except Exception as exc:
            if not isinstance(exc, AgentError):
                _log.exception("request failed unexpectedly")
            return _error_response(exc)
        if result is None:  # no one reads this answer: 499, "client closed request"
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        completion = Completion(
            id=new_completion_id(),
            model=self.agent.name,
            message=ChatMessage(role="assistant", content=result.content),
            finish_reason=result.finish_reason,
            usage=result.usage,
        )
        return JSONResponse(completion_body(completion), headers=_trace_headers())

    async def stream(
        self,
        body: ChatRequest,
        identity: Identity,
        conversation_id: str | None,
        scope: MemoryScope,
        delegated: bool,
        receive: Receive,
    ) -> Response:
        """Run in a task that feeds a queue; an error before the first chunk is still an HTTP error,
        and a client gone before it cancels the run (Starlette watches for it from the first chunk)."""
        queue: asyncio.Queue[_StreamItem] = asyncio.Queue()
        delivered = asyncio.Event()

        async def deliver(result: RunResult) -> None:
            queue.put_nowait(result)
            await delivered.wait()  # the run ends once the client has the whole answer

        async def produce() -> None:
            try:
                await self.agent.run(
                    body.messages,
                    identity,
                    conversation_id=conversation_id,
                    on_delta=queue.put_nowait,
                    memory_scope=scope,
                    delegated=delegated,
                    deliver=deliver,
                )
            except Exception as exc:
                if not isinstance(exc, AgentError):
                    _log.exception("streaming request failed unexpectedly")
                queue.put_nowait(exc)

        task = asyncio.create_task(produce())
        try:
            first = await _unless_disconnected(asyncio.ensure_future(queue.get()), receive)
        except asyncio.CancelledError:  # this request was cancelled before the first chunk
            task.cancel()
            raise
        if first is None:  # the client went away before the first chunk
            task.cancel()
            await asyncio.wait({task})
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        if isinstance(first, BaseException):
            await task
            return _error_response(first)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _RunStream(
            task,
            self._events(first, queue, task, delivered, include_usage),
            media_type="text/event-stream",
            headers=_trace_headers(),
        )

    async def _events(
        self,
        first: _StreamItem,
        queue: asyncio.Queue[_StreamItem],
        task: asyncio.Task[None],
        delivered: asyncio.Event,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        """The SSE events; a client that goes away before the last one cancels the run."""
        cid, model = new_completion_id(), self.agent.name
        item = first
        try:
            yield sse(chunk(cid, model, {"role": "assistant", "content": ""}))
            while True:
                if isinstance(item, str):
                    yield sse(chunk(cid, model, {"content": item}))
                elif isinstance(item, RunResult):
                    yield sse(chunk(cid, model, {}, item.finish_reason))
                    if include_usage:
                        yield sse(usage_chunk(cid, model, item.usage))
                    break
                else:  # the status line is already sent: report the error in the stream
                    yield sse(_error(item)[1])
                    break
                item = await queue.get()
            yield SSE_DONE
            delivered.set()
            await task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def create_agent_app(config: AgentConfig, otel: KaosOtelManager) -> FastAPI:
    """The agent's FastAPI app; MCP sessions open (and autonomous runs start) with the app."""
    state: dict[str, _AgentService] = {}
    faults = FaultSwitch.from_env()
    issuer = SessionIssuer.from_env()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        toolbox = McpToolbox(config.mcp_servers)
        timeout = httpx.Timeout(config.max_runtime_s, connect=10.0)
        async with httpx.AsyncClient(
            timeout=timeout, trust_env=False, event_hooks={"request": [async_inject_request_hook]}
        ) as http:
            model = ModelClient(config.model_base_url, http, config.model_api_key)
            memory = _memory_service(config, otel, faults)
            if memory is not None:
                await memory.start()
            agent = Agent(config, otel, model, toolbox, http, memory)
            state["service"] = _AgentService(agent, toolbox)
            toolbox.start()
            autonomous = (
                asyncio.create_task(
                    _autonomous_loop(
                        agent, toolbox, config.autonomous_goal, config.autonomous_interval_s, issuer
                    )
                )
                if config.autonomous_goal
                else None
            )
            try:
                yield
            finally:
                if autonomous is not None:
                    autonomous.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await autonomous
                await toolbox.aclose()
                if memory is not None:
                    await memory.aclose()

    app = FastAPI(
        title=f"kaos agent {config.name}", lifespan=lifespan, telemetry=FASTAPI_NATIVE_TELEMETRY_OFF
    )
    app.add_middleware(BodyLimitMiddleware)
    app.add_middleware(TraceContextMiddleware, otel=otel)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        """A body that is not a chat request (or not valid JSON) is a 400, as OpenAI's API says."""
        return _error_response(InvalidInputError(f"invalid request body ({len(exc.errors())} problems)"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """A body FastAPI cannot parse (not UTF-8) is a 400 in OpenAI's shape too; others as FastAPI does."""
        if exc.status_code == 400:
            return _error_response(InvalidInputError("request body is not valid UTF-8 JSON"))
        return await http_exception_handler(request, exc)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "agent": config.name}

    @app.get("/ready", response_model=None)
    async def ready() -> dict[str, Any] | JSONResponse:
        pending = state["service"].toolbox.pending
        if pending:
            return JSONResponse({"status": "starting", "pending_mcp_servers": pending}, status_code=503)
        return {"status": "ready", "agent": config.name}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        response: Response
        try:
            identity, scope = _identity(request, issuer)
            check_messages(body.messages)
        except AgentError as exc:
            return _error_response(exc)
        conversation_id = request.headers.get(CONVERSATION_ID_HEADER) or None
        if faults is not None and config.name == DOWN_AGENT:
            while faults.is_on(Fault.SUBAGENT_DOWN):  # the demo's "subagent-down": no answer
                await asyncio.sleep(0.2)
        service = state["service"]
        delegated = DELEGATED_BY_HEADER in request.headers
        if body.stream:
            response = await service.stream(
                body, identity, conversation_id, scope, delegated, request.receive
            )
        else:
            response = await service.complete(
                body, identity, conversation_id, scope, delegated, request.receive
            )
        response.headers[SESSION_ID_HEADER] = identity.session_id
        return response

    @app.delete("/v1/memory", response_model=None)
    async def forget(request: Request) -> JSONResponse:
        """Forget the request's memory scope (default ``session``) here and at every sub-agent.

        The answer counts what each agent deleted per store; it is a 503 naming the stores that
        failed (``agent/store``) if any did.
        """
        agent = state["service"].agent
        if agent.memory is None and not config.sub_agents:
            return JSONResponse(error_body("memory is off", "not_found"), status_code=404)
        try:
            identity, scope = _identity(request, issuer)
            report = await agent.forget(identity, scope)
        except AgentError as exc:
            return _error_response(exc)
        body = {"scope": scope.value, "deleted": report.deleted, "failed": report.failed}
        return JSONResponse(body, status_code=503 if report.failed else 200, headers=_trace_headers())

    return app


def _identity(request: Request, issuer: SessionIssuer) -> tuple[Identity, MemoryScope]:
    """Who the request acts for and its memory scope, by the gateway contract (:mod:`.identity`)."""
    raw = [(key.decode("latin-1"), value.decode("latin-1")) for key, value in request.headers.raw]
    values = identity_values(raw, issuer)
    user_id = values.get(USER_ID_HEADER) or None
    session_id = values.get(SESSION_ID_HEADER) or None
    scope = parse_scope(values.get(MEMORY_SCOPE_HEADER))
    if user_id is not None and user_id.startswith(AGENT_USER_PREFIX) and scope is not MemoryScope.SESSION:
        raise MemoryScopeError("an agent's autonomous runs have the session scope only")
    if user_id is None:
        if session_id is not None and not issuer.issued(session_id):
            raise IdentityError(
                "an anonymous request may only name a session this system issued (omit the header to get one)"
            )
        session_id = session_id or issuer.issue()
        if scope is not MemoryScope.SESSION:
            raise MemoryScopeError("anonymous requests have the session scope only")
    identity = Identity(user_id=user_id, session_id=session_id) if session_id else Identity(user_id=user_id)
    return identity, scope


def _memory_service(
    config: AgentConfig, otel: KaosOtelManager, faults: FaultSwitch | None
) -> MemoryService | None:
    """The agent's memory when ``memory_url`` is set (long-term facts only when enabled)."""
    if not config.memory_url:
        return None
    long_term = LongTermMemory(otel, config.model_base_url, faults) if config.memory_long_term else None
    return MemoryService(
        config.name,
        otel,
        RelationalStore(config.memory_url),
        long_term,
        window_tokens=config.memory_window_tokens,
        max_read_scope=config.memory_max_read_scope,
        faults=faults,
    )
