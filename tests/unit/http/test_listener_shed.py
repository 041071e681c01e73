"""A listener asked to shed a connection ends one HTTP/1.1 connection after its next response,
saying so (`Connection: close`), so its client never sends on it again and reconnects."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from certwatcher.reloader import CertReloader
from injector.http.server import Limits, Listener
from sidecarctl.manager.listeners import listen
from tests import certutil
from tests.kube.asgiapps import ok_app


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    """One request on a keep-alive connection: the response head, its body read."""
    writer.write(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return head.lower()


def test_a_shed_connection_ends_after_its_next_response_and_the_others_stay() -> None:
    ca = certutil.make_ca()
    cert_dir = Path(tempfile.mkdtemp(prefix="shed-"))
    certutil.write_dir(cert_dir, leaf=certutil.make_leaf(ca), ca_pem=ca.cert_pem)
    reloader = CertReloader(str(cert_dir))
    reloader.reload_now()
    shutil.rmtree(cert_dir)

    async def main() -> None:
        sock = listen("127.0.0.1:0")
        port = sock.getsockname()[1]
        stop = asyncio.Event()
        listener = Listener(ok_app, sock, reloader.front_context, Limits())
        task = asyncio.create_task(listener.serve(stop))
        context = certutil.client_context(ca.cert_pem, alpn=("http/1.1",))
        conns = [
            await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost") for _ in range(2)
        ]
        for reader, writer in conns:
            assert b"connection: close" not in await ask(reader, writer)
        listener.shed_one()
        first, second = conns
        assert b"connection: close" in await ask(*first)
        assert await asyncio.wait_for(first[0].read(), 5) == b""  # the server ended it
        for _ in range(3):  # one connection was asked for, one was shed
            assert b"connection: close" not in await ask(*second)
        assert listener.connections == 1
        second[1].close()
        stop.set()
        await task

    asyncio.run(main())
