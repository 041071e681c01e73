"""The webhook port's SO_REUSEPORT group: the kernel spreads connections over the workers' sockets,
and a socket that is bound but not listening (a worker not yet ready) gets none."""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Iterator

import pytest

from sidecarctl.manager.probes import bind_group


@contextlib.contextmanager
def group(count: int) -> Iterator[tuple[list[socket.socket], int]]:
    socks = bind_group("127.0.0.1:0", count)
    try:
        yield socks, socks[0].getsockname()[1]
    finally:
        for s in socks:
            s.close()


def accepted_per_socket(socks: list[socket.socket], port: int, count: int) -> list[int]:
    """Open `count` connections to `port`; how many each of `socks` (listening or not) accepted."""
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]
    try:
        return [accepted(s) if s.fileno() >= 0 else 0 for s in socks]
    finally:
        for c in clients:
            c.close()


def accepted(sock: socket.socket) -> int:
    """Connections waiting in `sock`'s accept queue (accepted here and closed); 0 unless it listens."""
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return 0
    sock.setblocking(False)
    n = 0
    while select.select([sock], [], [], 0.2)[0]:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            break
        conn.close()
        n += 1
    return n


def test_every_socket_of_a_group_is_bound_to_the_same_port() -> None:
    with group(3) as (socks, port):
        assert port != 0
        assert {s.getsockname()[1] for s in socks} == {port}


def test_a_group_that_nobody_listens_on_refuses_connections() -> None:
    with group(2) as (_, port), pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_only_the_listening_socket_gets_connections_while_the_other_is_merely_bound() -> None:
    with group(2) as (socks, port):
        socks[0].listen(64)
        assert accepted_per_socket(socks, port, 16) == [16, 0]


def test_connections_are_spread_over_the_listening_sockets() -> None:
    with group(2) as (socks, port):
        for s in socks:
            s.listen(128)
        counts = accepted_per_socket(socks, port, 64)
        assert sum(counts) == 64
        # A hash of each connection's ports: all 64 on one socket has a chance of 2 in 2**64.
        assert min(counts) >= 8, counts


def test_a_closed_socket_leaves_its_share_to_the_others() -> None:
    with group(2) as (socks, port):
        for s in socks:
            s.listen(128)
        socks[1].close()
        assert accepted_per_socket(socks, port, 16) == [16, 0]
