"""Loopback helpers shared by tests that start servers of their own."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_handed_out: set[int] = set()


def _ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, below the kernel's ephemeral range.

    Outgoing connections take their local ports from that range, so one opened by a server
    started meanwhile (Jaeger, the collector) cannot take this port before the server it is for
    listens on it. A port is handed out once per test process.
    """
    high = _ephemeral_range_start()
    for _ in range(200):
        port = random.randrange(10_000, high)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as sock:  # no luck below the range: any free port
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
