"""One HTTP/1.1 webhook connection's guard: its header deadline, and the response it ends after.

The listener (injector.http.server) wraps each HTTP/1.1 connection's app and reader in these, so a
client that drips its headers is cut off at the deadline, and a connection the supervisor wants
moved to another worker ends cleanly after a response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send


class Guard:
    """One HTTP/1.1 connection's header deadline: from a request's first bytes to its headers.

    Bytes that arrive while a request's body is being read belong to that request; bytes that
    arrive with no request in progress start the next one, and its headers are due in `timeout`.
    """

    __slots__ = ("active", "deadline", "pending", "reading_body", "timeout", "transport")

    def __init__(self, timeout: float, transport: asyncio.Transport) -> None:
        self.timeout = timeout
        self.transport = transport
        self.deadline: float | None = None
        self.active = 0
        self.pending = False
        self.reading_body = False

    def data(self, now: float) -> None:
        if self.reading_body:
            return
        self.pending = True
        if self.active == 0 and self.deadline is None:
            self.deadline = now + self.timeout

    def started(self) -> None:
        self.active += 1
        self.pending = False
        self.reading_body = True
        self.deadline = None

    def body_complete(self) -> None:
        self.reading_body = False

    def finished(self, now: float) -> None:
        self.active -= 1
        self.reading_body = False
        if self.active == 0 and self.pending:
            self.deadline = now + self.timeout


class GuardedReader:
    """The StreamReader hypercorn reads from, telling the guard when bytes arrive."""

    def __init__(self, reader: asyncio.StreamReader, guard: Guard, loop: asyncio.AbstractEventLoop) -> None:
        self._reader = reader
        self._guard = guard
        self._loop = loop

    async def read(self, n: int = -1) -> bytes:
        data = await self._reader.read(n)
        if data:
            self._guard.data(self._loop.time())
        return data

    def at_eof(self) -> bool:
        return self._reader.at_eof()


def guarded_app(app: ASGIApp, guard: Guard, loop: asyncio.AbstractEventLoop, closing: Callable[[], bool]) -> ASGIApp:
    """`app` telling `guard` when a request starts and its body ends; a response for which
    `closing()` is true says `Connection: close`, and the connection ends after it."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        guard.started()

        async def tell_body(message: Any = None) -> Any:
            message = await receive()
            if message.get("type") != "http.request" or not message.get("more_body"):
                guard.body_complete()
            return message

        async def send_closing(message: Any) -> None:
            if message.get("type") == "http.response.start" and closing():
                message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        try:
            await app(scope, tell_body, send_closing)
        finally:
            guard.finished(loop.time())

    return guarded
