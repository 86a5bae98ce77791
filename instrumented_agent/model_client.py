"""OpenAI-compatible chat-completions client over httpx, for any base URL and key."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from pydantic import ValidationError

from instrumented_agent.errors import ModelError
from instrumented_agent.openai_api import (
    LONE_SURROGATE,
    ChatMessage,
    Completion,
    ToolCall,
    ToolFunction,
    Usage,
)
from kaos_otel._secrets import REDACTED, default_redactor

__all__ = ["DeltaSink", "ModelClient"]

DeltaSink = Callable[[str], None]
"""Receives each content fragment of a streamed reply as it arrives."""


_MAX_ERROR_CHARS = 300


class ModelClient:
    """Calls ``{base_url}/chat/completions`` (``base_url`` usually ends in ``/v1``).

    The caller owns ``http_client`` (and decides its timeouts and event hooks, e.g. trace
    context injection). Every failure is raised as :class:`ModelError`.
    """

    def __init__(self, base_url: str, http_client: httpx.AsyncClient, api_key: str | None = None) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._http = http_client
        self._api_key = api_key
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        parsed = httpx.URL(self._url)
        self.server_address = parsed.host
        self.server_port = parsed.port or (443 if parsed.scheme == "https" else 80)

    async def complete(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[dict[str, Any]] = (),
        on_delta: DeltaSink | None = None,
        on_first_chunk: Callable[[], None] | None = None,
    ) -> Completion:
        """One completion; streamed (content passed to ``on_delta`` as it arrives) if ``on_delta`` is
        set, ``on_first_chunk`` called when the stream's first chunk arrives."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [m.model_dump(exclude_none=True) for m in messages],
        }
        if tools:
            body["tools"] = list(tools)
        if on_delta is not None:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        content = _request_body(body)
        headers = {**self._headers, "content-type": "application/json"}
        try:
            if on_delta is None:
                response = await self._http.post(self._url, content=content, headers=headers)
                _raise_for_status(response, self._api_key)
                return _parse_completion(response.json(), model)
            async with self._http.stream("POST", self._url, content=content, headers=headers) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for_status(response, self._api_key)
                return await _read_stream(response, model, on_delta, on_first_chunk, self._api_key)
        except httpx.HTTPError as exc:
            raise ModelError(f"model request failed: {type(exc).__name__}", type(exc).__name__) from exc
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
            raise ModelError(f"malformed model response: {type(exc).__name__}", "malformed_response") from exc


def _request_body(body: dict[str, Any]) -> bytes:
    """``body`` as UTF-8 JSON, each lone surrogate (from a tool result, a sub-agent's answer or a
    tool's description, say) replaced by U+FFFD: UTF-8 cannot carry it, and the conversation must
    still reach the model."""
    return _valid_text(json.dumps(body, ensure_ascii=False, separators=(",", ":"))).encode()


def _raise_for_status(response: httpx.Response, api_key: str | None) -> None:
    if response.status_code < 400:
        return
    try:
        message = str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError, RecursionError):
        message = response.reason_phrase
    raise ModelError(
        f"model answered HTTP {response.status_code}: {_masked(message, api_key)}", str(response.status_code)
    )


def _masked(message: str, api_key: str | None) -> str:
    """The model endpoint's error text, safe to return, log and record: the caller's key (which
    endpoints echo) and anything that looks like a secret masked, the length capped."""
    if api_key:
        message = message.replace(api_key, REDACTED)
    message = default_redactor(message)
    return message if len(message) <= _MAX_ERROR_CHARS else message[:_MAX_ERROR_CHARS] + "..."


def _delivered_whole(
    completion: Completion, on_delta: DeltaSink, on_first_chunk: Callable[[], None] | None
) -> Completion:
    """A whole completion answered to a streaming request, passed on as one chunk."""
    if on_first_chunk is not None:
        on_first_chunk()
    if completion.message.text():
        on_delta(completion.message.text())
    return completion


def _valid_text(text: str) -> str:
    """``text`` with each lone surrogate (half an emoji the endpoint escaped, then cut) replaced by
    U+FFFD, as a UTF-8 decoder does: the answer stays, and it can be answered, sent on and stored."""
    return LONE_SURROGATE.sub("\ufffd", text)


def _parse_completion(body: dict[str, Any], model: str) -> Completion:
    choice = body["choices"][0]
    try:
        message = ChatMessage.model_validate(choice["message"])
        usage = Usage.model_validate(body.get("usage") or {})
    except ValidationError as exc:
        raise ValueError(str(exc)) from exc
    if isinstance(message.content, str):
        message.content = _valid_text(message.content)
    elif message.content is not None:
        message.content = [
            {**part, "text": _valid_text(part["text"])} if isinstance(part.get("text"), str) else part
            for part in message.content
        ]
    return Completion(
        id=str(body.get("id") or ""),  # "" when the API gave none: no id is made up
        model=str(body.get("model") or model),
        message=message,
        finish_reason=str(choice.get("finish_reason") or "stop"),
        usage=usage,
    )


def _delta_text(content: object) -> str:
    """The text of a streamed content fragment: a string, or content parts (text parts joined, as
    in a whole message); ``ValueError`` for anything else."""
    if content is None or isinstance(content, str):
        return _valid_text(content or "")
    return _valid_text(ChatMessage.model_validate({"role": "assistant", "content": content}).text())


def _name_so_far(name: str, fragment: str) -> str:
    """A streamed tool call's name with its next ``fragment``: OpenAI sends the name once, some
    servers in pieces (Gemini), others whole in every fragment (Anthropic's and MiniMax's
    OpenAI-compatible APIs), so a fragment that repeats the whole name so far adds nothing."""
    return name if fragment == name else name + fragment


async def _read_stream(
    response: httpx.Response,
    model: str,
    on_delta: DeltaSink,
    on_first_chunk: Callable[[], None] | None,
    api_key: str | None,
) -> Completion:
    """Assemble a streamed completion (content, tool-call fragments by index, usage); a body
    without a single ``data:`` line is read as a whole completion (an endpoint that does not
    stream), whatever its content type says."""
    content: list[str] = []
    whole: list[str] | None = []  # the lines, until the first event shows it is a stream
    calls: dict[object, dict[str, str]] = {}  # by index, or by id from a server that sends none
    last_call: object = 0
    finish_reason = "stop"
    usage = Usage()
    completion_id, response_model = "", model
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            if whole is not None:
                whole.append(line)
            continue
        whole = None
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise TypeError(f"a stream chunk that is no object: {type(chunk).__name__}")
        if "error" in chunk:
            error = chunk["error"]
            error_text = str(error.get("message", "unknown error") if isinstance(error, dict) else error)
            raise ModelError(f"model stream failed: {_masked(error_text, api_key)}", "stream_error")
        if on_first_chunk is not None:
            on_first_chunk()
            on_first_chunk = None
        completion_id = str(chunk.get("id") or completion_id)
        response_model = str(chunk.get("model") or response_model)
        if chunk.get("usage"):
            usage = Usage.model_validate(chunk["usage"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = _delta_text(delta.get("content"))
            if text:
                content.append(text)
                on_delta(text)
            for fragment in delta.get("tool_calls") or ():
                index = fragment.get("index")
                if isinstance(index, str) and index.isdigit():
                    index = int(index)
                last_call = index if isinstance(index, int) else fragment.get("id") or last_call
                call = calls.setdefault(last_call, {"id": "", "name": "", "arguments": ""})
                function = fragment.get("function") or {}
                call["id"] = fragment.get("id") or call["id"]
                call["name"] = _name_so_far(call["name"], function.get("name") or "")
                call["arguments"] += function.get("arguments") or ""
            finish_reason = str(choice.get("finish_reason") or finish_reason)
    if whole is not None:  # no event at all: an answer in one body, or nothing usable (ValueError)
        completion = _parse_completion(json.loads("\n".join(whole)), model)
        return _delivered_whole(completion, on_delta, on_first_chunk)
    indexes = [key for key in calls if isinstance(key, int)]
    ordered = [calls[key] for key in sorted(indexes)] if len(indexes) == len(calls) else list(calls.values())
    tool_calls = [
        ToolCall(id=c["id"], function=ToolFunction(name=c["name"], arguments=c["arguments"] or "{}"))
        for c in ordered
    ]
    message = ChatMessage(role="assistant", content="".join(content) or None, tool_calls=tool_calls or None)
    return Completion(completion_id, response_model, message, finish_reason, usage)
