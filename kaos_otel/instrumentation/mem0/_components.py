"""Opt-in child spans for the embedder, LLM and vector store a Mem0 memory uses.

With ``child_spans=True`` the instrumentor swaps a memory instance's components for proxies
when one of its covered methods is called. A proxied call becomes a CLIENT span only while a
Mem0 operation span is active in the calling context, so it is always that span's child: work
``AsyncMemory`` hands to ``asyncio.to_thread`` carries the context along, while work ``Memory``
submits to its own thread pool (entity-boost searches, which need spaCy) gets no child span
rather than an orphaned root. Uninstrumenting puts the original components back.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import wrapt
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import SpanKind

from kaos_otel import catalog
from kaos_otel._internal_log import internal_error
from kaos_otel._telemetry import AgentTelemetry

IN_OPERATION: contextvars.ContextVar[bool] = contextvars.ContextVar("kaos_otel_mem0_operation", default=False)
"""True while a Mem0 operation span is active in this context."""

# instance attribute -> component kind (also the name of its section in mem0's MemoryConfig)
_COMPONENTS: tuple[tuple[str, str], ...] = (
    ("embedding_model", "embedder"),
    ("llm", "llm"),
    ("vector_store", "vector_store"),
    ("_entity_store", "vector_store"),
)
_TRACED_METHODS: Mapping[str, frozenset[str]] = {
    "embedder": frozenset({"embed", "embed_batch"}),
    "llm": frozenset({"generate_response"}),
    "vector_store": frozenset(
        {"insert", "search", "search_batch", "keyword_search", "update", "delete", "get", "list"}
    ),
}


def _configured_provider(instance: object, kind: str, component: object) -> str | None:
    """The provider named in the memory's config, if ``component`` is the class mem0 built for it."""
    from mem0.utils import factory  # imported late: mem0 must be imported after MEM0_TELEMETRY is set

    registries: Mapping[str, Mapping[str, Any]] = {
        "embedder": factory.EmbedderFactory.provider_to_class,
        "llm": factory.LlmFactory.provider_to_class,
        "vector_store": factory.VectorStoreFactory.provider_to_class,
    }
    provider = getattr(getattr(getattr(instance, "config", None), kind, None), "provider", None)
    registered = registries[kind].get(provider) if isinstance(provider, str) else None
    path = registered[0] if isinstance(registered, tuple) else registered
    cls = type(component)
    return provider if path == f"{cls.__module__}.{cls.__qualname__}" else None


class TracedComponent(wrapt.ObjectProxy):  # type: ignore[type-arg]
    """A Mem0 component whose traced methods become child spans of the memory operation."""

    def __init__(
        self,
        wrapped: Any,
        tracer: ComponentTracer,
        telemetry: AgentTelemetry,
        kind: str,
        provider: str | None,
    ) -> None:
        super().__init__(wrapped)
        self._self_tracer = tracer
        self._self_telemetry = telemetry
        self._self_kind = kind
        self._self_provider = provider

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.__wrapped__, name)
        if name in _TRACED_METHODS.get(self._self_kind, ()) and callable(value):
            return self._self_traced(name, value)
        return value

    def _self_traced(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def traced(*args: Any, **kwargs: Any) -> Any:
            if not IN_OPERATION.get() or not is_instrumentation_enabled():
                return method(*args, **kwargs)
            try:
                span_name, attributes = self._self_describe(name)
            except Exception as exc:  # a component of the app's own whose attributes raise
                internal_error("describing a Mem0 component call", exc)
                return method(*args, **kwargs)
            with self._self_telemetry.span(span_name, SpanKind.CLIENT, attributes):
                return method(*args, **kwargs)

        return traced

    def _self_describe(self, name: str) -> tuple[str, dict[str, object]]:
        """Span name and attributes of one call (GenAI conventions for models, DB for stores)."""
        wrapped = self.__wrapped__
        if self._self_kind == "vector_store":
            collection = getattr(wrapped, "collection_name", None)
            return f"{name} {collection}" if collection else name, {
                catalog.DB_SYSTEM_NAME: self._self_provider,
                catalog.DB_OPERATION_NAME: name,
                catalog.DB_COLLECTION_NAME: collection,
            }
        operation = "embeddings" if self._self_kind == "embedder" else "chat"
        model = getattr(getattr(wrapped, "config", None), "model", None)
        model = model if isinstance(model, str) else None
        return f"{operation} {model}" if model else operation, {
            catalog.GEN_AI_OPERATION_NAME: operation,
            catalog.GEN_AI_REQUEST_MODEL: model,
            catalog.GEN_AI_PROVIDER_NAME: self._self_provider,
        }


class ComponentTracer:
    """Installs :class:`TracedComponent` proxies on memory instances and removes them all again.

    Once uninstalled it installs nothing more, and it never removes another tracer's proxies: a
    method bound while instrumented and called after ``uninstrument()``, or a later
    ``instrument()`` with another manager, cannot leave proxies that feed the wrong manager.
    """

    def __init__(self, telemetry: AgentTelemetry) -> None:
        self._telemetry = telemetry
        self._lock = threading.Lock()
        self._instances: weakref.WeakSet[Any] = weakref.WeakSet()
        self._uninstalled = False

    def install(self, instance: object) -> None:
        """Proxy the instance's components that this tracer has not proxied yet (new or reassigned
        ones, or ones an earlier tracer's proxy still wraps)."""
        attributes = vars(instance)
        with self._lock:
            if self._uninstalled:
                return
            for attribute, kind in _COMPONENTS:
                component = attributes.get(attribute)
                if component is None:
                    continue
                if type(component) is TracedComponent:
                    if component._self_tracer is self:
                        continue
                    component = component.__wrapped__
                provider = _configured_provider(instance, kind, component)
                setattr(
                    instance, attribute, TracedComponent(component, self, self._telemetry, kind, provider)
                )
                self._instances.add(instance)

    def uninstall(self) -> None:
        """Put every original component back that this tracer proxied."""
        with self._lock:
            self._uninstalled = True
            instances = list(self._instances)
            self._instances.clear()
        for instance in instances:
            attributes = vars(instance)
            for attribute, _ in _COMPONENTS:
                component = attributes.get(attribute)
                if type(component) is TracedComponent and component._self_tracer is self:
                    setattr(instance, attribute, component.__wrapped__)
