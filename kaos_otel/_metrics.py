"""Metric instruments from the catalog, their Views, and label bounds.

The label contract is enforced twice: the recording methods only ever pass a metric's allowed
keys, and the SDK Views built from the catalog drop any other attribute. Values that can come
from model output (agent, tool, model, delegation target names) pass through
:class:`LabelBounds` first.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider, NoOpMeter
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.view import DropAggregation, ExplicitBucketHistogramAggregation, View
from opentelemetry.util.types import Attributes

from kaos_otel import catalog
from kaos_otel._config import name_set
from kaos_otel._internal_log import ForkSafeLock, internal_error, log_once
from kaos_otel._secrets import Redactor, default_redactor
from kaos_otel._spans import ERROR_OUTCOMES, OUTCOME_VALUE
from kaos_otel.catalog import MemoryScope, MemoryTier, Outcome, RequestOrigin
from kaos_otel.exporters.health import TelemetryHealth

METER_NAME = "kaos_otel"
_ORIGIN_VALUE: dict[RequestOrigin, str] = {member: member.value for member in RequestOrigin}
"""Each origin's value (as :data:`~kaos_otel._spans.OUTCOME_VALUE`: cheaper than ``value``)."""


MEM0_METER_NAME = "kaos_otel.instrumentation.mem0"
"""The meter (and tracer) of the Mem0 instrumentor."""
KAOS_METER_NAMES = (METER_NAME, MEM0_METER_NAME)
"""The meters kaos-otel records on: its own and its instrumentations'."""


def metric_views(*, drop_unlisted: bool = True) -> list[View]:
    """One View per catalog metric and kaos-otel meter (allowed label keys, explicit buckets).

    The catalog's Views match only kaos-otel's own meters (:data:`KAOS_METER_NAMES`). With
    ``drop_unlisted`` a last View drops every other instrument's stream, including another
    library's instrument that shares a catalog name (such as an instrumentation's
    ``gen_ai.client.operation.duration``): its label values are not bounded and it would count
    the same calls twice. Views can only select, never exclude, so that View matches kaos-otel's
    instruments as well and the SDK aggregates each of their records a second time (into
    nothing): about 1.4x the cost of a record. The manager's own provider avoids that with
    :class:`CatalogMeterProvider` instead. Only the Views' public arguments are used.
    """
    views: list[View] = [
        View(
            instrument_name=spec.name,
            meter_name=meter_name,
            attribute_keys=set(spec.attributes),
            aggregation=ExplicitBucketHistogramAggregation(list(spec.buckets)) if spec.buckets else None,
        )
        for spec in catalog.METRICS
        for meter_name in KAOS_METER_NAMES
    ]
    if drop_unlisted:
        views.append(View(instrument_name="*", aggregation=DropAggregation()))
    return views


SDK_METER_NAME = "opentelemetry-sdk"
"""The meter the OpenTelemetry SDK records metrics about itself on (live spans, queued items)."""


class CatalogMeterProvider(MeterProvider):
    """The meter provider a manager hands out: kaos-otel's meters, and no one else's by default.

    Meters named in :data:`KAOS_METER_NAMES` come from ``provider`` (an SDK provider built with
    ``metric_views(drop_unlisted=False)``); any other library's meter is a no-op, so its
    instruments, label values unbounded, never reach an export, and a convention metric of a
    catalog name recorded by another instrumentation is not counted twice. This is what
    ``drop_unlisted`` does with a View, without a second aggregation of every kaos-otel record.
    With ``other_meters=True`` (the ``opentelemetry-instrument`` distro) every other meter comes
    from ``provider`` too and exports as on a plain SDK provider.
    """

    def __init__(self, provider: SdkMeterProvider, *, other_meters: bool = False) -> None:
        self.provider = provider
        self.other_meters = other_meters

    def get_meter(
        self,
        name: str,
        version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes | None = None,
    ) -> Meter:
        """The SDK meter for kaos-otel's meters (and others with ``other_meters``), else a no-op."""
        if name in KAOS_METER_NAMES or self.other_meters:
            return self.provider.get_meter(
                name, version=version, schema_url=schema_url, attributes=attributes
            )
        if name == SDK_METER_NAME:  # the SDK's metrics about itself: not the app's to miss
            return NoOpMeter(name, version=version, schema_url=schema_url)
        log_once(
            "foreign-meter",
            "kaos-otel: meter %r records nothing: the manager's meter provider exports kaos-otel's "
            "metrics only. To export your own or other libraries' metrics too, create the manager "
            "with export_other_metrics=True, or install your own MeterProvider "
            "(views=kaos_otel.metric_views(drop_unlisted=False) keeps kaos-otel's buckets and label "
            "allow-lists) before creating it",
            name,
            level=logging.WARNING,
        )
        return NoOpMeter(name, version=version, schema_url=schema_url)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Collect and export what the SDK provider's readers hold."""
        return self.provider.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        """Shut the SDK provider down."""
        self.provider.shutdown(timeout_millis)


_NAME = re.compile(r"[\w.:/@+-]{1,128}")
"""What a name looks like (a tool, a delegation target, a provider, an error type): one word of name
characters. Anything else is free text (a model's output)."""

_NAME_OF_WORDS = re.compile(r"[\w.:/@+-]+(?: [\w.:/@+-]+){0,5}")
"""What an agent's or a model's name looks like, up to 128 characters: words of name characters,
at most six, one space apart ("Research Assistant", "Llama 3 70B Instruct"). Your code names
those; a model's output names tools and delegation targets, whose names are one word."""

_NAMED_BY_CODE = {catalog.GEN_AI_AGENT_NAME: _NAME_OF_WORDS, catalog.GEN_AI_REQUEST_MODEL: _NAME_OF_WORDS}


class LabelBounds:
    """Keeps label values from model output bounded.

    Per key: when names are registered (the tools, sub-agents and models the agents know), only
    those are kept; otherwise the first ``cap`` distinct values are. Everything else becomes
    :data:`~kaos_otel.catalog.OVERFLOW_VALUE`.
    """

    def __init__(self, cap: int = catalog.LABEL_VALUE_CAP, redactor: Redactor = default_redactor) -> None:
        self._cap = cap
        self._redactor = redactor
        self._lock = ForkSafeLock()
        self._known: dict[str, set[str]] = {}
        self._seen: dict[str, set[str]] = {}

    def register(self, key: str, names: Iterable[str]) -> None:
        """Declare names that are legitimate values of ``key``: from now on, only these (and names
        declared later) are kept; declaring an empty list closes ``key`` to every name."""
        declared = name_set(names)
        with self._lock:
            known = self._known.setdefault(key, set())
            known.update(declared)
            self._seen.setdefault(key, set()).intersection_update(known)

    def bound(self, key: str, value: object) -> str:
        """The label value (and span-name part) to record for ``value``: never free text.

        A registered name is kept whatever it looks like and however many are registered; any other
        must look like a name, and counts against the cap. A value that is not text (a model's
        ``{"name": 42}``) or that holds a secret is no name.
        """
        if not isinstance(value, str) or not value:
            return catalog.OVERFLOW_VALUE
        seen = self._seen.get(key)
        if seen is not None and value in seen:  # checked before, still allowed (see register())
            return value
        known = self._known.get(key)
        if known is not None and value not in known:
            return catalog.OVERFLOW_VALUE
        if known is None and (len(value) > 128 or not _NAMED_BY_CODE.get(key, _NAME).fullmatch(value)):
            return catalog.OVERFLOW_VALUE
        try:  # a secret: checked once per distinct value, never kept
            secret = self._redactor(value) != value
        except Exception as exc:  # the app's redactor failed: nothing it could not check is kept
            internal_error("checking a label value for secrets", exc)
            return catalog.OVERFLOW_VALUE
        if secret:
            return catalog.OVERFLOW_VALUE
        with self._lock:
            known = self._known.get(key)  # again: register() may have run since the check above
            seen = self._seen.setdefault(key, set())
            if known is not None and value not in known:
                return catalog.OVERFLOW_VALUE
            if known is None and len(seen) >= self._cap:  # the cap bounds what nobody declared
                return catalog.OVERFLOW_VALUE
            seen.add(value)
        return value


class KaosMetrics:
    """Every catalog instrument on one meter, with typed recording methods."""

    def __init__(self, meter: Meter, bounds: LabelBounds, health: TelemetryHealth | None = None) -> None:
        self.bounds = bounds
        specs = catalog.METRICS_BY_NAME

        def counter(name: str) -> Counter:
            spec = specs[name]
            return meter.create_counter(name, unit=spec.unit, description=spec.description)

        def histogram(name: str) -> Histogram:
            spec = specs[name]
            return meter.create_histogram(
                name,
                unit=spec.unit,
                description=spec.description,
                explicit_bucket_boundaries_advisory=list(spec.buckets or ()),
            )

        self._operation_duration = histogram(catalog.GEN_AI_CLIENT_OPERATION_DURATION)
        self._token_usage = histogram(catalog.GEN_AI_CLIENT_TOKEN_USAGE)
        self._time_to_first_chunk = histogram(catalog.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK)
        self._requests = counter(catalog.KAOS_REQUESTS)
        self._request_duration = histogram(catalog.KAOS_REQUEST_DURATION)
        self._request_steps = histogram(catalog.KAOS_REQUEST_STEPS)
        self._model_calls = counter(catalog.KAOS_MODEL_CALLS)
        self._model_duration = histogram(catalog.KAOS_MODEL_DURATION)
        self._tool_calls = counter(catalog.KAOS_TOOL_CALLS)
        self._tool_duration = histogram(catalog.KAOS_TOOL_DURATION)
        self._delegations = counter(catalog.KAOS_DELEGATIONS)
        self._delegation_duration = histogram(catalog.KAOS_DELEGATION_DURATION)
        self._memory_operations = counter(catalog.KAOS_MEMORY_OPERATIONS)
        self._memory_duration = histogram(catalog.KAOS_MEMORY_OPERATION_DURATION)
        self._window_tokens = histogram(catalog.KAOS_MEMORY_WINDOW_TOKENS)
        self._compactions = counter(catalog.KAOS_MEMORY_COMPACTIONS)
        self._extraction_lag = histogram(catalog.KAOS_MEMORY_EXTRACTION_LAG)
        if health is not None:
            spec = specs[catalog.KAOS_TELEMETRY_DROPPED]
            meter.create_observable_counter(
                spec.name, callbacks=[health.observe], unit=spec.unit, description=spec.description
            )

    def _agent(self, agent: str) -> str:
        return self.bounds.bound(catalog.GEN_AI_AGENT_NAME, agent)

    def record_request(
        self, agent: str, origin: RequestOrigin, outcome: Outcome, duration_s: float, steps: int | None
    ) -> None:
        """One agent request (``origin`` tells user requests from delegated and autonomous runs)."""
        labels = {
            catalog.GEN_AI_AGENT_NAME: self._agent(agent),
            catalog.KAOS_REQUEST_ORIGIN: _ORIGIN_VALUE[origin],
            catalog.KAOS_OUTCOME: OUTCOME_VALUE[outcome],
        }
        self._requests.add(1, labels)
        self._request_duration.record(duration_s, labels)
        if steps is not None:
            self._request_steps.record(steps, labels)

    def record_model_call(
        self,
        agent: str,
        model: str,
        provider: str,
        outcome: Outcome,
        duration_s: float,
        *,
        error_type: str | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        first_chunk_s: float | None = None,
    ) -> None:
        """One model call: the kaos metrics and the GenAI client metrics (the time to the first
        chunk only for a streamed answer)."""
        bounded_model = self.bounds.bound(catalog.GEN_AI_REQUEST_MODEL, model)
        labels = {
            catalog.GEN_AI_AGENT_NAME: self._agent(agent),
            catalog.GEN_AI_REQUEST_MODEL: bounded_model,
            catalog.KAOS_OUTCOME: OUTCOME_VALUE[outcome],
        }
        self._model_calls.add(1, labels)
        self._model_duration.record(duration_s, labels)
        gen_ai = {
            catalog.GEN_AI_OPERATION_NAME: "chat",
            catalog.GEN_AI_PROVIDER_NAME: self.bounds.bound(catalog.GEN_AI_PROVIDER_NAME, provider),
            catalog.GEN_AI_REQUEST_MODEL: bounded_model,
        }
        if outcome in ERROR_OUTCOMES:  # the convention: error.type on failed calls only (not degraded)
            error = self.bounds.bound(catalog.ERROR_TYPE, error_type or OUTCOME_VALUE[outcome])
            self._operation_duration.record(duration_s, {**gen_ai, catalog.ERROR_TYPE: error})
        else:
            self._operation_duration.record(duration_s, gen_ai)
        for token_type, tokens in (("input", input_tokens), ("output", output_tokens)):
            if tokens is not None:
                self._token_usage.record(tokens, {**gen_ai, catalog.GEN_AI_TOKEN_TYPE: token_type})
        if first_chunk_s is not None:
            self._time_to_first_chunk.record(first_chunk_s, gen_ai)

    def record_tool_call(self, agent: str, tool: str, outcome: Outcome, duration_s: float) -> None:
        """One tool call."""
        labels = {
            catalog.GEN_AI_AGENT_NAME: self._agent(agent),
            catalog.GEN_AI_TOOL_NAME: self.bounds.bound(catalog.GEN_AI_TOOL_NAME, tool),
            catalog.KAOS_OUTCOME: OUTCOME_VALUE[outcome],
        }
        self._tool_calls.add(1, labels)
        self._tool_duration.record(duration_s, labels)

    def record_delegation(self, agent: str, target: str, outcome: Outcome, duration_s: float) -> None:
        """One delegation to a sub-agent."""
        labels = {
            catalog.GEN_AI_AGENT_NAME: self._agent(agent),
            catalog.KAOS_DELEGATION_TARGET: self.bounds.bound(catalog.KAOS_DELEGATION_TARGET, target),
            catalog.KAOS_OUTCOME: OUTCOME_VALUE[outcome],
        }
        self._delegations.add(1, labels)
        self._delegation_duration.record(duration_s, labels)

    def record_memory_operation(
        self,
        tier: MemoryTier,
        operation: str,
        scope: MemoryScope | None,
        outcome: Outcome,
        duration_s: float,
    ) -> None:
        """One memory operation of any tier."""
        labels = {
            catalog.KAOS_MEMORY_TIER: tier.value,
            catalog.KAOS_MEMORY_OPERATION: (
                operation if operation in catalog.MEMORY_OPERATIONS else catalog.MEMORY_OPERATION_OTHER
            ),
            catalog.KAOS_MEMORY_SCOPE: scope.value if scope is not None else catalog.MEMORY_SCOPE_NONE,
            catalog.KAOS_OUTCOME: OUTCOME_VALUE[outcome],
        }
        self._memory_operations.add(1, labels)
        self._memory_duration.record(duration_s, labels)

    def record_window_tokens(self, agent: str, tokens: int) -> None:
        """The short-term window size after a turn."""
        self._window_tokens.record(tokens, {catalog.GEN_AI_AGENT_NAME: self._agent(agent)})

    def record_compaction(self, agent: str, outcome: Outcome) -> None:
        """One short-term window compaction."""
        self._compactions.add(
            1, {catalog.GEN_AI_AGENT_NAME: self._agent(agent), catalog.KAOS_OUTCOME: outcome.value}
        )

    def record_extraction_lag(self, agent: str, lag_s: float, outcome: Outcome) -> None:
        """Delay from compaction to long-term extraction finishing."""
        self._extraction_lag.record(
            lag_s, {catalog.GEN_AI_AGENT_NAME: self._agent(agent), catalog.KAOS_OUTCOME: outcome.value}
        )
