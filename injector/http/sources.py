"""Where the webhook listener's connections come from.

A process that serves alone listens on a socket of its own. The admission workers of
`sidecarctl run` are handed theirs by the supervisor (sidecarctl.manager.handoff), which balances
them; the listener serves both the same way.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Protocol

LISTEN_BACKLOG = 1024  # connections the kernel queues for a listener before accept


class ConnectionSource(Protocol):
    """Where a Listener's connections come from: a socket of its own, or a channel they are handed
    over by another process (sidecarctl.manager.handoff)."""

    def start(self, shed: Callable[[], None]) -> None:
        """The listener is ready to serve: from now on it may be given connections. `shed` asks it
        to end one of its connections after that connection's next response."""

    async def accept(self) -> socket.socket: ...

    def closed(self) -> None:
        """One connection that `accept` gave has ended."""


class ListeningSocket:
    """A socket of the listener's own, which listens from `start` on."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def start(self, shed: Callable[[], None]) -> None:
        self.sock.listen(LISTEN_BACKLOG)
        self.sock.setblocking(False)

    async def accept(self) -> socket.socket:
        conn, _ = await asyncio.get_running_loop().sock_accept(self.sock)
        return conn

    def closed(self) -> None:
        pass
