"""The webhook port's connections send without Nagle's delay.

An answer goes out as two TLS records (headers, then body); with Nagle on, the second waits for
the client's delayed ACK, ~40 ms a request, which capped the webhook at 16 connections / 44 ms =
360 requests/s whatever the work. asyncio sets TCP_NODELAY only on sockets whose proto is
IPPROTO_TCP, which an accepted socket inherits from the listening one: both are checked here.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from certwatcher.reloader import CertReloader
from injector.http import server
from injector.http.server import Limits, Listener
from sidecarctl.manager.listeners import listen
from tests import certutil
from tests.kube.asgiapps import ok_app


def test_the_listening_socket_is_tcp_so_accepted_ones_get_nodelay() -> None:
    sock = listen("127.0.0.1:0")
    try:
        assert sock.proto == socket.IPPROTO_TCP
        client = socket.create_connection(sock.getsockname())
        conn, _ = sock.accept()
        with client, conn:
            assert conn.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_a_served_connection_has_tcp_nodelay(monkeypatch: Any) -> None:
    seen: list[int] = []
    original = Listener._serve_tls

    async def spy(self: Listener, conn: socket.socket, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        seen.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        await original(self, conn, loop, deadline)

    monkeypatch.setattr(server.Listener, "_serve_tls", spy)
    ca = certutil.make_ca()
    leaf = certutil.make_leaf(ca)
    cert_dir = Path(tempfile.mkdtemp(prefix="nodelay-"))
    certutil.write_dir(cert_dir, leaf=leaf, ca_pem=ca.cert_pem)
    reloader = CertReloader(str(cert_dir))
    reloader.reload_now()
    shutil.rmtree(cert_dir)  # loaded into memory; nothing re-reads it in this test

    async def main() -> None:
        sock = listen("127.0.0.1:0")
        port = sock.getsockname()[1]
        stop = asyncio.Event()
        task = asyncio.create_task(Listener(ok_app, sock, reloader.front_context, Limits()).serve(stop))
        context = certutil.client_context(ca.cert_pem, alpn=("http/1.1",))
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
        writer.write(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        writer.close()
        stop.set()
        await task

    asyncio.run(main())
    assert seen and all(v != 0 for v in seen), seen
