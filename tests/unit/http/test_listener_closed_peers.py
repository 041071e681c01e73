"""Connections whose client completes TLS and closes without a request end at once.

hypercorn's TCPServer waits for its keep-alive timer (75 s) before it ends such a connection, so
each one held a TLS slot that long: a TLS health check at 20 connections a second filled the 256
slots in ~25 s, after which no handshake completed. Here the real Listener serves on the test's
event loop and the clients are blocking sockets on other threads, overlapping as a health
checker's connections do.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from certwatcher.reloader import CertReloader
from certwatcher.tls import HTTP1_ONLY
from injector.http.server import Limits, Listener
from sidecarctl.manager.listeners import listen
from tests import certutil
from tests.kube.asgiapps import ok_app

pytestmark = pytest.mark.serial  # bounds elapsed time: runs alone, not beside other tests

SLOTS = 8


def _handshake_and_close(port: int, ctx: ssl.SSLContext) -> None:
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        tls = ctx.wrap_socket(raw, server_hostname="localhost")
        with contextlib.suppress(OSError, ssl.SSLError):
            tls.unwrap()
    finally:
        raw.close()


def _requests(port: int, ctx: ssl.SSLContext, *, pause: float = 0.0) -> list[bytes]:
    """Two requests on one keep-alive connection, `pause` seconds apart; the status lines."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=3) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        lines = []
        for i in range(2):
            if i:
                time.sleep(pause)
            tls.sendall(b"GET / HTTP/1.1\r\nhost: localhost\r\n\r\n")
            data = b""
            while not data.endswith(b"ok"):
                chunk = tls.recv(4096)
                if not chunk:
                    break
                data += chunk
            lines.append(data.split(b"\r\n", 1)[0])
        return lines


def _run(clients: Callable[[int, ssl.SSLContext], Any]) -> tuple[Any, list[int]]:
    """Serve on this loop while `clients(port, ctx)` runs on a thread; also Listener.connections, sampled."""
    ca = certutil.make_ca()
    cert_dir = Path(tempfile.mkdtemp(prefix="closed-peers-"))
    certutil.write_dir(cert_dir, leaf=certutil.make_leaf(ca), ca_pem=ca.cert_pem)
    reloader = CertReloader(str(cert_dir), alpn=HTTP1_ONLY)
    reloader.reload_now()
    shutil.rmtree(cert_dir)  # loaded into memory; nothing re-reads it in this test
    ctx = certutil.client_context(ca.cert_pem, alpn=("h2", "http/1.1"))

    async def main() -> tuple[Any, list[int]]:
        sock = listen("127.0.0.1:0")
        listener = Listener(ok_app, sock, reloader.front_context, Limits(max_tls_connections=SLOTS))
        stop = asyncio.Event()
        task = asyncio.create_task(listener.serve(stop))
        try:
            result = await asyncio.to_thread(clients, sock.getsockname()[1], ctx)
            samples = []
            for _ in range(20):  # 2 s
                samples.append(listener.connections)
                await asyncio.sleep(0.1)
            return result, samples
        finally:
            stop.set()
            await task
            sock.close()

    return asyncio.run(main())


def _many(port: int, ctx: ssl.SSLContext, count: int = 60) -> list[str]:
    """`count` handshake-only connections started 20 ms apart; the errors the clients saw."""
    errors = []
    with ThreadPoolExecutor(8) as pool:
        futures = []
        for _ in range(count):
            futures.append(pool.submit(_handshake_and_close, port, ctx))
            time.sleep(0.02)
        for f in futures:
            try:
                f.result()
            except (OSError, ssl.SSLError) as e:
                errors.append(f"{type(e).__name__}: {e}")
    return errors


def test_handshake_only_connections_end_within_a_second_of_the_client_closing() -> None:
    errors, samples = _run(_many)
    assert errors == []
    assert samples[10:] == [0] * 10, samples  # none left open 1 s after the last client closed


def test_handshake_only_connections_never_use_up_the_tls_slots() -> None:
    def many_then_a_request(port: int, ctx: ssl.SSLContext) -> tuple[list[str], list[bytes], float]:
        errors = _many(port, ctx)
        started = time.monotonic()
        lines = _requests(port, ctx)
        return errors, lines, time.monotonic() - started

    (errors, lines, took), _ = _run(many_then_a_request)
    assert errors == [], f"{SLOTS} TLS slots held by closed connections: {errors[:3]}"
    assert lines == [b"HTTP/1.1 200 "] * 2
    assert took < 2.0


def test_an_idle_keep_alive_connection_stays_open_past_the_grace() -> None:
    # Longer than the grace given to a connection whose socket is gone: a live one is not cut.
    lines, _ = _run(lambda port, ctx: _requests(port, ctx, pause=1.5))
    assert lines == [b"HTTP/1.1 200 "] * 2
