"""The agentic loop: model -> MCP tool calls and delegations -> final answer, within budgets.

Every hop is a kaos_otel span: ``invoke_agent`` for the run, ``agent_step`` per iteration,
``chat {model}`` per model call, ``execute_tool {tool}`` per tool call (with the ``mcp`` SDK's
client span inside) and a CLIENT ``invoke_agent {target}`` per delegation. A failure is raised,
never swallowed: it fails its span with the exception, is logged inside that span, fails the run
(error outcome in the metrics) and becomes an HTTP error in the server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from instrumented_agent.config import (
    DELEGATE_TOOL,
    DELEGATED_BY_HEADER,
    MEMORY_SCOPE_HEADER,
    SESSION_ID_HEADER,
    USER_ID_HEADER,
    AgentConfig,
)
from instrumented_agent.errors import (
    BudgetExceededError,
    DelegationError,
    DelegationTimeoutError,
    MalformedToolCallError,
    ModelError,
    UnknownAgentError,
    UnknownToolError,
)
from instrumented_agent.identity import SessionIssuer, agent_user_id
from instrumented_agent.mcp_client import McpToolbox
from instrumented_agent.memory import MemoryService, Turn, new_session_id
from instrumented_agent.model_client import DeltaSink, ModelClient
from instrumented_agent.openai_api import ChatMessage, Completion, ToolCall, Usage, function_tool
from kaos_otel import AgentRun, KaosOtelManager, MemoryScope, Outcome, RequestOrigin
from kaos_otel.catalog import OVERFLOW_VALUE

__all__ = ["Agent", "ForgetReport", "Identity", "RunResult"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Identity:
    """Who a run acts for: the gateway-verified user, or the agent itself for self-initiated runs.

    ``session_id`` is the conversation session (from the gateway's header, else a new one).
    """

    user_id: str | None
    self_initiated: bool = False
    session_id: str = field(default_factory=new_session_id)

    @classmethod
    def of_agent(cls, agent_name: str, issuer: SessionIssuer) -> Identity:
        """The identity of a run the agent starts on its own: a new session each time, issued
        to the agent by ``issuer`` (its sub-agents accept ``agent:<name>`` only with one)."""
        return cls(agent_user_id(agent_name), self_initiated=True, session_id=issuer.issue(agent_name))


@dataclass(frozen=True)
class RunResult:
    """The final answer of a run and how it ended."""

    content: str
    finish_reason: str
    outcome: Outcome
    steps: int
    usage: Usage
    tools_unavailable: bool = False
    """Whether a model call of the run was not offered the tools of an MCP server not connected."""
    stopped: str = ""
    """Why a run stopped without a final answer (the budget's message, the end of ``content``)."""


@contextmanager
def _logged(what: str) -> Iterator[None]:
    """Log a failure (with its stack) inside the span it happens in, then re-raise it."""
    try:
        yield
    except Exception:
        _log.exception("%s failed", what)
        raise


@dataclass
class ForgetReport:
    """What a forget deleted, per agent and store (``None``: not counted), and the stores that failed."""

    deleted: dict[str, dict[str, int | None]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)


class Agent:
    """One agent: its configuration, model, MCP toolbox and sub-agents."""

    def __init__(
        self,
        config: AgentConfig,
        otel: KaosOtelManager,
        model: ModelClient,
        toolbox: McpToolbox,
        http_client: httpx.AsyncClient,
        memory: MemoryService | None = None,
    ) -> None:
        self.config = config
        self.memory = memory
        self._otel = otel
        self._model = model
        self._toolbox = toolbox
        self._http = http_client

    @property
    def name(self) -> str:
        """The agent's name."""
        return self.config.name

    def tool_definitions(self) -> list[dict[str, Any]]:
        """The tools offered to the model: MCP tools, plus delegation if there are sub-agents."""
        tools = [
            function_tool(tool.name, tool.description, tool.input_schema)
            for tool in self._toolbox.tools().values()
        ]
        if self.config.sub_agents:
            names = ", ".join(sorted(self.config.sub_agents))
            tools.append(
                function_tool(
                    DELEGATE_TOOL,
                    f"Delegate a task to a sub-agent ({names}) and get its answer.",
                    {
                        "type": "object",
                        "properties": {"agent": {"type": "string"}, "task": {"type": "string"}},
                        "required": ["agent", "task"],
                    },
                )
            )
        return tools

    async def run(
        self,
        messages: Sequence[ChatMessage],
        identity: Identity,
        *,
        conversation_id: str | None = None,
        on_delta: DeltaSink | None = None,
        memory_scope: MemoryScope = MemoryScope.SESSION,
        delegated: bool = False,
        deliver: Callable[[RunResult], Awaitable[None]] | None = None,
    ) -> RunResult:
        """Run the loop for ``messages`` on behalf of ``identity``; raises :class:`AgentError` on failure.

        The answer is everything the model says in the run, also alongside its tool calls (one
        paragraph per model call); ``on_delta`` receives the same text as it is said.
        ``delegated`` says another agent asked for this run (its metrics then count it apart from
        user requests; self-initiated runs are counted as autonomous). ``deliver`` (streaming)
        hands the result over and waits, inside the run, until the client has it: a client that
        goes away first cancels the run, which then ends ``canceled``.

        With memory on, the run recalls at ``memory_scope`` before its first model call and
        appends the last user message and the answer to the session after a successful answer.
        An answer without part of the memory, or one a model call of which was not offered the
        tools of an MCP server not connected, ends ``degraded``.
        """
        config = self.config
        self._otel.register_known_names(
            self.name, tools=self._toolbox.tools(), models=[config.model_name], targets=config.sub_agents
        )
        run = self._otel.invoke_agent(
            self.name,
            conversation_id=conversation_id,
            session_id=identity.session_id if self.memory else None,
            user_id=identity.user_id,
            max_steps=config.max_steps,
            origin=_origin(identity, delegated),
            provider=config.model_provider,
        )
        with run:
            _log.info("run started (%d messages, self-initiated=%s)", len(messages), identity.self_initiated)
            try:
                async with asyncio.timeout(config.max_runtime_s):
                    context, remembered = await self._recall(messages, identity, memory_scope)
                    result = await self._loop(run, [*context, *messages], identity, on_delta, conversation_id)
                    if result.outcome is Outcome.SUCCESS:
                        remembered = await self._remember(messages, identity, result.content) and remembered
            except TimeoutError as exc:
                _log.error("run stopped: runtime budget of %g s used up", config.max_runtime_s)
                raise BudgetExceededError(f"runtime budget of {config.max_runtime_s:g} s used up") from exc
            if result.outcome is not Outcome.SUCCESS:
                run.set_outcome(result.outcome)
                _log.warning("run ended without a final answer: %s", result.stopped)
            elif not remembered:
                run.set_outcome(Outcome.DEGRADED, "memory_unavailable")
                _log.warning("run answered without part of its memory")
            elif result.tools_unavailable:
                run.set_outcome(Outcome.DEGRADED, "tools_unavailable")
                _log.warning("run answered without the tools of an MCP server not connected")
            _log.info("run finished after %d steps", result.steps)
            if deliver is not None:
                await deliver(result)
            return result

    async def _recall(
        self, messages: Sequence[ChatMessage], identity: Identity, scope: MemoryScope
    ) -> tuple[list[ChatMessage], bool]:
        """What memory recalls for this run, as one system message (none without memory), and
        whether every tier could be read."""
        if self.memory is None:
            return [], True
        owner = self.memory.owner(identity.user_id, identity.session_id)
        recalled = await self.memory.recall(owner, scope, _last_user_text(messages))
        text = recalled.as_context()
        return ([ChatMessage(role="system", content=text)] if text else []), not recalled.degraded

    async def _remember(self, messages: Sequence[ChatMessage], identity: Identity, answer: str) -> bool:
        """Append the turn (last user message and the answer) to the session's window; whether
        it was written."""
        if self.memory is None:
            return True
        owner = self.memory.owner(identity.user_id, identity.session_id)
        return await self.memory.remember(
            owner, [Turn("user", _last_user_text(messages)), Turn("assistant", answer)]
        )

    async def _loop(
        self,
        run: AgentRun,
        messages: Sequence[ChatMessage],
        identity: Identity,
        on_delta: DeltaSink | None,
        conversation_id: str | None,
    ) -> RunResult:
        config = self.config
        conversation = [ChatMessage(role="system", content=config.instructions), *messages]
        usage = Usage()
        tool_calls = 0
        tools_unavailable = False
        said = _Said(on_delta)
        for step in range(1, config.max_steps + 1):
            with self._otel.agent_step(run, step):
                tools = self.tool_definitions()  # what the model may ask for in this step
                tools_unavailable = tools_unavailable or bool(self._toolbox.pending)
                completion = await self._call_model(conversation, tools, said.sink(), conversation_id)
                usage = _add_usage(usage, completion.usage)
                conversation.append(completion.message)
                said.add(completion.message.text())
                if not completion.message.tool_calls:
                    reason = _answer_finish_reason(completion.finish_reason)
                    return RunResult(said.answer(), reason, Outcome.SUCCESS, step, usage, tools_unavailable)
                for call in completion.message.tool_calls:
                    if tool_calls >= config.max_tool_calls:
                        return said.stop(
                            f"Stopped: tool-call budget of {config.max_tool_calls} used up.", step, usage
                        )
                    tool_calls += 1
                    result = await self._execute(call, identity, {t["function"]["name"] for t in tools})
                    conversation.append(ChatMessage(role="tool", tool_call_id=call.id, content=result))
        stop = f"Stopped: step budget of {config.max_steps} used up without a final answer."
        return said.stop(stop, config.max_steps, usage)

    async def _call_model(
        self,
        conversation: list[ChatMessage],
        tools: list[dict[str, Any]],
        on_delta: DeltaSink | None,
        conversation_id: str | None,
    ) -> Completion:
        model = self.config.model_name
        with self._otel.model_call(
            self.name,
            model,
            provider=self.config.model_provider,
            server_address=self._model.server_address,
            server_port=self._model.server_port,
            conversation_id=conversation_id,
            stream=on_delta is not None,
        ) as call:
            with _logged("model call"):
                try:
                    completion = await self._model.complete(
                        model, conversation, tools, on_delta, call.record_first_chunk
                    )
                except ModelError as exc:  # error.type: the status or failure, not the class name
                    call.set_outcome(Outcome.ERROR, exc.reason)
                    raise
            call.record_usage(
                completion.usage.prompt_tokens,
                completion.usage.completion_tokens,
                response_model=completion.model,
                finish_reasons=[completion.finish_reason],
                response_id=completion.id or None,
            )
            if call.records_messages:
                call.record_messages(
                    [m.model_dump(exclude_none=True) for m in conversation],
                    [
                        {
                            "message": completion.message.model_dump(exclude_none=True),
                            "finish_reason": completion.finish_reason,
                        }
                    ],
                )
            return completion

    async def _execute(self, call: ToolCall, identity: Identity, offered: Collection[str]) -> str:
        """Run one tool call: a delegation or an MCP tool, which must be one ``offered`` to the model
        (a tool whose server went away since is a :class:`ToolError`, not an unknown tool)."""
        name = call.function.name
        try:
            arguments, malformed = call.arguments_object(), ""
        except ValueError as exc:  # cut short, say: not called with arguments guessed
            arguments, malformed = {}, f"arguments of {name!r} are not a JSON object: {exc}"
        if name == DELEGATE_TOOL:
            return await self._delegate(
                str(arguments.get("agent", "")), str(arguments.get("task", "")), identity, malformed
            )
        with (
            self._otel.tool_call(self.name, name, call_id=call.id, arguments=call.function.arguments),
            _logged(f"tool call {name if name in offered else OVERFLOW_VALUE}"),
        ):
            if name not in offered:
                raise UnknownToolError(f"unknown tool {name!r}")
            if malformed:
                raise MalformedToolCallError(malformed)
            _log.info("calling tool %s", name)
            return await self._toolbox.call(name, arguments)

    async def forget(self, identity: Identity, scope: MemoryScope) -> ForgetReport:
        """Forget ``scope`` of ``identity`` in this agent's stores and at every sub-agent (theirs too)."""
        report = ForgetReport()
        if self.memory is not None:
            forgotten = await self.memory.forget(
                self.memory.owner(identity.user_id, identity.session_id), scope
            )
            report.deleted[self.name] = forgotten.deleted
            report.failed += [f"{self.name}/{store}" for store in forgotten.degraded]
        answers = await asyncio.gather(
            *(self._forget_at(name, url, identity, scope) for name, url in self.config.sub_agents.items())
        )
        for answer in answers:
            report.deleted.update(answer.deleted)
            report.failed += answer.failed
        return report

    async def _forget_at(self, target: str, url: str, identity: Identity, scope: MemoryScope) -> ForgetReport:
        """A sub-agent's forget of the same identity and scope."""
        headers = {
            SESSION_ID_HEADER: identity.session_id,
            DELEGATED_BY_HEADER: self.name,
            MEMORY_SCOPE_HEADER: scope.value,
        }
        if identity.user_id:
            headers[USER_ID_HEADER] = identity.user_id
        try:
            response = await self._http.delete(f"{url.rstrip('/')}/v1/memory", headers=headers)
            if response.status_code == 404:  # memory is off there: it holds nothing
                return ForgetReport()
            if response.status_code not in (200, 503):
                return ForgetReport(failed=[f"{target}/http-{response.status_code}"])
            body = response.json()
            return ForgetReport(dict(body["deleted"]), list(body["failed"]))
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            _log.warning("forget at %s failed: %s", target, type(exc).__name__)
            return ForgetReport(failed=[f"{target}/unreachable"])

    async def _delegate(self, target: str, task: str, identity: Identity, malformed: str = "") -> str:
        """Ask sub-agent ``target`` to do ``task``; its answer is the result (``malformed``: why the
        model's arguments could not be read, then nothing is asked)."""
        with (
            self._otel.delegation(self.name, target),
            _logged(f"delegation to {target if target in self.config.sub_agents else OVERFLOW_VALUE}"),
        ):
            if malformed:
                raise MalformedToolCallError(malformed)
            url = self.config.sub_agents.get(target)
            if url is None:
                known = ", ".join(sorted(self.config.sub_agents)) or "none"
                raise UnknownAgentError(f"unknown agent {target!r} (sub-agents: {known})")
            _log.info("delegating to %s", target)
            headers = {SESSION_ID_HEADER: identity.session_id, DELEGATED_BY_HEADER: self.name}
            if identity.user_id:
                headers[USER_ID_HEADER] = identity.user_id
            body = {"model": target, "messages": [{"role": "user", "content": task}]}
            timeout = self.config.delegation_timeout
            try:
                response = await self._http.post(
                    f"{url.rstrip('/')}/v1/chat/completions",
                    json=body,
                    headers=headers,
                    timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
                )
            except httpx.TimeoutException as exc:
                raise DelegationTimeoutError(f"{target} did not answer within {timeout:g} s") from exc
            except httpx.HTTPError as exc:
                raise DelegationError(f"{target} unreachable: {type(exc).__name__}") from exc
            except ValueError as exc:  # a body UTF-8 cannot hold: half an emoji in the model's task
                raise DelegationError(f"the task for {target} cannot be sent: {type(exc).__name__}") from exc
            try:
                payload = response.json()
                if response.status_code != 200:
                    raise DelegationError(
                        f"{target} answered HTTP {response.status_code}: {payload['error']['message']}"
                    )
                return str(payload["choices"][0]["message"]["content"] or "")
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise DelegationError(
                    f"{target} answered HTTP {response.status_code} with a malformed body"
                ) from exc


def _origin(identity: Identity, delegated: bool) -> RequestOrigin:
    """Who asked for a run: the agent itself, another agent, or a user."""
    if identity.self_initiated:
        return RequestOrigin.AUTONOMOUS
    return RequestOrigin.DELEGATED if delegated else RequestOrigin.USER


class _Said:
    """What the agent says in a run, which is its answer: the text of each model call (what the
    model says alongside its tool calls too) and a budget's stop message, one paragraph each.

    Streamed or not, the answer is the same: with ``on_delta`` the paragraphs are streamed as
    they come (a blank line before each after the first), so a streaming client sees what the
    model says before a tool call as soon as it is said, and then the rest of the same answer.
    """

    _BREAK = "\n\n"

    def __init__(self, on_delta: DeltaSink | None) -> None:
        self._on_delta = on_delta
        self._paragraphs: list[str] = []

    def sink(self) -> DeltaSink | None:
        """Where the next model call streams its text (``None``: the run does not stream)."""
        on_delta = self._on_delta
        if on_delta is None:
            return None
        opened = False

        def sink(text: str) -> None:
            nonlocal opened
            if not opened and self._paragraphs:
                on_delta(self._BREAK)
            opened = True
            on_delta(text)

        return sink

    def add(self, text: str) -> None:
        """The whole text of a model call (streamed already, if streaming)."""
        if text:
            self._paragraphs.append(text)

    def stop(self, stop: str, steps: int, usage: Usage) -> RunResult:
        """The result of a run stopped by a budget: ``stop`` (its message) said last, streamed
        at once if streaming."""
        sink = self.sink()
        if sink is not None:
            sink(stop)
        self.add(stop)
        return RunResult(self.answer(), "length", Outcome.MAX_STEPS, steps, usage, stopped=stop)

    def answer(self) -> str:
        """Everything said, one paragraph per model call."""
        return self._BREAK.join(self._paragraphs)


def _answer_finish_reason(model_reason: str) -> str:
    """The finish reason of a final answer: the model's when it says the answer is cut short
    (``length``) or filtered (``content_filter``), else ``stop``."""
    return model_reason if model_reason in ("length", "content_filter") else "stop"


def _last_user_text(messages: Sequence[ChatMessage]) -> str:
    """The text of the last user message ("" if there is none)."""
    return next((m.text() for m in reversed(messages) if m.role == "user"), "")


def _add_usage(total: Usage, more: Usage) -> Usage:
    return Usage(
        prompt_tokens=total.prompt_tokens + more.prompt_tokens,
        completion_tokens=total.completion_tokens + more.completion_tokens,
        total_tokens=total.total_tokens + more.total_tokens,
    )
