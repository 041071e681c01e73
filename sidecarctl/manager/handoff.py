"""The webhook port's connections, accepted by the supervisor and handed to the admission workers.

Why: the API server keeps a few long-lived keep-alive connections to a webhook and sends every
admission over them, so how connections are split decides how the load is split. With one
SO_REUSEPORT socket per worker the kernel hashed each connection to a worker: 10 connections split
4/6, and 11 split 9/2 once they had idled out and were reopened (the scale benchmark), and the
worker holding most of them queued requests while the other idled. Here the supervisor accepts on
one socket and passes each connection (SCM_RIGHTS over a Unix socket pair per worker) to the ready
worker holding the fewest, ties taken in turn, so connections split within one of even, as
Envoy's `exact_balance` does for the same reason. A connection costs the supervisor one accept and
one sendmsg, once; requests go straight to the worker.

A worker says `READY` once it has its first lists (before that it gets no connection: a store that
has not listed its SidecarSets would admit pods without sidecars) and `CLOSED` for each connection
it ends. A worker that dies closes its end, and the supervisor stops handing it connections the
moment it reads the end of file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from injector.http.server import readable
from injector.http.sources import LISTEN_BACKLOG

log = logging.getLogger("sidecarctl.handoff")

READY, CLOSED, CONNECTION, SHED = b"r", b"x", b"c", b"s"
_READ = 4096  # bytes (messages) read per wake-up of a channel


def _pair() -> tuple[socket.socket, socket.socket]:
    """A Unix stream socket pair. Every message is one byte, and a handed connection's fd travels
    with its byte: a one-byte read gets exactly the fds sent with that byte. The send buffer holds
    a few hundred such messages; past that a send fails and the connection goes to another worker."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    return ours, theirs


@dataclass
class _Worker:
    channel: socket.socket
    ready: bool = False
    open: int = 0  # connections handed to it and not yet reported closed
    shedding: bool = False  # asked to end one connection, and none has ended since


class Dispatcher:
    """The supervisor's side: accepts on the webhook port and hands connections out."""

    def __init__(self, sock: socket.socket, *, rebalance_every: float = 1.0) -> None:
        self.sock = sock  # bound; it listens once a worker is ready
        self.rebalance_every = rebalance_every
        self.workers: dict[int, _Worker] = {}
        self._uneven = False  # at the last look, one worker held two more than another
        self._turn = 0
        self._ready = asyncio.Event()
        self._refusing = False

    def attach(self, slot: int) -> socket.socket:
        """A new channel for the worker about to start in `slot`; returns the end it inherits (the
        caller closes its copy once the worker has started)."""
        self.detach(slot)
        ours, theirs = _pair()
        worker = _Worker(ours)
        self.workers[slot] = worker
        asyncio.get_running_loop().add_reader(ours.fileno(), self._read, slot, worker)
        return theirs

    def detach(self, slot: int) -> None:
        """Forget `slot`'s worker (it exited): no connection is handed to it from now on."""
        worker = self.workers.pop(slot, None)
        if worker is None:
            return
        with contextlib.suppress(RuntimeError, ValueError):
            asyncio.get_running_loop().remove_reader(worker.channel.fileno())
        worker.channel.close()

    def close(self) -> None:
        """Forget every worker (they have exited); the listening socket is the caller's."""
        for slot in list(self.workers):
            self.detach(slot)

    def open_connections(self) -> dict[int, int]:
        """Connections each ready worker holds, by slot."""
        return {slot: w.open for slot, w in self.workers.items() if w.ready}

    def _read(self, slot: int, worker: _Worker) -> None:
        try:
            messages = worker.channel.recv(_READ)
        except BlockingIOError:
            return
        except OSError:
            messages = b""
        if not messages:  # the worker exited: its end is closed
            if self.workers.get(slot) is worker:
                self.detach(slot)
            return
        if READY[0] in messages and not worker.ready:
            log.info("admission worker %d is ready: it is handed connections from now on", slot)
            worker.ready = True
            self._ready.set()
        closed = messages.count(CLOSED)
        if closed:
            worker.open = max(0, worker.open - closed)
            worker.shedding = False

    def rebalance(self) -> None:
        """Ask the worker holding the most connections to end one when it has held two more than
        another at two looks in a row. Handing out to the fewest keeps the split even as
        connections open, but the client closes them as it likes (kube-apiserver closes idle ones
        past its pool's size: 7/7 became 2/6 in the scale benchmark), and nothing else would move
        them back. Two looks, `rebalance_every` apart, because a count is briefly high while a
        connection its client has closed is still being shut down."""
        ready = sorted((w.open, slot) for slot, w in self.workers.items() if w.ready)
        uneven, self._uneven = self._uneven, len(ready) > 1 and ready[-1][0] - ready[0][0] >= 2
        if not (uneven and self._uneven):
            return
        worker = self.workers[ready[-1][1]]
        if worker.shedding:
            return
        try:
            worker.channel.send(SHED)
        except OSError as e:
            log.debug("admission worker %d not asked to shed a connection: %s", ready[-1][1], e)
            return
        worker.shedding = True

    def _pick(self, skip: set[int]) -> int | None:
        """The ready worker with the fewest connections; among equals, the next in turn."""
        ready = [s for s, w in self.workers.items() if w.ready and s not in skip]
        if not ready:
            return None
        n = max(self.workers) + 1
        slot = min(ready, key=lambda s: (self.workers[s].open, (s - self._turn) % n))
        self._turn = slot + 1
        return slot

    def hand(self, conn: socket.socket) -> bool:
        """Pass `conn` to a worker; False when no ready worker could take it. Closes our copy."""
        tried: set[int] = set()
        try:
            while (slot := self._pick(tried)) is not None:
                worker = self.workers[slot]
                try:
                    socket.send_fds(worker.channel, [CONNECTION], [conn.fileno()])
                except OSError as e:  # its queue is full (it is stalled) or it has just exited
                    log.debug("webhook connection not handed to worker %d: %s", slot, e)
                    tried.add(slot)
                    continue
                worker.open += 1
                self._refusing = False
                return True
            if not self._refusing:
                log.warning("webhook connection closed: no admission worker is ready")
                self._refusing = True
            return False
        finally:
            conn.close()

    async def serve(self) -> None:
        """Listen once the first worker is ready, then accept and hand out until cancelled."""
        await self._ready.wait()
        self.sock.listen(LISTEN_BACKLOG)
        self.sock.setblocking(False)
        loop = asyncio.get_running_loop()
        rebalancing = asyncio.create_task(self._rebalancing())
        try:
            while True:
                try:
                    conn, _ = await loop.sock_accept(self.sock)
                except OSError as e:  # out of file descriptors
                    log.warning("webhook port: accept failed: %s", e)
                    await asyncio.sleep(0.1)
                    continue
                self.hand(conn)
        finally:
            rebalancing.cancel()
            await asyncio.gather(rebalancing, return_exceptions=True)

    async def _rebalancing(self) -> None:
        while True:
            await asyncio.sleep(self.rebalance_every)
            self.rebalance()


class ConnectionsCollector(Collector):
    """`sidecarctl_webhook_worker_connections{worker}`: the connections each ready worker holds, as
    the supervisor counts them (an uneven split shows here first)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "sidecarctl_webhook_worker_connections",
            "Webhook connections each ready admission worker holds, as handed out by the supervisor.",
            labels=["worker"],
        )
        for slot, count in sorted(self.dispatcher.open_connections().items()):
            family.add_metric([str(slot)], count)
        yield family


class WorkerChannel:
    """A worker's side: the connections the supervisor hands it (an `injector.http.server`
    connection source)."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(False)
        self._shed: Callable[[], None] | None = None

    def start(self, shed: Callable[[], None]) -> None:
        self._shed = shed
        self._send(READY)

    def closed(self) -> None:
        self._send(CLOSED)

    async def accept(self) -> socket.socket:
        loop = asyncio.get_running_loop()
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self.sock, 1, 4)
            except BlockingIOError:
                await readable(loop, self.sock)
                continue
            if not message and not fds:
                raise ConnectionError("the supervisor closed the connection channel")
            if fds:
                for extra in fds[1:]:
                    socket.socket(fileno=extra).close()
                return socket.socket(fileno=fds[0])
            if message == SHED and self._shed is not None:
                self._shed()

    def _send(self, message: bytes) -> None:
        try:
            self.sock.send(message)
        except OSError as e:  # the supervisor is gone (this process ends with it) or not reading
            log.debug("connection channel: %s not sent: %s", message.decode(), e)
