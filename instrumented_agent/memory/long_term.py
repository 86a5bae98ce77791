"""The long-term tier: atomic facts in Mem0 (offline configuration), traced by ``Mem0Instrumentor``.

Loading mem0 and its embedder takes a few seconds, so the tier is optional and loads once, in a
thread, when the agent starts. Facts live in an in-memory vector store for the process's
lifetime. Methods are synchronous (run them in a thread: the context, hence the trace, follows);
they take turns, as Mem0's local vector store is not safe for concurrent calls (two at once
raised ``IndexError`` from its payload masks, and could keep raising after).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from instrumented_agent.faults import FaultSwitch
from instrumented_agent.memory.relational import Turn
from instrumented_agent.memory.scopes import Owner, mem0_ids
from kaos_otel import KaosOtelManager, MemoryScope

__all__ = ["LongTermMemory"]


class LongTermMemory:
    """Facts extracted from compacted turns, recalled semantically and filtered by scope."""

    def __init__(self, otel: KaosOtelManager, llm_base_url: str, faults: FaultSwitch | None = None) -> None:
        self._otel = otel
        self._llm_base_url = llm_base_url
        self._faults = faults
        self._turns = threading.Lock()
        self._memory: Any = None
        self._instrumented = False
        self._dir: Path | None = None

    def load(self) -> None:
        """Import mem0 (telemetry off), instrument it with this agent's telemetry and build it.

        A load that fails leaves nothing behind: no instrumentation, no files.
        """
        os.environ.setdefault("MEM0_TELEMETRY", "False")
        self._dir = Path(tempfile.mkdtemp(prefix="kaos-mem0-"))
        os.environ.setdefault("MEM0_DIR", str(self._dir))
        try:
            from kaos_otel.instrumentation.mem0 import Mem0Instrumentor
            from kaos_otel.instrumentation.mem0.offline import offline_memory

            instrumentor = Mem0Instrumentor()
            if not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument(telemetry=self._otel)
                self._instrumented = True
            self._memory = offline_memory(self._llm_base_url, history_db_path=self._dir / "history.db")
        except BaseException:
            self.close()
            raise
        if self._faults is not None:  # the demo's memory faults hit the store inside Mem0's traced calls
            self._memory.vector_store = _FaultyStore(self._memory.vector_store, self._faults)

    def close(self) -> None:
        """Undo what :meth:`load` did: the instrumentation it added and its files."""
        if self._instrumented:
            from kaos_otel.instrumentation.mem0 import Mem0Instrumentor

            Mem0Instrumentor().uninstrument()
            self._instrumented = False
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._memory = None

    def _loaded(self) -> Any:
        if self._memory is None:
            raise RuntimeError("long-term memory is not loaded")
        return self._memory

    def add(self, owner: Owner, facts: Sequence[Turn]) -> int:
        """Store each fact verbatim (no LLM inference) under the owner's ids; returns how many."""
        messages = [{"role": fact.role, "content": fact.content} for fact in facts]
        with self._turns:
            result = self._loaded().add(messages, infer=False, **mem0_ids(MemoryScope.SESSION, owner))
        return len(result.get("results", []))

    def search(self, owner: Owner, scope: MemoryScope, query: str, limit: int) -> list[str]:
        """The facts in ``scope`` closest to ``query``."""
        with self._turns:
            found = self._loaded().search(query, filters=mem0_ids(scope, owner), top_k=limit)
        return [str(item["memory"]) for item in found.get("results", [])]

    def all(self, owner: Owner, scope: MemoryScope) -> list[str]:
        """Every fact in ``scope``."""
        with self._turns:
            found = self._loaded().get_all(filters=mem0_ids(scope, owner))
        return [str(item["memory"]) for item in found.get("results", [])]

    def delete(self, owner: Owner, scope: MemoryScope) -> int:
        """Delete every fact in ``scope``, and what Mem0's history database kept of them; how many."""
        memory = self._loaded()
        ids = mem0_ids(scope, owner)
        with self._turns:
            found = memory.get_all(filters=ids, top_k=_ALL)
            memory_ids = [str(item["id"]) for item in found.get("results", [])]
            memory.delete_all(**ids)
            _purge_history(memory.db, memory_ids, ids)
        return len(memory_ids)


class _FaultyStore:
    """Mem0's vector store with every call subject to the demo's memory faults, so a fault shows
    on the Mem0 span and metrics as a slow or failing store would."""

    def __init__(self, store: Any, faults: FaultSwitch) -> None:
        self._store = store
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not callable(attribute):
            return attribute
        return lambda *args, **kwargs: self._faults.memory_call(partial(attribute, *args, **kwargs))


_ALL = 1_000_000
"""``top_k`` that lists every fact of a scope."""


def _purge_history(db: Any, memory_ids: Sequence[str], ids: dict[str, str]) -> None:
    """Remove the deleted facts from Mem0's history database (it keeps every old text verbatim).

    Its ``history`` rows of those facts and its ``messages`` rows of the scope go, then the file is
    rebuilt (``VACUUM``) so that no page still holds the text.
    """
    with db._lock:
        connection = db.connection
        connection.execute("BEGIN")
        try:
            connection.executemany("DELETE FROM history WHERE memory_id = ?", [(i,) for i in memory_ids])
            scopes = [row[0] for row in connection.execute("SELECT DISTINCT session_scope FROM messages")]
            for session_scope in scopes:
                parts = dict(part.partition("=")[::2] for part in str(session_scope).split("&"))
                if all(parts.get(key) == value for key, value in ids.items()):
                    connection.execute("DELETE FROM messages WHERE session_scope = ?", (session_scope,))
            connection.execute("COMMIT")
        except BaseException:  # left open, the transaction would fail every later write of Mem0's
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        connection.execute("VACUUM")
