"""The webhook port's connections handed from the supervisor to the admission workers: only to
ready workers, to the one holding the fewest, never to one that has gone."""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sidecarctl.manager.handoff import ConnectionsCollector, Dispatcher, WorkerChannel
from sidecarctl.manager.listeners import bind_only


def tally(into: dict[int, int], slot: int) -> None:
    into[slot] += 1


def no_shed() -> None:
    """A worker's shed request where a test does not look at it."""


class Harness:
    def __init__(self, rebalance_every: float) -> None:
        self.dispatcher = Dispatcher(bind_only("127.0.0.1:0"), rebalance_every=rebalance_every)
        self.port = self.dispatcher.sock.getsockname()[1]
        self.channels: dict[int, WorkerChannel] = {}
        self.clients: list[socket.socket] = []
        self.handed: list[socket.socket] = []  # every connection a worker was handed, closed at the end

    def worker(self, slot: int) -> WorkerChannel:
        theirs = self.dispatcher.attach(slot)
        self.channels[slot] = WorkerChannel(theirs.detach())
        return self.channels[slot]

    async def ready(self, count: int, sheds: dict[int, int] | None = None) -> None:
        """`count` workers that have said READY; with `sheds`, each counts there the connections it
        is asked to shed."""
        for slot in range(count):
            self.worker(slot)
            self.channels[slot].start(no_shed if sheds is None else functools.partial(tally, sheds, slot))
        await until(lambda: len(self.dispatcher.open_connections()) == count, "workers not ready")

    async def connect(self, count: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(count):
            client = socket.socket()
            client.setblocking(False)
            await loop.sock_connect(client, ("127.0.0.1", self.port))
            self.clients.append(client)

    async def taken(self, slot: int, within: float = 2.0) -> list[socket.socket]:
        """The connections handed to `slot`'s worker until none arrives for 0.2 s."""
        got: list[socket.socket] = []
        while True:
            try:
                got.append(await asyncio.wait_for(self.channels[slot].accept(), 0.2 if got else within))
                self.handed.append(got[-1])
            except TimeoutError:
                return got


def scenario(body: Callable[[Harness], Awaitable[None]], rebalance_every: float = 0.05) -> None:
    """Run `body` against a dispatcher that serves, in a loop of its own."""

    async def main() -> None:
        h = Harness(rebalance_every)
        task = asyncio.create_task(h.dispatcher.serve())
        try:
            await body(h)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            h.dispatcher.close()
            # Every socket closed here, not left to the collector: an unclosed one warns (ResourceWarning)
            # in whichever later test the collector happens to run.
            for c in [*h.clients, *h.handed, *(ch.sock for ch in h.channels.values())]:
                c.close()
            h.dispatcher.sock.close()

    asyncio.run(main())


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


def peer_port(conn: socket.socket) -> int:
    return int(conn.getpeername()[1])


def test_nothing_listens_until_a_worker_is_ready() -> None:
    async def body(harness: Harness) -> None:
        harness.worker(0)
        await asyncio.sleep(0.1)
        with pytest.raises(ConnectionRefusedError):
            await harness.connect(1)
        harness.channels[0].start(no_shed)
        await until(lambda: harness.dispatcher.open_connections() == {0: 0}, "worker 0 never counted as ready")
        await asyncio.sleep(0.05)
        await harness.connect(1)
        taken = await harness.taken(0)
        assert [peer_port(c) for c in taken] == [harness.clients[0].getsockname()[1]]

    scenario(body)


def test_connections_split_evenly_and_only_over_ready_workers() -> None:
    async def body(harness: Harness) -> None:
        for slot in range(3):
            harness.worker(slot)
        harness.channels[0].start(no_shed)
        harness.channels[2].start(no_shed)  # worker 1 has not listed its SidecarSets yet
        await until(lambda: set(harness.dispatcher.open_connections()) == {0, 2}, "workers 0 and 2 not ready")
        await harness.connect(16)
        counts = {slot: len(await harness.taken(slot, within=0.5)) for slot in range(3)}
        assert counts == {0: 8, 1: 0, 2: 8}
        assert harness.dispatcher.open_connections() == {0: 8, 2: 8}
        registry = CollectorRegistry()
        registry.register(ConnectionsCollector(harness.dispatcher))
        exposed = generate_latest(registry).decode()
        assert 'sidecarctl_webhook_worker_connections{worker="0"} 8.0' in exposed
        assert 'sidecarctl_webhook_worker_connections{worker="2"} 8.0' in exposed
        assert 'worker="1"' not in exposed  # not ready: it holds nothing and is not counted

    scenario(body)


def test_a_worker_that_closes_connections_gets_the_next_ones() -> None:
    async def body(harness: Harness) -> None:
        await harness.ready(2)
        await harness.connect(8)
        held = {slot: await harness.taken(slot) for slot in range(2)}
        assert [len(held[0]), len(held[1])] == [4, 4]
        for conn in held[1][:3]:  # three of worker 1's connections end
            conn.close()
            harness.channels[1].closed()
        await until(lambda: harness.dispatcher.open_connections() == {0: 4, 1: 1}, "closes not counted")
        await harness.connect(4)
        # Three to worker 1 until both hold four, then the tie goes to the worker whose turn it is.
        assert (len(await harness.taken(0)), len(await harness.taken(1))) == (1, 3)
        assert harness.dispatcher.open_connections() == {0: 5, 1: 4}

    scenario(body)


def test_a_worker_that_dies_is_handed_nothing_more() -> None:
    async def body(harness: Harness) -> None:
        await harness.ready(2)
        harness.channels[0].sock.close()  # its process exits: the kernel closes its end
        await until(lambda: 0 not in harness.dispatcher.workers, "the dead worker was not detached")
        await harness.connect(6)
        assert len(await harness.taken(1)) == 6

    scenario(body)


def test_with_no_ready_worker_left_a_connection_is_closed_at_once() -> None:
    async def body(harness: Harness) -> None:
        harness.worker(0)
        harness.channels[0].start(no_shed)
        await until(lambda: harness.dispatcher.open_connections() == {0: 0}, "worker 0 not ready")
        harness.channels[0].sock.close()
        await until(lambda: not harness.dispatcher.workers, "the dead worker was not detached")
        await harness.connect(1)
        loop = asyncio.get_running_loop()
        received = await asyncio.wait_for(loop.sock_recv(harness.clients[0], 1), 2.0)
        assert received == b""  # closed by the supervisor, not left hanging in a queue

    scenario(body)


def test_the_worker_side_raises_once_the_supervisor_is_gone() -> None:
    async def body(harness: Harness) -> None:
        channel = harness.worker(0)
        harness.dispatcher.detach(0)
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(channel.accept(), 2.0)

    scenario(body)


def test_the_worker_holding_two_more_is_asked_to_shed_one_at_a_time() -> None:
    async def body(harness: Harness) -> None:
        sheds = {0: 0, 1: 0}
        await harness.ready(2, sheds)
        await harness.connect(8)
        held = {slot: await harness.taken(slot) for slot in range(2)}
        assert [len(held[0]), len(held[1])] == [4, 4]
        # The client closes three of worker 0's connections (kube-apiserver trims its idle pool).
        for conn in held[0][:3]:
            conn.close()
            harness.channels[0].closed()
        await until(lambda: harness.dispatcher.open_connections() == {0: 1, 1: 4}, "closes not counted")
        listening = asyncio.create_task(harness.channels[1].accept())  # reads what the supervisor sends
        await until(lambda: sheds[1] == 1, "worker 1 was not asked to shed a connection")
        await asyncio.sleep(0.3)
        assert sheds == {0: 0, 1: 1}  # one at a time: the next only once it has ended one
        held[1][0].close()
        harness.channels[1].closed()
        await until(lambda: sheds[1] == 2, "worker 1 was not asked again while it held two more")
        held[1][1].close()
        harness.channels[1].closed()
        await until(lambda: harness.dispatcher.open_connections() == {0: 1, 1: 2}, "closes not counted")
        await asyncio.sleep(0.3)
        assert sheds == {0: 0, 1: 2}  # 1 and 2: even enough
        listening.cancel()

    scenario(body)


def test_a_split_uneven_at_one_look_only_is_left_alone() -> None:
    async def body(harness: Harness) -> None:
        sheds = {0: 0, 1: 0}
        await harness.ready(2, sheds)
        listening = asyncio.create_task(harness.channels[1].accept())
        workers = harness.dispatcher.workers

        async def look(held: tuple[int, int]) -> None:
            workers[0].open, workers[1].open = held
            harness.dispatcher.rebalance()
            await asyncio.sleep(0.1)

        await look((0, 2))  # a close not yet reported makes a count high for a moment
        await look((1, 2))
        await look((0, 2))
        assert sheds == {0: 0, 1: 0}
        await look((0, 2))  # uneven at two looks in a row
        assert sheds == {0: 0, 1: 1}
        listening.cancel()

    scenario(body, rebalance_every=3600.0)  # looks are taken by hand here


def test_a_burst_of_connections_and_of_closes_loses_none() -> None:
    async def body(harness: Harness) -> None:
        harness.worker(0)
        harness.channels[0].start(no_shed)
        await until(lambda: harness.dispatcher.open_connections() == {0: 0}, "worker 0 not ready")
        await harness.connect(40)  # all handed before the worker reads one
        await until(lambda: harness.dispatcher.open_connections() == {0: 40}, "not all 40 handed")
        taken = await harness.taken(0)
        assert len(taken) == 40
        for conn in taken:  # all end at once: 40 reports queued before the supervisor reads one
            conn.close()
            harness.channels[0].closed()
        await until(lambda: harness.dispatcher.open_connections() == {0: 0}, "closes lost")

    scenario(body)
