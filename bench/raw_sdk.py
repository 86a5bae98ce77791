"""The telemetry kaos-otel records, written on the raw OpenTelemetry SDK: the benchmarks' floor.

Each recorder creates the spans kaos-otel's domain helpers create (same names, kinds, attributes
and nesting, with ``start_as_current_span``) and records the same metric points with the same
label sets on plain SDK instruments, with none of kaos-otel's handles, label bounds or Views.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from opentelemetry.metrics import Histogram, Meter
from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.util.types import AttributeValue

from kaos_otel import MemoryScope, MemoryTier, RequestOrigin, catalog

SUCCESS = "success"
USER = RequestOrigin.USER.value
"""The origin of a request that no delegation started, as kaos-otel records it."""


def histogram(meter: Meter, name: str) -> Histogram:
    """A raw SDK histogram with the catalog's unit and bucket boundaries (as the SDK's advisory):
    its points have the buckets kaos-otel's have."""
    spec = catalog.METRICS_BY_NAME[name]
    return meter.create_histogram(
        name, unit=spec.unit, explicit_bucket_boundaries_advisory=list(spec.buckets or ())
    )


class AgentLoopTelemetry(Protocol):
    """The domain helpers an agent loop calls: :class:`~kaos_otel.AgentTelemetry`'s, or
    :class:`RawSdkAgentTelemetry`'s raw-SDK equivalents."""

    def invoke_agent(
        self, agent_name: str, *, conversation_id: str, max_steps: int
    ) -> AbstractContextManager[Any]: ...

    def agent_step(self, run: Any, step: int) -> AbstractContextManager[Any]: ...

    def model_call(
        self, agent_name: str, model: str, *, server_address: str, server_port: int
    ) -> AbstractContextManager[Any]: ...

    def tool_call(
        self, agent_name: str, tool_name: str, *, call_id: str, arguments: object
    ) -> AbstractContextManager[Any]: ...

    def record_window_tokens(self, agent_name: str, tokens: int) -> None: ...


class RawSdkMemoryTelemetry:
    """What a minimal Mem0 instrumentation written on the raw SDK records for one call."""

    def __init__(self, tracer: Tracer, meter: Meter) -> None:
        self._tracer = tracer
        self._operations = meter.create_counter(catalog.KAOS_MEMORY_OPERATIONS)
        self._duration = histogram(meter, catalog.KAOS_MEMORY_OPERATION_DURATION)

    @contextmanager
    def call(
        self,
        operation: str,
        scope: MemoryScope,
        user_id: str | None,
        extra: dict[str, AttributeValue] | None = None,
    ) -> Iterator[Span]:
        """A CLIENT span with the instrumentor's attributes (and ``extra``), then its two metric points."""
        start = time.perf_counter()
        attributes: dict[str, AttributeValue] = {
            catalog.GEN_AI_OPERATION_NAME: operation,
            catalog.GEN_AI_MEMORY_STORE_ID: "mem0",
            catalog.KAOS_MEMORY_TIER: MemoryTier.LONG_TERM.value,
            catalog.KAOS_MEMORY_OPERATION: operation,
            catalog.KAOS_MEMORY_SCOPE: scope.value,
            catalog.KAOS_MEMORY_PROVIDER: "mem0",
        }
        if user_id is not None:
            attributes[catalog.USER_ID] = user_id
        if extra:
            attributes.update(extra)
        span_context = self._tracer.start_as_current_span(
            operation, kind=SpanKind.CLIENT, attributes=attributes
        )
        with span_context as span:
            yield span
            span.set_attribute(catalog.KAOS_OUTCOME, SUCCESS)
            labels = {
                catalog.KAOS_MEMORY_TIER: MemoryTier.LONG_TERM.value,
                catalog.KAOS_MEMORY_OPERATION: operation,
                catalog.KAOS_MEMORY_SCOPE: scope.value,
                catalog.KAOS_OUTCOME: SUCCESS,
            }
            self._operations.add(1, labels)
            self._duration.record(time.perf_counter() - start, labels)

    def traced(self, operation: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """A Mem0 ``Memory`` method (``add``, ``search`` or ``delete``, called with the instance
        first) with each call inside :meth:`call`, recording what the instrumentor records of it:
        scope and user, ``infer`` and the created record's id for an add, the record id for a
        delete, the record count."""

        def traced_method(*args: Any, **kwargs: Any) -> Any:
            filters = kwargs.get("filters") or {}
            user_id = kwargs.get("user_id") or filters.get("user_id")
            scope = MemoryScope.USER if user_id else MemoryScope.STORE
            extra: dict[str, AttributeValue] = {}
            if operation == "create_memory":
                extra[catalog.KAOS_MEMORY_INFER] = bool(kwargs.get("infer", True))
            positional = args[1] if operation == "delete_memory" and len(args) > 1 else None
            memory_id = kwargs.get("memory_id", positional)
            if isinstance(memory_id, str):
                extra[catalog.GEN_AI_MEMORY_RECORD_ID] = memory_id
            with self.call(operation, scope, user_id, extra) as span:
                result = method(*args, **kwargs)
                if operation == "delete_memory":
                    span.set_attribute(catalog.GEN_AI_MEMORY_RECORD_COUNT, 1)
                records = result.get("results") if isinstance(result, dict) else None
                if isinstance(records, list):
                    span.set_attribute(catalog.GEN_AI_MEMORY_RECORD_COUNT, len(records))
                    if operation == "create_memory" and len(records) == 1:
                        span.set_attribute(catalog.GEN_AI_MEMORY_RECORD_ID, str(records[0]["id"]))
                return result

        return traced_method


class RawSdkRun:
    """The open ``invoke_agent`` span of :meth:`RawSdkAgentTelemetry.invoke_agent` and its step count."""

    def __init__(self, span: Span, agent_name: str) -> None:
        self.span = span
        self.agent_name = agent_name
        self.steps = 0


class RawSdkModelCall:
    """The open ``chat`` span of :meth:`RawSdkAgentTelemetry.model_call`."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None

    def record_usage(
        self,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        *,
        response_model: str | None = None,
        finish_reasons: Sequence[str] | None = None,
        response_id: str | None = None,
    ) -> None:
        """Token usage and response details, as ``ModelCall.record_usage`` sets them."""
        self.input_tokens, self.output_tokens = input_tokens, output_tokens
        attributes: dict[str, AttributeValue] = {}
        if input_tokens is not None:
            attributes[catalog.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
        if output_tokens is not None:
            attributes[catalog.GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
        if response_model is not None:
            attributes[catalog.GEN_AI_RESPONSE_MODEL] = response_model
        if response_id is not None:
            attributes[catalog.GEN_AI_RESPONSE_ID] = response_id
        if finish_reasons is not None:
            attributes[catalog.GEN_AI_RESPONSE_FINISH_REASONS] = tuple(finish_reasons)
        self.span.set_attributes(attributes)

    def record_messages(self, input_messages: object = None, output_messages: object = None) -> None:
        """Nothing: message content is not captured by default (nor by kaos-otel's default)."""


class RawSdkAgentTelemetry:
    """An agent request's spans and metric points (run, steps, model and tool calls) on the raw SDK.

    Its methods have the signatures of the :class:`~kaos_otel.AgentTelemetry` helpers the
    benchmarks' agent loop calls, so the same loop runs on either.
    """

    def __init__(self, tracer: Tracer, meter: Meter) -> None:
        self._tracer = tracer
        spec = catalog.METRICS_BY_NAME

        def counter(name: str) -> Any:
            return meter.create_counter(name, unit=spec[name].unit)

        self._requests = counter(catalog.KAOS_REQUESTS)
        self._request_duration = histogram(meter, catalog.KAOS_REQUEST_DURATION)
        self._request_steps = histogram(meter, catalog.KAOS_REQUEST_STEPS)
        self._model_calls = counter(catalog.KAOS_MODEL_CALLS)
        self._model_duration = histogram(meter, catalog.KAOS_MODEL_DURATION)
        self._operation_duration = histogram(meter, catalog.GEN_AI_CLIENT_OPERATION_DURATION)
        self._token_usage = histogram(meter, catalog.GEN_AI_CLIENT_TOKEN_USAGE)
        self._tool_calls = counter(catalog.KAOS_TOOL_CALLS)
        self._tool_duration = histogram(meter, catalog.KAOS_TOOL_DURATION)
        self._window_tokens = histogram(meter, catalog.KAOS_MEMORY_WINDOW_TOKENS)

    @contextmanager
    def invoke_agent(self, agent_name: str, *, conversation_id: str, max_steps: int) -> Iterator[RawSdkRun]:
        """The request's ``invoke_agent`` span (a user's request), then the three request metric points."""
        start = time.perf_counter()
        span_context = self._tracer.start_as_current_span(
            f"invoke_agent {agent_name}",
            attributes={
                catalog.GEN_AI_OPERATION_NAME: "invoke_agent",
                catalog.GEN_AI_AGENT_NAME: agent_name,
                catalog.GEN_AI_CONVERSATION_ID: conversation_id,
                catalog.KAOS_AGENT_MAX_STEPS: max_steps,
                catalog.KAOS_REQUEST_ORIGIN: USER,
            },
        )
        with span_context as span:
            run = RawSdkRun(span, agent_name)
            yield run
            span.set_attribute(catalog.KAOS_AGENT_STEPS, run.steps)
            span.set_attribute(catalog.KAOS_OUTCOME, SUCCESS)
            labels = {
                catalog.GEN_AI_AGENT_NAME: agent_name,
                catalog.KAOS_REQUEST_ORIGIN: USER,
                catalog.KAOS_OUTCOME: SUCCESS,
            }
            self._requests.add(1, labels)
            self._request_duration.record(time.perf_counter() - start, labels)
            self._request_steps.record(run.steps, labels)

    @contextmanager
    def agent_step(self, run: RawSdkRun, step: int) -> Iterator[Span]:
        """One step of the loop."""
        run.steps = step
        with self._tracer.start_as_current_span(
            catalog.SPAN_AGENT_STEP,
            attributes={catalog.GEN_AI_AGENT_NAME: run.agent_name, catalog.KAOS_AGENT_STEP: step},
        ) as span:
            yield span

    @contextmanager
    def model_call(
        self, agent_name: str, model: str, *, server_address: str, server_port: int
    ) -> Iterator[RawSdkModelCall]:
        """A ``chat`` CLIENT span, then the five model-call metric points."""
        start = time.perf_counter()
        span_context = self._tracer.start_as_current_span(
            f"chat {model}",
            kind=SpanKind.CLIENT,
            attributes={
                catalog.GEN_AI_OPERATION_NAME: "chat",
                catalog.GEN_AI_PROVIDER_NAME: "openai",
                catalog.GEN_AI_REQUEST_MODEL: model,
                catalog.GEN_AI_AGENT_NAME: agent_name,
                catalog.SERVER_ADDRESS: server_address,
                catalog.SERVER_PORT: server_port,
            },
        )
        with span_context as span:
            call = RawSdkModelCall(span)
            yield call
            span.set_attribute(catalog.KAOS_OUTCOME, SUCCESS)
            elapsed = time.perf_counter() - start
            labels = {
                catalog.GEN_AI_AGENT_NAME: agent_name,
                catalog.GEN_AI_REQUEST_MODEL: model,
                catalog.KAOS_OUTCOME: SUCCESS,
            }
            self._model_calls.add(1, labels)
            self._model_duration.record(elapsed, labels)
            gen_ai = {
                catalog.GEN_AI_OPERATION_NAME: "chat",
                catalog.GEN_AI_PROVIDER_NAME: "openai",
                catalog.GEN_AI_REQUEST_MODEL: model,
            }
            self._operation_duration.record(elapsed, gen_ai)
            for token_type, tokens in (("input", call.input_tokens), ("output", call.output_tokens)):
                if tokens is not None:
                    self._token_usage.record(tokens, {**gen_ai, catalog.GEN_AI_TOKEN_TYPE: token_type})

    @contextmanager
    def tool_call(
        self, agent_name: str, tool_name: str, *, call_id: str, arguments: object
    ) -> Iterator[Span]:
        """An ``execute_tool`` span, then its two metric points (arguments are content: not recorded)."""
        start = time.perf_counter()
        span_context = self._tracer.start_as_current_span(
            f"execute_tool {tool_name}",
            attributes={
                catalog.GEN_AI_OPERATION_NAME: "execute_tool",
                catalog.GEN_AI_TOOL_NAME: tool_name,
                catalog.GEN_AI_TOOL_TYPE: "function",
                catalog.GEN_AI_TOOL_CALL_ID: call_id,
                catalog.GEN_AI_AGENT_NAME: agent_name,
            },
        )
        with span_context as span:
            yield span
            span.set_attribute(catalog.KAOS_OUTCOME, SUCCESS)
            labels = {
                catalog.GEN_AI_AGENT_NAME: agent_name,
                catalog.GEN_AI_TOOL_NAME: tool_name,
                catalog.KAOS_OUTCOME: SUCCESS,
            }
            self._tool_calls.add(1, labels)
            self._tool_duration.record(time.perf_counter() - start, labels)

    def record_window_tokens(self, agent_name: str, tokens: int) -> None:
        """The short-term window size after the request."""
        self._window_tokens.record(tokens, {catalog.GEN_AI_AGENT_NAME: agent_name})
