"""Who a memory belongs to, and the one place that turns a read scope into filters.

Writes are compound: every turn, summary and fact records the agent, the user and the session it
was authored in. A read resolves to one scope level (session < agent < user < store):

| scope | reads |
| --- | --- |
| ``session`` | this agent x this user x this session (the only scope of anonymous requests) |
| ``agent`` | this agent x this user, every session |
| ``user`` | this user across every agent on the store (needs a verified user) |
| ``store`` | everything: refused for any request arriving through an agent |

Every relational query and every Mem0 call gets its filter from :func:`scope_clause` or
:func:`mem0_ids`, so tenant isolation is audited here and nowhere else. A request without a
verified user acts as :data:`ANONYMOUS_USER` and sees only anonymous memories.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Table, and_

from instrumented_agent.errors import AgentError
from kaos_otel import MemoryScope

__all__ = [
    "ANONYMOUS_USER",
    "SCOPE_ORDER",
    "MemoryScopeError",
    "Owner",
    "check_read_scope",
    "mem0_ids",
    "new_session_id",
    "parse_scope",
    "scope_clause",
]

ANONYMOUS_USER = ":anonymous"
"""The user key of requests that carry no verified user (a gateway never issues it)."""

SCOPE_ORDER: tuple[MemoryScope, ...] = (
    MemoryScope.SESSION,
    MemoryScope.AGENT,
    MemoryScope.USER,
    MemoryScope.STORE,
)


class MemoryScopeError(AgentError):
    """A memory read or forget asked for a scope this request may not use."""

    status_code = 403
    error_type = "memory_scope_refused"


def new_session_id() -> str:
    """A fresh session id, for requests that arrive without one."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Owner:
    """The compound key of a write: the agent, the verified user (or none) and the session."""

    agent: str
    user_id: str | None
    session_id: str

    @property
    def user_key(self) -> str:
        """The user as stored: the verified user id, or :data:`ANONYMOUS_USER`."""
        return self.user_id or ANONYMOUS_USER


def parse_scope(value: str | None) -> MemoryScope:
    """A scope name (``None`` or empty means ``session``); :class:`MemoryScopeError` if unknown."""
    if not value:
        return MemoryScope.SESSION
    try:
        return MemoryScope(value.strip().lower())
    except ValueError:
        names = ", ".join(s.value for s in SCOPE_ORDER)
        shown = value if len(value) <= 40 else value[:40] + "..."  # a header may be 100 KB long
        raise MemoryScopeError(f"unknown memory scope {shown!r} (one of {names})") from None


def check_read_scope(scope: MemoryScope, ceiling: MemoryScope, owner: Owner) -> None:
    """Refuse ``store``, anything above ``ceiling``, and ``user`` without a verified user."""
    if scope is MemoryScope.STORE:
        raise MemoryScopeError("the store scope is refused for requests through an agent")
    if SCOPE_ORDER.index(scope) > SCOPE_ORDER.index(ceiling):
        raise MemoryScopeError(
            f"memory scope {scope.value!r} is above this agent's ceiling {ceiling.value!r}"
        )
    if owner.user_id is None and scope is not MemoryScope.SESSION:
        raise MemoryScopeError("anonymous requests have the session scope only")


def scope_clause(table: Table, scope: MemoryScope, owner: Owner) -> ColumnElement[bool]:
    """The WHERE clause restricting ``table`` (columns agent, user_id, session_id) to ``scope``."""
    if scope is MemoryScope.STORE:
        raise MemoryScopeError("the store scope is refused for requests through an agent")
    clauses = [table.c.user_id == owner.user_key]
    if scope in (MemoryScope.SESSION, MemoryScope.AGENT):
        clauses.append(table.c.agent == owner.agent)
    if scope is MemoryScope.SESSION:
        clauses.append(table.c.session_id == owner.session_id)
    return and_(*clauses)


def mem0_ids(scope: MemoryScope, owner: Owner) -> dict[str, str]:
    """Mem0's ``user_id`` / ``agent_id`` / ``run_id`` for ``scope`` (its filters, or its write ids)."""
    if scope is MemoryScope.STORE:
        raise MemoryScopeError("the store scope is refused for requests through an agent")
    ids = {"user_id": owner.user_key}
    if scope in (MemoryScope.SESSION, MemoryScope.AGENT):
        ids["agent_id"] = owner.agent
    if scope is MemoryScope.SESSION:
        ids["run_id"] = owner.session_id
    return ids
