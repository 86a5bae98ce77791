"""Offline Mem0 for tests: environment, a scripted OpenAI-compatible server and a network guard.

Import this module before anything imports ``mem0``: it turns mem0's telemetry off and points
``MEM0_DIR`` at a temporary folder (removed at exit).
"""

from __future__ import annotations

import atexit
import ipaddress
import itertools
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import pytest

if getattr(sys.modules.get("mem0.memory.telemetry"), "MEM0_TELEMETRY", False):
    raise RuntimeError("mem0 was imported with its telemetry on before tests/mem0_support.py")
os.environ["MEM0_TELEMETRY"] = "False"
_MEM0_DIR = tempfile.mkdtemp(prefix="kaos-mem0-")
os.environ.setdefault("MEM0_DIR", _MEM0_DIR)
atexit.register(shutil.rmtree, _MEM0_DIR, ignore_errors=True)

from mem0 import AsyncMemory, Memory  # noqa: E402

from kaos_otel.instrumentation.mem0.offline import offline_async_memory, offline_memory  # noqa: E402

__all__ = ["AsyncMemory", "Memory", "NetworkGuard", "ScriptedModelServer", "make_memory", "memory_caller"]

Flavor = Literal["sync", "async"]
MemoryCall = Callable[..., Awaitable[Any]]
_databases = itertools.count()


class ScriptedModelServer:
    """A minimal OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 for mem0's extraction.

    Every completion answers ``{"memory": [{"id": "0", "text": fact}, ...]}`` with ``facts``;
    request bodies are kept in ``requests``.
    """

    def __init__(self, facts: tuple[str, ...] = ()) -> None:
        self.facts = facts
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    self._reply(HTTPStatus.NOT_FOUND, {"error": {"message": f"no route {self.path}"}})
                    return
                server.requests.append(body)
                self._reply(HTTPStatus.OK, server.completion(body))

            def _reply(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="model-server", daemon=True
        )

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``http://127.0.0.1:PORT/v1``)."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def completion(self, request: dict[str, Any]) -> dict[str, Any]:
        """A chat completion whose content is the scripted extraction result."""
        content = json.dumps({"memory": [{"id": str(i), "text": fact} for i, fact in enumerate(self.facts)]})
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": 0,
            "model": request.get("model", "scripted"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
        }

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def _is_loopback(host: object) -> bool:
    if host in (None, "localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


class NetworkGuard:
    """Fails any connection or name lookup that is not loopback, and remembers the attempts."""

    def __init__(self) -> None:
        self.violations: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Patch ``socket`` for the duration of the test."""
        guard = self
        original_connect = socket.socket.connect
        original_connect_ex = socket.socket.connect_ex
        original_getaddrinfo = socket.getaddrinfo

        def check(family: int, address: Any) -> None:
            if family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
                guard.violations.append(f"connect {address!r}")
                raise OSError(f"network access blocked in tests: {address!r}")

        def connect(sock: socket.socket, address: Any) -> None:
            check(sock.family, address)
            original_connect(sock, address)

        def connect_ex(sock: socket.socket, address: Any) -> int:
            check(sock.family, address)
            return original_connect_ex(sock, address)

        def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            name = host.decode() if isinstance(host, bytes) else host
            if not _is_loopback(name):
                guard.violations.append(f"getaddrinfo {name!r}")
                raise socket.gaierror(f"name lookup blocked in tests: {name!r}")
            return original_getaddrinfo(host, *args, **kwargs)

        monkeypatch.setattr(socket.socket, "connect", connect)
        monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def make_memory(flavor: Flavor, model_server: ScriptedModelServer, folder: Path) -> Any:
    """An offline ``Memory`` or ``AsyncMemory`` with its own history database in ``folder``."""
    build = offline_memory if flavor == "sync" else offline_async_memory
    return build(model_server.base_url, history_db_path=folder / f"history-{next(_databases)}.db")


def memory_caller(memory: Any) -> MemoryCall:
    """``await call("search", ...)`` for a ``Memory`` and an ``AsyncMemory`` alike."""

    async def call(method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(memory, method)(*args, **kwargs)
        return await result if isinstance(result, Awaitable) else result

    return call
