"""The webhook's TLS listener, with a bound on everything a client can hold.

Why not hypercorn's own `serve`: it starts TLS on every accepted socket (asyncio then zero-fills a
256 KiB buffer per connection before the first byte), has no cap on connections, no deadline for a
handshake that never starts or for headers that drip in, and cannot turn HTTP/2 off per port. This
accept loop keeps hypercorn's HTTP machinery (h11/h2 and the ASGI bridge, `TCPServer`) and owns the
connection around it:

- at most `max_connections` sockets per process; a new one beyond that is closed at once;
- a socket that sends nothing within `handshake_timeout` is closed before any TLS state exists;
- at most `max_tls_connections` connections in TLS at once; a new one waits for a slot within the
  same deadline, then is closed; the handshake itself must end by that deadline too;
- once a request's first bytes arrive, its headers must be complete within `header_timeout`
  (HTTP/1.1), else the connection is aborted; the body's deadline is the app's (`injector.http.app`);
- an idle keep-alive connection is closed after `keep_alive_timeout`;
- HTTP/2 is offered only with `http2`, with bounded concurrent streams and requests per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from asyncio import sslproto
from dataclasses import dataclass
from typing import Any, cast

from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config
from starlette.types import ASGIApp

from injector.http.guard import Guard, GuardedReader, guarded_app
from injector.http.metrics import CONNECTIONS_CLOSED, OPEN_CONNECTIONS
from injector.http.sources import ConnectionSource, ListeningSocket

log = logging.getLogger("injector.server")

# asyncio zero-fills this much per TLS connection; one TLS record is at most 16 KiB plus overhead.
sslproto.SSLProtocol.max_size = 64 * 1024


@dataclass(frozen=True)
class Limits:
    max_connections: int = 4096
    max_tls_connections: int = 256
    handshake_timeout: float = 10.0
    header_timeout: float = 10.0
    keep_alive_timeout: float = 75.0
    graceful_timeout: float = 5.0
    http2: bool = False
    h2_max_concurrent_streams: int = 100
    max_requests_per_connection: int = 10_000
    # From our close_notify to giving up on the peer's (asyncio waits 30 s): a peer that never
    # answers it would hold its TLS slot that long.
    tls_shutdown_timeout: float = 2.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_tls_connections", "h2_max_concurrent_streams"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("handshake_timeout", "header_timeout", "keep_alive_timeout", "tls_shutdown_timeout"):
            if not 0 < getattr(self, name) <= 600:
                raise ValueError(f"{name} must be between 0 and 600 seconds")


def _closed(reason: str) -> None:
    CONNECTIONS_CLOSED.labels(reason).inc()


async def readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Until the peer has sent something (or closed): no buffer is allocated while waiting."""
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


class _Protocol(asyncio.StreamReaderProtocol):
    """StreamReaderProtocol that says when the connection is gone (`lost`)."""

    def __init__(self, reader: asyncio.StreamReader, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(reader, loop=loop)
        self.lost = asyncio.Event()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.lost.set()


# Seconds hypercorn gets to end a connection on its own once the socket is gone.
LOST_GRACE = 0.5


async def _until_lost(serving: asyncio.Future[None], protocol: _Protocol) -> None:
    """Wait for hypercorn to end the connection, or for the socket to go and a short grace after.

    A client that completes the TLS handshake and closes without a request (a TLS health check,
    a load balancer, `openssl s_client`) leaves hypercorn's TCPServer waiting for its keep-alive
    timer (75 s) before it ends, with the connection's TLS slot held: 20 such connections a
    second filled the 256 slots in about 25 s, and then no handshake completed until the timer
    freed some (the API server's calls timed out meanwhile). Once the socket is closed nothing
    can be answered on it, so the connection ends there.
    """

    async def gone() -> None:
        await protocol.lost.wait()

    lost: asyncio.Future[None] = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({serving, lost}, return_when=asyncio.FIRST_COMPLETED)
        if not serving.done():
            await asyncio.wait({serving}, timeout=LOST_GRACE)
        if not serving.done():
            _closed("peer_gone")
            return
        serving.result()  # hypercorn's own error (a socket already closed when it started): the caller counts it
    finally:
        lost.cancel()


class _Writer(asyncio.StreamWriter):
    """A StreamWriter whose close ends quietly however the peer behaves.

    When hypercorn closes a connection (a request it will not keep alive, a bound that was hit) it
    sends close_notify and waits for the TLS shutdown; a client that had already sent its next
    request makes that wait raise `SSLError: APPLICATION_DATA_AFTER_CLOSE_NOTIFY`, which hypercorn
    does not expect and logs as a traceback per connection. The connection is closed either way.
    """

    async def wait_closed(self) -> None:
        try:
            await super().wait_closed()
        except (ssl.SSLError, OSError) as e:
            log.debug("webhook connection closed uncleanly by the peer: %s", e)


class Listener:
    """Serves `app` over TLS on the connections of a listening socket or of another source."""

    def __init__(
        self, app: ASGIApp, source: socket.socket | ConnectionSource, context: ssl.SSLContext, limits: Limits
    ) -> None:
        self.app = app
        self.source = ListeningSocket(source) if isinstance(source, socket.socket) else source
        self.context = context
        self.limits = limits
        self.config = Config()
        self.config.keep_alive_timeout = limits.keep_alive_timeout
        self.config.graceful_timeout = limits.graceful_timeout
        self.config.h2_max_concurrent_streams = limits.h2_max_concurrent_streams
        self.config.keep_alive_max_requests = limits.max_requests_per_connection
        self.config.accesslog = None
        self.config.errorlog = logging.getLogger("hypercorn.error")
        self.worker = WorkerContext(None)
        self.connections = 0
        self._tls = asyncio.Semaphore(limits.max_tls_connections)
        self._guards: set[Guard] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._shed = 0  # HTTP/1.1 connections to end after their next response

    def shed_one(self) -> None:
        """End one HTTP/1.1 connection after its next response (`Connection: close`, so its client
        never sends on it again): the supervisor asks this of a worker holding more connections
        than another, and the client's next connection goes to the one with fewer."""
        self._shed += 1

    def _closing(self) -> bool:
        if self._shed <= 0:
            return False
        self._shed -= 1
        _closed("rebalanced")
        return True

    async def serve(self, stop: asyncio.Event) -> None:
        """Accept until `stop`; then let open requests finish within the graceful timeout.

        The source starts here, not where it is made: a socket listens (on one that already
        listens, this only sets the backlog), and a worker tells the supervisor it may be handed
        connections, only once the caller is ready to answer.
        """
        self.source.start(self.shed_one)
        accept = asyncio.create_task(self._accept_loop(), name="accept")
        sweep = asyncio.create_task(self._sweep(), name="header-deadlines")
        try:
            await stop.wait()
        finally:
            accept.cancel()
            await asyncio.gather(accept, return_exceptions=True)
            await self.worker.terminated.set()  # idle keep-alive connections close now
            if self._tasks:
                _, pending = await asyncio.wait(set(self._tasks), timeout=self.limits.graceful_timeout)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            sweep.cancel()
            await asyncio.gather(sweep, return_exceptions=True)

    async def _accept_loop(self) -> None:
        while True:
            try:
                conn = await self.source.accept()
            except OSError as e:  # out of file descriptors, or the socket went away
                log.warning("webhook listener: accept failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            if self.connections >= self.limits.max_connections:
                conn.close()
                self.source.closed()
                _closed("max_connections")
                continue
            self.connections += 1
            OPEN_CONNECTIONS.inc()
            task = asyncio.create_task(self._connection(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connection(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.handshake_timeout
        slot = False
        try:
            conn.setblocking(False)
            # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and an accepted
            # socket inherits proto 0 from socket.socket(): without it, an answer written as two TLS
            # records (headers, body) waits for the client's delayed ACK, ~40 ms per request.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                await asyncio.wait_for(readable(loop, conn), self.limits.handshake_timeout)
            except TimeoutError:
                _closed("handshake_timeout")
                return
            try:
                await asyncio.wait_for(self._tls.acquire(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                _closed("max_tls_connections")
                return
            slot = True
            await self._serve_tls(conn, loop, deadline)
        except (OSError, ssl.SSLError):
            _closed("error")
        except Exception as e:  # a protocol error deep in h11/h2: one line, the connection ends
            log.debug("webhook connection ended: %s: %s", type(e).__name__, e)
            _closed("error")
        finally:
            if slot:
                self._tls.release()
            with contextlib.suppress(OSError):
                conn.close()
            self.connections -= 1
            OPEN_CONNECTIONS.dec()
            self.source.closed()

    async def _serve_tls(self, conn: socket.socket, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        reader = asyncio.StreamReader(limit=2**16, loop=loop)
        protocol = _Protocol(reader, loop=loop)
        remaining = max(0.1, deadline - loop.time())
        try:
            transport, _ = await asyncio.wait_for(
                loop.connect_accepted_socket(
                    lambda: protocol,
                    conn,
                    ssl=self.context,
                    ssl_handshake_timeout=remaining,
                    ssl_shutdown_timeout=self.limits.tls_shutdown_timeout,
                ),
                remaining + 1.0,
            )
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError):
            _closed("handshake_failed")
            return
        assert isinstance(transport, asyncio.Transport)
        writer = _Writer(transport, protocol, reader, loop)
        ssl_object = writer.get_extra_info("ssl_object")
        http2 = ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2"
        guard: Guard | None = None
        app = self.app
        source: Any = reader
        if not http2:
            guard = Guard(self.limits.header_timeout, transport)
            self._guards.add(guard)
            app = guarded_app(self.app, guard, loop, self._closing)
            source = GuardedReader(reader, guard, loop)
        serving = asyncio.ensure_future(
            TCPServer(ASGIWrapper(cast(Any, app)), loop, self.config, self.worker, {}, source, writer)
        )
        try:
            await _until_lost(serving, protocol)
        finally:
            if guard is not None:
                self._guards.discard(guard)
            transport.abort()
            if not serving.done():
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)

    async def _sweep(self) -> None:
        """Abort connections whose request headers are overdue."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.5)
            now = loop.time()
            for guard in [g for g in self._guards if g.deadline is not None and g.deadline <= now]:
                self._guards.discard(guard)
                _closed("header_timeout")
                guard.transport.abort()
