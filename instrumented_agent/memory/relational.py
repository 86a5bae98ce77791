"""The relational tiers on SQLAlchemy Core (SQLite or PostgreSQL): raw turns and rolling summaries.

- ``kaos_memory_turns``: every turn, verbatim and append-only, the source of truth. The
  short-term window of a session is its turns not yet folded into a summary.
- ``kaos_memory_summaries``: the medium-term rolling summary of a session, one new row (version)
  per compaction, so past versions stay readable.

Methods are synchronous (run them in a thread); every filter comes from
:func:`~instrumented_agent.memory.scopes.scope_clause`.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    DateTime,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    create_engine,
    delete,
    event,
    func,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, IntegrityError
from sqlalchemy.pool import StaticPool

from instrumented_agent.memory.scopes import Owner, scope_clause
from kaos_otel import MemoryScope

__all__ = ["DEFAULT_SQLITE_URL", "Compaction", "RelationalStore", "Summary", "Turn", "estimate_tokens"]

DEFAULT_SQLITE_URL = "sqlite:///.kaos/memory.db"
"""What ``--memory-url sqlite`` means: a SQLite file under the agent's working directory."""

_ID = 200
metadata = MetaData()
turns = Table(
    "kaos_memory_turns",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("agent", String(_ID), nullable=False),
    Column("user_id", String(_ID), nullable=False),
    Column("session_id", String(_ID), nullable=False),
    Column("role", String(32), nullable=False),
    Column("content", Text, nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("compacted", Boolean, nullable=False, default=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_kaos_memory_turns_owner", "user_id", "agent", "session_id", "compacted"),
)
summaries = Table(
    "kaos_memory_summaries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("agent", String(_ID), nullable=False),
    Column("user_id", String(_ID), nullable=False),
    Column("session_id", String(_ID), nullable=False),
    Column("version", Integer, nullable=False),
    Column("content", Text, nullable=False),
    Column("through_turn_id", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("agent", "user_id", "session_id", "version", name="uq_kaos_memory_summary_version"),
)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""What a database cannot store as text: NUL (PostgreSQL) and lone surrogates (not UTF-8 at all)."""


def _storable(text: str) -> str:
    """``text`` with NUL and lone surrogates replaced by U+FFFD: a model's answer may hold them,
    and the database would refuse the whole turn."""
    return _UNSTORABLE.sub("\ufffd", text)


def estimate_tokens(text: str) -> int:
    """A deterministic token estimate that does not depend on spaces: the larger of the word
    count and one token per four characters, plus four for the message frame."""
    return max(len(text.split()), (len(text) + 3) // 4) + 4


@dataclass(frozen=True)
class Turn:
    """One message of a conversation."""

    role: str
    content: str


@dataclass(frozen=True)
class Summary:
    """One version of a session's rolling summary."""

    session_id: str
    version: int
    content: str


class _FoldedElsewhere(Exception):
    """Turns a compaction read were deleted (forgotten) or folded by another one before it wrote."""


@dataclass(frozen=True)
class Compaction:
    """What one compaction did: the summary version it wrote and the turns it folded into it."""

    summary_id: int
    version: int
    folded: tuple[Turn, ...]
    window_tokens: int


Summariser = Callable[[str | None, Sequence[Turn]], str]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


_URL_FORMS = "sqlite, sqlite:///FILE, sqlite:// or postgresql+psycopg://USER:PASSWORD@HOST/DATABASE"


def parse_memory_url(url: str) -> URL:
    """``url`` parsed (``sqlite`` is in-memory SQLite); a URL that is malformed or names another
    database is a ``ValueError`` saying the forms accepted (never the URL itself: it may hold a
    password)."""
    try:
        parsed = make_url(DEFAULT_SQLITE_URL if url == "sqlite" else url)
    except (ArgumentError, ValueError):  # a port that is not a number is a ValueError
        raise ValueError(f"the memory URL is malformed: use {_URL_FORMS}") from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(f"the memory URL names database {parsed.drivername!r}: use {_URL_FORMS}")
    return parsed


_LOCK_WAIT_S = 10
"""How long a statement waits for a lock another connection holds before it fails (and its memory
operation degrades), on either database."""


def _engine(url: str) -> Engine:
    """An engine for ``url`` (:func:`parse_memory_url`); in-memory SQLite is one connection
    shared by every thread."""
    parsed = parse_memory_url(url)
    options: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "sqlite":
        options["connect_args"] = {"check_same_thread": False, "timeout": _LOCK_WAIT_S}
        if parsed.database in (None, "", ":memory:"):
            # no reconnecting: a new connection would be a new, empty database
            options |= {"poolclass": StaticPool, "pool_pre_ping": False}
        else:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    elif parsed.get_backend_name() == "postgresql":
        options["connect_args"] = {"connect_timeout": 3}
    engine = create_engine(parsed, **options)
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _overwrite_deleted_content)
    else:
        event.listen(engine, "connect", _bound_lock_waits)
    return engine


def _bound_lock_waits(connection: Any, _: Any) -> None:
    """PostgreSQL waits for a lock forever by default (a table another session locked would hang
    every memory operation): at most :data:`_LOCK_WAIT_S`, as SQLite."""
    cursor = connection.cursor()
    cursor.execute(f"SET lock_timeout = {_LOCK_WAIT_S * 1000}")
    cursor.close()
    connection.commit()


def _overwrite_deleted_content(connection: Any, _: Any) -> None:
    """SQLite zeroes what a DELETE removes, so forgotten text leaves the database file too."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA secure_delete = ON")
    cursor.close()


class RelationalStore:
    """Turns and summaries in one database (``sqlite:///file``, ``sqlite://`` or ``postgresql+psycopg://``)."""

    def __init__(self, url: str) -> None:
        self._engine = _engine(url)
        backend = self._engine.url.get_backend_name()
        self.provider = backend
        self.store_id = f"{backend}:{self._engine.url.database or 'memory'}"
        self._schema_ready = False
        # In-memory SQLite is one connection every thread shares: one call at a time uses it (two
        # transactions on it at once commit or roll back each other's writes).
        shared = isinstance(self._engine.pool, StaticPool)
        self._one_at_a_time: AbstractContextManager[Any] = threading.Lock() if shared else nullcontext()

    def ensure_schema(self) -> None:
        """Create the tables if they do not exist (once per process, retried after a failure)."""
        if self._schema_ready:
            return
        with self._one_at_a_time:
            for table in metadata.sorted_tables:
                try:
                    table.create(self._engine, checkfirst=True)
                except DatabaseError:  # another process sharing the database may have created it first
                    if not inspect(self._engine).has_table(table.name):
                        raise
        self._schema_ready = True

    @contextmanager
    def _connection(self, *, transaction: bool = False) -> Iterator[Connection]:
        """A connection, in a transaction (committed at the end) when asked."""
        with self._one_at_a_time, self._engine.begin() if transaction else self._engine.connect() as conn:
            yield conn

    def window_tokens(self, owner: Owner) -> int:
        """The session's window size (tokens of the turns not folded into a summary)."""
        self.ensure_schema()
        with self._connection() as conn:
            return self._window_tokens(conn, owner)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

    def append(self, owner: Owner, new_turns: Sequence[Turn]) -> int:
        """Append turns to the session; returns the window size (tokens) after the append (none
        given: nothing is written)."""
        self.ensure_schema()
        with self._connection(transaction=True) as conn:
            if not new_turns:  # an empty list would be one row of NULLs, refused
                return self._window_tokens(conn, owner)
            conn.execute(
                turns.insert(),
                [
                    {
                        "agent": owner.agent,
                        "user_id": owner.user_key,
                        "session_id": owner.session_id,
                        "role": turn.role,
                        "content": _storable(turn.content),
                        "tokens": estimate_tokens(turn.content),
                        "compacted": False,
                        "created_at": _now(),
                    }
                    for turn in new_turns
                ],
            )
            return self._window_tokens(conn, owner)

    def window(self, owner: Owner, scope: MemoryScope, limit: int) -> list[Turn]:
        """The latest ``limit`` turns not folded into a summary, oldest first."""
        self.ensure_schema()
        query = (
            select(turns.c.role, turns.c.content)
            .where(scope_clause(turns, scope, owner), turns.c.compacted.is_(False))
            .order_by(turns.c.id.desc())
            .limit(limit)
        )
        with self._connection() as conn:
            rows = conn.execute(query).all()
        return [Turn(row.role, row.content) for row in reversed(rows)]

    def summaries(self, owner: Owner, scope: MemoryScope, limit: int) -> list[Summary]:
        """The latest summary version of each session in ``scope`` (newest sessions first)."""
        self.ensure_schema()
        keys = (summaries.c.agent, summaries.c.user_id, summaries.c.session_id)
        latest = (
            select(*keys, func.max(summaries.c.version).label("version"))
            .where(scope_clause(summaries, scope, owner))
            .group_by(*keys)
            .subquery()
        )
        query = (
            select(summaries.c.session_id, summaries.c.version, summaries.c.content)
            .join(
                latest,
                and_(
                    summaries.c.agent == latest.c.agent,
                    summaries.c.user_id == latest.c.user_id,
                    summaries.c.session_id == latest.c.session_id,
                    summaries.c.version == latest.c.version,
                ),
            )
            .order_by(summaries.c.id.desc())
            .limit(limit)
        )
        with self._connection() as conn:
            return [Summary(r.session_id, r.version, r.content) for r in conn.execute(query)]

    def summary_versions(self, owner: Owner) -> list[Summary]:
        """Every summary version of the owner's session, oldest first."""
        self.ensure_schema()
        query = (
            select(summaries.c.session_id, summaries.c.version, summaries.c.content)
            .where(scope_clause(summaries, MemoryScope.SESSION, owner))
            .order_by(summaries.c.version)
        )
        with self._connection() as conn:
            return [Summary(r.session_id, r.version, r.content) for r in conn.execute(query)]

    def compact(self, owner: Owner, budget: int, summarise: Summariser) -> Compaction | None:
        """Fold the session's older turns into a new summary version if the window exceeds ``budget``.

        The newest turns that fit in half the budget stay in the window (at least the last one).
        When a concurrent compaction of the same session wrote this summary version first, it
        folded these turns already, and when a forget deleted them meanwhile no summary of them may
        be written: ``None``, nothing to do.
        """
        self.ensure_schema()
        try:
            return self._compact(owner, budget, summarise)
        except (IntegrityError, _FoldedElsewhere):  # the other compaction (or a forget) won
            return None

    def _compact(self, owner: Owner, budget: int, summarise: Summariser) -> Compaction | None:
        session = scope_clause(turns, MemoryScope.SESSION, owner)
        with self._connection(transaction=True) as conn:
            # The previous version first, then the turns not folded yet: a compaction committed
            # in between is caught by the version's unique key, never folded into this one again.
            previous = conn.execute(
                select(summaries.c.version, summaries.c.content)
                .where(scope_clause(summaries, MemoryScope.SESSION, owner))
                .order_by(summaries.c.version.desc())
                .limit(1)
            ).first()
            rows = conn.execute(
                select(turns.c.id, turns.c.role, turns.c.content, turns.c.tokens)
                .where(session, turns.c.compacted.is_(False))
                .order_by(turns.c.id)
            ).all()
            if len(rows) < 2 or sum(r.tokens for r in rows) <= budget:
                return None
            keep_from, kept_tokens = len(rows) - 1, rows[-1].tokens
            while keep_from > 1 and kept_tokens + rows[keep_from - 1].tokens <= budget // 2:
                keep_from -= 1
                kept_tokens += rows[keep_from].tokens
            folded = rows[:keep_from]
            folded_turns = tuple(Turn(r.role, r.content) for r in folded)
            version = (previous.version if previous else 0) + 1
            summary_id = conn.execute(
                summaries.insert().returning(summaries.c.id),
                {
                    "agent": owner.agent,
                    "user_id": owner.user_key,
                    "session_id": owner.session_id,
                    "version": version,
                    "content": _storable(summarise(previous.content if previous else None, folded_turns)),
                    "through_turn_id": folded[-1].id,
                    "created_at": _now(),
                },
            ).scalar_one()
            # these turns only: one another request appended meanwhile may hold a lower id
            marked = conn.execute(
                update(turns)
                .where(turns.c.id.in_([r.id for r in folded]), turns.c.compacted.is_(False))
                .values(compacted=True)
            ).rowcount
            if marked != len(folded):  # forgotten (or folded) since they were read: roll back
                raise _FoldedElsewhere
            return Compaction(summary_id, version, folded_turns, self._window_tokens(conn, owner))

    def delete_turns(self, owner: Owner, scope: MemoryScope) -> int:
        """Delete every turn in ``scope`` (raw turns included); returns how many."""
        return self._delete(turns, owner, scope)

    def delete_summaries(self, owner: Owner, scope: MemoryScope) -> int:
        """Delete every summary version in ``scope``; returns how many."""
        return self._delete(summaries, owner, scope)

    def count_turns(self, owner: Owner, scope: MemoryScope) -> int:
        """How many raw turns (folded or not) ``scope`` holds."""
        self.ensure_schema()
        with self._connection() as conn:
            count: int = conn.execute(
                select(func.count()).select_from(turns).where(scope_clause(turns, scope, owner))
            ).scalar_one()
        return count

    def _delete(self, table: Table, owner: Owner, scope: MemoryScope) -> int:
        self.ensure_schema()
        with self._connection(transaction=True) as conn:
            return conn.execute(delete(table).where(scope_clause(table, scope, owner))).rowcount

    @staticmethod
    def _window_tokens(conn: Connection, owner: Owner) -> int:
        tokens: int | None = conn.execute(
            select(func.sum(turns.c.tokens)).where(
                scope_clause(turns, MemoryScope.SESSION, owner), turns.c.compacted.is_(False)
            )
        ).scalar_one()
        return int(tokens or 0)
