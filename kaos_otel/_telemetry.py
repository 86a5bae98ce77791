"""Agent-domain telemetry: convention-conformant spans that also record the catalog's metrics.

:class:`AgentTelemetry` works on any tracer and meter; :class:`~kaos_otel.KaosOtelManager` adds
configuration and the export pipeline on top, and instrumentors (Mem0) build one from the
global providers.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Real
from typing import Any, NamedTuple, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry._logs import Logger, LoggerProvider, LogRecord, get_logger_provider
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Tracer
from opentelemetry.util.types import AnyValue, AttributeValue

from kaos_otel import _genai_messages as genai_messages
from kaos_otel import catalog
from kaos_otel._config import enum_member, name_set
from kaos_otel._content import ContentPolicy, policy_from_env, safe_str, to_attributes, to_log_value
from kaos_otel._internal_log import internal_error, log_once
from kaos_otel._metrics import KAOS_METER_NAMES, METER_NAME, KaosMetrics, LabelBounds
from kaos_otel._spans import (
    NOOP_HANDLE,
    EndCallback,
    NoopSpanHandle,
    SpanFactory,
    SpanHandle,
    SpanScope,
    _SpanMark,
    outcome_named,
)
from kaos_otel.catalog import MemoryScope, MemoryTier, Outcome, RequestOrigin
from kaos_otel.exporters.health import TelemetryHealth

F = TypeVar("F", bound=Callable[..., Any])
_T = TypeVar("_T")

_MEMORY_SCOPES = frozenset(MemoryScope)
"""Every scope, as members and as their values (``MemoryScope`` is a ``StrEnum``)."""


def _described(value: object) -> str:
    """A wrong value, for a log line: text and numbers as they are (text shortened), anything else
    by its type (its ``repr`` may raise, or be huge)."""
    if isinstance(value, str):
        return repr(value[:80])
    if type(value) is float or type(value) is bool or (type(value) is int and abs(value) < 2**128):
        return repr(value)  # exact types: a subclass's repr may raise
    return f"a {type(value).__qualname__}"


def _given_attributes(where: str, attributes: object) -> Mapping[str, object]:
    """The caller's extra span attributes; a value that is not a mapping is logged and left out."""
    if attributes is None:
        return {}
    if isinstance(attributes, Mapping):
        return attributes
    internal_error(f"{where} attributes", TypeError(f"not attributes: {_described(attributes)}"))
    return {}


_DELEGATION_KEY = otel_context.create_key("kaos-otel-delegation")
"""Context key: the span mark of the delegation whose block the context is in (see :class:`_Delegation`)."""


class _Delegation(SpanHandle):
    """A delegation's span: its context says so, so that an agent run started inside it (an
    in-process sub-agent) counts as delegated, not as a user's request. The context holds the
    span's mark, not the handle: a handle its own context references would wait for the garbage
    collector, with its span, instead of being freed as it ends."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._context = otel_context.set_value(_DELEGATION_KEY, self._mark, self._context)


def _origin_of_current_context() -> RequestOrigin:
    """``delegated`` for a run started inside a delegation's block that has not ended, with no
    other agent run between them (spans of any other kind may be), else ``user``."""
    delegation = otel_context.get_value(_DELEGATION_KEY)
    if isinstance(delegation, _SpanMark) and not delegation.ended:
        return RequestOrigin.DELEGATED
    return RequestOrigin.USER


class AgentRun(SpanHandle):
    """An ``invoke_agent`` span; counts the loop steps it contains."""

    __slots__ = ("agent_name", "origin", "steps")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._set_initial_fields()
        if otel_context.get_value(_DELEGATION_KEY, self._context) is not None:
            # a run started inside this one is not the delegation's, whatever encloses this one
            self._context = otel_context.set_value(_DELEGATION_KEY, None, self._context)

    def _set_initial_fields(self) -> None:
        self.agent_name = ""
        self.origin = RequestOrigin.USER
        self.steps = 0


_INFERENCE_EVENT_KEYS = (
    catalog.GEN_AI_OPERATION_NAME,
    catalog.GEN_AI_PROVIDER_NAME,
    catalog.GEN_AI_REQUEST_MODEL,
    catalog.SERVER_ADDRESS,
    catalog.SERVER_PORT,
    catalog.GEN_AI_CONVERSATION_ID,
)
"""What the inference-details event repeats of the ``chat`` span's attributes when it begins
(:meth:`ModelCall.record_usage` adds the response's)."""


class ModelCall(SpanHandle):
    """A ``chat`` span; carries token usage to the metrics."""

    __slots__ = (
        "event_attributes",
        "events",
        "finish_reasons",
        "first_chunk_s",
        "input_tokens",
        "model",
        "output_tokens",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._set_initial_fields()

    def _set_initial_fields(self) -> None:
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.first_chunk_s: float | None = None
        """Seconds from the call's start to its first chunk (a streamed answer)."""
        self.finish_reasons: tuple[str, ...] = ()
        self.model = ""
        self.events: Logger | None = None
        """Where the content event goes, when content capture includes events."""
        self.event_attributes: dict[str, AnyValue] = {}
        """What the content event repeats of the call (provider, server, usage...), kept only
        when there is an event to emit: the span may not be recorded, or be another SDK's."""

    def record_usage(
        self,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        *,
        response_model: str | None = None,
        finish_reasons: Sequence[str] | None = None,
        response_id: str | None = None,
    ) -> None:
        """Record token usage and response details (a token count that is not an int from 0 to
        2**63 - 1 is left out: OTLP carries 64-bit integers). Request parameters the conventions
        name (``gen_ai.request.temperature``, ``gen_ai.request.max_tokens``...) go in
        ``model_call(attributes=...)``.

        Called again (a stream's finish and usage chunks), it adds what it is given: what is not
        given keeps its value. It must be called before the call ends, whose span and metrics are
        then complete: later, it records nothing and says so once.
        """
        if self.is_ended:
            log_once(
                "record_usage after end",
                "kaos-otel: record_usage on a model call that has ended records nothing; call it "
                "before the model_call block ends (for a stream: consume it inside the block)",
                level=logging.WARNING,
            )
            return
        self.input_tokens = _token_count(input_tokens, self.input_tokens)
        self.output_tokens = _token_count(output_tokens, self.output_tokens)
        self.finish_reasons = _finish_reasons(finish_reasons) or self.finish_reasons
        if self.events is None and not self.span.is_recording():
            return
        response = to_attributes(
            {
                catalog.GEN_AI_USAGE_INPUT_TOKENS: self.input_tokens,
                catalog.GEN_AI_USAGE_OUTPUT_TOKENS: self.output_tokens,
                catalog.GEN_AI_RESPONSE_MODEL: response_model,
                catalog.GEN_AI_RESPONSE_ID: None if response_id is None else safe_str(response_id),
                catalog.GEN_AI_RESPONSE_FINISH_REASONS: self.finish_reasons or None,
            },
            self._policy,
        )  # converted once, for the span and the content event
        self.span.set_attributes(response)
        if self.events is not None:
            self.event_attributes.update(response)

    def record_first_chunk(self) -> None:
        """Say that the first chunk of a streamed answer arrived: the time since the call began is
        ``gen_ai.response.time_to_first_chunk`` on the span and goes to the
        ``gen_ai.client.operation.time_to_first_chunk`` metric when the call ends. Later calls
        change nothing."""
        if self.first_chunk_s is not None or self.is_ended:
            return
        self.first_chunk_s = self.elapsed_s
        if self.span.is_recording():
            self.span.set_attribute(catalog.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, self.first_chunk_s)

    @property
    def records_messages(self) -> bool:
        """Whether :meth:`record_messages` records anything: content capture is on, and the span
        is sampled or the content event is on (it is emitted whether the span is sampled or not).
        Build the messages only when it does."""
        return self.events is not None or (self._policy.capture_on_spans and self.span.is_recording())

    def record_messages(self, input_messages: object = None, output_messages: object = None) -> None:
        """Record prompt and response messages, only when content capture is on.

        ``SPAN_ONLY`` / ``SPAN_AND_EVENT`` set ``gen_ai.input.messages`` / ``gen_ai.output.messages``
        on the span; ``EVENT_ONLY`` / ``SPAN_AND_EVENT`` emit them in the GenAI conventions'
        ``gen_ai.client.inference.operation.details`` event (a log record in the span's context).

        Messages are recorded in the conventions' shape (``role`` and ``parts``, output messages
        with a ``finish_reason``). OpenAI Chat Completions messages, choices, whole completions
        and a stream's chunks (``chat.completion.chunk``, deltas joined) are converted (text and
        content parts, tool calls, tool results, reasoning), and so are Anthropic Messages API
        messages and responses (content blocks, ``stop_reason``); messages that have ``parts`` are
        kept; text is one text part. Call :meth:`record_usage` first to give output messages the
        finish reasons it records.
        """
        if (input_messages is None and output_messages is None) or not self.records_messages:
            return
        try:
            if input_messages is not None:
                input_messages = genai_messages.input_messages(input_messages)
            if output_messages is not None:
                output_messages = genai_messages.output_messages(output_messages, self.finish_reasons)
        except Exception as exc:  # recorded as given
            internal_error("converting chat messages", exc)
        self.set_content(catalog.GEN_AI_INPUT_MESSAGES, input_messages)
        self.set_content(catalog.GEN_AI_OUTPUT_MESSAGES, output_messages)
        if self.events is None:
            return
        try:
            attributes = dict(self.event_attributes)
            for key, messages in (
                (catalog.GEN_AI_INPUT_MESSAGES, input_messages),
                (catalog.GEN_AI_OUTPUT_MESSAGES, output_messages),
            ):
                if messages is not None:  # structured, as the conventions ask of events
                    attributes[key] = to_log_value(messages, self._policy)
            self.events.emit(
                LogRecord(
                    timestamp=time.time_ns(),
                    event_name=catalog.GEN_AI_INFERENCE_DETAILS_EVENT,
                    context=self.context,
                    attributes=attributes,
                )
            )
        except Exception as exc:
            internal_error("content event", exc)


class MemoryOperation(SpanHandle):
    """A ``gen_ai.memory.client`` span."""

    __slots__ = ()

    def set_record_count(self, count: int) -> None:
        """Records returned or affected (a count that is not an integer from 0 to 2**63 - 1 is
        logged and left out)."""
        valid = _count("set_record_count", count)
        if valid is not None:
            self.span.set_attribute(catalog.GEN_AI_MEMORY_RECORD_COUNT, valid)


H = TypeVar("H", bound=SpanHandle)


class TelemetryParts(NamedTuple):
    """What :class:`AgentTelemetry` is built from."""

    tracer: Tracer
    metrics: KaosMetrics
    policy: ContentPolicy
    enabled: bool
    events: Logger | None


def telemetry_parts(
    tracer_provider: trace.TracerProvider | None,
    meter_provider: metrics.MeterProvider | None,
    policy: ContentPolicy | None = None,
    health: TelemetryHealth | None = None,
    bounds: LabelBounds | None = None,
    *,
    logger_provider: LoggerProvider | None = None,
    enabled: bool = True,
    scope: str = METER_NAME,
) -> TelemetryParts:
    """The one place telemetry is built (manager, integrations, Mem0): a tracer, the catalog's
    instruments and the content-event logger on the given (default: global) providers, or no-ops
    when disabled."""
    policy = policy or policy_from_env()
    bounds = bounds or LabelBounds()
    if not enabled:
        noop = KaosMetrics(metrics.NoOpMeter(scope), bounds)
        return TelemetryParts(trace.NoOpTracer(), noop, policy, False, None)
    # The providers' own get_tracer/get_meter, with no version: the meter is the same one a host
    # gets with ``meter_provider.get_meter(scope)`` (a second meter of the same name would
    # register its instruments as conflicting streams).
    tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(scope)
    # the catalog's Views select kaos-otel's meters by name: instruments on a meter of any other
    # scope would match none, and with metric_views()' last View be dropped
    meter_name = scope if scope in KAOS_METER_NAMES else METER_NAME
    meter = (meter_provider or metrics.get_meter_provider()).get_meter(meter_name)
    events = None
    if policy.capture.on_events:
        events = (logger_provider or get_logger_provider()).get_logger(scope)
    return TelemetryParts(tracer, KaosMetrics(meter, bounds, health), policy, True, events)


class AgentTelemetry:
    """Spans (three styles) and agent-domain helpers on one tracer and one set of instruments."""

    def __init__(
        self,
        tracer: Tracer,
        metrics: KaosMetrics,
        policy: ContentPolicy,
        *,
        enabled: bool = True,
        events: Logger | None = None,
    ) -> None:
        self._spans = SpanFactory(tracer, policy)
        self._metrics = metrics
        self._enabled = enabled
        self._events = events if policy.capture.on_events else None

    @classmethod
    def from_providers(
        cls,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        policy: ContentPolicy | None = None,
        health: TelemetryHealth | None = None,
        bounds: LabelBounds | None = None,
        enabled: bool = True,
        scope: str = METER_NAME,
        logger_provider: LoggerProvider | None = None,
    ) -> AgentTelemetry:
        """Domain helpers on providers you built (default: the global ones).

        Without ``policy``, content capture and the size cap come from the environment, as a
        manager reads them (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``, the attribute
        value length limits). Python logging is not bridged: that is the host's logging handler's
        job. Build the meter provider with :func:`kaos_otel.metric_views` so the label contract holds,
        e.g. around a ``PrometheusMetricReader``. ``health`` adds ``kaos.telemetry.dropped``;
        ``scope`` names the tracer (an instrumentation's module, for instance; metrics stay on
        kaos-otel's meter, which the catalog Views select);
        ``logger_provider`` receives the GenAI content events in the ``EVENT`` capture modes.
        """
        parts = telemetry_parts(
            tracer_provider,
            meter_provider,
            policy,
            health,
            bounds,
            logger_provider=logger_provider,
            enabled=enabled,
            scope=scope,
        )
        return cls(parts.tracer, parts.metrics, parts.policy, enabled=parts.enabled, events=parts.events)

    @property
    def enabled(self) -> bool:
        """Whether telemetry is recorded at all (``False`` with ``OTEL_SDK_DISABLED``)."""
        return self._enabled

    @property
    def content_policy(self) -> ContentPolicy:
        """What content is captured and how exported strings are cleaned."""
        return self._spans.policy

    @property
    def metrics(self) -> KaosMetrics:
        """The catalog's instruments."""
        return self._metrics

    # --- generic spans --------------------------------------------------------------------------
    def span_begin(
        self,
        name: str,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, object] | None = None,
        *,
        links: Sequence[Link] | None = None,
        parent: Context | None = None,
    ) -> SpanHandle:
        """Begin a span that is current until :meth:`span_success` or :meth:`span_failure`.

        ``parent``: the context to begin it in, taken as given (its span may have ended); by
        default the current one. End it in the task or thread that began it, or that one keeps it
        current for other libraries' spans and logs (on a pool thread: the next job's, unless
        submitted with :func:`kaos_otel.context.submit_in_context`)."""
        if not self._enabled:
            return NOOP_HANDLE
        return self._spans.begin(name, kind=kind, attributes=attributes, links=links, parent=parent)

    def span_success(self, span: SpanHandle) -> None:
        """End a span begun with :meth:`span_begin` successfully (ending twice is harmless).

        The same as ``span.success()``. Both spellings stay on purpose: this one is the explicit
        style's begin/success/failure triple on the telemetry object, the handle's serves code
        that was handed only the span (a callback, another task).
        """
        span.success()

    def span_failure(self, span: SpanHandle, exc: BaseException) -> None:
        """End a span as failed by ``exc`` (the same as ``span.failure(exc)``, see :meth:`span_success`)."""
        span.failure(exc)

    def span(
        self,
        name: str,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, object] | None = None,
        *,
        links: Sequence[Link] | None = None,
        parent: Context | None = None,
    ) -> SpanScope:
        """A span for a ``with`` block: ``with otel.span("step") as span: ...``.

        The span begins when the block is entered (not when ``span()`` is called) and ends with it;
        ``parent`` as for :meth:`span_begin`.
        """
        return SpanScope(self._spans if self._enabled else None, name, kind, attributes, links, parent)

    @overload
    def traced(self, name: F, /) -> F: ...

    @overload
    def traced(
        self,
        name: str | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Callable[[F], F]: ...

    def traced(
        self,
        name: str | Callable[..., Any] | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Any:
        """Decorator for sync, async, generator and async-generator functions.

        Use it as ``@otel.traced`` or ``@otel.traced("name", kind=..., attributes=...)``; the span
        is named after the function's qualified name unless a name is given. Above
        ``@staticmethod`` or ``@classmethod`` it traces the function and keeps the descriptor.
        """
        if callable(name) or isinstance(name, classmethod):  # bare ``@otel.traced``
            return self.traced()(name)
        if not self._enabled:
            return _identity
        return self._spans.traced(name, kind=kind, attributes=attributes)

    # --- agent domain ---------------------------------------------------------------------------
    def register_known_names(
        self,
        agent: str | None = None,
        *,
        tools: Iterable[str] | None = None,
        models: Iterable[str] | None = None,
        targets: Iterable[str] | None = None,
    ) -> None:
        """Declare the names an agent knows; other names from model output become one overflow label.

        The names are pooled per kind for every agent recording through this object, not kept per
        agent: once one agent's tools are declared, a tool name no agent declared is ``_other``, and
        once an agent name is declared (``agent`` or ``targets``), so is every agent not declared.
        Call it for each agent that shares it. A kind left out (``None``) stays as it was: until
        names of it are declared, its first 50 distinct names are kept. An empty list declares that
        the agent knows none (an agent with no tools): every name of that kind is then ``_other``.
        Declared names are never capped: declare the names your code defines, not a list a remote
        party sends (an MCP server's ``tools/list``), which would lift the bound.
        """
        bounds = self._metrics.bounds
        targets = None if targets is None else name_set(targets)  # read twice below (a generator too)
        if agent is not None:
            bounds.register(catalog.GEN_AI_AGENT_NAME, [agent])
        for key, names in (
            (catalog.GEN_AI_TOOL_NAME, tools),
            (catalog.GEN_AI_REQUEST_MODEL, models),
            (catalog.KAOS_DELEGATION_TARGET, targets),
        ):
            if names is not None:
                bounds.register(key, names)
        if targets:
            bounds.register(catalog.GEN_AI_AGENT_NAME, targets)

    def _begin(
        self,
        handle_type: type[H],
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, object],
        on_end: EndCallback,
    ) -> H:
        handle = self._spans.begin(
            name, kind=kind, attributes=attributes, on_end=on_end, handle_type=handle_type
        )
        assert isinstance(handle, handle_type)
        return handle

    def invoke_agent(
        self,
        agent_name: str,
        *,
        agent_id: str | None = None,
        conversation_id: str | None = None,
        session_id: str | None = None,
        user_id: str | None = None,
        max_steps: int | None = None,
        origin: RequestOrigin | str | None = None,
        provider: str | None = None,
        attributes: Mapping[str, object] | None = None,
    ) -> AgentRun:
        """An agent run (``invoke_agent {agent}``); records requests, duration and steps at the end.

        ``provider`` is ``gen_ai.provider.name`` on the span, which the conventions require: the
        provider of the model the agent runs on, as best known (``openai``...); not a metric label.

        The span name carries the agent's name as metric labels do (bounded: see
        :meth:`register_known_names`); ``gen_ai.agent.name`` keeps it as given. ``origin`` says who
        asked for the run (a user, another agent, the agent itself), so that dashboards count each
        user request once. Not given, it is ``delegated`` for a run started inside a
        :meth:`delegation` block with no other agent run between them (a sub-agent in the same
        process; in a pool thread, submitted with :func:`kaos_otel.context.submit_in_context`),
        else ``user``; a sub-agent serving another process's delegation says ``delegated`` itself.
        """
        if not self._enabled:
            return NOOP_AGENT_RUN
        if origin is None:
            origin = _origin_of_current_context()
        else:
            origin = enum_member(RequestOrigin, _folded(origin), RequestOrigin.USER, "invoke_agent origin")
        run = self._begin(
            AgentRun,
            f"invoke_agent {self._metrics.bounds.bound(catalog.GEN_AI_AGENT_NAME, agent_name)}",
            SpanKind.INTERNAL,
            {
                catalog.GEN_AI_OPERATION_NAME: "invoke_agent",
                catalog.GEN_AI_AGENT_NAME: agent_name,
                catalog.GEN_AI_AGENT_ID: agent_id,
                catalog.GEN_AI_CONVERSATION_ID: conversation_id,
                catalog.SESSION_ID: session_id,
                catalog.USER_ID: user_id,
                catalog.KAOS_AGENT_MAX_STEPS: max_steps,
                catalog.KAOS_REQUEST_ORIGIN: origin.value,
                catalog.GEN_AI_PROVIDER_NAME: provider,
                **_given_attributes("invoke_agent", attributes),
            },
            self._end_agent_run,
        )
        run.agent_name = agent_name
        run.origin = origin
        return run

    def _end_agent_run(self, handle: SpanHandle, duration_s: float) -> None:
        assert isinstance(handle, AgentRun)
        handle.span.set_attribute(catalog.KAOS_AGENT_STEPS, handle.steps)
        self._metrics.record_request(
            handle.agent_name, handle.origin, handle.outcome or Outcome.SUCCESS, duration_s, handle.steps
        )

    def agent_step(self, run: AgentRun, step: int | None = None) -> SpanHandle:
        """One loop iteration (``agent_step``; the number is the ``kaos.agent.step`` attribute)."""
        if not self._enabled:
            return NOOP_HANDLE
        if not isinstance(run, AgentRun):  # the step is still traced, under the current span
            internal_error("agent_step", TypeError(f"not an agent run: {_described(run)}"))
            return self._spans.begin(catalog.SPAN_AGENT_STEP, attributes={catalog.KAOS_AGENT_STEP: step})
        number = None if step is None else _count("agent_step", step)
        run.steps = number if number is not None else run.steps + 1
        return self._spans.begin(
            catalog.SPAN_AGENT_STEP,
            attributes={catalog.GEN_AI_AGENT_NAME: run.agent_name, catalog.KAOS_AGENT_STEP: run.steps},
        )

    def model_call(
        self,
        agent_name: str,
        model: str,
        *,
        provider: str = "openai",
        server_address: str | None = None,
        server_port: int | None = None,
        conversation_id: str | None = None,
        stream: bool = False,
        attributes: Mapping[str, object] | None = None,
    ) -> ModelCall:
        """A model call (``chat {model}``, CLIENT); records the GenAI client metrics at the end.

        ``conversation_id`` is ``gen_ai.conversation.id`` on the span (the run's, as given to
        :meth:`invoke_agent`; never a metric label). ``stream``: the answer is streamed
        (``gen_ai.request.stream``); say when its first chunk arrives with
        :meth:`ModelCall.record_first_chunk`.

        ``provider`` is ``gen_ai.provider.name`` on the span and the metrics; it defaults to
        ``openai`` (the OpenAI-compatible API the reference agent speaks): name yours
        (``anthropic``, ``aws.bedrock``, ``gcp.vertex_ai``...), or it is recorded as OpenAI. One
        given in ``attributes`` wins, on the metrics too.

        The span name carries the model as metric labels do (bounded: see
        :meth:`register_known_names`); ``gen_ai.request.model`` keeps it as given."""
        if not self._enabled:
            return NOOP_MODEL_CALL

        def on_end(handle: SpanHandle, duration_s: float) -> None:
            assert isinstance(handle, ModelCall)
            self._metrics.record_model_call(
                agent_name,
                model,
                provider,
                handle.outcome or Outcome.SUCCESS,
                duration_s,
                error_type=handle.error_type,
                input_tokens=handle.input_tokens,
                output_tokens=handle.output_tokens,
                first_chunk_s=handle.first_chunk_s,
            )

        call_attributes = {
            catalog.GEN_AI_OPERATION_NAME: "chat",
            catalog.GEN_AI_PROVIDER_NAME: provider,
            catalog.GEN_AI_REQUEST_MODEL: model,
            catalog.GEN_AI_AGENT_NAME: agent_name,
            catalog.SERVER_ADDRESS: server_address,
            catalog.SERVER_PORT: server_port,
            catalog.GEN_AI_CONVERSATION_ID: conversation_id,
            **_given_attributes("model_call", attributes),
        }
        if stream:  # set only then: every other call skips the key
            call_attributes.setdefault(catalog.GEN_AI_REQUEST_STREAM, True)  # given attributes win
        if isinstance(given_provider := call_attributes[catalog.GEN_AI_PROVIDER_NAME], str):
            provider = given_provider  # given attributes win on the metrics too: they say what the span says
        call = self._begin(
            ModelCall,
            f"chat {self._metrics.bounds.bound(catalog.GEN_AI_REQUEST_MODEL, model)}",
            SpanKind.CLIENT,
            call_attributes,
            on_end,
        )
        call.model = model
        if self._events is not None:
            call.events = self._events
            call.event_attributes = to_attributes(
                {key: call_attributes.get(key) for key in _INFERENCE_EVENT_KEYS}, self._spans.policy
            )
        return call

    def tool_call(
        self,
        agent_name: str,
        tool_name: str,
        *,
        call_id: str | None = None,
        arguments: object = None,
        tool_type: str = "function",
        attributes: Mapping[str, object] | None = None,
    ) -> SpanHandle:
        """A tool call (``execute_tool {tool}``); arguments are recorded only with content capture on.

        Once tool names are registered, span names and labels carry only those (any other is
        ``_other``, and the name asked for is recorded as ``kaos.requested_name`` only with content
        capture on); before, the first 50 distinct names.
        """
        if not self._enabled:
            return NOOP_HANDLE

        def on_end(handle: SpanHandle, duration_s: float) -> None:
            self._metrics.record_tool_call(
                agent_name, tool_name, handle.outcome or Outcome.SUCCESS, duration_s
            )

        name = self._metrics.bounds.bound(catalog.GEN_AI_TOOL_NAME, tool_name)
        handle = self._begin(
            SpanHandle,
            f"execute_tool {name}",
            SpanKind.INTERNAL,
            {
                catalog.GEN_AI_OPERATION_NAME: "execute_tool",
                catalog.GEN_AI_TOOL_NAME: name,
                catalog.GEN_AI_TOOL_TYPE: tool_type,
                catalog.GEN_AI_TOOL_CALL_ID: call_id,
                catalog.GEN_AI_AGENT_NAME: agent_name,
                **_given_attributes("tool_call", attributes),
            },
            on_end,
        )
        if name is not tool_name:  # kept names come back as given: no comparison of model output
            handle.set_content(catalog.KAOS_REQUESTED_NAME, tool_name)
        handle.set_content(catalog.GEN_AI_TOOL_CALL_ARGUMENTS, arguments)
        return handle

    def delegation(
        self, agent_name: str, target: str, *, attributes: Mapping[str, object] | None = None
    ) -> SpanHandle:
        """A delegation to a sub-agent (``invoke_agent {target}``, CLIENT); names as in tool_call.

        The sub-agent may run in another process (its server continues the trace) or in this one:
        an :meth:`invoke_agent` started inside the block, with no other agent run between them,
        counts as ``delegated``."""
        if not self._enabled:
            return NOOP_HANDLE

        def on_end(handle: SpanHandle, duration_s: float) -> None:
            self._metrics.record_delegation(agent_name, target, handle.outcome or Outcome.SUCCESS, duration_s)

        name = self._metrics.bounds.bound(catalog.KAOS_DELEGATION_TARGET, target)
        handle = self._begin(
            _Delegation,
            f"invoke_agent {name}",
            SpanKind.CLIENT,
            {
                catalog.GEN_AI_OPERATION_NAME: "invoke_agent",
                catalog.GEN_AI_AGENT_NAME: name,
                catalog.KAOS_DELEGATION_SOURCE: agent_name,
                catalog.KAOS_DELEGATION_TARGET: name,
                **_given_attributes("delegation", attributes),
            },
            on_end,
        )
        if name is not target:  # as in tool_call
            handle.set_content(catalog.KAOS_REQUESTED_NAME, target)
        return handle

    def memory_operation(
        self,
        tier: MemoryTier | str,
        operation: str,
        *,
        scope: MemoryScope | str | None = None,
        store_id: str | None = None,
        record_id: str | None = None,
        provider: str | None = None,
        attributes: Mapping[str, object] | None = None,
    ) -> MemoryOperation:
        """A memory operation of any tier (``gen_ai.memory.client`` span named after the operation).

        A value of the wrong kind (a tier naming no tier, an operation that is not text, attributes
        that are not a mapping) is logged and replaced, never raised."""
        if not self._enabled:
            return NOOP_MEMORY_OPERATION
        tier = enum_member(MemoryTier, _folded(tier), MemoryTier.SHORT_TERM, "memory_operation tier")
        if isinstance(scope, str) and (folded := _folded(scope)) in _MEMORY_SCOPES:
            scope = MemoryScope(folded)
        elif scope is not None:  # naming no scope: recorded without one
            internal_error("memory_operation", ValueError(f"not a memory scope: {_described(scope)}"))
            scope = None
        if not isinstance(operation, str) or not operation:
            internal_error("memory_operation", TypeError(f"not an operation name: {_described(operation)}"))
            operation = catalog.MEMORY_OPERATION_OTHER
        elif operation not in catalog.MEMORY_OPERATIONS:
            log_once(
                "unknown-memory-operation",
                "kaos-otel: memory operation %s is not one of %s; metrics count it as %r (the span "
                "keeps the name). Said once, for the first such name",
                _described(operation), ", ".join(catalog.MEMORY_OPERATIONS), catalog.MEMORY_OPERATION_OTHER,
                level=logging.WARNING,
            )  # fmt: skip

        def on_end(handle: SpanHandle, duration_s: float) -> None:
            self._metrics.record_memory_operation(
                tier, operation, scope, handle.outcome or Outcome.SUCCESS, duration_s
            )

        return self._begin(
            MemoryOperation,
            operation,
            SpanKind.CLIENT,
            {
                catalog.GEN_AI_OPERATION_NAME: operation,
                catalog.GEN_AI_MEMORY_STORE_ID: store_id,
                catalog.GEN_AI_MEMORY_RECORD_ID: record_id,
                catalog.KAOS_MEMORY_TIER: tier.value,
                catalog.KAOS_MEMORY_OPERATION: operation,
                catalog.KAOS_MEMORY_SCOPE: scope.value if scope is not None else None,
                catalog.KAOS_MEMORY_PROVIDER: provider,
                **_given_attributes("memory_operation", attributes),
            },
            on_end,
        )

    def record_window_tokens(self, agent_name: str, tokens: int) -> None:
        """Record the short-term window size (tokens) after a turn (a size that is not an integer
        from 0 to 2**63 - 1 is logged and not recorded)."""
        count = _count("record_window_tokens", tokens)
        if count is not None:
            self._record("record_window_tokens", self._metrics.record_window_tokens, agent_name, count)

    def record_compaction(self, agent_name: str, outcome: Outcome | str = Outcome.SUCCESS) -> None:
        """Record one short-term window compaction (the outcome in any case; one naming no
        outcome is logged and not recorded)."""
        member = outcome_named("record_compaction", outcome)
        if member is not None:
            self._record("record_compaction", self._metrics.record_compaction, agent_name, member)

    def record_extraction_lag(
        self, agent_name: str, lag_s: float, outcome: Outcome | str = Outcome.SUCCESS
    ) -> None:
        """Record the delay from compaction to long-term extraction finishing (a lag that is not a
        finite number of seconds from 0, or an outcome naming no outcome, is logged and not
        recorded)."""
        seconds = _seconds("record_extraction_lag", lag_s)
        member = outcome_named("record_extraction_lag", outcome)
        if seconds is not None and member is not None:
            self._record(
                "record_extraction_lag", self._metrics.record_extraction_lag, agent_name, seconds, member
            )

    def _record(self, where: str, record: Callable[..., None], *args: object) -> None:
        """Record a metric point when telemetry is on; a failure is logged, never raised."""
        if self._enabled:
            try:
                record(*args)
            except Exception as exc:
                internal_error(where, exc)


def _finish_reasons(value: object) -> tuple[str, ...]:
    """Finish reasons given as one string or a sequence of strings; anything else is said and
    left out (an exception here would reach the agent)."""
    if value is None or isinstance(value, str):
        return () if not value else (value,)
    if type(value) is list or type(value) is tuple:  # nearly always: no ABC check
        reasons: tuple[Any, ...] | None = tuple(value)
    else:
        try:
            reasons = tuple(value) if isinstance(value, Iterable) else None
        except Exception as exc:  # a generator that fails
            internal_error("record_usage finish_reasons", exc)
            return ()
    if reasons is not None and all(isinstance(reason, str) for reason in reasons):
        return reasons
    internal_error("record_usage finish_reasons", TypeError(f"not finish reasons: {_described(value)}"))
    return ()


def _token_count(value: object, recorded: int | None) -> int | None:
    """``value`` if it can be a token count on a span and a metric point, else what was
    ``recorded`` before (a value that cannot is logged)."""
    if type(value) is int and 0 <= value < 2**63:  # nearly always: no call
        return value
    if value is None:
        return recorded
    count = _count("record_usage", value)
    return recorded if count is None else count


def _count(where: str, value: object) -> int | None:
    """``value`` if it is a count a span and a metric point can carry (an integer from 0 to 2**63 - 1:
    OTLP carries 64-bit integers), else ``None``, logged."""
    try:  # any integer (a NumPy one too), no bool
        count = -1 if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except Exception:
        count = -1
    if 0 <= count < 2**63:
        return count
    internal_error(where, ValueError(f"not a count: {_described(value)}"))
    return None


def _seconds(where: str, value: object) -> float | None:
    """``value`` if it is a duration in seconds (a finite number from 0), else ``None``, logged."""
    try:  # any real number (a NumPy one too), no bool
        seconds = float(value) if isinstance(value, Real) and not isinstance(value, bool) else -1.0
    except Exception:
        seconds = -1.0
    if 0 <= seconds <= _MAX_SECONDS:
        return seconds
    internal_error(where, ValueError(f"not a duration in seconds: {_described(value)}"))
    return None


_MAX_SECONDS = 1e12
"""About 30,000 years: any duration a process measures, and no infinity or overflowing int."""


def _folded(value: _T) -> _T | str:
    """Text as the catalog's enums spell their values (lower case, no spaces around), so that
    ``"LONG_TERM"`` or ``"Delegated"`` is not recorded as another value; anything else as it is."""
    if isinstance(value, str) and type(value) is str:  # a member (a str too) as it is: no lookup
        return value.strip().lower()
    return value


def _identity(fn: F) -> F:
    return fn


class _NoopAgentRun(NoopSpanHandle, AgentRun):
    """An agent run that records nothing (telemetry disabled)."""

    __slots__ = ()

    def __init__(self) -> None:
        NoopSpanHandle.__init__(self)
        self._set_initial_fields()


class _NoopModelCall(NoopSpanHandle, ModelCall):
    """A model call that records nothing (telemetry disabled)."""

    __slots__ = ()

    def __init__(self) -> None:
        NoopSpanHandle.__init__(self)
        self._set_initial_fields()

    def record_usage(
        self,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        *,
        response_model: str | None = None,
        finish_reasons: Sequence[str] | None = None,
        response_id: str | None = None,
    ) -> None:
        """Do nothing (this handle is shared: it keeps no state)."""

    def record_first_chunk(self) -> None:
        """Do nothing (this handle is shared: it keeps no state)."""

    @property
    def records_messages(self) -> bool:
        """``False``: nothing is recorded."""
        return False

    def record_messages(self, input_messages: object = None, output_messages: object = None) -> None:
        """Do nothing."""


class _NoopMemoryOperation(NoopSpanHandle, MemoryOperation):
    """A memory operation that records nothing (telemetry disabled)."""

    __slots__ = ()


NOOP_AGENT_RUN: AgentRun = _NoopAgentRun()
NOOP_MODEL_CALL: ModelCall = _NoopModelCall()
NOOP_MEMORY_OPERATION: MemoryOperation = _NoopMemoryOperation()
