"""Live traffic for ``kaos-agent demo --duration``: a steady stream of user requests, faults on a schedule.

Requests go to the coordinator at a fixed rate (concurrently, like independent users), from a few
users who keep their sessions (so memory windows grow, compact and feed long-term extraction);
one in four is streamed. Faults (:mod:`instrumented_agent.faults`) are switched on and off at
their scheduled times through the fault file every service watches.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from instrumented_agent.config import SESSION_ID_HEADER, USER_ID_HEADER
from instrumented_agent.faults import Fault, FaultSwitch, ScheduledFault
from instrumented_agent.server import TRACE_ID_HEADER

__all__ = ["LiveReport", "LiveTraffic", "describe", "run_live"]

_USERS = 3
_STREAM_EVERY = 4
_REQUEST_TIMEOUT_S = 90.0
_MAX_IN_FLIGHT = 48


@dataclass(frozen=True)
class LiveTraffic:
    """How long to send, how fast, and which faults to switch on when."""

    duration_s: float
    rate_rps: float = 1.0
    faults: tuple[ScheduledFault, ...] = ()


@dataclass
class LiveReport:
    """What the live traffic did: requests by HTTP status, fault switches, a research trace id."""

    sent: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    failed_streams: int = 0
    """Streams answered 200 whose run then failed: the error came as an event in the stream."""
    research_trace_id: str | None = None
    """The first research request answered before any fault was on (all five services in it)."""
    fault_changes: list[dict[str, Any]] = field(default_factory=list)
    """``{"at_s": seconds into the run, "active": [fault names]}`` at each switch."""

    def as_json(self) -> dict[str, Any]:
        """The report as the demo's JSON summary shows it."""
        return {
            "sent": self.sent,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "failed_streams": self.failed_streams,
            "research_trace_id": self.research_trace_id,
            "fault_changes": self.fault_changes,
        }


def _prompt(n: int) -> str:
    a, b = 30 + n % 20, 10 + n % 15
    return f"Research the AI chip market and add the market shares of the top two vendors: {a} and {b}."


def _is_error_event(line: str) -> bool:
    """Whether a server-sent event line carries an OpenAI-style error body."""
    if not line.startswith("data: {"):
        return False
    try:
        event = json.loads(line[len("data: ") :])
    except ValueError:
        return False
    return isinstance(event, dict) and "error" in event


class _Sender:
    """Sends request ``n`` and records its outcome (thread-safe)."""

    def __init__(self, coordinator_url: str, report: LiveReport) -> None:
        self._url = f"{coordinator_url}/v1/chat/completions"
        self._report = report
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=_REQUEST_TIMEOUT_S, trust_env=False)
        self._sessions = [f"demo-session-{i}-{time.time_ns()}" for i in range(_USERS)]

    def close(self) -> None:
        self._client.close()

    def send(self, n: int, faults_on: bool) -> None:
        user = n % _USERS
        headers = {USER_ID_HEADER: f"demo-user-{user}", SESSION_ID_HEADER: self._sessions[user]}
        body: dict[str, Any] = {"model": "coordinator", "messages": [{"role": "user", "content": _prompt(n)}]}
        status, trace_id, stream_failed = 0, None, False
        try:
            if n % _STREAM_EVERY == _STREAM_EVERY - 1:
                body["stream"] = True
                with self._client.stream("POST", self._url, json=body, headers=headers) as response:
                    stream_failed = any(_is_error_event(line) for line in response.iter_lines())
                    status, trace_id = response.status_code, response.headers.get(TRACE_ID_HEADER)
            else:
                response = self._client.post(self._url, json=body, headers=headers)
                status, trace_id = response.status_code, response.headers.get(TRACE_ID_HEADER)
        except httpx.HTTPError:
            status = 0  # no answer (counted as status 0)
        with self._lock:
            self._report.by_status[status] += 1
            answered = status == 200 and not stream_failed
            self._report.failed_streams += status == 200 and stream_failed
            if answered and not faults_on and self._report.research_trace_id is None:
                self._report.research_trace_id = trace_id


def run_live(
    coordinator_url: str, traffic: LiveTraffic, switch: FaultSwitch, say: Callable[[str], None]
) -> LiveReport:
    """Send requests for ``traffic.duration_s`` seconds, switching faults on schedule; then wait for all."""
    report = LiveReport()
    sender = _Sender(coordinator_url, report)
    interval = 1.0 / traffic.rate_rps
    started = time.monotonic()
    active: frozenset[Fault] = frozenset()
    switch.write(active)
    pending: list[Future[None]] = []
    pool = ThreadPoolExecutor(max_workers=_MAX_IN_FLIGHT, thread_name_prefix="demo-user")
    try:
        next_send = started
        while (elapsed := time.monotonic() - started) < traffic.duration_s:
            wanted = frozenset(f.fault for f in traffic.faults if f.on_at(elapsed))
            if wanted != active:
                active = wanted
                switch.write(active)
                names = sorted(f.value for f in active)
                report.fault_changes.append({"at_s": round(elapsed, 1), "active": names})
                say(f"  {elapsed:6.1f} s  faults on: {', '.join(names) or 'none'}")
            if time.monotonic() >= next_send:
                pending = [f for f in pending if not f.done()]
                if len(pending) < _MAX_IN_FLIGHT:
                    pending.append(pool.submit(sender.send, report.sent, bool(active)))
                    report.sent += 1
                next_send += interval
            time.sleep(max(0.0, min(0.1, next_send - time.monotonic())))
        if active:
            switch.write(())
            report.fault_changes.append({"at_s": round(time.monotonic() - started, 1), "active": []})
        say(f"  {traffic.duration_s:6.1f} s  {report.sent} requests sent; waiting for the last answers")
        pool.shutdown(wait=True)
    finally:  # on Ctrl-C: no waiting for answers (they fail once the services stop)
        pool.shutdown(wait=False, cancel_futures=True)
        switch.write(())
        sender.close()
    return report


def describe(faults: Sequence[ScheduledFault]) -> str:
    """The fault schedule in one line."""
    return ", ".join(str(f) for f in faults) or "no faults"
