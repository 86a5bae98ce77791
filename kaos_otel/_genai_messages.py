"""Chat messages in the shape the GenAI conventions give ``gen_ai.input.messages`` and
``gen_ai.output.messages``: ``{"role", "parts": [...]}``, output messages with a ``finish_reason``.

Messages in the OpenAI Chat Completions shape (``content`` as text or content parts,
``tool_calls``, ``tool_call_id``, ``refusal``, the legacy ``function_call``), the shape most agent
code holds, are converted, as dicts or as the ``openai`` SDK's objects (anything with
``model_dump()``); for the output, choices, a whole completion (its ``choices``) and the chunks of
a streamed one (each choice's deltas joined) too. So are the content blocks of Anthropic's
Messages API (``tool_use``, ``tool_result``, ``thinking``, ``image`` and ``document``) and its
``stop_reason``; media sent inline become ``blob`` parts, uploaded files ``file`` parts. A message
that already has ``parts`` is kept as it is, and plain text becomes one text part. Anything else
(a mapping that is no message, a list holding one) is kept as given.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kaos_otel._content import _MAX_WALKED_VALUES

_FINISH_REASONS = {
    "tool_calls": "tool_call",
    "function_call": "tool_call",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_call",
    "refusal": "content_filter",
}
"""OpenAI's and Anthropic's finish reasons (``stop_reason``) that the conventions spell differently."""


_CONTENT_KEYS = frozenset({"content", "parts", "tool_calls", "tool_call_id", "function_call", "refusal"})
"""A mapping with none of these keys carries no chat message's content (a choice holds one under
``message``): it is kept as given rather than converted into an empty message..."""

_EMPTY_MESSAGE_KEYS = frozenset({"role", "name", "audio", "annotations"})
_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
"""...unless it is a chat role's message with nothing in it (``model_dump(exclude_none=True)`` of
an empty reply is ``{"role": "assistant"}``)."""

_MAX_CONVERTED = _MAX_WALKED_VALUES // 3 + 1
"""Messages converted at most: the walk that exports them (span JSON, the event's value) keeps
10,000 values, at least three of each message (itself, its role, its parts), so it never gets
past these; the rest are kept as given (a history of 100,000 messages took half a second to
convert for the 8 KB kept)."""

_REASONING_KEYS = ("reasoning_content", "reasoning")
"""Where OpenAI-compatible servers (DeepSeek, vLLM, OpenRouter...) put a message's reasoning."""

_ROLES = {"developer": "system", "function": "tool"}
"""OpenAI's roles that the conventions spell differently (``function``: the legacy call's result)."""


def input_messages(value: object) -> object:
    """``gen_ai.input.messages`` from text, one message or a sequence of messages."""
    if isinstance(value, str):
        return [{"role": "user", "parts": [_text(value)]}]
    messages = _message_list(value, choices=False)
    if messages is None:
        return value
    return [_message(message) for message, _ in messages] + _not_converted(value)


def output_messages(value: object, finish_reasons: Sequence[str] = ()) -> object:
    """``gen_ai.output.messages`` from text, one message or choice, or a sequence of them.

    A message's ``finish_reason`` is its choice's, else the one recorded for its choice's index or
    its position (``record_usage``), else ``tool_call`` when it calls a tool, ``stop`` when not.
    """
    if isinstance(value, str):
        value = [{"role": "assistant", "content": value}]
    given = value
    if isinstance(value, list | tuple) and value and all(map(_is_chunk, value)):
        value = _joined_chunks(value)
    value = _dumped(value)
    if isinstance(value, Mapping) and isinstance(value.get("choices"), list | tuple):
        value = value["choices"]  # a whole completion
    messages = _message_list(value, choices=True)
    if messages is None:
        return given
    converted = []
    for index, (item, choice) in enumerate(messages):
        reason: object = None
        position = index
        if choice is not None:  # an OpenAI choice: {"index", "message", "finish_reason"}
            reason = choice.get("finish_reason")
            if type(choice.get("index")) is int:
                position = choice["index"]
        message = dict(_message(item, default_role="assistant"))  # the caller's own is not changed
        if "finish_reason" not in message:
            if reason is None:
                reason = item.get("finish_reason")
            if reason is None:
                reason = item.get("stop_reason")  # an Anthropic message's
            if reason is None and 0 <= position < len(finish_reasons):
                reason = finish_reasons[position]
            if reason is None:
                parts = message["parts"] if isinstance(message["parts"], list | tuple) else ()
                calls = any(isinstance(part, Mapping) and part.get("type") == "tool_call" for part in parts)
                reason = "tool_call" if calls else "stop"
            message["finish_reason"] = _FINISH_REASONS.get(str(reason), str(reason))
        converted.append(message)
    return converted + _not_converted(value)


def _not_converted(value: object) -> list[Any]:
    """The messages past :data:`_MAX_CONVERTED`, as given: no export walks them, but they are
    there for the walk to say that it left some out."""
    return list(value[_MAX_CONVERTED:]) if isinstance(value, list | tuple) else []


def _field(item: object, name: str) -> Any:
    """A field of a mapping or of an object (the ``openai`` SDK's chunks are read without being
    dumped: a long answer streams in a thousand of them)."""
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _is_chunk(item: object) -> bool:
    """A chunk of a streamed Chat Completion (``chat.completion.chunk``)."""
    return bool(_field(item, "object") == "chat.completion.chunk")


def _joined_chunks(chunks: Sequence[object]) -> list[dict[str, Any]]:
    """The choices a streamed completion's chunks add up to: each choice's ``delta``s joined (text
    appended, tool calls gathered by their index, or their id when a server sends none, arguments
    appended) and its last finish reason. Pieces are joined once, at the end."""
    joined: dict[int, _StreamedChoice] = {}
    for chunk in chunks:
        for choice in _field(chunk, "choices") or ():
            index = _field(choice, "index")
            entry = joined.setdefault(index if type(index) is int else 0, _StreamedChoice())
            if _field(choice, "finish_reason") is not None:
                entry.finish_reason = _field(choice, "finish_reason")
            delta = _field(choice, "delta")
            if delta is not None:
                entry.add(delta)
    return [entry.choice(index) for index, entry in sorted(joined.items())]


class _StreamedChoice:
    """One choice of a stream, as its deltas arrive."""

    def __init__(self) -> None:
        self.role: object = None
        self.texts: dict[str, list[str]] = {}
        """``content``, ``refusal`` and reasoning pieces."""
        self.calls: dict[object, dict[str, Any]] = {}
        """Tool calls by index (or id), each with its ``id`` and the pieces of its function."""
        self.last_call: object = None
        self.legacy: dict[str, Any] | None = None
        self.finish_reason: object = None

    def add(self, delta: object) -> None:
        if self.role is None and isinstance(_field(delta, "role"), str):
            self.role = _field(delta, "role")
        for key in ("content", "refusal", *_REASONING_KEYS):
            if isinstance(_field(delta, key), str):
                self.texts.setdefault(key, []).append(_field(delta, key))
        for call_delta in _field(delta, "tool_calls") or ():
            call_key = _field(call_delta, "index")
            if call_key is None:  # a server that sends no index: a new id starts a new call
                call_key = _field(call_delta, "id") or self.last_call
            self.last_call = call_key
            call = self.calls.setdefault(call_key, {"function": {"arguments": []}})
            if _field(call_delta, "id") is not None:
                call.setdefault("id", _field(call_delta, "id"))
            _join_function(call["function"], _field(call_delta, "function"))
        if _field(delta, "function_call") is not None:  # the legacy single call
            if self.legacy is None:
                self.legacy = {"arguments": []}
            _join_function(self.legacy, _field(delta, "function_call"))

    def choice(self, index: int) -> dict[str, Any]:
        message: dict[str, Any] = {key: "".join(pieces) for key, pieces in self.texts.items()}
        if self.role is not None:
            message["role"] = self.role
        if self.calls:
            keys = list(self.calls)
            if all(type(key) is int for key in keys):
                keys.sort()  # by index, as the API numbers them
            message["tool_calls"] = [
                {**self.calls[key], "function": _joined_function(self.calls[key]["function"])} for key in keys
            ]
        if self.legacy is not None:
            message["function_call"] = _joined_function(self.legacy)
        choice: dict[str, Any] = {"index": index, "message": message}
        if self.finish_reason is not None:
            choice["finish_reason"] = self.finish_reason
        return choice


def _join_function(function: dict[str, Any], delta: object) -> None:
    """Add a called function's delta: its name once, a piece of its arguments."""
    if isinstance(_field(delta, "name"), str):
        function.setdefault("name", _field(delta, "name"))
    if isinstance(_field(delta, "arguments"), str):
        function["arguments"].append(_field(delta, "arguments"))


def _joined_function(function: dict[str, Any]) -> dict[str, Any]:
    return {**function, "arguments": "".join(function["arguments"])}


_Found = tuple[Mapping[str, Any], Mapping[str, Any] | None]
"""A message found, and the choice that held it (``None`` for a message on its own)."""


def _message_list(value: object, *, choices: bool) -> list[_Found] | None:
    """The messages in ``value`` (with ``choices``, also held by choices), each dumped once, when
    every item is one, else ``None`` (kept as given); at most :data:`_MAX_CONVERTED`."""
    items = [value] if isinstance(value, Mapping) else value
    if not isinstance(items, list | tuple):
        items = [items] if hasattr(items, "model_dump") else None
    if items is None:
        return None
    found: list[_Found] = []
    for item in items[:_MAX_CONVERTED]:
        item = _dumped(item)
        if not isinstance(item, Mapping):
            return None
        inner = _dumped(item.get("message")) if choices else None
        message, choice = (inner, item) if isinstance(inner, Mapping) else (item, None)
        if not _is_message(message):
            return None
        found.append((message, choice))
    return found


def _is_message(item: Mapping[str, Any]) -> bool:
    if not _CONTENT_KEYS.isdisjoint(item):
        return True
    return item.get("role") in _CHAT_ROLES and _EMPTY_MESSAGE_KEYS.issuperset(item)


def _dumped(value: object) -> object:
    """A pydantic model (the ``openai`` SDK's messages and choices) as its dict, else ``value``."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, Mapping):
        dumped = dump(exclude_none=True)
        return dumped if isinstance(dumped, Mapping) else value
    return value


def _message(message: Mapping[str, Any], default_role: str = "user") -> Mapping[str, Any]:
    """One message with ``parts``; one that has them already is returned as it is."""
    if "parts" in message:
        return message
    role = message.get("role") or default_role
    if not isinstance(role, str):
        role = str(role)
    parts: list[dict[str, Any]] = []
    if role in ("tool", "function"):  # a tool's result; the legacy call's has a name and no id
        parts.append(
            {
                "type": "tool_call_response",
                "id": message.get("tool_call_id"),
                "response": _response(message.get("content")),
            }
        )
    else:
        reasoning = [
            message[key] for key in _REASONING_KEYS if isinstance(message.get(key), str) and message[key]
        ]
        if reasoning:  # the first: some servers send it under both names
            parts.append({"type": "reasoning", "content": reasoning[0]})
        parts.extend(_content_parts(message.get("content")))
        if message.get("refusal") is not None:  # the conventions' generic part: a type of its own
            parts.append({"type": "refusal", "content": message["refusal"]})
        calls = [_dumped(call) for call in message.get("tool_calls") or ()]
        legacy = _dumped(message.get("function_call"))
        if isinstance(legacy, Mapping):  # the legacy single call
            calls.append({"function": legacy})
        for call in calls:
            if isinstance(call, Mapping):
                parts.append(_tool_call(call))
    converted: dict[str, Any] = {"role": _ROLES.get(role, role), "parts": parts}
    if isinstance(message.get("name"), str):
        converted["name"] = message["name"]
    return converted


def _content_parts(content: object) -> list[dict[str, Any]]:
    if content is None or content == "":  # a reply that only calls tools may say "" (streams do)
        return []
    if not isinstance(content, list | tuple):
        return [_text(content if isinstance(content, str) else str(content))]
    parts = []
    for part in content:
        part = _dumped(part)
        if isinstance(part, str):
            parts.append(_text(part))
        elif isinstance(part, Mapping):
            parts.append(_content_part(part))
    return parts


def _content_part(part: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI content part (``text``, ``image_url``, ``input_audio``, ``file``...) or an
    Anthropic content block (``text``, ``image``, ``document``, ``tool_use``, ``tool_result``,
    ``thinking``) as a part."""
    kind = part.get("type")
    if kind == "text" and "text" in part:
        return _text(part["text"])
    if kind == "image_url" and isinstance(part.get("image_url"), Mapping):
        return _linked("image", url=part["image_url"].get("url"))
    if kind == "input_audio" and isinstance(part.get("input_audio"), Mapping):
        audio = part["input_audio"]
        return {
            "type": "blob",
            "modality": "audio",
            "mime_type": f"audio/{audio.get('format', 'wav')}",
            "content": audio.get("data"),
        }
    if kind == "file" and isinstance(part.get("file"), Mapping):  # OpenAI's: uploaded, or inline
        file = part["file"]
        data = file.get("file_data")  # a data: URL, or the base64 alone
        url, data = (data, None) if isinstance(data, str) and data[:5].lower() == "data:" else (None, data)
        return _linked("document", url=url, file_id=file.get("file_id"), data=data, given=part)
    if kind in ("image", "document") and isinstance(part.get("source"), Mapping):  # Anthropic's
        source = part["source"]
        data = source.get("data") if source.get("type") == "base64" else None
        mime_type = source.get("media_type")
        return _linked(
            kind,
            url=source.get("url"),
            file_id=source.get("file_id"),
            data=data,
            mime_type=mime_type,
            given=part,
        )
    if kind == "tool_use":  # Anthropic's tool call, its arguments already parsed
        return {
            "type": "tool_call",
            "id": part.get("id"),
            "name": part.get("name"),
            "arguments": part.get("input"),
        }
    if kind == "tool_result":  # Anthropic's tool result, in the user's message
        return {
            "type": "tool_call_response",
            "id": part.get("tool_use_id"),
            "response": _response(part.get("content")),
        }
    if kind == "thinking" and isinstance(part.get("thinking"), str):  # its signature is no content
        return {"type": "reasoning", "content": part["thinking"]}
    return {**part, "type": kind if isinstance(kind, str) else "unknown"}  # the conventions' generic part


def _linked(
    modality: str,
    *,
    url: object = None,
    file_id: object = None,
    data: object = None,
    mime_type: object = None,
    given: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Media sent inline (base64 ``data``, or a ``data:`` URL: a ``blob`` part, as the conventions
    want), by URL (``uri``) or as an uploaded file (``file``); ``given`` as it is when none."""
    if isinstance(url, str) and url[:5].lower() == "data:":
        header, encoded, inline = url.partition(";base64,")
        if not encoded:
            header, encoded, inline = url.partition(";BASE64,")
        if encoded:
            data = inline
            mime_type = header[5:].split(";", 1)[0] or None
    if isinstance(data, str):
        return {"type": "blob", "modality": modality, "mime_type": mime_type, "content": data}
    if isinstance(file_id, str):
        return {"type": "file", "modality": modality, "mime_type": mime_type, "file_id": file_id}
    if isinstance(url, str) or given is None:
        return {"type": "uri", "modality": modality, "uri": url}
    return {**given}


def _response(content: object) -> object:
    """A tool's result: text as it is, content parts converted."""
    return _content_parts(content) if isinstance(content, list | tuple) else content


def _tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = _dumped(call.get("function"))
    if not isinstance(function, Mapping):
        function = call
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        # text that is not JSON stays as the model wrote it, and so does JSON nested too deep for
        # the parser (a RecursionError, a thousand levels in)
        with contextlib.suppress(ValueError, RecursionError):
            arguments = json.loads(arguments)
    return {"type": "tool_call", "id": call.get("id"), "name": function.get("name"), "arguments": arguments}


def _text(content: object) -> dict[str, Any]:
    return {"type": "text", "content": content}
