"""Run an ASGI app with uvicorn on a port, or on a listening socket inherited from a supervisor."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn

from instrumented_agent.errors import ListenError
from instrumented_agent.supervisor import ENV_SUPERVISOR_PID

__all__ = ["serve"]

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1


def _stop_with_supervisor() -> None:
    """On Linux, get SIGTERM when the supervising process dies, even if it is killed outright."""
    supervisor = os.environ.get(ENV_SUPERVISOR_PID)
    if supervisor is None or sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != supervisor:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _inherited_socket(fd: int) -> socket.socket:
    """The listening stream socket ``fd`` (:class:`ListenError` if it is not one)."""
    try:
        sock = socket.socket(fileno=fd)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ListenError(f"cannot serve on file descriptor {fd}: {reason}") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()  # not ours to close
        raise ListenError(f"cannot serve on file descriptor {fd}: not a listening stream socket")
    return sock


def serve(app: Any, host: str = "127.0.0.1", port: int = 8000, fd: int | None = None) -> None:
    """Serve ``app`` until SIGINT/SIGTERM, shut down gracefully, then return (so callers can flush).

    With ``fd``, the already-listening socket with that descriptor is used instead of binding
    ``host:port``: the parent bound it, so it knows the address before this process is up.
    """
    if fd is not None:
        sock = _inherited_socket(fd)
    else:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        sock.listen(128)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    def stop(signum: int, frame: FrameType | None) -> None:
        server.should_exit = True

    # While it runs, uvicorn handles stop signals itself, then re-raises them with the handler it
    # found: with the default one the process would die before the caller's telemetry flush. This
    # handler also covers a signal that arrives before uvicorn has started.
    previous = {sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS}
    _stop_with_supervisor()
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
