"""Concurrent writers of one memory database: compactions of one session, schema creation.

Two compactions of one session at once (two requests of a session answered concurrently) both
read the same window and write the same next summary version; the one whose insert loses on the
version's unique key has nothing left to do. It must not degrade the request's memory, and no turn
is folded into two versions. Agents sharing one database create its tables at the same time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Connection, Table, event

from instrumented_agent.memory import RelationalStore, Turn, relational
from instrumented_agent.memory.relational import Compaction
from instrumented_agent.memory.scopes import Owner
from instrumented_agent.memory.service import summarise
from kaos_otel import MemoryScope

OWNER = Owner("librarian", "dave", "session-1")


def test_a_compaction_that_loses_the_race_for_a_summary_version_is_a_no_op(tmp_path: Path) -> None:
    store = RelationalStore(f"sqlite:///{tmp_path / 'memory.db'}")
    store.ensure_schema()
    store.append(OWNER, [Turn("user", f"turn {i} " + "word " * 20) for i in range(4)])
    winners: list[Compaction | None] = []

    def summarise_while_another_compacts(previous: str | None, folded: Sequence[Turn]) -> str:
        if not winners:  # the other compaction reads the same window and commits first
            winners.append(store.compact(OWNER, 40, summarise))
        return summarise(previous, folded)

    assert store.compact(OWNER, 40, summarise_while_another_compacts) is None
    (winner,) = winners
    assert winner is not None and winner.version == 1
    assert [s.version for s in store.summary_versions(OWNER)] == [1]
    store.dispose()


@pytest.mark.parametrize("statement", [0, 1], ids=["before-its-first-read", "between-its-reads"])
def test_a_compaction_committed_while_another_reads_is_never_folded_again(
    tmp_path: Path, statement: int
) -> None:
    """Another compaction of the session commits just before one of this compaction's reads: each
    turn is still folded into exactly one summary version."""
    store = RelationalStore(f"sqlite:///{tmp_path / 'memory.db'}")
    store.ensure_schema()
    store.append(OWNER, [Turn("user", f"turn-{i} " + "word " * 20) for i in range(4)])
    reads: list[str] = []

    def other_compaction_first(conn: Connection, cursor: object, sql: str, *args: object) -> None:
        if sql.lstrip().upper().startswith("SELECT") and len(reads) < 2:
            reads.append(sql)
            if len(reads) == statement + 1:
                store.append(OWNER, [Turn("user", f"turn-{i} " + "word " * 20) for i in range(4, 8)])
                assert store.compact(OWNER, 40, summarise) is not None

    engine = store._engine  # the engine this store compacts through, for the hook
    event.listen(engine, "before_cursor_execute", other_compaction_first)
    try:
        store.compact(OWNER, 40, summarise)
    finally:
        event.remove(engine, "before_cursor_execute", other_compaction_first)
    versions = store.summary_versions(OWNER)
    assert [s.version for s in versions] == list(range(1, len(versions) + 1))
    folded = re.findall(r"turn-\d+", versions[-1].content)
    assert len(folded) == len(set(folded)), f"a turn folded twice: {folded}"
    store.dispose()


def test_tables_another_process_created_meanwhile_are_taken_as_they_are(tmp_path: Path) -> None:
    """The demo's agents share one SQLite file and create its tables at start-up, together."""
    url = f"sqlite:///{tmp_path / 'memory.db'}"
    store, other = RelationalStore(url), RelationalStore(url)
    created: list[str] = []

    def other_creates_first(table: Table, connection: Connection, **kw: object) -> None:
        if not created:  # after this store's check, before its CREATE TABLE
            created.append(table.name)
            other.ensure_schema()

    event.listen(relational.turns, "before_create", other_creates_first)
    try:
        store.ensure_schema()
    finally:
        event.remove(relational.turns, "before_create", other_creates_first)
    assert created == [relational.turns.name]
    store.append(OWNER, [Turn("user", "hello")])
    assert store.count_turns(OWNER, MemoryScope.SESSION) == 1
    store.dispose()
    other.dispose()


def test_threads_writing_to_in_memory_sqlite_at_once_lose_no_turn() -> None:
    """In-memory SQLite is one connection every thread shares: its calls take turns (two
    transactions on it at once committed or rolled back each other's turns, silently)."""
    store = RelationalStore("sqlite://")
    store.ensure_schema()
    owners = [Owner("librarian", f"user-{i}", "s1") for i in range(8)]

    def converse(owner: Owner) -> None:
        for turn in range(6):
            store.append(owner, [Turn("user", f"turn {turn}"), Turn("assistant", "ok")])
            store.window(owner, MemoryScope.SESSION, 10)

    with ThreadPoolExecutor(len(owners)) as pool:
        list(pool.map(converse, owners))
    assert [store.count_turns(owner, MemoryScope.SESSION) for owner in owners] == [12] * len(owners)
    store.dispose()
