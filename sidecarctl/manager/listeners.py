"""The TCP sockets the manager serves on, bound before any server starts.

The supervisor binds each port once and hands the socket to the process that serves it, so a port
is taken (or refused) at start-up, and port 0 gives a free one to tests.
"""

from __future__ import annotations

import socket

from injector.http.sources import LISTEN_BACKLOG


def bind_only(bind: str) -> socket.socket:
    """A TCP socket bound to `host:port` (the port may be 0), not yet listening."""
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and the
    # sockets accepted from this one inherit it.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    return sock


def listen(bind: str, *, backlog: int = LISTEN_BACKLOG) -> socket.socket:
    """A listening TCP socket for `host:port` (the port may be 0)."""
    sock = bind_only(bind)
    sock.listen(backlog)
    return sock


def bound_address(bind: str, sock: socket.socket) -> str:
    """`bind` with the port the kernel chose when it asked for port 0."""
    host = bind.rpartition(":")[0]
    return f"{host}:{sock.getsockname()[1]}"
