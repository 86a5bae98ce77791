"""A scripted OpenAI-compatible model server, so every scenario runs deterministically offline.

The reply depends only on the conversation: the tools offered (which tells the coordinator,
the researcher and the analyst apart), the first user message and the tool results already
present. Scripts:

- coordinator (offered ``delegate_to_agent``): asks ``researcher`` to find sources on the topic,
  ``analyst`` to add the numbers, then answers with both results; a message mentioning
  ``ghost`` delegates to the non-existent agent ``ghost`` instead (the failure scenario).
- researcher (offered ``echo``): searches (``echo``) for the task, then reports the results.
- analyst (offered ``add``): calls ``add`` with the first two numbers of the task (default 2, 3),
  then answers with the sum.
- a message containing ``forever`` keeps calling the first tool (to exhaust budgets); one
  containing ``missing tool`` calls a tool nobody offers; one containing ``model error`` gets
  HTTP 500.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from instrumented_agent.config import DELEGATE_TOOL
from instrumented_agent.faults import MODEL_LATENCY_S, Fault, FaultSwitch
from instrumented_agent.openai_api import (
    ChatMessage,
    ChatRequest,
    Completion,
    ToolCall,
    ToolFunction,
    Usage,
    completion_body,
    completion_chunks,
    error_body,
    new_completion_id,
)
from kaos_otel.instrumentation.asgi import FASTAPI_NATIVE_TELEMETRY_OFF

__all__ = ["ScriptedModelError", "create_model_app", "scripted_reply"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_TOPIC = re.compile(r"\bresearch\s+(.+?)(?:\s+and\s|[.:;,]|$)", re.IGNORECASE)


class ScriptedModelError(RuntimeError):
    """The conversation asked the scripted model to fail."""


@dataclass(frozen=True)
class _Call:
    name: str
    arguments: dict[str, Any]
    result: str | None


def _calls(messages: list[ChatMessage]) -> list[_Call]:
    """Tool calls made so far, each with its result if one is present."""
    results = {m.tool_call_id: m.text() for m in messages if m.role == "tool" and m.tool_call_id}
    calls: list[_Call] = []
    for message in messages:
        for call in message.tool_calls or ():
            calls.append(_Call(call.function.name, call.arguments_or_empty(), results.get(call.id)))
    return calls


def _call(name: str, arguments: dict[str, Any], step: int) -> ChatMessage:
    function = ToolFunction(name=name, arguments=json.dumps(arguments))
    return ChatMessage(role="assistant", tool_calls=[ToolCall(id=f"call_{step}_{name}", function=function)])


def _answer(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


def _number(text: str) -> str:
    """Render a numeric tool result without a trailing ``.0``."""
    try:
        return f"{float(text):g}"
    except ValueError:
        return text


def _coordinator(task: str, calls: list[_Call]) -> ChatMessage:
    delegated = {str(c.arguments.get("agent")): c.result or "" for c in calls if c.name == DELEGATE_TOOL}
    if "ghost" in task.lower():
        if "ghost" not in delegated:
            return _call(DELEGATE_TOOL, {"agent": "ghost", "task": task}, len(calls))
        return _answer(f"The ghost agent replied: {delegated['ghost']}")
    numbers = _NUMBER.findall(task)[:2] or ["2", "3"]
    topic = _TOPIC.search(task)
    plan = {
        "researcher": f"Find sources on {topic.group(1)}." if topic else f"Find sources for: {task}",
        "analyst": f"Add {' and '.join(numbers)}.",
    }
    for agent, subtask in plan.items():
        if agent not in delegated:
            return _call(DELEGATE_TOOL, {"agent": agent, "task": subtask}, len(calls))
    return _answer(
        f"Here is what the team found. Researcher: {delegated['researcher']} Analyst: {delegated['analyst']}"
    )


def _researcher(task: str, calls: list[_Call]) -> ChatMessage:
    done = [c for c in calls if c.name == "echo"]
    if not done:
        return _call("echo", {"message": task}, len(calls))
    return _answer(f"Search results: {done[-1].result}")


def _analyst(task: str, calls: list[_Call]) -> ChatMessage:
    done = [c for c in calls if c.name == "add"]
    numbers = [float(n) for n in _NUMBER.findall(task)[:2]]
    a, b = (numbers + [2.0, 3.0][len(numbers) :])[:2]
    if not done:
        return _call("add", {"a": a, "b": b}, len(calls))
    return _answer(f"The sum of {a:g} and {b:g} is {_number(done[-1].result or '')}.")


def scripted_reply(request: ChatRequest) -> ChatMessage:
    """The scripted assistant message for ``request`` (raises :class:`ScriptedModelError` on demand)."""
    users = [m.text() for m in request.messages if m.role == "user"]
    task = users[0] if users else ""
    tools = request.tool_names()
    calls = _calls(request.messages)
    lowered = task.lower()
    if "model error" in lowered:
        raise ScriptedModelError("scripted model error requested by the conversation")
    if "missing tool" in lowered:
        return _call("missing_tool", {}, len(calls))
    if "what do you remember" in lowered:  # the recalled memory, as the agent put it in the prompt
        recalled = [m.text() for m in request.messages if m.role == "system"][1:]
        return _answer("Remembered: " + (" | ".join(recalled) or "nothing"))
    if "forever" in lowered and tools:
        tool = sorted(tools)[0]
        arguments = {"message": task} if tool == "echo" else {"a": 1, "b": 1}
        return _call(tool, arguments, len(calls))
    if DELEGATE_TOOL in tools:
        return _coordinator(task, calls)
    if "echo" in tools:
        return _researcher(task, calls)
    if "add" in tools:
        return _analyst(task, calls)
    return _answer(f"Scripted reply to: {task}")


def _tokens(text: str) -> int:
    """A deterministic token estimate (one per word, at least one)."""
    return max(1, len(text.split()))


def _usage(request: ChatRequest, reply: ChatMessage) -> Usage:
    prompt = sum(_tokens(m.text()) + 4 for m in request.messages)
    completion = _tokens(reply.text()) + 8 * len(reply.tool_calls or ())
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def create_model_app(latency_s: float = 0.0) -> FastAPI:
    """The scripted model as a FastAPI app (``POST /v1/chat/completions``, ``GET /health``)."""
    app = FastAPI(title="kaos scripted model", telemetry=FASTAPI_NATIVE_TELEMETRY_OFF)
    faults = FaultSwitch.from_env()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: ChatRequest) -> JSONResponse | StreamingResponse:
        if latency_s > 0:
            await asyncio.sleep(latency_s)
        active = faults.active() if faults is not None else frozenset()
        if Fault.MODEL_LATENCY in active:
            await asyncio.sleep(MODEL_LATENCY_S)
        if faults is not None and Fault.MODEL_ERRORS in active and faults.one_in(2):
            body = error_body("model error injected by the demo", "server_error", "injected")
            return JSONResponse(body, status_code=500)
        try:
            reply = scripted_reply(request)
        except ScriptedModelError as exc:
            return JSONResponse(error_body(str(exc), "server_error", "scripted_failure"), status_code=500)
        completion = Completion(
            id=new_completion_id(),
            model=request.model or "scripted",
            message=reply,
            finish_reason="tool_calls" if reply.tool_calls else "stop",
            usage=_usage(request, reply),
        )
        if not request.stream:
            return JSONResponse(completion_body(completion))
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        return StreamingResponse(
            completion_chunks(completion, include_usage=include_usage), media_type="text/event-stream"
        )

    return app
