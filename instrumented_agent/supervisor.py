"""Start ``kaos-agent serve`` processes on free loopback ports and always stop them again.

The supervisor binds each service's loopback socket itself (port 0) and hands it to the process, so
every URL is known before any process is up and all of them can start at once. Each process runs
in its own session (a terminal Ctrl-C reaches only the supervisor, which then stops the children)
and logs to a file in the work directory. :meth:`Supervisor.stop` terminates every process it started, by PID,
and kills whatever is still alive after the deadline.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Self

import httpx

from instrumented_agent.identity import ENV_SESSION_KEY

__all__ = ["RunningService", "ServiceSpec", "StartupError", "Supervisor"]

ENV_SUPERVISOR_PID = "KAOS_SUPERVISOR_PID"
"""Set in every child's environment: the supervisor's pid, whose death stops the child too."""
_POLL_S = 0.05
_PROBE_TIMEOUT_S = 0.25
_LOG_TAIL_LINES = 20
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kaos-supervisor-spawn")
"""Starts every child from one thread that lives as long as the process: Linux's parent-death
signal, which stops a child whose supervisor died, fires when the *thread* that started it ends."""


class StartupError(RuntimeError):
    """A service exited or did not become ready in time."""

    def __init__(self, name: str, reason: str, log_tail: str) -> None:
        super().__init__(f"{name} failed to start: {reason}")
        self.name = name
        self.reason = reason
        self.log_tail = log_tail


@dataclass(frozen=True)
class ServiceSpec:
    """What to run: a name and the arguments after ``kaos-agent serve``."""

    name: str
    serve_args: Sequence[str]
    ready_path: str = "/health"


@dataclass(frozen=True)
class RunningService:
    """A started process, its base URL (once known) and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    ready_path: str

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the process log."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Supervisor:
    """Owns a set of service processes; use as a context manager so they are always stopped."""

    def __init__(
        self, workdir: Path, env: Mapping[str, str] | None = None, startup_timeout_s: float = 30.0
    ) -> None:
        self.workdir = workdir
        self._env = {**(os.environ if env is None else env), ENV_SUPERVISOR_PID: str(os.getpid())}
        # one key for every agent of the system: an anonymous session follows its delegations
        # (set but empty counts as unset, as for the agents: each would pick a key of its own)
        if not self._env.get(ENV_SESSION_KEY):
            self._env[ENV_SESSION_KEY] = secrets.token_hex(32)
        self._startup_timeout_s = startup_timeout_s
        self.services: dict[str, RunningService] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def spawn(self, spec: ServiceSpec) -> RunningService:
        """Start one service on a fresh loopback port without waiting for it."""
        if spec.name in self.services:
            raise ValueError(f"service {spec.name!r} already started")
        log_path = self.workdir / f"{spec.name}.log"
        # A Ctrl-C landing inside Popen would leave a started child unregistered, so never stopped.
        with (
            _deferred_stop_signals(),
            socket.create_server(("127.0.0.1", 0)) as sock,
            log_path.open("wb") as log,
        ):
            sock.set_inheritable(True)
            command = [sys.executable, "-m", "instrumented_agent.cli", "serve", *spec.serve_args]
            process = _spawner.submit(
                subprocess.Popen,
                [*command, "--fd", str(sock.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
                pass_fds=[sock.fileno()],
                start_new_session=True,
            ).result()
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            service = RunningService(spec.name, process, url, log_path, spec.ready_path)
            self.services[spec.name] = service
        return service

    def wait_ready(self, services: Sequence[RunningService]) -> None:
        """Wait until every service answers its ready path with 200, checking all of them in turn.

        Raises :class:`StartupError` as soon as one exits, or when one is not ready in time; the
        processes stay registered so :meth:`stop` (or leaving the ``with`` block) ends them.
        """
        deadline = time.monotonic() + self._startup_timeout_s
        waiting = list(services)
        with httpx.Client(timeout=_PROBE_TIMEOUT_S, trust_env=False) as client:
            while waiting:
                for service in list(waiting):
                    code = service.process.poll()
                    if code is not None:
                        raise StartupError(service.name, f"exited with code {code}", service.log_tail())
                    if _answers(client, service.url + service.ready_path):
                        waiting.remove(service)
                if waiting and time.monotonic() >= deadline:
                    name = waiting[0].name
                    reason = f"not ready after {self._startup_timeout_s:g} s"
                    raise StartupError(name, reason, waiting[0].log_tail())
                if waiting:
                    time.sleep(_POLL_S)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every process (newest first), wait up to ``timeout_s``, then SIGKILL the rest."""
        running = [s.process for s in reversed(self.services.values()) if s.process.poll() is None]
        for process in running:
            _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        try:
            for process in running:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _kill(process)
        except KeyboardInterrupt:  # a second Ctrl-C: do not wait for graceful shutdown
            for process in running:
                _kill(process)
            raise


@contextlib.contextmanager
def _deferred_stop_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, then deliver them to the handlers in place before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def defer(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, defer) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in received:
            signal.raise_signal(signum)


def _answers(client: httpx.Client, url: str) -> bool:
    """Whether ``url`` answers 200 right now (a socket not served yet just times out)."""
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def _kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process if it is still running, and reap it."""
    if process.poll() is None:
        _signal(process, signal.SIGKILL)
    process.wait()


def _signal(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send ``sig`` to the process by PID (it may have exited meanwhile)."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)
