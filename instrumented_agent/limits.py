"""What one request may cost the agent: body size, messages, text, and what memory keeps and recalls.

Every limit answers with a clear HTTP error (413 for size, 400 for malformed input) before any
work starts, so one client cannot exhaust memory, the database or the model's context for others.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from instrumented_agent.errors import AgentError
from instrumented_agent.openai_api import LONE_SURROGATE, ChatMessage, error_body
from kaos_otel.instrumentation.asgi import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_MESSAGES",
    "MAX_MESSAGE_CHARS",
    "MAX_STORED_TURN_CHARS",
    "BodyLimitMiddleware",
    "InvalidInputError",
    "RequestTooLargeError",
    "cap_turn",
    "check_messages",
]

MAX_BODY_BYTES = 1 << 20
"""A request body above 1 MiB is refused (413) before it is read whole."""
MAX_MESSAGES = 200
MAX_MESSAGE_CHARS = 64 * 1024
MAX_STORED_TURN_CHARS = 8 * 1024
"""A turn longer than this is stored cut (with a marker saying how much was cut)."""


class RequestTooLargeError(AgentError):
    """The request is above a size limit."""

    status_code = 413
    error_type = "request_too_large"


class InvalidInputError(AgentError):
    """The request's text is not valid Unicode."""

    status_code = 400
    error_type = "invalid_request_error"


def check_messages(messages: Sequence[ChatMessage]) -> None:
    """Refuse no messages, too many or too long ones, and text that is not valid Unicode (a lone
    surrogate anywhere in a message, its tool calls and other fields included: it cannot be sent
    on to the model)."""
    if not messages:
        raise InvalidInputError("messages must hold at least one message")
    if len(messages) > MAX_MESSAGES:
        raise RequestTooLargeError(f"at most {MAX_MESSAGES} messages per request")
    for message in messages:
        if len(message.text()) > MAX_MESSAGE_CHARS:
            raise RequestTooLargeError(f"a message may hold at most {MAX_MESSAGE_CHARS} characters")
        if LONE_SURROGATE.search(json.dumps(message.model_dump(exclude_none=True), ensure_ascii=False)):
            raise InvalidInputError("message text is not valid Unicode (lone surrogate)")


def cap_turn(text: str) -> str:
    """``text`` cut to :data:`MAX_STORED_TURN_CHARS`, saying how much was cut."""
    if len(text) <= MAX_STORED_TURN_CHARS:
        return text
    marker = f" ...[cut {len(text) - MAX_STORED_TURN_CHARS} chars]"
    return text[: MAX_STORED_TURN_CHARS - len(marker)] + marker


class BodyLimitMiddleware:
    """ASGI middleware answering 413 to a body above ``limit`` bytes (declared or streamed)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await _too_large(send, self.limit)
            return
        chunks: list[bytes] = []
        received = 0
        while True:  # read the body here, at most ``limit`` bytes of it, then hand it on whole
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was complete
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.limit:
                await _too_large(send, self.limit)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


async def _too_large(send: Send, limit: int) -> None:
    body = json.dumps(
        error_body(f"request body above {limit} bytes", RequestTooLargeError.error_type)
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
