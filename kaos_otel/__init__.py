"""kaos-otel: OpenTelemetry for multi-agent AI systems.

The public surface: :class:`KaosOtelManager` (spans in three styles, agent-domain helpers,
metrics, logs, a bounded export pipeline), the span handle types, outcomes and settings.
Names of everything emitted live in :mod:`kaos_otel.catalog`.
"""

from kaos_otel._config import ContentCapture, OtlpProtocol, TelemetrySettings, TrustPolicy
from kaos_otel._content import ContentPolicy, default_redactor
from kaos_otel._logs import TraceContextFilter, console_handler
from kaos_otel._manager import KaosOtelManager, configure
from kaos_otel._metrics import CatalogMeterProvider, KaosMetrics, LabelBounds, metric_views
from kaos_otel._pipeline import ExportPipeline
from kaos_otel._spans import SpanHandle, SpanScope
from kaos_otel._telemetry import AgentRun, AgentTelemetry, MemoryOperation, ModelCall
from kaos_otel._trace_tree import render_trace_trees
from kaos_otel.catalog import MemoryScope, MemoryTier, Outcome, RequestOrigin
from kaos_otel.context import (
    create_background_task,
    run_in_executor_in_context,
    submit_in_context,
    wrap_in_context,
)
from kaos_otel.exporters import BatchSettings, TelemetryHealth, sanitized_exporter

__all__ = [
    "AgentRun",
    "AgentTelemetry",
    "BatchSettings",
    "CatalogMeterProvider",
    "ContentCapture",
    "ContentPolicy",
    "ExportPipeline",
    "KaosMetrics",
    "KaosOtelManager",
    "LabelBounds",
    "MemoryOperation",
    "MemoryScope",
    "MemoryTier",
    "ModelCall",
    "OtlpProtocol",
    "Outcome",
    "RequestOrigin",
    "SpanHandle",
    "SpanScope",
    "TelemetryHealth",
    "TelemetrySettings",
    "TraceContextFilter",
    "TrustPolicy",
    "configure",
    "console_handler",
    "create_background_task",
    "default_redactor",
    "metric_views",
    "render_trace_trees",
    "run_in_executor_in_context",
    "sanitized_exporter",
    "submit_in_context",
    "wrap_in_context",
]
