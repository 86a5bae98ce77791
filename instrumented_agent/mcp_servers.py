"""The demo's MCP servers (calculator and echo search) over streamable HTTP.

Tracing comes from the ``mcp`` SDK itself: every request gets one SERVER span whose parent is the
trace context the client put in ``params._meta``. The spans go to the global tracer provider that
:class:`kaos_otel.KaosOtelManager` installs, so no extra HTTP server span is added here.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kaos_otel import run_in_executor_in_context

__all__ = ["MCP_PATH", "McpServerKind", "create_mcp_app", "create_mcp_server"]

McpServerKind = Literal["calculator", "echo"]
MCP_PATH = "/mcp"

_log = logging.getLogger(__name__)


def _calculator() -> MCPServer:
    server = MCPServer("calculator", instructions="Arithmetic tools.")

    @server.tool()
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        _log.info("add called")
        return a + b

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


def create_mcp_server(kind: McpServerKind) -> MCPServer:
    """A fresh calculator or echo-search server."""
    return _calculator() if kind == "calculator" else _echo()


def create_mcp_app(kind: McpServerKind) -> Starlette:
    """The server as a stateless streamable-HTTP app at :data:`MCP_PATH`, plus ``GET /health``."""
    app = create_mcp_server(kind).streamable_http_app(
        streamable_http_path=MCP_PATH, stateless_http=True, json_response=True
    )
    app.add_route("/health", _health, methods=["GET"])
    return app


async def _health(_: Request) -> Response:
    return JSONResponse({"status": "ok"})
