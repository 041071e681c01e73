"""A TCP load balancer in front of several kube-apiservers, as the `kubernetes` Service is.

Each new connection goes to the next upstream in turn (TLS passes through untouched: every
kube-apiserver of one control plane serves the same certificate), so a client that keeps one
connection talks to one server, and one that opens a connection per request meets them all, as
with kube-proxy. Upstreams are added and removed while it runs, as a rolling upgrade does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from tests.kube.controlplane import free_port
from tests.kube.loop import BackgroundLoop


class Balancer:
    """`url` leads to the upstream ports in turn; `upstreams` may be changed at any time."""

    def __init__(self, loop: BackgroundLoop, upstreams: list[int]) -> None:
        self.loop = loop
        self.upstreams = list(upstreams)
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.connections = 0
        self._turn = itertools.count()
        self._server: asyncio.base_events.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    def start(self) -> Balancer:
        self._server = self.loop.run(asyncio.start_server(self._accept, "127.0.0.1", self.port))
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
            for task in list(self._pipes):
                task.cancel()
            await asyncio.gather(*self._pipes, return_exceptions=True)

        self.loop.run(close())

    def __enter__(self) -> Balancer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        ports = list(self.upstreams)
        if not ports:
            writer.close()
            return
        port = ports[next(self._turn) % len(ports)]
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except asyncio.CancelledError:
            pass  # stopped: the balancer closes its connections
        finally:
            self._pipes.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
