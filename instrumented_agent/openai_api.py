"""The slice of the OpenAI chat-completions wire format that the agents and the scripted model speak."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "LONE_SURROGATE",
    "SSE_DONE",
    "ChatMessage",
    "ChatRequest",
    "Completion",
    "StreamOptions",
    "ToolCall",
    "ToolFunction",
    "Usage",
    "chunk",
    "completion_body",
    "completion_chunks",
    "error_body",
    "function_tool",
    "new_completion_id",
    "sse",
    "usage_chunk",
]

SSE_DONE = "data: [DONE]\n\n"
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""Half a UTF-16 surrogate pair in a ``str`` (a JSON ``\\ud83d`` escape without its other half, as
when an emoji is cut): not valid Unicode, so UTF-8 cannot carry it on."""


class ToolFunction(BaseModel):
    """The function a tool call names, with JSON-encoded arguments."""

    name: str
    arguments: str = "{}"


class ToolCall(BaseModel):
    """One tool call requested by the model."""

    id: str
    type: Literal["function"] = "function"
    function: ToolFunction

    def arguments_object(self) -> dict[str, Any]:
        """The arguments as a dict (``{}`` for none); ``ValueError`` if they are not a JSON object
        (cut short by the model's token limit, say)."""
        try:
            value = json.loads(self.function.arguments or "{}")
        except RecursionError as exc:  # nested too deep for the parser
            raise ValueError("arguments nested too deep") from exc
        if not isinstance(value, dict):
            raise ValueError(f"arguments are a JSON {type(value).__name__}, not an object")
        return value

    def arguments_or_empty(self) -> dict[str, Any]:
        """The arguments as a dict, or ``{}`` if they are not a JSON object."""
        try:
            return self.arguments_object()
        except ValueError:
            return {}


class ChatMessage(BaseModel):
    """A chat message; unknown fields are kept."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as plain text (text parts joined)."""
        if isinstance(self.content, list):
            return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")
        return self.content or ""


class StreamOptions(BaseModel):
    """``stream_options`` of a streaming request."""

    include_usage: bool = False


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions`` body; unknown fields are kept."""

    model_config = ConfigDict(extra="allow")

    model: str = ""
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    def tool_names(self) -> set[str]:
        """Names of the function tools offered to the model (entries without a function object
        name none)."""
        functions = [tool.get("function") for tool in self.tools or ()]
        return {str(function.get("name")) for function in functions if isinstance(function, dict)}


class Usage(BaseModel):
    """Token usage of one completion."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True)
class Completion:
    """One assistant reply: message, finish reason and usage."""

    id: str
    model: str
    message: ChatMessage
    finish_reason: str
    usage: Usage


def new_completion_id() -> str:
    """A fresh ``chatcmpl-...`` id."""
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def function_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A ``tools`` entry for a function with a JSON-schema ``parameters`` object."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def completion_body(completion: Completion) -> dict[str, Any]:
    """The non-streaming response body for ``completion``."""
    return {
        "id": completion.id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": completion.model,
        "choices": [
            {
                "index": 0,
                "message": completion.message.model_dump(exclude_none=True),
                "finish_reason": completion.finish_reason,
            }
        ],
        "usage": completion.usage.model_dump(),
    }


def sse(data: dict[str, Any]) -> str:
    """One server-sent event carrying ``data`` as JSON."""
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def chunk(
    completion_id: str,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with one choice."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(completion_id: str, model: str, usage: Usage) -> dict[str, Any]:
    """The trailing chunk sent when ``stream_options.include_usage`` is set."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage.model_dump(),
    }


def completion_chunks(completion: Completion, *, include_usage: bool) -> Iterator[str]:
    """``completion`` as a complete SSE stream: role, content words, tool calls, finish, usage, ``[DONE]``."""
    cid, model = completion.id, completion.model
    yield sse(chunk(cid, model, {"role": "assistant", "content": ""}))
    words = completion.message.text().split(" ")
    for index, word in enumerate(words):
        if word or index:
            yield sse(chunk(cid, model, {"content": word if index == 0 else " " + word}))
    for index, call in enumerate(completion.message.tool_calls or ()):
        delta = {"tool_calls": [{"index": index, **call.model_dump()}]}
        yield sse(chunk(cid, model, delta))
    yield sse(chunk(cid, model, {}, completion.finish_reason))
    if include_usage:
        yield sse(usage_chunk(cid, model, completion.usage))
    yield SSE_DONE


def error_body(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body: ``{"error": {"message", "type", "code"}}``."""
    return {"error": {"message": message, "type": error_type, "code": code}}
