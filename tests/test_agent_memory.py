"""The reference agent's three-tier memory on SQLite and on a real PostgreSQL, and its telemetry.

Tier behaviour and scopes run against both relational backends (a private PostgreSQL cluster is
started for this module). The long-term tier runs the real mem0 offline. The last tests run agent
processes over HTTP: memory spans in the request's trace without content, and an agent whose
memory backend is down still answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import httpx
import psycopg
import pytest
from net_support import free_port

from instrumented_agent import faults
from instrumented_agent.config import MEMORY_SCOPE_HEADER, SESSION_ID_HEADER, USER_ID_HEADER
from instrumented_agent.faults import Fault, FaultSwitch
from instrumented_agent.memory import (
    LongTermMemory,
    MemoryScopeError,
    MemoryService,
    Owner,
    RelationalStore,
    Turn,
    parse_scope,
    relational,
)
from instrumented_agent.memory.relational import Compaction, Summariser, Summary, estimate_tokens
from instrumented_agent.memory.service import Recall, summarise
from instrumented_agent.server import TRACE_ID_HEADER
from instrumented_agent.supervisor import ServiceSpec, Supervisor
from instrumented_agent.system import agent_spec, otlp_env
from kaos_otel import KaosOtelManager, MemoryScope, catalog
from kaos_otel.receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.timeout(120)

PG_PACKAGE = "postgresql"
_METRIC_LABELS = {
    catalog.GEN_AI_AGENT_NAME,
    catalog.KAOS_MEMORY_TIER,
    catalog.KAOS_MEMORY_OPERATION,
    catalog.KAOS_MEMORY_SCOPE,
    catalog.KAOS_OUTCOME,
}


# --- a private PostgreSQL cluster ----------------------------------------------------------------


class PostgresCluster:
    """``initdb`` into a temporary folder and ``postgres`` on a free loopback port, as OS user postgres."""

    def __init__(self) -> None:
        binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
        if not binaries or shutil.which("runuser") is None:
            pytest.fail(
                "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin (or runuser "
                f"missing): install them with `apt-get install -y --no-install-recommends {PG_PACKAGE}`",
                pytrace=False,
            )
        self.bindir = binaries[-1].parent
        self.root = Path(tempfile.mkdtemp(prefix="kaos-pg-"))
        shutil.chown(self.root, "postgres", "postgres")
        self.data = self.root / "data"
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._as_postgres(
            "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"
        )

    def _as_postgres(self, tool: str, *args: str) -> None:
        command = ["runuser", "-u", "postgres", "--", str(self.bindir / tool), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"{tool} failed: {done.stderr}"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        )

    def start(self) -> None:
        log = (self.root / "postgres.log").open("ab")
        self._process = subprocess.Popen(
            [
                *("runuser", "-u", "postgres", "--", str(self.bindir / "postgres"), "-D", str(self.data)),
                *("-p", str(self.port), "-k", str(self.root), "-c", "listen_addresses=127.0.0.1"),
                *("-c", "fsync=off", "-c", "full_page_writes=off"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                self.connect().close()
                return
            except psycopg.OperationalError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"postgres did not start: {(self.root / 'postgres.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Fast shutdown of the postmaster (by the PID in its pid file), then of runuser."""
        if self._process is None:
            return
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGINT)
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database: a SQLite file, or a new database on the private PostgreSQL cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'memory.db'}"
    cluster: PostgresCluster = request.getfixturevalue("postgres")
    name = f"kaos_{uuid.uuid4().hex[:12]}"
    with cluster.connect() as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return cluster.url(name)


def _otel(make_otel: Callable[..., KaosOtelManager]) -> KaosOtelManager:
    return make_otel(environ={"OTEL_METRIC_EXPORT_INTERVAL": "200"})


def _memory_spans(receiver: OtlpReceiver) -> list[ReceivedSpan]:
    return [s for s in receiver.spans() if catalog.KAOS_MEMORY_TIER in s.attributes]


def _assert_no_ids_on_metrics(receiver: OtlpReceiver) -> None:
    for point in receiver.metric_points():
        if point.name.startswith("kaos.memory."):
            assert set(point.attributes) <= _METRIC_LABELS, point


# --- tiers and scopes, on both backends ----------------------------------------------------------
async def test_scopes_isolate_sessions_agents_and_users(
    backend_url: str, make_otel: Callable[..., KaosOtelManager]
) -> None:
    otel = _otel(make_otel)
    services = {
        agent: MemoryService(agent, otel, RelationalStore(backend_url), max_read_scope=MemoryScope.USER)
        for agent in ("infra", "appdev")
    }
    infra, appdev = services["infra"], services["appdev"]
    await infra.start()
    writes = [
        (infra.owner("alice", "s1"), "alice s1 via infra"),
        (infra.owner("alice", "s2"), "alice s2 via infra"),
        (appdev.owner("alice", "s3"), "alice s3 via appdev"),
        (infra.owner("bob", "s1"), "bob s1 via infra"),
        (infra.owner(None, "s1"), "anonymous s1 via infra"),
    ]
    for owner, text in writes:
        await services[owner.agent].remember(owner, [Turn("user", text)])

    async def seen(service: MemoryService, owner: Owner, scope: MemoryScope) -> set[str]:
        return {t.content for t in (await service.recall(owner, scope, "")).turns}

    alice = infra.owner("alice", "s1")
    assert await seen(infra, alice, MemoryScope.SESSION) == {"alice s1 via infra"}
    assert await seen(infra, alice, MemoryScope.AGENT) == {"alice s1 via infra", "alice s2 via infra"}
    assert await seen(infra, alice, MemoryScope.USER) == {
        "alice s1 via infra",
        "alice s2 via infra",
        "alice s3 via appdev",
    }
    assert await seen(infra, infra.owner("bob", "s1"), MemoryScope.USER) == {"bob s1 via infra"}
    assert await seen(infra, infra.owner(None, "s1"), MemoryScope.SESSION) == {"anonymous s1 via infra"}
    assert await seen(infra, infra.owner(None, "s2"), MemoryScope.SESSION) == set()
    with pytest.raises(MemoryScopeError, match="store scope is refused"):
        await infra.recall(alice, MemoryScope.STORE, "")
    for wider in (MemoryScope.AGENT, MemoryScope.USER):
        with pytest.raises(MemoryScopeError, match="anonymous requests have the session scope only"):
            await infra.recall(infra.owner(None, "s1"), wider, "")
    with pytest.raises(MemoryScopeError, match=r"unknown memory scope 'xxxx.{36}\.\.\.' \(one of") as refused:
        parse_scope("x" * 100_000)  # a header's whole value is not sent back
    assert len(str(refused.value)) < 200
    ceiling = MemoryService("infra", otel, infra.relational, max_read_scope=MemoryScope.SESSION)
    with pytest.raises(MemoryScopeError, match="above this agent's ceiling"):
        await ceiling.recall(alice, MemoryScope.AGENT, "")
    for service in services.values():
        await service.aclose()


async def test_compaction_writes_summary_versions_and_records_metrics(
    backend_url: str, make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    otel = _otel(make_otel)
    memory = MemoryService("summariser", otel, RelationalStore(backend_url), window_tokens=40)
    await memory.start()
    owner = memory.owner("carol", "s1")
    for i in range(6):
        await memory.remember(
            owner, [Turn("user", f"question {i} about the deployment"), Turn("assistant", f"answer {i}")]
        )
    versions = memory.relational.summary_versions(owner)
    assert [s.version for s in versions] == list(range(1, len(versions) + 1)) and len(versions) >= 2
    assert "question 0 about the deployment" in versions[-1].content  # rolling: older content kept
    assert memory.relational.count_turns(owner, MemoryScope.SESSION) == 12  # raw turns all kept
    recalled = await memory.recall(owner, MemoryScope.SESSION, "")
    assert [s.version for s in recalled.summaries] == [versions[-1].version]
    assert recalled.turns[-1] == Turn("assistant", "answer 5")
    assert sum(len(t.content.split()) + 4 for t in recalled.turns) <= 40
    await memory.aclose()
    otel.force_flush()

    def arrived(r: OtlpReceiver) -> bool:
        names = {p.name for p in r.metric_points()}
        return {catalog.KAOS_MEMORY_COMPACTIONS, catalog.KAOS_MEMORY_WINDOW_TOKENS} <= names

    assert otlp_receiver.wait_for(arrived, timeout=10)
    points = otlp_receiver.metric_points()
    compactions = [p for p in points if p.name == catalog.KAOS_MEMORY_COMPACTIONS]
    assert max(int(p.value or 0) for p in compactions) == len(versions)
    assert {p.attributes[catalog.KAOS_OUTCOME] for p in compactions} == {"success"}
    window = [p for p in points if p.name == catalog.KAOS_MEMORY_WINDOW_TOKENS]
    assert max(p.count or 0 for p in window) == 6 and max(p.max or 0 for p in window) <= 40
    tiers = {
        (p.attributes[catalog.KAOS_MEMORY_TIER], p.attributes[catalog.KAOS_MEMORY_OPERATION])
        for p in points
        if p.name == catalog.KAOS_MEMORY_OPERATION_DURATION
    }
    assert {("short_term", "create_memory"), ("medium_term", "create_memory")} <= tiers
    assert {("short_term", "search_memory"), ("medium_term", "search_memory")} <= tiers
    _assert_no_ids_on_metrics(otlp_receiver)


async def test_remembering_no_turn_writes_nothing_and_is_no_outage(
    make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    otel = _otel(make_otel)
    memory = MemoryService("summariser", otel, RelationalStore("sqlite://"))
    await memory.start()
    owner = memory.owner("carol", "s1")
    assert await memory.remember(owner, [Turn("user", "hello")])
    assert await memory.remember(owner, []) is True
    assert memory.relational.count_turns(owner, MemoryScope.SESSION) == 1
    await memory.aclose()
    otel.force_flush()
    assert otlp_receiver.wait_for(lambda r: len(_memory_spans(r)) == 2, timeout=10)
    assert {s.attributes[catalog.KAOS_OUTCOME] for s in _memory_spans(otlp_receiver)} == {"success"}


@pytest.mark.parametrize("budget", [10, 40])
def test_a_summary_of_which_no_word_fits_the_recall_is_left_out(budget: int) -> None:
    """Recall cuts summaries to their newest part: one with no room left for a single word is
    left out, not sent as a bare ``...`` that takes the room of the newest turn."""
    newest = Summary("s2", 3, "recent " * 6)  # 15 estimated tokens
    assert estimate_tokens(newest.content) == 15
    turn = Turn("user", "hello there")
    recalled = Recall((turn,), (newest, Summary("s1", 7, "older " * 400))).within(budget)
    assert recalled.turns == (turn,)
    assert all(s.content.removeprefix("... ").strip() for s in recalled.summaries), recalled.summaries


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("mysql://kaos:hunter2@db/memory", "names database 'mysql'"),
        ("postgres://kaos:hunter2@db/memory", "names database 'postgres'"),
        ("postgresql+psycopg://kaos:hunter2@db:port/memory", "malformed"),
        ("memory.db", "malformed"),
    ],
)
def test_a_memory_url_of_no_supported_database_is_a_clear_error(url: str, said: str) -> None:
    with pytest.raises(ValueError, match=r"use sqlite, .* or postgresql") as raised:
        RelationalStore(url)
    assert said in str(raised.value) and "hunter2" not in str(raised.value)


async def test_a_turn_with_text_no_database_stores_is_remembered_cleaned(
    backend_url: str, make_otel: Callable[..., KaosOtelManager]
) -> None:
    """A model's answer may hold NUL (PostgreSQL refuses it) or a lone surrogate (not UTF-8): the
    turn is still remembered, and folded, with U+FFFD in their place, not lost as an outage."""
    memory = MemoryService("summariser", _otel(make_otel), RelationalStore(backend_url), window_tokens=30)
    await memory.start()
    owner = memory.owner("carol", "s1")
    answer = "nul\x00here and a lone \ud800 surrogate"
    assert await memory.remember(owner, [Turn("user", "question"), Turn("assistant", answer)])
    recalled = await memory.recall(owner, MemoryScope.SESSION, "")
    cleaned = "nul\ufffdhere and a lone \ufffd surrogate"
    assert recalled.turns == (Turn("user", "question"), Turn("assistant", cleaned)) and not recalled.degraded
    assert await memory.remember(owner, [Turn("user", "more " * 20 + "\x00")])
    (summary,) = memory.relational.summary_versions(owner)
    assert cleaned in summary.content
    await memory.aclose()


async def test_captured_records_are_memory_records_kept_valid_json(
    make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    """With content capture on, every tier's ``gen_ai.memory.records`` is the conventions'
    ``MemoryRecord`` list, still JSON when the size cap cuts a long window."""
    otel = make_otel(environ={"OTEL_METRIC_EXPORT_INTERVAL": "200"}, capture_content=True)
    memory = MemoryService("summariser", otel, RelationalStore("sqlite://"), window_tokens=9000)
    await memory.start()
    owner = memory.owner("carol", "s1")
    for i in range(4):
        await memory.remember(owner, [Turn("user", f"question {i}"), Turn("assistant", "word " * 1500)])
    await memory.recall(owner, MemoryScope.SESSION, "")  # a window above the attribute size cap
    memory.window_tokens = 40
    await memory.remember(owner, [Turn("user", "fold them")])
    await memory.recall(owner, MemoryScope.SESSION, "")
    await memory.aclose()
    otel.force_flush()

    captured = [
        (
            s.attributes[catalog.KAOS_MEMORY_TIER],
            s.name,
            json.loads(s.attributes[catalog.GEN_AI_MEMORY_RECORDS]),
        )
        for s in _memory_spans(otlp_receiver)
        if catalog.GEN_AI_MEMORY_RECORDS in s.attributes
    ]
    assert {(tier, name) for tier, name, _ in captured} == {
        ("short_term", "create_memory"),
        ("short_term", "search_memory"),
        ("medium_term", "search_memory"),
    }
    for _, _, records in captured:
        kept = [r for r in records if r != "..."]  # "...": the items the size cap left out
        assert kept and all(isinstance(r["content"], str) for r in kept)
        assert all(isinstance(r.get("metadata", {}), dict) for r in kept)
    (summary,) = next(records for tier, _, records in captured if tier == "medium_term")
    assert summary["metadata"] == {"version": 1} and "question 0" in summary["content"]


async def test_concurrent_turns_of_one_session_count_the_compactions_written(
    backend_url: str, make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    """Requests of one session remembered at once: a compaction that finds its turns folded by
    another writes nothing and is not counted; every turn is folded into one version only."""
    otel = _otel(make_otel)
    memory = MemoryService("summariser", otel, RelationalStore(backend_url), window_tokens=40)
    await memory.start()
    owner = memory.owner("carol", "s1")
    await asyncio.gather(
        *(
            memory.remember(
                owner, [Turn("user", f"question-{i} " + "word " * 8), Turn("assistant", "ok " * 8)]
            )
            for i in range(24)
        )
    )
    await memory.aclose()
    versions = memory.relational.summary_versions(owner)
    folded = re.findall(r"question-\d+", versions[-1].content)
    assert len(folded) == len(set(folded)), f"a turn folded twice: {sorted(folded)}"
    otel.force_flush()

    def counted(r: OtlpReceiver) -> float:
        return max(
            (p.value or 0 for p in r.metric_points() if p.name == catalog.KAOS_MEMORY_COMPACTIONS), default=0
        )

    assert otlp_receiver.wait_for(lambda r: counted(r) >= len(versions), timeout=10)
    assert counted(otlp_receiver) == len(versions)
    written = [
        s.attributes.get(catalog.GEN_AI_MEMORY_RECORD_COUNT)
        for s in _memory_spans(otlp_receiver)
        if s.attributes[catalog.KAOS_MEMORY_TIER] == "medium_term" and s.name == "create_memory"
    ]
    assert written.count(1) == len(versions) and set(written) <= {0, 1}, written


def test_a_turn_appended_during_a_compaction_is_folded_later(postgres: PostgresCluster) -> None:
    """PostgreSQL hands out ids before commit: a turn another request appends while a compaction
    runs can hold a lower id than the turns folded, and commit after them. It stays in the window
    and a later compaction folds it."""
    name = f"kaos_{uuid.uuid4().hex[:12]}"
    with postgres.connect() as conn:
        conn.execute(f"CREATE DATABASE {name}")
    store = RelationalStore(postgres.url(name))
    owner = Owner("summariser", "carol", "s1")
    words = " word" * 20
    store.append(owner, [Turn("user", f"early-{i}{words}") for i in range(2)])
    with psycopg.connect(postgres.url(name).replace("postgresql+psycopg", "postgresql")) as late:
        late.execute(  # another request's append: its id taken now, committed after the compaction
            "INSERT INTO kaos_memory_turns (agent, user_id, session_id, role, content, tokens, compacted,"
            " created_at) VALUES (%s, %s, %s, 'user', %s, 30, false, now())",
            (owner.agent, owner.user_key, owner.session_id, "late-turn" + words),
        )
        store.append(owner, [Turn("user", f"mid-{i}{words}") for i in range(4)])
        assert store.compact(owner, 40, summarise) is not None
        late.commit()
    for round_ in range(3):
        store.append(owner, [Turn("user", f"later-{round_}-{i}{words}") for i in range(4)])
        store.compact(owner, 40, summarise)
    assert "late-turn" in store.summary_versions(owner)[-1].content
    store.dispose()


def test_turns_forgotten_while_a_compaction_summarises_them_leave_no_summary(backend_url: str) -> None:
    """A forget (another request, agent or process on the same database) that deletes the turns a
    running compaction has read: the compaction writes no summary of them (nor hands them over
    for long-term extraction), so nothing of the forgotten turns is left."""
    store, other = RelationalStore(backend_url), RelationalStore(backend_url)
    owner = Owner("summariser", "carol", "s1")
    store.append(owner, [Turn("user", f"secret-{i}" + " word" * 20) for i in range(4)])

    def forget_meanwhile(previous: str | None, folded: Sequence[Turn]) -> str:
        assert other.delete_turns(owner, MemoryScope.SESSION) == 4
        assert other.delete_summaries(owner, MemoryScope.SESSION) == 0
        return summarise(previous, folded)

    assert store.compact(owner, 40, forget_meanwhile) is None
    assert store.summary_versions(owner) == [] and store.count_turns(owner, MemoryScope.SESSION) == 0
    store.dispose()
    other.dispose()


# --- long-term tier (real mem0, offline) ---------------------------------------------------------
async def test_a_window_another_request_compacted_records_its_size_now(
    make_otel: Callable[..., KaosOtelManager], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A compaction that finds its turns folded by another request's records the window as it now
    is, not its size before that compaction (which was over the budget)."""
    otel = _otel(make_otel)
    recorded: list[int] = []
    monkeypatch.setattr(otel, "record_window_tokens", lambda agent, tokens: recorded.append(tokens))
    store = RelationalStore(f"sqlite:///{tmp_path / 'memory.db'}")
    memory = MemoryService("summariser", otel, store, window_tokens=40)
    await memory.start()
    owner = memory.owner("carol", "s1")
    compact = store.compact

    def another_request_compacts_first(
        owner: Owner, budget: int, summariser: Summariser
    ) -> Compaction | None:
        compact(owner, budget, summarise)
        return compact(owner, budget, summariser)  # nothing left to fold: None

    monkeypatch.setattr(store, "compact", another_request_compacts_first)
    await memory.remember(owner, [Turn("user", "hello " + "word " * 30), Turn("assistant", "ok " * 8)])
    await memory.aclose()
    assert recorded == [store.window_tokens(owner)] and recorded[0] <= memory.window_tokens


async def test_a_request_cancelled_while_its_compaction_runs_still_counts_and_extracts_it(
    make_otel: Callable[..., KaosOtelManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compaction's thread commits whatever happens to the request (a run timeout cancels
    it): the compaction is counted and its turns still reach the long-term tier."""
    otel = _otel(make_otel)
    compactions: list[object] = []
    monkeypatch.setattr(otel, "record_compaction", lambda agent, outcome: compactions.append(outcome))
    long_term = LongTermMemory(otel, "http://127.0.0.1:9/v1")  # no LLM call: facts stored verbatim
    store = RelationalStore("sqlite://")
    memory = MemoryService("librarian", otel, store, long_term, window_tokens=30)
    await memory.start()
    owner = memory.owner("dave", "s1")
    compacting = threading.Event()
    compact = store.compact

    def slow_compact(owner: Owner, budget: int, summariser: Summariser) -> Compaction | None:
        compacting.set()
        time.sleep(0.3)  # a database another writer holds
        return compact(owner, budget, summariser)

    monkeypatch.setattr(store, "compact", slow_compact)
    turns = [Turn("user", "dave lives in Oslo " + "word " * 30), Turn("assistant", "noted " * 8)]
    request = asyncio.create_task(memory.remember(owner, turns))
    while not compacting.is_set():
        await asyncio.sleep(0.01)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    await memory.drain()
    assert compactions == ["success"]
    assert any("dave lives in Oslo" in fact for fact in long_term.all(owner, MemoryScope.AGENT))
    await memory.aclose()


async def test_background_extraction_records_lag_and_forget_fans_out(
    make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    otel = _otel(make_otel)
    long_term = LongTermMemory(otel, "http://127.0.0.1:9/v1")  # no LLM call: facts stored verbatim
    memory = MemoryService("librarian", otel, RelationalStore("sqlite://"), long_term, window_tokens=30)
    await memory.start()
    owner, other = memory.owner("dave", "s1"), memory.owner("erin", "s1")
    with otel.span("request") as request:
        for i in range(4):
            await memory.remember(
                owner, [Turn("user", f"dave prefers region eu-west-{i}"), Turn("assistant", "noted")]
            )
        await memory.remember(other, [Turn("user", "erin prefers region us-east")])
        await memory.drain()
        recalled = await memory.recall(owner, MemoryScope.AGENT, "which region does dave prefer")
    assert recalled.facts and all("dave prefers region" in fact for fact in recalled.facts)
    assert long_term.all(owner, MemoryScope.AGENT)

    forgotten = await memory.forget(owner, MemoryScope.AGENT)
    assert forgotten.degraded == [] and forgotten.deleted["short_term"] == 8
    assert (forgotten.deleted["medium_term"] or 0) >= 1
    assert memory.relational.count_turns(owner, MemoryScope.AGENT) == 0
    assert memory.relational.summary_versions(owner) == []
    assert long_term.all(owner, MemoryScope.AGENT) == []
    assert memory.relational.count_turns(other, MemoryScope.AGENT) == 1  # erin's memory untouched
    await memory.aclose()
    otel.force_flush()

    assert otlp_receiver.wait_for(
        lambda r: any(p.name == catalog.KAOS_MEMORY_EXTRACTION_LAG for p in r.metric_points()), timeout=10
    )
    lag = [p for p in otlp_receiver.metric_points() if p.name == catalog.KAOS_MEMORY_EXTRACTION_LAG]
    assert {p.attributes[catalog.KAOS_OUTCOME] for p in lag} == {"success"} and max(
        p.count or 0 for p in lag
    ) >= 1
    spans = _memory_spans(otlp_receiver)
    trace_id = format(request.span.get_span_context().trace_id, "032x")
    created = [
        s
        for s in spans
        if s.attributes[catalog.KAOS_MEMORY_TIER] == "long_term" and s.name == "create_memory"
    ]
    assert created and all(s.trace_id == trace_id for s in created)  # the background task joins the trace
    deleted = {s.attributes[catalog.KAOS_MEMORY_TIER] for s in spans if s.name == "delete_memory"}
    assert deleted == {"short_term", "medium_term", "long_term"}
    _assert_no_ids_on_metrics(otlp_receiver)


def test_a_forget_whose_history_purge_fails_leaves_mem0_writable(
    make_otel: Callable[..., KaosOtelManager],
) -> None:
    """The purge of Mem0's history database fails (here a trigger refuses it, as a locked or
    read-only file would): the forget fails, and Mem0 keeps working once the database does."""
    long_term = LongTermMemory(_otel(make_otel), "http://127.0.0.1:9/v1")
    long_term.load()
    owner = Owner("librarian", "dave", "s1")
    try:
        long_term.add(owner, [Turn("user", "dave lives in Oslo")])
        connection = long_term._loaded().db.connection
        connection.execute(
            "CREATE TRIGGER refuse BEFORE DELETE ON history BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        with pytest.raises(sqlite3.IntegrityError, match="refused"):
            long_term.delete(owner, MemoryScope.SESSION)
        connection.execute("DROP TRIGGER refuse")
        assert long_term.add(owner, [Turn("user", "dave moved to Bergen")]) == 1
        assert long_term.delete(owner, MemoryScope.SESSION) == 1
    finally:
        long_term.close()


def test_a_long_term_tier_that_fails_to_load_leaves_no_files_nor_instrumentation(
    make_otel: Callable[..., KaosOtelManager], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kaos_otel.instrumentation.mem0 import Mem0Instrumentor, offline

    def unavailable(*args: object, **kwargs: object) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(offline, "offline_memory", unavailable)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    instrumented_before = Mem0Instrumentor().is_instrumented_by_opentelemetry
    long_term = LongTermMemory(_otel(make_otel), "http://127.0.0.1:9/v1")
    with pytest.raises(OSError, match="no space left"):
        long_term.load()
    assert list(tmp_path.glob("kaos-mem0-*")) == []
    assert Mem0Instrumentor().is_instrumented_by_opentelemetry is instrumented_before


def test_long_term_calls_from_many_threads_take_turns(make_otel: Callable[..., KaosOtelManager]) -> None:
    """Requests run memory calls in threads; Mem0's local store raised IndexError (and could keep
    raising) when two reached it at once."""
    long_term = LongTermMemory(_otel(make_otel), "http://127.0.0.1:9/v1")
    long_term.load()
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        owner = Owner("librarian", f"user-{worker % 3}", f"session-{worker}")
        for turn in range(100):
            try:
                if (worker + turn) % 2:
                    long_term.add(owner, [Turn("user", f"user {worker} likes colour {turn}")])
                else:
                    long_term.search(owner, MemoryScope.USER, f"colour {turn}", 5)
            except Exception as exc:
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        long_term.close()
    assert errors == []


async def test_the_demo_memory_faults_show_on_the_long_term_tier_too(
    make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """``memory-errors`` fails Mem0's store inside Mem0's call: its span and metrics say so (the
    fault used to hit before Mem0 ran, leaving the long-term tier looking healthy)."""
    otel = _otel(make_otel)
    switch = FaultSwitch(tmp_path / "faults.json")
    switch.write([Fault.MEMORY_ERRORS])
    long_term = LongTermMemory(otel, "http://127.0.0.1:9/v1", switch)
    memory = MemoryService("librarian", otel, RelationalStore("sqlite://"), long_term, faults=switch)
    await memory.start()
    owner = memory.owner("dave", "s1")
    for _ in range(8):
        await memory.recall(owner, MemoryScope.AGENT, "which region does dave prefer")
    await memory.aclose()
    otel.force_flush()
    searches = [
        s for s in _memory_spans(otlp_receiver)
        if s.attributes[catalog.KAOS_MEMORY_TIER] == "long_term" and s.name == "search_memory"
    ]  # fmt: skip
    assert len(searches) == 8
    failed = [s for s in searches if s.status_code == "ERROR"]
    assert 0 < len(failed) < 8
    assert all(s.attributes[catalog.ERROR_TYPE].endswith("InjectedFaultError") for s in failed)


async def test_a_slow_long_term_store_holds_no_thread_of_the_relational_tiers(
    make_otel: Callable[..., KaosOtelManager],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The demo's ``memory-latency`` on Mem0's store: while long-term calls wait for it, one at a
    time, a relational write still answers at once. They used to wait on the loop's shared thread
    pool, so a slow store slowed every tier (short-term p95 11 s in a live demo). Closing the
    service meanwhile lets the queued calls finish first."""
    monkeypatch.setattr(faults, "MEMORY_LATENCY_S", 0.3)
    monkeypatch.setattr(FaultSwitch, "one_in", lambda self, n: True)  # every store call is slow
    switch = FaultSwitch(tmp_path / "faults.json")
    switch.write([Fault.MEMORY_LATENCY])
    otel = _otel(make_otel)
    long_term = LongTermMemory(otel, "http://127.0.0.1:9/v1", switch)
    memory = MemoryService("librarian", otel, RelationalStore("sqlite://"), long_term)
    await memory.start()
    queued: list[object] = []  # what was handed to the long-term thread
    submit = memory._long_term_thread.submit

    def counted_submit(*args: Any, **kwargs: Any) -> Any:
        queued.append(args)
        return submit(*args, **kwargs)

    monkeypatch.setattr(memory._long_term_thread, "submit", counted_submit)
    loop = asyncio.get_running_loop()
    recalls = [
        asyncio.create_task(memory.recall(memory.owner(f"user-{i}", "s1"), MemoryScope.SESSION, "regions"))
        for i in range(12)
    ]
    while len(queued) < 12:  # the recalls' relational reads are done; their Mem0 searches queue
        await asyncio.sleep(0.01)
    started = loop.time()
    await memory.remember(memory.owner("writer", "s1"), [Turn("user", "I prefer eu-west-1.")])
    relational_s = loop.time() - started
    closing = asyncio.create_task(memory.aclose())  # while the searches still queue
    await asyncio.gather(*recalls)
    long_term_s = loop.time() - started
    await closing
    assert long_term_s > 12 * 0.3  # the searches did wait for the slow store, one at a time
    assert relational_s < long_term_s / 10, (relational_s, long_term_s)
    assert not [r.getMessage() for r in caplog.records if "degraded" in r.getMessage()]


# --- a backend that goes down -------------------------------------------------------------------
async def test_a_locked_postgres_table_degrades_memory_instead_of_hanging(
    postgres: PostgresCluster, make_otel: Callable[..., KaosOtelManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session holding a lock on the memory tables (a migration, a VACUUM FULL): PostgreSQL
    would wait for it forever, so each memory operation gives up after a bounded wait, as on a
    locked SQLite file, and degrades; the memory works again once the lock is gone."""
    monkeypatch.setattr(relational, "_LOCK_WAIT_S", 1)
    name = f"kaos_{uuid.uuid4().hex[:12]}"
    with postgres.connect() as conn:
        conn.execute(f"CREATE DATABASE {name}")
    memory = MemoryService("steady", _otel(make_otel), RelationalStore(postgres.url(name)))
    await memory.start()
    owner = memory.owner("frank", "s1")
    assert await memory.remember(owner, [Turn("user", "before the lock")])
    url = postgres.url(name).replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(url) as locker:
        locker.execute("LOCK TABLE kaos_memory_turns, kaos_memory_summaries IN ACCESS EXCLUSIVE MODE")
        assert await memory.remember(owner, [Turn("user", "during the lock")]) is False
        assert (await memory.recall(owner, MemoryScope.SESSION, "")).degraded
        locker.rollback()
    assert await memory.remember(owner, [Turn("user", "after the lock")])
    recalled = await memory.recall(owner, MemoryScope.SESSION, "")
    assert [t.content for t in recalled.turns] == ["before the lock", "after the lock"]
    await memory.aclose()


async def test_postgres_outage_degrades_memory_then_recovers(
    postgres: PostgresCluster, make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    otel = _otel(make_otel)
    memory = MemoryService("steady", otel, RelationalStore(postgres.url()))
    await memory.start()
    owner = memory.owner("frank", uuid.uuid4().hex)
    await memory.remember(owner, [Turn("user", "before the outage")])
    postgres.stop()
    try:
        with otel.span("request"):
            recalled = await memory.recall(owner, MemoryScope.SESSION, "")
            written = await memory.remember(owner, [Turn("user", "during the outage")])
            forgotten = await memory.forget(owner, MemoryScope.SESSION)
        assert recalled.turns == () and recalled.summaries == () and recalled.degraded
        assert written is False
        assert forgotten.degraded == ["short_term", "medium_term"]
    finally:
        postgres.start()
    assert await memory.remember(owner, [Turn("user", "after the outage")]) is True
    recovered = await memory.recall(owner, MemoryScope.SESSION, "")
    assert [t.content for t in recovered.turns] == ["before the outage", "after the outage"]
    assert not recovered.degraded
    await memory.aclose()
    otel.force_flush()

    degraded = [
        s for s in _memory_spans(otlp_receiver) if s.attributes.get(catalog.KAOS_OUTCOME) == "degraded"
    ]
    assert len(degraded) == 5  # two reads, one append, two deletes
    assert all(any(e.name == "exception" for e in s.events) for s in degraded)
    assert otlp_receiver.wait_for(
        lambda r: any(
            p.name == catalog.KAOS_MEMORY_OPERATIONS and p.attributes.get(catalog.KAOS_OUTCOME) == "degraded"
            for p in r.metric_points()
        ),
        timeout=10,
    )


# --- agents over HTTP ---------------------------------------------------------------------------
def _chat(url: str, prompt: str, headers: dict[str, str]) -> httpx.Response:
    body = {"model": "any", "messages": [{"role": "user", "content": prompt}]}
    with httpx.Client(timeout=30, trust_env=False) as client:
        return client.post(f"{url}/v1/chat/completions", json=body, headers=headers)


def _trace(receiver: OtlpReceiver, response: httpx.Response, service: str) -> list[ReceivedSpan]:
    trace_id = response.headers[TRACE_ID_HEADER]
    assert receiver.wait_for(
        lambda r: any(
            s.trace_id == trace_id and s.kind == "SERVER" and s.service_name == service for s in r.spans()
        ),
        timeout=10,
    )
    return [s for s in receiver.spans() if s.trace_id == trace_id]


def test_agents_remember_over_http_and_survive_a_memory_outage(
    module_receiver: OtlpReceiver, tmp_path: Path
) -> None:
    env = otlp_env(module_receiver.grpc_endpoint, export_delay_ms=200)
    closed = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
    memory = ["--memory-url", f"sqlite:///{tmp_path / 'memory.db'}", "--memory-window-tokens", "120"]
    with Supervisor(tmp_path, env=env) as supervisor:
        model = supervisor.spawn(ServiceSpec("model", ["model"]))
        echo = supervisor.spawn(ServiceSpec("mcp-echo", ["mcp", "echo"]))
        keeper = supervisor.spawn(agent_spec("keeper", model, mcp=[echo], extra_args=memory))
        amnesiac = supervisor.spawn(
            agent_spec("amnesiac", model, mcp=[echo], extra_args=["--memory-url", closed])
        )
        supervisor.wait_ready([model, echo, keeper, amnesiac])

        secret = f"zebra-{uuid.uuid4().hex}"
        headers = {USER_ID_HEADER: "grace", SESSION_ID_HEADER: "session-1"}
        responses = [_chat(keeper.url, f"Look up {secret} number {i}", headers) for i in range(3)]
        assert [r.status_code for r in responses] == [200, 200, 200]
        assert responses[0].headers[SESSION_ID_HEADER] == "session-1"
        assert "echo: Look up" in responses[2].json()["choices"][0]["message"]["content"]
        new_session = _chat(keeper.url, "hello", {USER_ID_HEADER: "grace"})
        assert len(new_session.headers[SESSION_ID_HEADER]) == 32
        refused = _chat(keeper.url, "hello", {**headers, MEMORY_SCOPE_HEADER: "store"})
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "memory_scope_refused"
        above = _chat(keeper.url, "hello", {**headers, MEMORY_SCOPE_HEADER: "user"})
        assert above.status_code == 403  # the default ceiling is agent
        with httpx.Client(timeout=30, trust_env=False) as client:
            forgot = client.request("DELETE", f"{keeper.url}/v1/memory", headers=headers)
        assert forgot.status_code == 200 and forgot.json()["deleted"]["keeper"]["short_term"] >= 2

        down = _chat(amnesiac.url, "Look up the weather", {USER_ID_HEADER: "grace"})
        assert down.status_code == 200
        assert down.json()["choices"][0]["message"]["content"] == "Search results: echo: Look up the weather"

        spans = _trace(module_receiver, responses[1], "keeper")
        down_spans = _trace(module_receiver, down, "amnesiac")

    by_id = {s.span_id: s for s in spans}
    memory_spans = [s for s in spans if catalog.KAOS_MEMORY_TIER in s.attributes]
    assert sorted((s.name, s.attributes[catalog.KAOS_MEMORY_TIER]) for s in memory_spans) == [
        ("create_memory", "short_term"),
        ("search_memory", "medium_term"),
        ("search_memory", "short_term"),
    ]
    for span in memory_spans:
        assert by_id[span.parent_span_id or ""].name == "invoke_agent keeper"
        assert span.attributes[catalog.SESSION_ID] == "session-1"
    window = next(
        s
        for s in memory_spans
        if s.name == "search_memory" and s.attributes[catalog.KAOS_MEMORY_TIER] == "short_term"
    )
    assert window.attributes[catalog.GEN_AI_MEMORY_RECORD_COUNT] == 2  # the first turn, recalled
    everything = repr([(s.attributes, s.events) for s in module_receiver.spans()])
    assert secret not in everything  # no content by default
    degraded = [s for s in down_spans if s.attributes.get(catalog.KAOS_OUTCOME) == "degraded"]
    assert sorted(s.name for s in degraded) == [
        "create_memory",
        "invoke_agent amnesiac",  # it answered without its memory: not a plain success
        "search_memory",
        "search_memory",
    ]
    (run,) = [s for s in degraded if s.name == "invoke_agent amnesiac"]
    assert run.attributes[catalog.ERROR_TYPE] == "memory_unavailable" and run.status_code == "UNSET"
    (keeper_run,) = [s for s in spans if s.name == "invoke_agent keeper"]
    assert keeper_run.attributes[catalog.KAOS_OUTCOME] == "success"
    assert module_receiver.wait_for(
        lambda r: any(
            p.name == catalog.KAOS_REQUESTS
            and p.attributes.get(catalog.GEN_AI_AGENT_NAME) == "amnesiac"
            and p.attributes.get(catalog.KAOS_OUTCOME) == "degraded"
            for p in r.metric_points()
        ),
        timeout=10,
    )
    assert module_receiver.wait_for(
        lambda r: any(
            p.name == catalog.KAOS_MEMORY_OPERATIONS and p.attributes.get(catalog.KAOS_OUTCOME) == "degraded"
            for p in r.metric_points()
        ),
        timeout=10,
    )
    _assert_no_ids_on_metrics(module_receiver)


class _FailingLongTerm:
    """Stands for LongTermMemory: its load or its search fails."""

    def __init__(self, *, fail_load: bool = False) -> None:
        self.fail_load = fail_load

    def load(self) -> None:
        if self.fail_load:
            raise RuntimeError("mem0 could not start")

    def search(self, owner: object, scope: object, query: str, limit: int) -> list[str]:
        raise RuntimeError("vector store down")

    def close(self) -> None:
        pass


async def test_a_long_term_tier_that_failed_degrades_the_recall_and_its_span(
    make_otel: Callable[..., KaosOtelManager], otlp_receiver: OtlpReceiver
) -> None:
    """A failed long-term search degrades its queued span (with the exception) and the recall; a
    tier that failed to load at start-up degrades every recall after it."""
    otel = _otel(make_otel)
    failing = MemoryService("a", otel, RelationalStore("sqlite://"), cast(LongTermMemory, _FailingLongTerm()))
    unloaded = MemoryService(
        "b", otel, RelationalStore("sqlite://"), cast(LongTermMemory, _FailingLongTerm(fail_load=True))
    )
    for memory in (failing, unloaded):
        await memory.start()
        recalled = await memory.recall(memory.owner("u", "s"), MemoryScope.SESSION, "where is my order?")
        assert recalled.degraded
        assert not (await memory.recall(memory.owner("u", "s"), MemoryScope.SESSION, "")).degraded  # no query
        if memory is unloaded:  # its facts may still be stored: the forget cannot say they are gone
            forgotten = await memory.forget(memory.owner("u", "s"), MemoryScope.SESSION)
            assert forgotten.degraded == ["long_term"]
        await memory.aclose()
    otel.force_flush()
    assert otlp_receiver.wait_for(lambda r: any(s.name == "long-term search" for s in r.spans()), 10)
    (search,) = [s for s in otlp_receiver.spans() if s.name == "long-term search"]
    assert search.attributes[catalog.KAOS_OUTCOME] == "degraded"
    assert search.attributes[catalog.ERROR_TYPE] == "RuntimeError"
    assert [e.name for e in search.events] == ["exception"]
