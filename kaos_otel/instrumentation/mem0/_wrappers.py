"""The wrappers around ``Memory`` and ``AsyncMemory`` methods: one memory span per call.

Each call becomes a ``gen_ai.memory.client`` span begun in the caller's context through
:meth:`~kaos_otel.AgentTelemetry.memory_operation`, which also records the memory metrics with
the long-term tier. Ids (user, agent, run, memory) go on the span only; query text, memory text
and metadata only with content capture on. A failure inside the instrumentation is logged and
the call proceeds untraced; a failure of mem0 ends the span as an error and is re-raised as is.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from kaos_otel import catalog
from kaos_otel._internal_log import internal_error
from kaos_otel._telemetry import AgentTelemetry, MemoryOperation
from kaos_otel.catalog import MemoryScope, MemoryTier
from kaos_otel.instrumentation.mem0._components import IN_OPERATION, ComponentTracer

PROVIDER = "mem0"

Bound = Mapping[str, Any]
Records = Callable[[Bound, object], list[Any] | None]
Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]

# mem0 id argument -> span attribute and scope. The narrowest id present sets the scope actually
# read: run_id (session) < agent_id (agent; with or without user_id) < user_id (user) < none (store).
_SCOPE_IDS: tuple[tuple[str, str, MemoryScope], ...] = (
    ("run_id", catalog.SESSION_ID, MemoryScope.SESSION),
    ("agent_id", catalog.GEN_AI_AGENT_ID, MemoryScope.AGENT),
    ("user_id", catalog.USER_ID, MemoryScope.USER),
)


def _result_records(bound: Bound, result: object) -> list[Any] | None:
    """Records of a ``{"results": [...]}`` or list result."""
    records = result.get("results") if isinstance(result, Mapping) else result
    return list(records) if isinstance(records, list) else None


def _found_record(bound: Bound, result: object) -> list[Any]:
    """The record ``get`` found (none if it returned ``None``)."""
    return [result] if result else []


def _updated_record(bound: Bound, result: object) -> list[Any]:
    """The record ``update`` wrote: its id, new text and metadata."""
    record = {
        "id": bound.get("memory_id"),
        "memory": bound.get("text") or bound.get("data"),
        "metadata": bound.get("metadata"),
    }
    return [{key: value for key, value in record.items() if value is not None}]


def _deleted_record(bound: Bound, result: object) -> list[Any]:
    """The record ``delete`` removed."""
    return [{"id": bound.get("memory_id")}]


@dataclass(frozen=True, slots=True)
class Method:
    """One covered Mem0 method and how its calls are recorded."""

    name: str
    operation: str
    params: tuple[str, ...]
    """Names of the positional parameters after ``self``."""
    records: Records | None
    """The records a call returned or affected (their count and, with capture on, content)."""


METHODS: tuple[Method, ...] = (
    Method("add", "create_memory", ("messages",), _result_records),
    Method("search", "search_memory", ("query",), _result_records),
    Method("get", "get_memory", ("memory_id",), _found_record),
    Method("get_all", "list_memory", (), _result_records),
    Method("update", "update_memory", ("memory_id", "text", "metadata"), _updated_record),
    Method("delete", "delete_memory", ("memory_id",), _deleted_record),
    Method("delete_all", "delete_memory", ("user_id", "agent_id", "run_id"), None),
    Method("history", "memory_history", ("memory_id",), _result_records),
    Method("reset", "delete_memory_store", (), None),
)


def _entity_id(value: object) -> str | None:
    """An id the way mem0 normalizes it (ints become strings, whitespace trimmed)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value).strip() or None


def _memory_record(raw: object) -> dict[str, Any] | None:
    """A mem0 record or history entry as a GenAI ``MemoryRecord`` (``content``, and ``id``,
    ``metadata`` and ``score`` where mem0 gave them); ``None`` when it holds no content."""
    if not isinstance(raw, Mapping):
        return None
    content = raw.get("memory", raw.get("new_memory"))
    if content is None:
        return None
    record: dict[str, Any] = {"content": content}
    record_id = _entity_id(raw.get("memory_id") or raw.get("id"))  # a history entry's memory
    if record_id is not None:
        record["id"] = record_id
    if isinstance(raw.get("metadata"), Mapping):
        record["metadata"] = raw["metadata"]
    score = raw.get("score")
    if isinstance(score, int | float) and not isinstance(score, bool):
        record["score"] = score
    return record


def scope_and_ids(bound: Bound) -> tuple[MemoryScope, dict[str, str]]:
    """The scope a call was made at and its ids as span attributes, from arguments and ``filters``
    (where mem0 reads ``"*"`` as any value: no id)."""
    filters = bound.get("filters")
    sources = (bound, filters) if isinstance(filters, Mapping) else (bound,)
    scope = MemoryScope.STORE
    ids: dict[str, str] = {}
    for key, attribute, key_scope in _SCOPE_IDS:
        value = next(
            (found for source in sources if (found := _entity_id(source.get(key))) not in (None, "*")), None
        )
        if value is not None:
            ids[attribute] = value
            if scope is MemoryScope.STORE:
                scope = key_scope
    return scope, ids


class Mem0Tracing:
    """Builds the wrappers for one ``instrument()`` call."""

    def __init__(self, telemetry: AgentTelemetry, *, child_spans: bool = False) -> None:
        self._telemetry = telemetry
        self._components = ComponentTracer(telemetry) if child_spans else None
        self._closed = False

    def wrapper(self, method: Method, original: Callable[..., Any]) -> Wrapper:
        """A ``wrapt`` wrapper for ``original`` (a coroutine function gets an async wrapper)."""
        if inspect.iscoroutinefunction(original):
            return self._async_wrapper(method)
        return self._sync_wrapper(method)

    def close(self) -> None:
        """Stop tracing (a method bound before ``uninstrument()`` then runs untraced) and remove the
        child-span proxies from every memory instance."""
        self._closed = True
        if self._components is not None:
            self._components.uninstall()

    def _sync_wrapper(self, method: Method) -> Wrapper:
        def wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            started = self._start(method, instance, args, kwargs)
            if started is None:
                return wrapped(*args, **kwargs)
            handle, bound = started
            token = IN_OPERATION.set(True)
            try:
                with handle:
                    result = wrapped(*args, **kwargs)
                    self._finish(handle, method, bound, result)
            finally:
                IN_OPERATION.reset(token)
            return result

        return wrapper

    def _async_wrapper(self, method: Method) -> Wrapper:
        async def wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            started = self._start(method, instance, args, kwargs)
            if started is None:
                return await wrapped(*args, **kwargs)
            handle, bound = started
            token = IN_OPERATION.set(True)
            try:
                with handle:
                    result = await wrapped(*args, **kwargs)
                    self._finish(handle, method, bound, result)
            finally:
                IN_OPERATION.reset(token)
            return result

        return wrapper

    def _start(
        self, method: Method, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[MemoryOperation, Bound] | None:
        """Begin the span (current until it ends); ``None`` when suppressed or on an internal error."""
        if self._closed or not is_instrumentation_enabled():
            return None
        try:
            bound = {**dict(zip(method.params, args, strict=False)), **kwargs}
            scope, ids = scope_and_ids(bound)
            attributes: dict[str, object] = dict(ids)
            memory_id = _entity_id(bound.get("memory_id"))
            store_id = getattr(instance, "collection_name", None)
            if method.name == "add":
                attributes[catalog.KAOS_MEMORY_INFER] = bool(bound.get("infer", True))
            if self._components is not None:
                self._components.install(instance)
            handle = self._telemetry.memory_operation(
                MemoryTier.LONG_TERM,
                method.operation,
                scope=scope,
                store_id=store_id if isinstance(store_id, str) else None,
                record_id=memory_id,
                provider=PROVIDER,
                attributes=attributes,
            )
        except Exception as exc:
            internal_error("starting a Mem0 span", exc)
            return None
        handle.set_content(catalog.GEN_AI_MEMORY_QUERY_TEXT, bound.get("query"))
        return handle, bound

    def _finish(self, handle: MemoryOperation, method: Method, bound: Bound, result: object) -> None:
        """Record count, created record id and (with capture on) content of a successful call."""
        if method.records is None or not handle.span.is_recording():
            return
        try:
            records = method.records(bound, result)
            if records is None:
                return
            handle.set_record_count(len(records))
            if method.name == "add" and len(records) == 1 and isinstance(records[0], Mapping):
                handle.set_attribute(catalog.GEN_AI_MEMORY_RECORD_ID, _entity_id(records[0].get("id")))
            if self._telemetry.content_policy.capture_on_spans:  # as JSON text, capped as it is walked
                converted = [record for record in map(_memory_record, records) if record is not None]
                handle.set_content(catalog.GEN_AI_MEMORY_RECORDS, converted or None)
        except Exception as exc:
            internal_error("recording a Mem0 result", exc)
