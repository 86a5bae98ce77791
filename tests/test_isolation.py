"""No tenant reads or deletes another's memory, over HTTP, at every scope, anonymous callers included.

A real agent process with memory (SQLite) and the scripted model, which answers "what do you
remember" with the memory the agent recalled into its prompt. Three victims store a marker
(two verified users and an anonymous caller in the session the server issued it); then attackers
(anonymous, another verified user, reserved and repeated identity headers) try every session id
they could know or forge at every scope, reading and deleting. The gateway contract holds: the
attacker cannot set another user's ``x-kaos-user-id`` (the gateway overwrites it), everything
else is theirs to choose.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from instrumented_agent.config import MEMORY_SCOPE_HEADER, SESSION_ID_HEADER, USER_ID_HEADER
from instrumented_agent.supervisor import ServiceSpec, Supervisor
from instrumented_agent.system import agent_spec

pytestmark = pytest.mark.timeout(600)

Headers = list[tuple[str, str]]
READ = "What do you remember?"


@dataclass
class Victim:
    name: str
    headers: Headers
    marker: str


@dataclass
class Agent:
    url: str
    database: Path
    client: httpx.Client

    def chat(self, prompt: str, headers: Headers) -> httpx.Response:
        body = {"model": "any", "messages": [{"role": "user", "content": prompt}]}
        return self.client.post(f"{self.url}/v1/chat/completions", json=body, headers=headers)

    def forget(self, headers: Headers) -> httpx.Response:
        return self.client.request("DELETE", f"{self.url}/v1/memory", headers=headers)

    def rows_with(self, marker: str) -> int:
        with sqlite3.connect(self.database) as db:
            (count,) = db.execute(
                "SELECT count(*) FROM kaos_memory_turns WHERE content LIKE ?", (f"%{marker}%",)
            ).fetchone()
        return int(count)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    workdir = tmp_path_factory.mktemp("isolation")
    database = workdir / "memory.db"
    memory = ["--memory-url", f"sqlite:///{database}", "--memory-max-read-scope", "user"]
    with Supervisor(workdir) as supervisor, httpx.Client(timeout=30, trust_env=False) as client:
        model = supervisor.spawn(ServiceSpec("model", ["model"]))
        keeper = supervisor.spawn(agent_spec("keeper", model, extra_args=memory))
        supervisor.wait_ready([model, keeper])
        yield Agent(keeper.url, database, client)


def _victims(agent: Agent) -> list[Victim]:
    first = agent.chat("hello", [])
    assert first.status_code == 200
    anonymous_session = first.headers[SESSION_ID_HEADER]
    victims = [
        Victim("alice", [(USER_ID_HEADER, "alice"), (SESSION_ID_HEADER, "alice-s1")], ""),
        Victim("bob", [(USER_ID_HEADER, "bob"), (SESSION_ID_HEADER, "bob-s1")], ""),
        Victim("anonymous", [(SESSION_ID_HEADER, anonymous_session)], ""),
    ]
    for victim in victims:
        victim.marker = f"MARKER-{victim.name}-{uuid.uuid4().hex}"
        assert agent.chat(f"Remember {victim.marker}", victim.headers).status_code == 200
    return victims


def _own_memory_is_intact(agent: Agent, victims: list[Victim]) -> None:
    for victim in victims:
        answer = agent.chat(READ, victim.headers)
        assert answer.status_code == 200, answer.text
        assert victim.marker in answer.text, victim.name  # the detector works: owners see their marker
        assert agent.rows_with(victim.marker) >= 1


def _attempts(anonymous_session: str) -> list[Headers]:
    nonce = anonymous_session.split("-")[1]
    sessions: list[str | None] = [
        None,
        "alice-s1",
        "bob-s1",
        anonymous_session.upper(),  # the issued id itself is the anonymous caller's credential
        f"anon-{nonce}-{'f' * 32}",
        f"anon-{'0' * 32}-{'0' * 32}",
        ":anonymous",
        "s1",
        "",
        "Alice-s1",
        uuid.uuid4().hex,
        f"anon-{uuid.uuid4().hex}-{'0' * 32}",
    ]
    scopes = [None, "session", "agent", "user", "store", "USER", "bogus"]
    attackers: list[Headers] = [
        [],
        [(USER_ID_HEADER, "")],
        [(USER_ID_HEADER, "mallory")],
        [(USER_ID_HEADER, ":anonymous")],
        [(USER_ID_HEADER, "agent:keeper")],
        [(USER_ID_HEADER, "mallory"), (USER_ID_HEADER, "alice")],
    ]
    attempts = []
    for attacker, session, scope in itertools.product(attackers, sessions, scopes):
        headers = list(attacker)
        if session is not None:
            headers.append((SESSION_ID_HEADER, session))
        if scope is not None:
            headers.append((MEMORY_SCOPE_HEADER, scope))
        attempts.append(headers)
    return attempts


def test_a_thousand_cross_tenant_attempts_read_and_delete_nothing(agent: Agent) -> None:
    victims = _victims(agent)
    _own_memory_is_intact(agent, victims)
    anonymous_session = dict(victims[2].headers)[SESSION_ID_HEADER]
    attempts = _attempts(anonymous_session)
    markers = [victim.marker for victim in victims]
    reads, statuses = [], set()
    for headers in attempts:
        for response in (agent.chat(READ, headers), agent.forget(headers)):
            statuses.add(response.status_code)
            reads += [(headers, marker) for marker in markers if marker in response.text]
    assert 2 * len(attempts) >= 1000
    assert reads == [], f"{len(reads)} cross-tenant reads, e.g. {reads[:3]}"
    assert statuses <= {200, 400, 403}, statuses
    _own_memory_is_intact(agent, victims)  # 0 deletes


def test_the_database_is_the_users_only(agent: Agent) -> None:
    assert agent.database.stat().st_mode & 0o777 == 0o600


def test_identity_rules(agent: Agent) -> None:
    anonymous = agent.chat("hello", [])
    issued = anonymous.headers[SESSION_ID_HEADER]
    assert issued.startswith("anon-") and len(issued) > 64  # unguessable, returned in a header
    assert agent.chat("hello", [(SESSION_ID_HEADER, issued)]).headers[SESSION_ID_HEADER] == issued
    assert agent.chat("hello", [(SESSION_ID_HEADER, "chosen-by-client")]).status_code == 400
    for scope in ("agent", "user"):
        refused = agent.chat("hello", [(SESSION_ID_HEADER, issued), (MEMORY_SCOPE_HEADER, scope)])
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "memory_scope_refused"
    for reserved in (":anonymous", "agent:keeper", ":x"):
        answer = agent.chat("hello", [(USER_ID_HEADER, reserved)])
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_identity"
    repeated = agent.chat("hello", [(USER_ID_HEADER, "mallory"), (USER_ID_HEADER, "alice")])
    assert repeated.status_code == 400 and "repeated" in repeated.json()["error"]["message"]
    verified = agent.chat("hello", [(USER_ID_HEADER, "carol"), (SESSION_ID_HEADER, "carol-chosen")])
    assert verified.headers[SESSION_ID_HEADER] == "carol-chosen"  # a verified user may name sessions


def test_agents_of_one_system_share_the_session_key_even_when_it_is_set_empty(tmp_path: Path) -> None:
    """``KAOS_SESSION_KEY=`` (a compose file passing an unset variable on) means unset: the
    supervisor picks one key for all, so another agent accepts the session one of them issued."""
    with Supervisor(tmp_path, env={**os.environ, "KAOS_SESSION_KEY": ""}) as supervisor:
        model = supervisor.spawn(ServiceSpec("model", ["model"]))
        first, second = (supervisor.spawn(agent_spec(name, model)) for name in ("first", "second"))
        supervisor.wait_ready([model, first, second])
        body = {"model": "any", "messages": [{"role": "user", "content": "hello"}]}
        with httpx.Client(timeout=60, trust_env=False) as client:
            issued = client.post(f"{first.url}/v1/chat/completions", json=body).headers[SESSION_ID_HEADER]
            answer = client.post(
                f"{second.url}/v1/chat/completions", json=body, headers={SESSION_ID_HEADER: issued}
            )
    assert answer.status_code == 200, answer.text
    assert answer.headers[SESSION_ID_HEADER] == issued
