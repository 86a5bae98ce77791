"""Telemetry health: counts of telemetry the pipeline dropped or failed to export."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Literal

from opentelemetry.metrics import CallbackOptions, Observation

from kaos_otel import catalog
from kaos_otel._internal_log import ForkSafeLock

Signal = Literal["traces", "metrics", "logs"]
"""A signal (the values of :data:`kaos_otel.catalog.TELEMETRY_SIGNALS`, as a type)."""
DropReason = Literal["queue_full", "export_failed", "shutdown"]
"""Why items were lost (:data:`kaos_otel.catalog.TELEMETRY_DROP_REASONS`, as a type)."""


class TelemetryHealth:
    """Thread-safe loss counters, reported as the ``kaos.telemetry.dropped`` metric."""

    def __init__(self) -> None:
        self._lock = ForkSafeLock()  # a child forked while a request thread counted a drop
        self._counts: Counter[tuple[str, str]] = Counter()

    def record_drop(self, signal: Signal, reason: DropReason, count: int = 1) -> None:
        """Count ``count`` items of ``signal`` lost for ``reason``."""
        if count <= 0:
            return
        with self._lock:
            self._counts[(signal, reason)] += count

    def dropped(self, signal: Signal | None = None) -> int:
        """Items lost so far, for one signal or all."""
        with self._lock:
            return sum(n for (sig, _), n in self._counts.items() if signal is None or sig == signal)

    def snapshot(self) -> dict[tuple[str, str], int]:
        """Every (signal, reason) count."""
        with self._lock:
            return dict(self._counts)

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        """Observable-counter callback: every (signal, reason), 0 included, so "nothing lost" shows."""
        counts = self.snapshot()
        return [
            Observation(
                counts.get((signal, reason), 0),
                {catalog.KAOS_TELEMETRY_SIGNAL: signal, catalog.KAOS_TELEMETRY_REASON: reason},
            )
            for signal in catalog.TELEMETRY_SIGNALS
            for reason in catalog.TELEMETRY_DROP_REASONS
        ]
