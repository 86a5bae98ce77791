"""Three-tier, scoped agent memory for the reference agent, every operation traced with kaos_otel.

See ``docs/memory.md``. Short-term window and medium-term summaries live in a relational store
(:mod:`.relational`, SQLite or PostgreSQL), long-term facts in Mem0 (:mod:`.long_term`), scope
filtering in :mod:`.scopes`, and :class:`MemoryService` ties them together.
"""

from __future__ import annotations

from instrumented_agent.memory.long_term import LongTermMemory
from instrumented_agent.memory.relational import DEFAULT_SQLITE_URL, RelationalStore, Summary, Turn
from instrumented_agent.memory.scopes import MemoryScopeError, Owner, new_session_id, parse_scope
from instrumented_agent.memory.service import Forgotten, MemoryService, Recall

__all__ = [
    "DEFAULT_SQLITE_URL",
    "Forgotten",
    "LongTermMemory",
    "MemoryScopeError",
    "MemoryService",
    "Owner",
    "Recall",
    "RelationalStore",
    "Summary",
    "Turn",
    "new_session_id",
    "parse_scope",
]
