"""Forget forgets: ``DELETE /v1/memory`` at the coordinator reaches every agent that holds the
user's memory, every store (SQL turns and summaries, Mem0 facts and Mem0's history database),
answers per-store counts, and leaves the forgotten text in 0 bytes of any file the agents wrote.

A real system of processes: the scripted model, MCP servers, a coordinator and a researcher with
memory on (SQLite, long-term facts in the real mem0), an analyst without memory. Each agent's
temporary files (Mem0's directory) are under the test's work directory (``TMPDIR``), so every
store's files can be searched byte by byte.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from net_support import free_port

from instrumented_agent.config import MEMORY_SCOPE_HEADER, SESSION_ID_HEADER, USER_ID_HEADER
from instrumented_agent.supervisor import ServiceSpec, Supervisor
from instrumented_agent.system import agent_spec

pytestmark = pytest.mark.timeout(300)


@dataclass
class System:
    workdir: Path
    coordinator: str
    researcher: str
    amnesiac: str
    client: httpx.Client

    def chat(self, url: str, prompt: str, headers: dict[str, str]) -> httpx.Response:
        body = {"model": "any", "messages": [{"role": "user", "content": prompt}]}
        return self.client.post(f"{url}/v1/chat/completions", json=body, headers=headers)

    def files_with(self, marker: str) -> list[Path]:
        """Every file under the work directory whose bytes contain ``marker``."""
        needle = marker.encode()
        return [p for p in self.workdir.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    workdir = tmp_path_factory.mktemp("forget")
    (workdir / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(workdir / "tmp")}

    def memory(name: str) -> list[str]:
        url = f"sqlite:///{workdir / f'{name}.db'}"
        return ["--memory-url", url, "--memory-long-term", "--memory-window-tokens", "24"]

    with (
        Supervisor(workdir, env=env, startup_timeout_s=120) as supervisor,
        httpx.Client(timeout=60, trust_env=False) as client,
    ):
        model = supervisor.spawn(ServiceSpec("model", ["model"]))
        echo = supervisor.spawn(ServiceSpec("mcp-echo", ["mcp", "echo"]))
        calculator = supervisor.spawn(ServiceSpec("mcp-calculator", ["mcp", "calculator"]))
        researcher = supervisor.spawn(
            agent_spec("researcher", model, mcp=[echo], extra_args=memory("researcher"))
        )
        analyst = supervisor.spawn(agent_spec("analyst", model, mcp=[calculator]))
        coordinator = supervisor.spawn(
            agent_spec(
                "coordinator", model, sub_agents=[researcher, analyst], extra_args=memory("coordinator")
            )
        )
        closed = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
        amnesiac = supervisor.spawn(agent_spec("amnesiac", model, extra_args=["--memory-url", closed]))
        supervisor.wait_ready([model, echo, calculator, researcher, analyst, coordinator, amnesiac])
        yield System(workdir, coordinator.url, researcher.url, amnesiac.url, client)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_delete_at_the_coordinator_forgets_everywhere_to_the_last_byte(system: System) -> None:
    alice_marker, bob_marker = f"ALICE{uuid.uuid4().hex}", f"BOB{uuid.uuid4().hex}"
    alice = {USER_ID_HEADER: "alice", SESSION_ID_HEADER: "alice-1"}
    bob = {USER_ID_HEADER: "bob", SESSION_ID_HEADER: "bob-1"}
    for i in range(4):  # enough turns to compact: summaries, then facts extracted into Mem0
        for headers, marker in ((alice, alice_marker), (bob, bob_marker)):
            answer = system.chat(system.coordinator, f"Research {marker} number {i}", headers)
            assert answer.status_code == 200, answer.text

    def in_every_store(marker: str) -> bool:
        files = {p.name for p in system.files_with(marker)}
        return {"coordinator.db", "researcher.db"} <= files and sum(
            name == "history.db" for name in files
        ) >= 1

    _wait_for(lambda: in_every_store(alice_marker), "the marker never reached every store")
    history_files = [p for p in system.files_with(alice_marker) if p.name == "history.db"]
    assert len({p.parent for p in history_files}) == 2  # both agents' Mem0 hold it

    forgot = system.client.request(
        "DELETE", f"{system.coordinator}/v1/memory", headers={**alice, MEMORY_SCOPE_HEADER: "user"}
    )
    assert forgot.status_code == 200, forgot.text
    report = forgot.json()
    assert report["failed"] == []
    assert set(report["deleted"]) == {"coordinator", "researcher"}  # the analyst holds no memory
    for agent, stores in report["deleted"].items():
        assert set(stores) == {"short_term", "medium_term", "long_term"}, agent
        assert stores["short_term"] > 0 and stores["medium_term"] > 0 and stores["long_term"] > 0, (
            agent,
            stores,
        )

    assert system.files_with(alice_marker) == []  # 0 bytes in any store's files
    assert in_every_store(bob_marker)  # the search works, and nobody else's memory went
    recalled = system.chat(
        system.researcher, "What do you remember?", {**alice, MEMORY_SCOPE_HEADER: "agent"}
    )
    assert alice_marker not in recalled.text


def test_a_failing_store_makes_the_forget_a_503_that_names_it(system: System) -> None:
    forgot = system.client.request(
        "DELETE", f"{system.amnesiac}/v1/memory", headers={USER_ID_HEADER: "alice"}
    )
    assert forgot.status_code == 503
    assert forgot.json()["failed"] == ["amnesiac/short_term", "amnesiac/medium_term"]


def test_an_anonymous_session_follows_its_delegations_and_is_forgotten_everywhere(system: System) -> None:
    first = system.chat(system.coordinator, "Research anonymous things", {})
    assert first.status_code == 200, first.text  # the researcher accepted the issued session
    session = {SESSION_ID_HEADER: first.headers[SESSION_ID_HEADER]}
    forgot = system.client.request("DELETE", f"{system.coordinator}/v1/memory", headers=session)
    assert forgot.status_code == 200, forgot.text
    deleted = forgot.json()["deleted"]
    assert deleted["coordinator"]["short_term"] == 2 and deleted["researcher"]["short_term"] == 2, deleted
