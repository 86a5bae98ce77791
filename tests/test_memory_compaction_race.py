"""Two compactions of one session at once (two requests of a session answered concurrently).

Both read the same window and write the same next summary version; the one whose insert loses
on the version's unique key has nothing left to do. It must not degrade the request's memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from instrumented_agent.memory import RelationalStore, Turn
from instrumented_agent.memory.relational import Compaction
from instrumented_agent.memory.scopes import Owner
from instrumented_agent.memory.service import summarise

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
