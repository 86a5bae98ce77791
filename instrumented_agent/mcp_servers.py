"""The demo's MCP servers (calculator and echo search) over streamable HTTP.

Tracing comes from the ``mcp`` SDK itself: every request gets one SERVER span whose parent is the
trace context the client put in ``params._meta``. The spans go to the global tracer provider that
:class:`kaos_otel.KaosOtelManager` installs, so no extra HTTP server span is added here. Ahead of
the SDK's tracing, trace-context entries of ``_meta`` that are not text are dropped: OpenTelemetry's
propagators raise on them, and a number as ``baggage`` failed the call, one as ``tracestate``
lost a valid ``traceparent``.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, cast

from mcp.server.context import CallNext, HandlerResult, ServerMiddleware, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import RequestParamsMeta
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kaos_otel import run_in_executor_in_context

__all__ = ["MCP_PATH", "McpServerKind", "TraceContextMetaGuard", "create_mcp_app", "create_mcp_server"]

McpServerKind = Literal["calculator", "echo"]
MCP_PATH = "/mcp"

_log = logging.getLogger(__name__)


def _calculator() -> MCPServer:
    server = MCPServer("calculator", instructions="Arithmetic tools.")

    @server.tool()
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        _log.info("add called")
        total = a + b
        if not math.isfinite(total):  # JSON has no NaN or infinity: the answer would read null
            raise ToolError("the numbers and their sum must be finite")
        return total

    return server


def _search(message: str) -> str:
    """The blocking "search backend" (runs in a worker thread)."""
    _log.info("searching for %d characters", len(message))
    return f"echo: {message}"


def _echo() -> MCPServer:
    server = MCPServer("echo-search", instructions="A search tool that echoes the query back.")
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="echo-search")

    @server.tool()
    async def echo(message: str) -> str:
        """Search for a message (returns the message itself)."""
        # A plain thread pool does not copy the context; the helper does, so the worker's log
        # records carry the trace and the span of this tool call.
        return await run_in_executor_in_context(pool, _search, message)

    return server


_TRACE_CONTEXT_FIELDS = ("traceparent", "tracestate", "baggage")


class TraceContextMetaGuard(ServerMiddleware[Any]):
    """Drops the trace-context entries of a request's ``_meta`` that are not text, before the SDK's
    tracing reads them (the outermost middleware)."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        meta = ctx.meta
        if meta and any(not isinstance(meta.get(field, ""), str) for field in _TRACE_CONTEXT_FIELDS):
            kept = {
                key: value
                for key, value in meta.items()
                if key not in _TRACE_CONTEXT_FIELDS or isinstance(value, str)
            }
            ctx.meta = cast(RequestParamsMeta, kept)
        return await call_next(ctx)


def create_mcp_server(kind: McpServerKind) -> MCPServer:
    """A fresh calculator or echo-search server."""
    server = _calculator() if kind == "calculator" else _echo()
    server.middleware.insert(0, TraceContextMetaGuard())  # ahead of the SDK's tracing
    return server


def create_mcp_app(kind: McpServerKind) -> Starlette:
    """The server as a stateless streamable-HTTP app at :data:`MCP_PATH`, plus ``GET /health``."""
    app = create_mcp_server(kind).streamable_http_app(
        streamable_http_path=MCP_PATH, stateless_http=True, json_response=True
    )
    app.add_route("/health", _health, methods=["GET"])
    return app


async def _health(_: Request) -> Response:
    return JSONResponse({"status": "ok"})
