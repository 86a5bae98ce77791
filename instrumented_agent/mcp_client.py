"""Long-lived MCP client sessions over streamable HTTP, one per server, and the tools they offer.

Each session is opened (and its tools listed) by a background task when the agent starts, so a
tool call during a request is exactly one ``tools/call``: one client span from the ``mcp`` SDK,
whose context travels in ``params._meta`` and, for servers that only read headers, in the HTTP
``traceparent`` header too. A session that stops answering is reopened in the background; a call
that fails (or whose arguments are too large) fails only its own request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from instrumented_agent.errors import ToolError
from kaos_otel.propagation import async_inject_request_hook

__all__ = ["McpTool", "McpToolbox"]

_log = logging.getLogger(__name__)
_RETRY_INITIAL_S = 0.2
_RETRY_MAX_S = 5.0
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
_PING_TIMEOUT_S = 5.0
MAX_TOOL_ARGUMENTS_BYTES = 256 * 1024
"""A tool call whose arguments are larger fails on its own, before it is sent."""


@dataclass(frozen=True)
class McpTool:
    """A tool offered by one MCP server."""

    name: str
    description: str
    input_schema: dict[str, Any]
    server_url: str


@dataclass
class _Session:
    url: str
    client: Client | None = None
    tools: dict[str, McpTool] = field(default_factory=dict)
    reopen: asyncio.Event = field(default_factory=asyncio.Event)
    connected: asyncio.Event = field(default_factory=asyncio.Event)


class McpToolbox:
    """The agent's MCP servers: open sessions, the union of their tools, and ``call``."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._sessions = [_Session(url) for url in urls]
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    def start(self) -> None:
        """Open every session in the background (retrying until it succeeds or :meth:`aclose`)."""
        self._tasks = [asyncio.create_task(self._keep_open(s), name=f"mcp {s.url}") for s in self._sessions]

    @property
    def ready(self) -> bool:
        """Whether every server is connected and its tools are known."""
        return all(s.client is not None for s in self._sessions)

    async def wait_until_ready(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for every server to be connected; whether they are."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                for session in self._sessions:
                    await session.connected.wait()
        return self.ready

    @property
    def pending(self) -> list[str]:
        """URLs of servers not connected yet."""
        return [s.url for s in self._sessions if s.client is None]

    def tools(self) -> dict[str, McpTool]:
        """Tools of the connected servers by name (the first server offering a name wins)."""
        tools: dict[str, McpTool] = {}
        for session in self._sessions:
            for name, tool in session.tools.items():
                tools.setdefault(name, tool)
        return tools

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Call tool ``name`` and return its text; :class:`ToolError` if it fails or reports an error."""
        session = next((s for s in self._sessions if name in s.tools and s.client is not None), None)
        if session is None or session.client is None:
            raise ToolError(f"no connected MCP server offers tool {name!r}")
        try:  # sized as the UTF-8 it is sent as
            size = len(json.dumps(arguments, default=str, ensure_ascii=False).encode())
        except ValueError as exc:  # half an emoji from a model's JSON: sent, it would break the session
            raise ToolError(f"arguments of {name!r} cannot be sent: {type(exc).__name__}") from exc
        if size > MAX_TOOL_ARGUMENTS_BYTES:
            raise ToolError(f"arguments of {name!r} are {size} bytes, above {MAX_TOOL_ARGUMENTS_BYTES}")
        client = session.client
        try:
            result = await client.call_tool(name, arguments)
        except Exception as exc:
            await self._reopen_if_broken(session, client)
            raise ToolError(f"MCP call to {name!r} failed: {type(exc).__name__}") from exc
        text = _text(result)
        if result.is_error:
            raise ToolError(f"tool {name!r} returned an error: {text}")
        return text

    async def _reopen_if_broken(self, session: _Session, client: Client) -> None:
        """Reopen the session only if it no longer answers a ping: one failed call (a timeout, an
        oversized reply, a server-side error) must not fail the other requests sharing it."""
        try:
            await asyncio.wait_for(client.send_ping(), _PING_TIMEOUT_S)
        except Exception:
            if session.client is client:
                session.reopen.set()

    async def aclose(self) -> None:
        """Close every session and stop the background tasks."""
        self._closing = True
        for session in self._sessions:
            session.reopen.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _keep_open(self, session: _Session) -> None:
        delay = _RETRY_INITIAL_S
        while not self._closing:
            try:
                async with (
                    httpx2.AsyncClient(
                        timeout=_HTTP_TIMEOUT, event_hooks={"request": [async_inject_request_hook]}
                    ) as http,
                    Client(streamable_http_client(session.url, http_client=http)) as client,
                ):
                    listing = await client.list_tools()
                    session.tools = {
                        tool.name: McpTool(
                            tool.name, tool.description or "", dict(tool.input_schema), session.url
                        )
                        for tool in listing.tools
                    }
                    session.client = client
                    session.connected.set()
                    delay = _RETRY_INITIAL_S
                    _log.info("connected to MCP server %s (%d tools)", session.url, len(session.tools))
                    await session.reopen.wait()
            except Exception as exc:
                _log.warning("MCP server %s unavailable (%s); retrying", session.url, type(exc).__name__)
            finally:
                session.client = None
                session.connected.clear()
                session.tools = {}
                session.reopen.clear()
            if not self._closing:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))
