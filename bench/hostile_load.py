"""Hostile load against a reference agent with memory: does it stay bounded and answer ``/health``?

``python -m bench.hostile_load --duration 600`` starts the scripted model, the echo MCP server and
one agent with memory (SQLite), then runs hostile clients side by side for the duration: 50 MB
bodies, bodies streamed without a length, the largest accepted messages without spaces, too many
messages, lone surrogates, tool calls with the largest accepted text, anonymous and verified
callers in fresh sessions writing memory, forged sessions, deletes. Every few seconds it samples
the agent's resident memory (``VmRSS``), the database's size on disk and whether ``/health``
answers. It prints one JSON report (maxima, status counts, health failures).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from instrumented_agent.config import SESSION_ID_HEADER, USER_ID_HEADER
from instrumented_agent.limits import MAX_MESSAGE_CHARS, MAX_MESSAGES
from instrumented_agent.supervisor import ServiceSpec, Supervisor
from instrumented_agent.system import agent_spec

__all__ = ["HostileReport", "main", "run_hostile_load"]

_SAMPLE_EVERY_S = 2.0


@dataclass
class HostileReport:
    """What the load did and the maxima it reached."""

    duration_s: float
    requests: int = 0
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    max_rss_bytes: int = 0
    max_database_bytes: int = 0
    health_checks: int = 0
    health_failures: int = 0
    max_health_latency_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values."""
        return {
            "duration_s": round(self.duration_s, 1),
            "requests": self.requests,
            "statuses": dict(sorted(self.statuses.items())),
            "max_rss_mib": round(self.max_rss_bytes / 2**20, 1),
            "max_database_mib": round(self.max_database_bytes / 2**20, 2),
            "health_checks": self.health_checks,
            "health_failures": self.health_failures,
            "max_health_latency_s": round(self.max_health_latency_s, 2),
        }


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _database_bytes(database: Path) -> int:
    """The database file and its journal or WAL (which come and go while it is sampled)."""
    total = 0
    for path in database.parent.glob(database.name + "*"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            continue
    return total


def _chat(messages: list[dict[str, str]]) -> bytes:
    return json.dumps({"model": "any", "messages": messages}).encode()


def _attacks(rng: random.Random) -> list[tuple[str, bytes | None, dict[str, str]]]:
    """(kind, body, headers) of one round of hostile requests (``None`` body: a streamed 50 MB)."""
    spaceless = "x" * (MAX_MESSAGE_CHARS - 10)
    user = {USER_ID_HEADER: f"user-{rng.randrange(1000)}", SESSION_ID_HEADER: uuid.uuid4().hex}
    return [
        ("huge-declared", b"{" + b" " * (50 << 20) + b"}", {}),
        ("huge-streamed", None, {}),
        ("largest-spaceless", _chat([{"role": "user", "content": spaceless}]), user),
        ("too-many", _chat([{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1)), {}),
        ("surrogate", b'{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}', {}),
        ("anonymous-write", _chat([{"role": "user", "content": "Look up " + "y" * 4000}]), {}),
        (
            "forged-session",
            _chat([{"role": "user", "content": "What do you remember?"}]),
            {SESSION_ID_HEADER: "s1"},
        ),
        ("verified-write", _chat([{"role": "user", "content": "Look up " + "z " * 3000}]), user),
    ]


async def _streamed_50mb() -> Any:
    chunk = b" " * (1 << 20)
    yield b"{"
    for _ in range(50):
        yield chunk
    yield b"}"


async def _client(url: str, report: HostileReport, deadline: float, seed: int) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        first_round = True  # every kind of attack is sent at least once, however short the run
        while first_round or time.monotonic() < deadline:
            first_round = False
            for kind, body, headers in _attacks(rng):
                content = _streamed_50mb() if body is None else body
                try:
                    response = await client.post(
                        f"{url}/v1/chat/completions",
                        content=content,
                        headers={"content-type": "application/json", **headers},
                    )
                    status = str(response.status_code)
                    if kind == "verified-write" and rng.random() < 0.2:
                        await client.request("DELETE", f"{url}/v1/memory", headers=headers)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                report.requests += 1
                report.statuses[f"{kind} {status}"] += 1


def _sampler(
    url: str, pid: int, database: Path, report: HostileReport, deadline: float, clients_done: threading.Event
) -> None:
    """Samples on its own thread and client, so that the load's own work never delays a health check."""
    with httpx.Client(timeout=10, trust_env=False) as client:
        while True:
            report.max_rss_bytes = max(report.max_rss_bytes, _rss_bytes(pid))
            report.max_database_bytes = max(report.max_database_bytes, _database_bytes(database))
            report.health_checks += 1
            started = time.monotonic()
            try:
                if client.get(f"{url}/health").status_code != 200:
                    report.health_failures += 1
            except httpx.HTTPError:
                report.health_failures += 1
            report.max_health_latency_s = max(report.max_health_latency_s, time.monotonic() - started)
            if time.monotonic() >= deadline and clients_done.is_set():
                return
            time.sleep(_SAMPLE_EVERY_S)


def run_hostile_load(duration_s: float, clients: int = 4, workdir: Path | None = None) -> HostileReport:
    """Start the agent, load it for ``duration_s`` seconds with ``clients`` hostile clients, report."""
    root = workdir or Path(tempfile.mkdtemp(prefix="kaos-hostile-"))
    database = root / "memory.db"
    report = HostileReport(duration_s)
    with Supervisor(root) as supervisor:
        model = supervisor.spawn(ServiceSpec("model", ["model"]))
        echo = supervisor.spawn(ServiceSpec("mcp-echo", ["mcp", "echo"]))
        memory = ["--memory-url", f"sqlite:///{database}", "--memory-window-tokens", "2000"]
        agent = supervisor.spawn(agent_spec("researcher", model, mcp=[echo], extra_args=memory))
        supervisor.wait_ready([model, echo, agent])

        deadline = time.monotonic() + duration_s
        done = threading.Event()
        sampler = threading.Thread(
            target=_sampler, args=(agent.url, agent.pid, database, report, deadline, done), daemon=True
        )
        sampler.start()

        async def load() -> None:
            await asyncio.gather(*(_client(agent.url, report, deadline, seed) for seed in range(clients)))

        try:
            asyncio.run(load())
        finally:
            done.set()
            sampler.join()
    return report


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--duration SECONDS --clients N``; prints the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent hostile clients (default 4)")
    args = parser.parse_args(argv)
    report = run_hostile_load(args.duration, args.clients)
    json.dump(report.as_dict(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
