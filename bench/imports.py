"""Import time: ``import kaos_otel`` against ``import opentelemetry.sdk.trace``, in fresh interpreters."""

from __future__ import annotations

import statistics
import subprocess
import sys
from typing import Any

_TIMED = "import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"


def _import_s(module: str) -> float:
    result = subprocess.run(
        [sys.executable, "-c", _TIMED.format(module=module)], capture_output=True, text=True, check=True
    )
    return float(result.stdout.strip())


def import_time(rounds: int) -> dict[str, Any]:
    """Median seconds of each import over ``rounds`` alternating fresh interpreters, and their ratio.

    ``kaos_otel`` imports the SDK itself, so the ratio includes the SDK's own import.
    """
    kaos: list[float] = []
    sdk: list[float] = []
    for index in range(rounds):
        pair = (
            ("kaos_otel", "opentelemetry.sdk.trace")
            if index % 2 == 0
            else ("opentelemetry.sdk.trace", "kaos_otel")
        )
        for module in pair:
            (kaos if module == "kaos_otel" else sdk).append(_import_s(module))
    return {
        "rounds": rounds,
        "kaos_otel_ms": round(statistics.median(kaos) * 1000, 1),
        "opentelemetry_sdk_trace_ms": round(statistics.median(sdk) * 1000, 1),
        "ratio": round(statistics.median(k / s for k, s in zip(kaos, sdk, strict=True)), 3),
    }
