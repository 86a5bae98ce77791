"""Every name kaos-otel emits: span names, attributes, metrics and log events.

This module is the single source of truth. Docs, dashboards, alert rules and tests are checked
against it, so a convention rename is one edit here. Names come from the OpenTelemetry GenAI,
memory and MCP conventions where one exists; ``kaos.*`` names are used only where none does.

Units: every duration is in seconds (``s``), as OpenTelemetry recommends. Every duration
histogram has explicit buckets (SigNoz drops exponential histograms): from 5 ms to 10 minutes for
``kaos.*``, the GenAI convention's advised buckets (10 ms to 81.92 s) for ``gen_ai.*``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Literal

# Names the OpenTelemetry semantic conventions define come from opentelemetry-semantic-conventions.
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_AGENT_ID as GEN_AI_AGENT_ID,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_AGENT_NAME as GEN_AI_AGENT_NAME,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_CONVERSATION_ID as GEN_AI_CONVERSATION_ID,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_INPUT_MESSAGES as GEN_AI_INPUT_MESSAGES,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_OPERATION_NAME as GEN_AI_OPERATION_NAME,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_OUTPUT_MESSAGES as GEN_AI_OUTPUT_MESSAGES,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_PROVIDER_NAME as GEN_AI_PROVIDER_NAME,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_REQUEST_MODEL as GEN_AI_REQUEST_MODEL,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_RESPONSE_FINISH_REASONS as GEN_AI_RESPONSE_FINISH_REASONS,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_RESPONSE_ID as GEN_AI_RESPONSE_ID,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_RESPONSE_MODEL as GEN_AI_RESPONSE_MODEL,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_TOKEN_TYPE as GEN_AI_TOKEN_TYPE,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_TOOL_CALL_ARGUMENTS as GEN_AI_TOOL_CALL_ARGUMENTS,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_TOOL_CALL_ID as GEN_AI_TOOL_CALL_ID,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_TOOL_NAME as GEN_AI_TOOL_NAME,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_TOOL_TYPE as GEN_AI_TOOL_TYPE,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_USAGE_INPUT_TOKENS as GEN_AI_USAGE_INPUT_TOKENS,
)
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_USAGE_OUTPUT_TOKENS as GEN_AI_USAGE_OUTPUT_TOKENS,
)
from opentelemetry.semconv._incubating.attributes.mcp_attributes import (
    MCP_METHOD_NAME as MCP_METHOD_NAME,
)
from opentelemetry.semconv._incubating.attributes.session_attributes import (
    SESSION_ID as SESSION_ID,
)
from opentelemetry.semconv._incubating.attributes.user_attributes import (
    USER_ID as USER_ID,
)
from opentelemetry.semconv._incubating.metrics.gen_ai_metrics import (
    GEN_AI_CLIENT_OPERATION_DURATION as GEN_AI_CLIENT_OPERATION_DURATION,
)
from opentelemetry.semconv._incubating.metrics.gen_ai_metrics import (
    GEN_AI_CLIENT_TOKEN_USAGE as GEN_AI_CLIENT_TOKEN_USAGE,
)
from opentelemetry.semconv.attributes.client_attributes import (
    CLIENT_ADDRESS as CLIENT_ADDRESS,
)
from opentelemetry.semconv.attributes.db_attributes import (
    DB_COLLECTION_NAME as DB_COLLECTION_NAME,
)
from opentelemetry.semconv.attributes.db_attributes import (
    DB_OPERATION_NAME as DB_OPERATION_NAME,
)
from opentelemetry.semconv.attributes.db_attributes import (
    DB_SYSTEM_NAME as DB_SYSTEM_NAME,
)
from opentelemetry.semconv.attributes.error_attributes import (
    ERROR_TYPE as ERROR_TYPE,
)
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_REQUEST_HEADER_TEMPLATE as HTTP_REQUEST_HEADER_TEMPLATE,
)
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_REQUEST_METHOD as HTTP_REQUEST_METHOD,
)
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_REQUEST_METHOD_ORIGINAL as HTTP_REQUEST_METHOD_ORIGINAL,
)
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_RESPONSE_HEADER_TEMPLATE as HTTP_RESPONSE_HEADER_TEMPLATE,
)
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_RESPONSE_STATUS_CODE as HTTP_RESPONSE_STATUS_CODE,
)
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_ROUTE as HTTP_ROUTE,
)
from opentelemetry.semconv.attributes.network_attributes import (
    NETWORK_PEER_ADDRESS as NETWORK_PEER_ADDRESS,
)
from opentelemetry.semconv.attributes.network_attributes import (
    NETWORK_PEER_PORT as NETWORK_PEER_PORT,
)
from opentelemetry.semconv.attributes.network_attributes import (
    NETWORK_PROTOCOL_VERSION as NETWORK_PROTOCOL_VERSION,
)
from opentelemetry.semconv.attributes.server_attributes import (
    SERVER_ADDRESS as SERVER_ADDRESS,
)
from opentelemetry.semconv.attributes.server_attributes import (
    SERVER_PORT as SERVER_PORT,
)
from opentelemetry.semconv.attributes.url_attributes import (
    URL_PATH as URL_PATH,
)
from opentelemetry.semconv.attributes.url_attributes import (
    URL_QUERY as URL_QUERY,
)
from opentelemetry.semconv.attributes.url_attributes import (
    URL_SCHEME as URL_SCHEME,
)
from opentelemetry.semconv.attributes.user_agent_attributes import (
    USER_AGENT_ORIGINAL as USER_AGENT_ORIGINAL,
)


class Outcome(StrEnum):
    """How an operation ended, as recorded on spans (``kaos.outcome``) and metric labels."""

    SUCCESS = "success"
    ERROR = "error"
    MAX_STEPS = "max_steps"
    CANCELED = "canceled"
    DEGRADED = "degraded"


class RequestOrigin(StrEnum):
    """Who asked for an agent run (``kaos.request.origin``): headline panels count ``user`` only."""

    USER = "user"
    """A request from outside the system (a user or the gateway in front of it)."""
    DELEGATED = "delegated"
    """A run another agent of the system delegated (part of some user request)."""
    AUTONOMOUS = "autonomous"
    """A run the agent started on its own."""


class MemoryTier(StrEnum):
    """The three memory tiers of the seed's design."""

    SHORT_TERM = "short_term"
    MEDIUM_TERM = "medium_term"
    LONG_TERM = "long_term"


class MemoryScope(StrEnum):
    """The read scope a memory operation was made at (session < agent < user < store)."""

    SESSION = "session"
    AGENT = "agent"
    USER = "user"
    STORE = "store"


# --- attribute keys -------------------------------------------------------------------------
# OpenTelemetry GenAI conventions
# streaming (semantic conventions v1.41.0; opentelemetry-semantic-conventions 0.61b0, the oldest
# release supported, does not define them)
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
# memory conventions (semantic-conventions-genai #140)
GEN_AI_MEMORY_STORE_ID = "gen_ai.memory.store.id"
GEN_AI_MEMORY_RECORD_ID = "gen_ai.memory.record.id"
GEN_AI_MEMORY_RECORD_COUNT = "gen_ai.memory.record.count"
GEN_AI_MEMORY_QUERY_TEXT = "gen_ai.memory.query.text"
GEN_AI_MEMORY_RECORDS = "gen_ai.memory.records"
# general conventions
# kaos.* (no convention exists)
KAOS_OUTCOME = "kaos.outcome"
KAOS_REQUEST_ORIGIN = "kaos.request.origin"
KAOS_AGENT_STEP = "kaos.agent.step"
KAOS_AGENT_MAX_STEPS = "kaos.agent.max_steps"
KAOS_AGENT_STEPS = "kaos.agent.steps"
KAOS_DELEGATION_SOURCE = "kaos.delegation.source"
KAOS_DELEGATION_TARGET = "kaos.delegation.target"
KAOS_MEMORY_TIER = "kaos.memory.tier"
KAOS_MEMORY_OPERATION = "kaos.memory.operation"
KAOS_MEMORY_SCOPE = "kaos.memory.scope"
KAOS_MEMORY_PROVIDER = "kaos.memory.provider"
KAOS_MEMORY_INFER = "kaos.memory.infer"
KAOS_TELEMETRY_SIGNAL = "kaos.telemetry.signal"
KAOS_TELEMETRY_REASON = "kaos.telemetry.reason"
TELEMETRY_SIGNALS = ("traces", "metrics", "logs")
"""The values of ``kaos.telemetry.signal``."""
TELEMETRY_DROP_REASONS = ("queue_full", "export_failed", "shutdown")
"""The values of ``kaos.telemetry.reason``: why telemetry was lost."""
KAOS_TRACE_TRUST = "kaos.trace.trust"
KAOS_REQUESTED_NAME = "kaos.requested_name"

OVERFLOW_VALUE = "_other"
"""The one label value that every name outside a label's bound collapses into."""

HIGH_CARDINALITY_KEYS: frozenset[str] = frozenset(
    {
        SESSION_ID,
        USER_ID,
        GEN_AI_CONVERSATION_ID,
        GEN_AI_AGENT_ID,
        GEN_AI_TOOL_CALL_ID,
        GEN_AI_RESPONSE_ID,
        GEN_AI_MEMORY_STORE_ID,
        GEN_AI_MEMORY_RECORD_ID,
    }
)
"""Ids that belong on spans and logs, never on metric labels."""


@dataclass(frozen=True, slots=True)
class AttributeSpec:
    """One attribute key kaos-otel sets, where it is defined and whether it is content."""

    key: str
    """The key; a part in braces is a template's, filled from the data (``http.request.header.{name}``)."""
    brief: str
    source: Literal["otel", "kaos"]
    content: bool = False


ATTRIBUTES: tuple[AttributeSpec, ...] = (
    AttributeSpec(GEN_AI_OPERATION_NAME, "GenAI operation (invoke_agent, chat, execute_tool...)", "otel"),
    AttributeSpec(GEN_AI_PROVIDER_NAME, "Model provider, e.g. openai", "otel"),
    AttributeSpec(GEN_AI_AGENT_NAME, "Agent name", "otel"),
    AttributeSpec(GEN_AI_AGENT_ID, "Agent instance id", "otel"),
    AttributeSpec(GEN_AI_CONVERSATION_ID, "Conversation id", "otel"),
    AttributeSpec(GEN_AI_REQUEST_MODEL, "Requested model", "otel"),
    AttributeSpec(GEN_AI_RESPONSE_MODEL, "Model that answered", "otel"),
    AttributeSpec(GEN_AI_RESPONSE_ID, "The completion's id, as the model API gave it", "otel"),
    AttributeSpec(GEN_AI_RESPONSE_FINISH_REASONS, "Finish reasons of the choices", "otel"),
    AttributeSpec(GEN_AI_REQUEST_STREAM, "The model call streamed its answer (set only then)", "otel"),
    AttributeSpec(GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, "Seconds from the request to its first chunk", "otel"),
    AttributeSpec(GEN_AI_USAGE_INPUT_TOKENS, "Input tokens used", "otel"),
    AttributeSpec(GEN_AI_USAGE_OUTPUT_TOKENS, "Output tokens used", "otel"),
    AttributeSpec(GEN_AI_TOKEN_TYPE, "input or output (metric label)", "otel"),
    AttributeSpec(GEN_AI_TOOL_NAME, "Tool name", "otel"),
    AttributeSpec(GEN_AI_TOOL_CALL_ID, "Tool call id", "otel"),
    AttributeSpec(GEN_AI_TOOL_TYPE, "function or extension", "otel"),
    AttributeSpec(GEN_AI_TOOL_CALL_ARGUMENTS, "Tool arguments", "otel", content=True),
    AttributeSpec(GEN_AI_INPUT_MESSAGES, "Prompt messages", "otel", content=True),
    AttributeSpec(GEN_AI_OUTPUT_MESSAGES, "Response messages", "otel", content=True),
    AttributeSpec(GEN_AI_MEMORY_STORE_ID, "Memory store id", "otel"),
    AttributeSpec(GEN_AI_MEMORY_RECORD_ID, "Memory record id", "otel"),
    AttributeSpec(GEN_AI_MEMORY_RECORD_COUNT, "Records returned or affected", "otel"),
    AttributeSpec(GEN_AI_MEMORY_QUERY_TEXT, "Memory search query", "otel", content=True),
    AttributeSpec(GEN_AI_MEMORY_RECORDS, "Memory record content", "otel", content=True),
    AttributeSpec(ERROR_TYPE, "Exception class or error code", "otel"),
    AttributeSpec(SERVER_ADDRESS, "Server host (on a server span: as the client addressed it)", "otel"),
    AttributeSpec(SERVER_PORT, "Server port (on a server span: as the client addressed it)", "otel"),
    AttributeSpec(SESSION_ID, "Session id", "otel"),
    AttributeSpec(USER_ID, "Verified user id (from the gateway header)", "otel"),
    AttributeSpec(
        HTTP_REQUEST_METHOD, "HTTP method of an incoming request, _OTHER if unknown (ASGI middleware)", "otel"
    ),
    AttributeSpec(HTTP_REQUEST_METHOD_ORIGINAL, "An unknown method as sent (ASGI middleware)", "otel"),
    AttributeSpec(HTTP_ROUTE, "Matched route template, e.g. /chat (ASGI middleware)", "otel"),
    AttributeSpec(HTTP_RESPONSE_STATUS_CODE, "HTTP status sent (ASGI middleware)", "otel"),
    AttributeSpec(URL_PATH, "Request path (ASGI middleware)", "otel"),
    AttributeSpec(URL_SCHEME, "http or https (ASGI middleware)", "otel"),
    AttributeSpec(URL_QUERY, "Query string, signature values REDACTED (ASGI middleware)", "otel"),
    AttributeSpec(CLIENT_ADDRESS, "Original client: forwarded header if trusted, else peer (ASGI)", "otel"),
    AttributeSpec(NETWORK_PEER_ADDRESS, "Address of the connection's peer (ASGI middleware)", "otel"),
    AttributeSpec(NETWORK_PEER_PORT, "Port of the connection's peer (ASGI middleware)", "otel"),
    AttributeSpec(NETWORK_PROTOCOL_VERSION, "HTTP version: 1.1, 2 (ASGI middleware)", "otel"),
    AttributeSpec(USER_AGENT_ORIGINAL, "User-Agent header (ASGI middleware)", "otel"),
    AttributeSpec(
        f"{HTTP_REQUEST_HEADER_TEMPLATE}.{{name}}",
        "A request header's values, when OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST names it "
        "(ASGI middleware)",
        "otel",
    ),
    AttributeSpec(
        f"{HTTP_RESPONSE_HEADER_TEMPLATE}.{{name}}",
        "A response header's values, when OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_RESPONSE names it "
        "(ASGI middleware)",
        "otel",
    ),
    AttributeSpec(DB_SYSTEM_NAME, "Vector store engine, e.g. qdrant (Mem0 child spans)", "otel"),
    AttributeSpec(DB_OPERATION_NAME, "Vector store operation, e.g. search (Mem0 child spans)", "otel"),
    AttributeSpec(DB_COLLECTION_NAME, "Vector store collection (Mem0 child spans)", "otel"),
    AttributeSpec(KAOS_OUTCOME, "success | error | max_steps | canceled | degraded", "kaos"),
    AttributeSpec(KAOS_REQUEST_ORIGIN, "user | delegated | autonomous: who asked for the run", "kaos"),
    AttributeSpec(KAOS_AGENT_STEP, "Loop step number (1-based)", "kaos"),
    AttributeSpec(KAOS_AGENT_MAX_STEPS, "Step budget of the run", "kaos"),
    AttributeSpec(KAOS_AGENT_STEPS, "Steps the run took", "kaos"),
    AttributeSpec(KAOS_DELEGATION_SOURCE, "Agent that delegated", "kaos"),
    AttributeSpec(KAOS_DELEGATION_TARGET, "Agent delegated to (bounded on metrics)", "kaos"),
    AttributeSpec(KAOS_MEMORY_TIER, "short_term | medium_term | long_term", "kaos"),
    AttributeSpec(KAOS_MEMORY_OPERATION, "Memory operation name (search_memory...)", "kaos"),
    AttributeSpec(KAOS_MEMORY_SCOPE, "session | agent | user | store", "kaos"),
    AttributeSpec(KAOS_MEMORY_PROVIDER, "Memory engine, e.g. mem0", "kaos"),
    AttributeSpec(KAOS_MEMORY_INFER, "Memories extracted by an LLM (Mem0 infer)", "kaos"),
    AttributeSpec(KAOS_TELEMETRY_SIGNAL, "traces | metrics | logs", "kaos"),
    AttributeSpec(KAOS_TELEMETRY_REASON, "queue_full | export_failed | shutdown", "kaos"),
    AttributeSpec(KAOS_TRACE_TRUST, "trusted | link | ignore: how incoming context was used", "kaos"),
    AttributeSpec(
        KAOS_REQUESTED_NAME,
        "Tool or agent name model output asked for that is not a registered one (names say _other)",
        "kaos",
        content=True,
    ),
)


# --- spans ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SpanSpec:
    """A span kaos-otel creates: its name pattern, kind and the operation it stands for."""

    name: str
    kind: Literal["INTERNAL", "CLIENT", "SERVER"]
    operation: str
    brief: str


SPAN_INVOKE_AGENT = "invoke_agent {gen_ai.agent.name}"
SPAN_AGENT_STEP = "agent_step"
SPAN_CHAT = "chat {gen_ai.request.model}"
SPAN_EXECUTE_TOOL = "execute_tool {gen_ai.tool.name}"
SPAN_DELEGATION = "invoke_agent {kaos.delegation.target}"
SPAN_MEMORY = "{gen_ai.operation.name}"
SPAN_EMBEDDINGS = "embeddings {gen_ai.request.model}"
SPAN_VECTOR_STORE = "{db.operation.name} {db.collection.name}"
SPAN_HTTP_SERVER = "{http.request.method} {http.route}"
SPAN_HTTP_SERVER_UNROUTED = "{http.request.method}"
SPAN_HTTP_SERVER_OTHER_METHOD = "HTTP {http.route}"
SPAN_HTTP_SERVER_OTHER_METHOD_UNROUTED = "HTTP"

MEMORY_OPERATIONS: tuple[str, ...] = (
    "create_memory_store",
    "search_memory",
    "create_memory",
    "update_memory",
    "upsert_memory",
    "delete_memory",
    "delete_memory_store",
    "get_memory",
    "list_memory",
    "memory_history",
)
"""Memory operation names: the convention's, plus read/list/history for engines such as Mem0."""
MEMORY_OPERATION_OTHER = "other"
"""The ``kaos.memory.operation`` label value of any operation not listed above."""
MEMORY_SCOPE_NONE = "none"
"""The ``kaos.memory.scope`` label value of an operation made without a scope."""

SPANS: tuple[SpanSpec, ...] = (
    SpanSpec(SPAN_INVOKE_AGENT, "INTERNAL", "invoke_agent", "One agent run (the agentic loop)"),
    SpanSpec(SPAN_AGENT_STEP, "INTERNAL", "agent_step", "One loop iteration; step number in kaos.agent.step"),
    SpanSpec(SPAN_CHAT, "CLIENT", "chat", "One model call"),
    SpanSpec(
        SPAN_EXECUTE_TOOL, "INTERNAL", "execute_tool", "One tool call (the MCP client span is its child)"
    ),
    SpanSpec(SPAN_DELEGATION, "CLIENT", "invoke_agent", "Delegation to a remote sub-agent"),
    SpanSpec(SPAN_MEMORY, "CLIENT", "<memory operation>", "One memory operation (gen_ai.memory.client)"),
    SpanSpec(SPAN_EMBEDDINGS, "CLIENT", "embeddings", "Embedding inside a memory operation (opt-in)"),
    SpanSpec(SPAN_VECTOR_STORE, "CLIENT", "<vector store op>", "Vector store call in a memory op (opt-in)"),
    SpanSpec(SPAN_HTTP_SERVER, "SERVER", "http", "Incoming HTTP request (ASGI middleware)"),
    SpanSpec(SPAN_HTTP_SERVER_UNROUTED, "SERVER", "http", "Incoming HTTP request no route matched"),
    SpanSpec(SPAN_HTTP_SERVER_OTHER_METHOD, "SERVER", "http", "Incoming request, unknown method (_OTHER)"),
    SpanSpec(SPAN_HTTP_SERVER_OTHER_METHOD_UNROUTED, "SERVER", "http", "Unknown method, no route matched"),
)


# --- metrics --------------------------------------------------------------------------------
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
GEN_AI_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
GEN_AI_TOKEN_BUCKETS: tuple[float, ...] = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
STEP_BUCKETS: tuple[float, ...] = (0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 7.5, 9.5, 14.5, 19.5, 29.5, 49.5)
"""Steps are whole numbers: edges between them, so that ``histogram_quantile`` (which spreads a
bucket's counts over its width) reads 3 for runs of 3 steps, not 2.5."""
WINDOW_TOKEN_BUCKETS: tuple[float, ...] = (
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
    32768,
    65536,
    131072,
    262144,
)

LABEL_VALUE_CAP = 50
"""Distinct values any one label key may take (across every instrument that has it) before values
overflow."""

OPTIONAL_METRIC_LABELS: frozenset[str] = frozenset({ERROR_TYPE})
"""Label keys present only on some points (``error.type`` only on failed calls)."""

Instrument = Literal["counter", "histogram"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: instrument, unit, allowed label keys and (histograms) bucket boundaries."""

    name: str
    instrument: Instrument
    unit: str
    description: str
    attributes: tuple[str, ...]
    buckets: tuple[float, ...] | None = None
    max_label_sets: int = 0
    label_value_bounds: tuple[tuple[str, int], ...] = ()
    """Per label key, the most distinct values it can take (absence of an optional key counts)."""

    @property
    def required_attributes(self) -> tuple[str, ...]:
        """The label keys every point carries."""
        return tuple(key for key in self.attributes if key not in OPTIONAL_METRIC_LABELS)

    def value_bound(self, key: str) -> int:
        """The most distinct values label ``key`` can take on this metric (0 if not a label)."""
        return dict(self.label_value_bounds).get(key, 0)

    @property
    def prometheus(self) -> str:
        """The series name Prometheus shows (``_bucket`` etc. are added for histograms)."""
        return prometheus_name(self.name, self.unit, monotonic=self.instrument == "counter")

    @property
    def signoz(self) -> str:
        """The name SigNoz shows; histograms are queried as ``<name>.bucket``."""
        return self.name + ".bucket" if self.instrument == "histogram" else self.name


def _metric(
    name: str,
    instrument: Instrument,
    unit: str,
    description: str,
    attributes: tuple[str, ...],
    buckets: tuple[float, ...] | None = None,
    *,
    fixed_label_values: dict[str, int] | None = None,
) -> MetricSpec:
    """Build a spec whose label-set bound is the product of each key's value bound.

    A key's bound is its fixed number of values, or the cap plus the overflow value; an optional
    key may also be absent, which counts as one more value.
    """
    fixed = fixed_label_values or {}
    bounds = tuple(
        (key, fixed.get(key, LABEL_VALUE_CAP + 1) + (key in OPTIONAL_METRIC_LABELS)) for key in attributes
    )
    max_label_sets = 1
    for _, bound in bounds:
        max_label_sets *= bound
    return MetricSpec(name, instrument, unit, description, attributes, buckets, max_label_sets, bounds)


_OUTCOMES = len(Outcome)
_AGENT_OUTCOME = {KAOS_OUTCOME: _OUTCOMES}
_REQUEST_LABELS = (GEN_AI_AGENT_NAME, KAOS_REQUEST_ORIGIN, KAOS_OUTCOME)
_REQUEST_FIXED = {KAOS_OUTCOME: _OUTCOMES, KAOS_REQUEST_ORIGIN: len(RequestOrigin)}

KAOS_REQUESTS = "kaos.requests"
KAOS_REQUEST_DURATION = "kaos.request.duration"
KAOS_REQUEST_STEPS = "kaos.request.steps"
KAOS_MODEL_CALLS = "kaos.model.calls"
KAOS_MODEL_DURATION = "kaos.model.duration"
KAOS_TOOL_CALLS = "kaos.tool.calls"
KAOS_TOOL_DURATION = "kaos.tool.duration"
KAOS_DELEGATIONS = "kaos.delegations"
KAOS_DELEGATION_DURATION = "kaos.delegation.duration"
KAOS_MEMORY_OPERATIONS = "kaos.memory.operations"
KAOS_MEMORY_OPERATION_DURATION = "kaos.memory.operation.duration"
KAOS_MEMORY_WINDOW_TOKENS = "kaos.memory.window.tokens"
KAOS_MEMORY_COMPACTIONS = "kaos.memory.compactions"
KAOS_MEMORY_EXTRACTION_LAG = "kaos.memory.extraction.lag"
KAOS_TELEMETRY_DROPPED = "kaos.telemetry.dropped"

_MEMORY_LABELS = (KAOS_MEMORY_TIER, KAOS_MEMORY_OPERATION, KAOS_MEMORY_SCOPE, KAOS_OUTCOME)
_MEMORY_FIXED = {
    KAOS_MEMORY_TIER: len(MemoryTier),
    KAOS_MEMORY_OPERATION: len(MEMORY_OPERATIONS) + 1,  # + MEMORY_OPERATION_OTHER
    KAOS_MEMORY_SCOPE: len(MemoryScope) + 1,  # + MEMORY_SCOPE_NONE
    KAOS_OUTCOME: _OUTCOMES,
}

METRICS: tuple[MetricSpec, ...] = (
    _metric(
        GEN_AI_CLIENT_OPERATION_DURATION,
        "histogram",
        "s",
        "GenAI operation duration (convention)",
        (GEN_AI_OPERATION_NAME, GEN_AI_PROVIDER_NAME, GEN_AI_REQUEST_MODEL, ERROR_TYPE),
        GEN_AI_DURATION_BUCKETS_S,
        fixed_label_values={GEN_AI_OPERATION_NAME: 1},
    ),
    _metric(
        GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK,
        "histogram",
        "s",
        "Time to the first chunk of a streamed answer (convention)",
        (GEN_AI_OPERATION_NAME, GEN_AI_PROVIDER_NAME, GEN_AI_REQUEST_MODEL),
        GEN_AI_DURATION_BUCKETS_S,
        fixed_label_values={GEN_AI_OPERATION_NAME: 1},
    ),
    _metric(
        GEN_AI_CLIENT_TOKEN_USAGE,
        "histogram",
        "{token}",
        "Tokens used per model call (convention)",
        (GEN_AI_OPERATION_NAME, GEN_AI_PROVIDER_NAME, GEN_AI_REQUEST_MODEL, GEN_AI_TOKEN_TYPE),
        GEN_AI_TOKEN_BUCKETS,
        fixed_label_values={GEN_AI_OPERATION_NAME: 1, GEN_AI_TOKEN_TYPE: 2},
    ),
    _metric(
        KAOS_REQUESTS,
        "counter",
        "{request}",
        "Agent requests by origin and outcome",
        _REQUEST_LABELS,
        fixed_label_values=_REQUEST_FIXED,
    ),
    _metric(
        KAOS_REQUEST_DURATION,
        "histogram",
        "s",
        "Agent request duration",
        _REQUEST_LABELS,
        DURATION_BUCKETS_S,
        fixed_label_values=_REQUEST_FIXED,
    ),
    _metric(
        KAOS_REQUEST_STEPS,
        "histogram",
        "{step}",
        "Loop steps per agent request",
        _REQUEST_LABELS,
        STEP_BUCKETS,
        fixed_label_values=_REQUEST_FIXED,
    ),
    _metric(
        KAOS_MODEL_CALLS,
        "counter",
        "{call}",
        "Model calls",
        (GEN_AI_AGENT_NAME, GEN_AI_REQUEST_MODEL, KAOS_OUTCOME),
        fixed_label_values=_AGENT_OUTCOME,
    ),
    _metric(
        KAOS_MODEL_DURATION,
        "histogram",
        "s",
        "Model call duration",
        (GEN_AI_AGENT_NAME, GEN_AI_REQUEST_MODEL, KAOS_OUTCOME),
        DURATION_BUCKETS_S,
        fixed_label_values=_AGENT_OUTCOME,
    ),
    _metric(
        KAOS_TOOL_CALLS,
        "counter",
        "{call}",
        "Tool calls",
        (GEN_AI_AGENT_NAME, GEN_AI_TOOL_NAME, KAOS_OUTCOME),
        fixed_label_values=_AGENT_OUTCOME,
    ),
    _metric(
        KAOS_TOOL_DURATION,
        "histogram",
        "s",
        "Tool call duration",
        (GEN_AI_AGENT_NAME, GEN_AI_TOOL_NAME, KAOS_OUTCOME),
        DURATION_BUCKETS_S,
        fixed_label_values=_AGENT_OUTCOME,
    ),
    _metric(
        KAOS_DELEGATIONS,
        "counter",
        "{delegation}",
        "Delegations to sub-agents",
        (GEN_AI_AGENT_NAME, KAOS_DELEGATION_TARGET, KAOS_OUTCOME),
        fixed_label_values=_AGENT_OUTCOME,
    ),
    _metric(
        KAOS_DELEGATION_DURATION,
        "histogram",
        "s",
        "Delegation duration",
        (GEN_AI_AGENT_NAME, KAOS_DELEGATION_TARGET, KAOS_OUTCOME),
        DURATION_BUCKETS_S,
        fixed_label_values=_AGENT_OUTCOME,
    ),
    _metric(
        KAOS_MEMORY_OPERATIONS,
        "counter",
        "{operation}",
        "Memory operations",
        _MEMORY_LABELS,
        fixed_label_values=_MEMORY_FIXED,
    ),
    _metric(
        KAOS_MEMORY_OPERATION_DURATION,
        "histogram",
        "s",
        "Memory operation duration",
        _MEMORY_LABELS,
        DURATION_BUCKETS_S,
        fixed_label_values=_MEMORY_FIXED,
    ),
    _metric(
        KAOS_MEMORY_WINDOW_TOKENS,
        "histogram",
        "{token}",
        "Short-term window size after a turn",
        (GEN_AI_AGENT_NAME,),
        WINDOW_TOKEN_BUCKETS,
    ),
    _metric(
        KAOS_MEMORY_COMPACTIONS,
        "counter",
        "{compaction}",
        "Short-term window compactions",
        (GEN_AI_AGENT_NAME, KAOS_OUTCOME),
        fixed_label_values=_AGENT_OUTCOME,
    ),
    _metric(
        KAOS_MEMORY_EXTRACTION_LAG,
        "histogram",
        "s",
        "Delay from compaction to long-term extraction finishing",
        (GEN_AI_AGENT_NAME, KAOS_OUTCOME),
        DURATION_BUCKETS_S,
        fixed_label_values=_AGENT_OUTCOME,
    ),
    _metric(
        KAOS_TELEMETRY_DROPPED,
        "counter",
        "{item}",
        "Telemetry items dropped or failed to export",
        (KAOS_TELEMETRY_SIGNAL, KAOS_TELEMETRY_REASON),
        fixed_label_values={
            KAOS_TELEMETRY_SIGNAL: len(TELEMETRY_SIGNALS),
            KAOS_TELEMETRY_REASON: len(TELEMETRY_DROP_REASONS),
        },
    ),
)

METRICS_BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in METRICS}


# --- log events -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LogEventSpec:
    """A named log event (``event.name``) kaos-otel emits."""

    name: str
    brief: str
    content: bool


GEN_AI_INFERENCE_DETAILS_EVENT = "gen_ai.client.inference.operation.details"

LOG_EVENTS: tuple[LogEventSpec, ...] = (
    LogEventSpec(
        GEN_AI_INFERENCE_DETAILS_EVENT,
        "Model call input/output messages; only with content capture in an EVENT mode",
        content=True,
    ),
)


# --- backend names --------------------------------------------------------------------------
_UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes"}


def prometheus_name(name: str, unit: str, *, monotonic: bool) -> str:
    """Translate an OTel metric name the way the collector and Prometheus exporters do."""
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    suffix = _UNIT_SUFFIXES.get(unit, "")
    if suffix and not base.endswith(suffix):
        base = f"{base}_{suffix}"
    return base + "_total" if monotonic else base


def prometheus_label(key: str) -> str:
    """Translate an attribute key into its Prometheus label name."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def catalog_as_dict() -> dict[str, Any]:
    """The whole catalog as plain data (``kaos-otel catalog --json``)."""
    return {
        "units": {"duration": "s"},
        "label_value_cap": LABEL_VALUE_CAP,
        "overflow_value": OVERFLOW_VALUE,
        "spans": [asdict(spec) for spec in SPANS],
        "attributes": [asdict(spec) for spec in ATTRIBUTES],
        "metrics": [
            {
                "name": spec.name,
                "instrument": spec.instrument,
                "unit": spec.unit,
                "description": spec.description,
                "attributes": list(spec.attributes),
                "buckets": list(spec.buckets) if spec.buckets is not None else None,
                "max_label_sets": spec.max_label_sets,
                "label_value_bounds": dict(spec.label_value_bounds),
                "prometheus": spec.prometheus,
                "prometheus_labels": [prometheus_label(key) for key in spec.attributes],
                "signoz": spec.signoz,
            }
            for spec in METRICS
        ],
        "log_events": [asdict(spec) for spec in LOG_EVENTS],
        "memory_operations": list(MEMORY_OPERATIONS),
        "outcomes": [outcome.value for outcome in Outcome],
    }


# --- docs/metrics.md ------------------------------------------------------------------------
_OUTCOME_MEANINGS = {
    Outcome.SUCCESS: "finished and did what was asked",
    Outcome.ERROR: "ended by an exception, or an error the agent caught and reported with `set_outcome`",
    Outcome.MAX_STEPS: "the run used its step budget without an answer",
    Outcome.CANCELED: "canceled (`asyncio.CancelledError`, client gone, the process stopping)",
    Outcome.DEGRADED: (
        "finished without a dependency, e.g. memory backend down and the agent went on (the "
        "reference agent's `error.type`: `memory_unavailable`, or `tools_unavailable` when a model "
        "call was not offered the tools of an MCP server not connected)"
    ),
}
_BOUNDED_NAME_KEYS = (
    GEN_AI_AGENT_NAME,
    GEN_AI_TOOL_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_PROVIDER_NAME,
    KAOS_DELEGATION_TARGET,
    ERROR_TYPE,
)


def _numbers(values: tuple[float, ...]) -> str:
    return ", ".join(str(int(v)) if float(v).is_integer() else str(float(v)) for v in values)


def _code(values: list[str] | tuple[str, ...]) -> str:
    return ", ".join(f"`{v}`" for v in values)


def _series(spec: MetricSpec) -> tuple[list[str], list[str]]:
    """(Prometheus series, SigNoz names) of one metric."""
    if spec.instrument == "histogram":
        return (
            [f"{spec.prometheus}_{s}" for s in ("bucket", "count", "sum")],
            [spec.signoz, f"{spec.name}.count", f"{spec.name}.sum"],
        )
    return [spec.prometheus], [spec.signoz]


def metrics_markdown() -> str:
    """``docs/metrics.md``: every metric with unit, buckets, labels and backend names."""
    closed_values = {
        KAOS_OUTCOME: [o.value for o in Outcome],
        KAOS_MEMORY_TIER: [t.value for t in MemoryTier],
        KAOS_REQUEST_ORIGIN: [o.value for o in RequestOrigin],
        KAOS_MEMORY_OPERATION: [*MEMORY_OPERATIONS, MEMORY_OPERATION_OTHER],
        KAOS_MEMORY_SCOPE: [*(s.value for s in MemoryScope), MEMORY_SCOPE_NONE],
        GEN_AI_OPERATION_NAME: ["chat"],
        GEN_AI_TOKEN_TYPE: ["input", "output"],
        KAOS_TELEMETRY_SIGNAL: list(TELEMETRY_SIGNALS),
        KAOS_TELEMETRY_REASON: list(TELEMETRY_DROP_REASONS),
    }
    lines = [
        "# Metrics",
        "",
        "<!-- Generated from kaos_otel/catalog.py by",
        "     `kaos-otel catalog --markdown > docs/metrics.md`;",
        "     tests/test_catalog.py fails when this file and the catalog differ. -->",
        "",
        "Every metric kaos-otel records. The names, units, buckets and label keys below are enforced:",
        "`tests/test_metrics_contract.py` checks them at an OTLP receiver and `tests/test_prometheus.py`",
        "checks the Prometheus names against a real Prometheus.",
        "",
        "## Units and buckets",
        "",
        "- Durations are in **seconds** (unit `s`), as the OpenTelemetry semantic conventions",
        "  recommend; counts use curly-brace annotations (`{request}`, `{token}`...).",
        "- Every histogram has explicit bucket boundaries (SigNoz drops exponential histograms), also",
        "  when `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION` asks for exponential ones.",
        f"- kaos duration histograms span 5 ms to 10 minutes: {_numbers(DURATION_BUCKETS_S)}.",
        "- The GenAI client metrics use the buckets the convention prescribes:",
        f"  `{GEN_AI_CLIENT_OPERATION_DURATION}` and `{GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK}`",
        f"  {_numbers(GEN_AI_DURATION_BUCKETS_S)};",
        f"  `{GEN_AI_CLIENT_TOKEN_USAGE}` {_numbers(GEN_AI_TOKEN_BUCKETS)}.",
        f"- Steps per request: {_numbers(STEP_BUCKETS)}.",
        f"- Short-term window tokens: {_numbers(WINDOW_TOKEN_BUCKETS)}.",
        "",
        "## Labels",
        "",
        "- Each metric has an allow-list of label keys (below), enforced by SDK Views",
        "  (`kaos_otel.metric_views()`): any other attribute never reaches a metric. Ids stay on",
        f"  spans and logs only: {_code(sorted(HIGH_CARDINALITY_KEYS))}.",
        f"- Names that can come from model output ({_code(_BOUNDED_NAME_KEYS)}) are bounded: names",
        "  registered with `register_known_names` are kept (all of them), any other becomes",
        f"  `{OVERFLOW_VALUE}`; without registered names the first {LABEL_VALUE_CAP} distinct values",
        f"  of a key are kept and later ones become `{OVERFLOW_VALUE}`, for the life of the process",
        "  (an `error.type` first seen after 50 others stays `_other` until a restart; declare",
        "  such names with `otel.metrics.bounds.register(key, names)`).",
        f"- {_code(sorted(OPTIONAL_METRIC_LABELS))} is present only on failed calls.",
        "- *Max label sets* is the product of each key's bound (its closed set of values, or",
        f"  {LABEL_VALUE_CAP} plus `{OVERFLOW_VALUE}`, or the names registered plus `{OVERFLOW_VALUE}`, plus",
        "  one where a key may be absent).",
        "- Metrics of other libraries recorded on the manager's meter provider are not exported,",
        "  including another library's instrument that shares a catalog name (its values are not",
        "  bounded and it would count calls twice): the manager's `CatalogMeterProvider` hands them a",
        "  no-op meter, and only kaos-otel's own meters (`kaos_otel` and its instrumentations) reach",
        "  the SDK. On a meter provider you build yourself, `metric_views()` drops them with a View.",
        "  With `export_other_metrics=True`, and under `opentelemetry-instrument` (the kaos-otel",
        "  distro), they are exported as a plain SDK exports them, each in its own scope",
        "  (`otel_scope_name` in Prometheus): another GenAI instrumentation of the model client",
        "  then counts each call a second time, under its scope; use one or the other.",
        "",
        "Outcomes (`kaos.outcome`):",
        "",
        *(f"- `{outcome.value}`: {meaning}" for outcome, meaning in _OUTCOME_MEANINGS.items()),
        "",
        "## Names in backends",
        "",
        "- **Prometheus** (the collector's `prometheus` exporter and the SDK's `PrometheusMetricReader`",
        "  agree): dots become underscores, the unit is appended (`s` -> `_seconds`; annotations",
        "  such as `{token}` are dropped), counters end in `_total`, histograms are",
        "  `_bucket` (label `le`), `_count` and `_sum`. Through the collector, `job` is `service.name`",
        "  and `instance` is `service.instance.id`, a new value each time a process starts (the series",
        "  of a restarted agent are new series; `sum by` without `instance`, as the dashboards and alert",
        "  rules do, keeps them together); the exporter",
        "  adds `otel_scope_name` / `otel_scope_version`, and resource attributes go to `target_info`.",
        "- **SigNoz** keeps the OpenTelemetry names and label keys as they are; a histogram `x` is",
        "  queried as `x.bucket` (label `le`), `x.count` and `x.sum` (also `x.min`, `x.max`).",
        "",
        "## Metrics",
        "",
        "| Metric | Instrument | Unit | Label keys | Max label sets | Prometheus | SigNoz | Description |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for spec in METRICS:
        prometheus, signoz = _series(spec)
        buckets = f" ({len(spec.buckets)} buckets)" if spec.buckets else ""
        lines.append(
            f"| `{spec.name}` | {spec.instrument}{buckets} | `{spec.unit}` | {_code(spec.attributes)} "
            f"| {spec.max_label_sets} | {_code(prometheus)} | {_code(signoz)} | {spec.description} |"
        )
    lines += [
        "",
        "## Label keys",
        "",
        "| Key | Prometheus label | Values |",
        "|---|---|---|",
    ]
    keys = dict.fromkeys(key for spec in METRICS for key in spec.attributes)
    for key in keys:
        if key in closed_values:
            values = _code(closed_values[key])
        elif key in _BOUNDED_NAME_KEYS:
            values = f"registered names or the first {LABEL_VALUE_CAP}, then `{OVERFLOW_VALUE}`"
        else:
            values = "-"
        lines.append(f"| `{key}` | `{prometheus_label(key)}` | {values} |")
    return "\n".join(lines) + "\n"
