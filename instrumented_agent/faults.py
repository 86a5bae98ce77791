"""Faults the live demo switches on and off mid-run, so dashboards and alerts show real failures.

``kaos-agent demo --duration ... --fault NAME[@START[-END]]`` writes the set of active faults to
one small JSON file and hands its path to every service in :data:`ENV_FAULTS_FILE`; each service
re-reads it when it changes. Without that variable nothing here is active (production path).

- ``memory-latency``: one memory backend call in two takes :data:`MEMORY_LATENCY_S` longer.
- ``memory-errors``: one memory backend call in two fails (a relational operation ends
  ``degraded``; a long-term one fails in Mem0's vector store, so Mem0's span ends ``error``).
- ``model-errors``: one model call in two is an HTTP 500 from the scripted model.
- ``model-latency``: every model reply takes :data:`MODEL_LATENCY_S` longer.
- ``subagent-down``: agent :data:`DOWN_AGENT` stops answering (its callers' delegations time out).
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

__all__ = [
    "DOWN_AGENT",
    "ENV_FAULTS_FILE",
    "MEMORY_LATENCY_S",
    "MODEL_LATENCY_S",
    "Fault",
    "FaultSwitch",
    "InjectedFaultError",
    "ScheduledFault",
    "parse_fault",
]

ENV_FAULTS_FILE = "KAOS_DEMO_FAULTS_FILE"
MEMORY_LATENCY_S = 3.0
"""Above the memory-latency alert's 2.5 s p95 threshold."""
MODEL_LATENCY_S = 1.5
DOWN_AGENT = "researcher"
T = TypeVar("T")


class Fault(StrEnum):
    """A fault the live demo can inject."""

    MEMORY_LATENCY = "memory-latency"
    MEMORY_ERRORS = "memory-errors"
    MODEL_ERRORS = "model-errors"
    MODEL_LATENCY = "model-latency"
    SUBAGENT_DOWN = "subagent-down"


class InjectedFaultError(ConnectionError):
    """A failure the demo injected (``memory-errors``)."""


@dataclass(frozen=True)
class ScheduledFault:
    """A fault on from ``start_s`` to ``end_s`` (``None``: the end of the run) seconds into the run."""

    fault: Fault
    start_s: float
    end_s: float | None = None

    def on_at(self, elapsed_s: float) -> bool:
        """Whether the fault is on ``elapsed_s`` seconds into the run."""
        return self.start_s <= elapsed_s and (self.end_s is None or elapsed_s < self.end_s)

    def __str__(self) -> str:
        end = "" if self.end_s is None else f"-{self.end_s:g}"
        return f"{self.fault.value}@{self.start_s:g}{end}"


def parse_fault(text: str, default_start_s: float) -> ScheduledFault:
    """``NAME``, ``NAME@START`` or ``NAME@START-END`` (seconds into the run); ``ValueError`` if bad."""
    name, _, when = text.partition("@")
    try:
        fault = Fault(name.strip())
    except ValueError:
        known = ", ".join(f.value for f in Fault)
        raise ValueError(f"unknown fault {name!r} (known: {known})") from None
    if not when:
        return ScheduledFault(fault, default_start_s)
    start, _, end = when.partition("-")
    try:
        scheduled = ScheduledFault(fault, float(start), float(end) if end else None)
    except ValueError:
        raise ValueError(f"malformed fault time {when!r} (expected START or START-END in seconds)") from None
    start_s, end_s = scheduled.start_s, scheduled.end_s
    if not (0 <= start_s < math.inf) or (end_s is not None and not start_s < end_s < math.inf):
        raise ValueError(f"fault {text!r}: START must be >= 0 and END after START (finite seconds)")
    return scheduled


class FaultSwitch:
    """The active faults, shared through a JSON file (the demo writes it, services read it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._active: frozenset[Fault] = frozenset()
        self._draws = random.Random(0)  # a fixed seed: the same draws in every run

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> FaultSwitch | None:
        """The switch named by :data:`ENV_FAULTS_FILE`, or ``None`` (no fault injection)."""
        path = environ.get(ENV_FAULTS_FILE)
        return cls(Path(path)) if path else None

    def write(self, faults: Iterable[Fault]) -> None:
        """Make ``faults`` the active set (atomic replace, so readers never see half a file)."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(f.value for f in faults)))
        tmp.replace(self.path)

    def active(self) -> frozenset[Fault]:
        """The faults on now (re-read when the file changed; none if it is missing or unreadable)."""
        try:
            stat = self.path.stat()
        except OSError:
            return frozenset()
        seen = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if seen != self._seen:
                try:
                    values = json.loads(self.path.read_text())
                    self._active = frozenset(Fault(v) for v in values if v in set(Fault))
                except (OSError, ValueError, TypeError):
                    self._active = frozenset()
                self._seen = seen
            return self._active

    def is_on(self, fault: Fault) -> bool:
        """Whether ``fault`` is on now."""
        return fault in self.active()

    def memory_call(self, call: Callable[[], T]) -> T:
        """``call()`` (a memory backend call) slowed or failed by the memory faults that are on,
        one call in two."""
        active = self.active()
        if Fault.MEMORY_LATENCY in active and self.one_in(2):
            time.sleep(MEMORY_LATENCY_S)
        if Fault.MEMORY_ERRORS in active and self.one_in(2):
            raise InjectedFaultError("memory backend unavailable (injected by the demo)")
        return call()

    def one_in(self, n: int) -> bool:
        """True for about one call in ``n``: drawn, not counted, so that a request making a fixed
        number of calls does not fail at the same ones every time (every memory tier fails)."""
        return self._draws.randrange(n) == 0
