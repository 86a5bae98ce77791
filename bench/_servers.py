"""Out-of-process peers for the benchmarks: a scripted model and an OTLP receiver.

They run in their own processes (``python -m bench._servers model|receiver``) so their work does
not compete with the measured code for the GIL, as a real model server or collector would not.
Each prints ``READY <port>`` once it listens. The receiver then answers commands on stdin, one
per line: ``count`` (spans received so far), ``mode ok|unavailable|hang``, ``clear``, ``quit``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import IO, Any, Self, cast

# --------------------------------------------------------------------------- scripted model

TOOL_SCRIPT: tuple[tuple[str, dict[str, Any]], ...] = (
    ("add", {"a": 2, "b": 3}),
    ("lookup", {"query": "opening hours of the library"}),
)
"""The tool calls the scripted model asks for, in order, before it answers."""


def scripted_completion(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style chat completion: the next scripted tool call, or the final answer."""
    messages = body.get("messages") or []
    done = sum(1 for message in messages if message.get("role") == "tool")
    prompt_tokens = sum(len(str(message.get("content") or "").split()) + 4 for message in messages)
    if done < len(TOOL_SCRIPT):
        name, arguments = TOOL_SCRIPT[done]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{done}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        }
        finish, completion_tokens = "tool_calls", 12
    else:
        message = {"role": "assistant", "content": "The sum is 5 and the library opens at nine."}
        finish, completion_tokens = "stop", 11
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class _ModelServer(ThreadingHTTPServer):
    daemon_threads = True
    latency_s = 0.0


class _ModelHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _ModelServer

    def do_POST(self) -> None:
        """Answer ``/v1/chat/completions`` after the configured latency."""
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.server.latency_s > 0:
            time.sleep(self.server.latency_s)
        payload = json.dumps(scripted_completion(body)).encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging."""


def _serve_model(latency_s: float) -> None:
    server = _ModelServer(("127.0.0.1", 0), _ModelHandler)
    server.latency_s = latency_s
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()


# --------------------------------------------------------------------------- receiver


def _serve_receiver() -> None:
    from kaos_otel.receiver import OtlpReceiver

    receiver = OtlpReceiver().start()
    port = receiver.grpc_endpoint.rsplit(":", 1)[1]
    print(f"READY {port}", flush=True)
    try:
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            if command == "count":
                print(len(receiver.spans()), flush=True)
            elif command == "mode":
                receiver.set_failure(cast(Any, arg))
                print("ok", flush=True)
            elif command == "clear":
                receiver.clear()
                print("ok", flush=True)
            elif command == "quit":
                break
    finally:
        receiver.stop()


# --------------------------------------------------------------------------- parent side


class ServerProcess:
    """A ``bench._servers`` child process, started and always stopped by its own PID."""

    def __init__(self, kind: str, *args: str, ready_timeout_s: float = 30.0) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench._servers", kind, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        line = self._readline(ready_timeout_s)
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"bench server {kind!r} did not start: {line!r}")
        self.port = int(line.split()[1])

    def _readline(self, timeout_s: float) -> str:
        stdout = cast(IO[str], self._process.stdout)
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        return stdout.readline().strip() if ready else ""

    def command(self, text: str, timeout_s: float = 30.0) -> str:
        """Send one command line and return the reply line."""
        stdin = cast(IO[str], self._process.stdin)
        stdin.write(text + "\n")
        stdin.flush()
        return self._readline(timeout_s)

    def span_count(self) -> int:
        """Spans the receiver has accepted so far."""
        return int(self.command("count"))

    def wait_for_spans(self, expected: int, timeout_s: float) -> bool:
        """Poll until the receiver holds at least ``expected`` spans or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        while self.span_count() < expected:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Terminate the child (its PID only) and reap it."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the child processes."""
    parser = argparse.ArgumentParser(prog="python -m bench._servers")
    sub = parser.add_subparsers(dest="kind", required=True)
    model = sub.add_parser("model")
    model.add_argument("--latency", type=float, default=0.025)
    sub.add_parser("receiver")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.kind == "model":
        _serve_model(args.latency)
    else:
        _serve_receiver()


if __name__ == "__main__":
    main()
