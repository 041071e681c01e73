"""Hot reload proven with real TLS handshakes on 127.0.0.1.

The server is a plain `asyncio` TLS listener given `CertReloader.front_context` once, as hypercorn
does; clients trust only the CA. Handshake failures are counted, not tolerated.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest

from certwatcher import metrics
from certwatcher.reloader import CertReloader, CertReloadError
from certwatcher.tls import ServingPair
from tests.certutil import (
    Hammer,
    KeyPair,
    client_context,
    close,
    echo_server,
    handshake,
    make_ca,
    make_leaf,
    peer_serial,
    write_dir,
)

pytestmark = pytest.mark.serial  # bounds elapsed time: runs alone, not beside other tests

CA = make_ca("reload-ca")


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


@contextlib.asynccontextmanager
async def serving(reloader: CertReloader) -> AsyncIterator[int]:
    stop = asyncio.Event()
    task = asyncio.create_task(reloader.run(stop))
    try:
        async with echo_server(reloader.front_context) as server:
            yield server.port
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


def trusting_ca() -> ssl.SSLContext:
    return client_context(CA.cert_pem)


def fresh_dir(tmp_path: Path) -> tuple[Path, KeyPair]:
    cert_dir = tmp_path / "certs"
    leaf = make_leaf(CA)
    write_dir(cert_dir, leaf=leaf, ca_pem=CA.cert_pem)
    return cert_dir, leaf


def test_no_sni_and_sni_clients_get_the_cert_and_alpn(tmp_path: Path) -> None:
    cert_dir, leaf = fresh_dir(tmp_path)
    reloader = CertReloader(cert_dir, poll_interval=0.5)
    names: list[str | None] = []
    select = reloader.front_context.sni_callback
    assert select is not None

    def recording(obj: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> int | None:
        names.append(name)
        # typeshed types the name as str; a client without SNI gets None, as this test shows.
        return select(obj, name, ctx)  # type: ignore[arg-type]

    reloader.front_context.sni_callback = recording

    async def main() -> None:
        async with serving(reloader) as port:
            assert await reloader.wait_ready(2)
            by_ip = await handshake(port, trusting_ca(), server_hostname="127.0.0.1")
            by_name = await handshake(port, trusting_ca(), server_hostname="localhost")
            h11 = await handshake(port, client_context(CA.cert_pem, alpn=["http/1.1"]))
            none = await handshake(port, client_context(CA.cert_pem, alpn=[]))
        assert by_ip.serial == by_name.serial == leaf.serial
        assert (by_ip.alpn, by_name.alpn, h11.alpn, none.alpn) == ("h2", "h2", "http/1.1", None)

    run(main())
    # A client connecting to an IP address sends no SNI, and the callback still ran for it.
    assert names[0] is None and names[1] == "localhost"


def swap_under_load(tmp_path: Path, *, poll: float, events: float | None, bound: float) -> None:
    cert_dir, old = fresh_dir(tmp_path)
    reloader = CertReloader(cert_dir, poll_interval=poll, event_interval=events)

    async def main() -> None:
        async with serving(reloader) as port:
            assert await reloader.wait_ready(2)
            async with Hammer(port, {"ca": trusting_ca}, rate=20) as hammer:
                await asyncio.sleep(0.5)
                old_dir = os.readlink(cert_dir / "..data")
                new = make_leaf(CA)
                swapped_at = time.monotonic()
                write_dir(cert_dir, leaf=new, ca_pem=CA.cert_pem)
                seen = await hammer.wait_for_serial(new.serial, bound + 1.0)
                await asyncio.sleep(0.3)
            assert not (cert_dir / old_dir).exists()
        assert seen is not None, "new certificate never served"
        assert seen - swapped_at <= bound, f"served after {seen - swapped_at:.2f}s"
        assert hammer.failures == [], hammer.failures[:3]
        assert len(hammer.shots) >= 15
        assert {s.alpn for s in hammer.shots} == {"h2"}
        served = [s.serial for s in hammer.shots]
        assert served[0] == old.serial and served[-1] == new.serial

    run(main())


def test_symlink_swap_under_load_with_stamp_events(tmp_path: Path) -> None:
    # Content poll far away: only the 0.2 s stamp check can make the 1 s bound.
    swap_under_load(tmp_path, poll=30.0, events=0.2, bound=1.0)


def test_symlink_swap_under_load_content_poll_only(tmp_path: Path) -> None:
    swap_under_load(tmp_path, poll=0.4, events=None, bound=2 * 0.4)


def test_half_written_pair_keeps_old_cert_serving(tmp_path: Path) -> None:
    cert_dir, old = fresh_dir(tmp_path)
    reloader = CertReloader(cert_dir, poll_interval=0.2, event_interval=0.05)
    errors_before = metrics.CERT_RELOAD_ERRORS.labels(reason="key_mismatch")._value.get()

    async def main() -> None:
        async with serving(reloader) as port:
            assert await reloader.wait_ready(2)
            async with Hammer(port, {"ca": trusting_ca}, rate=20) as hammer:
                new = make_leaf(CA)
                (cert_dir / "tls.crt").write_bytes(new.cert_pem)  # in place, key not yet
                await asyncio.sleep(0.8)  # several polls and past the stamp's hot window
                assert {s.serial for s in hammer.shots} == {old.serial}
                assert reloader.errors.get("key_mismatch") == 1  # one line, not one per poll
                assert metrics.CERT_RELOAD_FAILING._value.get() == 1, "failing while the pair is refused"
                (cert_dir / "tls.key").write_bytes(new.key_pem)
                seen = await hammer.wait_for_serial(new.serial, 2.0)
                assert metrics.CERT_RELOAD_FAILING._value.get() == 0, "a served pair ends the failure"
                await asyncio.sleep(0.2)
            assert seen is not None
            assert hammer.failures == []

    run(main())
    assert metrics.CERT_RELOAD_ERRORS.labels(reason="key_mismatch")._value.get() >= errors_before + 1


def test_a_refused_change_put_back_ends_the_failure(tmp_path: Path) -> None:
    cert_dir, _ = fresh_dir(tmp_path)
    reloader = CertReloader(cert_dir, poll_interval=0.2, event_interval=0.05)
    assert reloader.reload_now()
    served_cert = (cert_dir / "tls.crt").read_bytes()
    (cert_dir / "tls.crt").write_bytes(make_leaf(CA).cert_pem)  # key not matching
    assert not reloader.reload_now()
    assert metrics.CERT_RELOAD_FAILING._value.get() == 1
    (cert_dir / "tls.crt").write_bytes(served_cert)
    assert not reloader.reload_now(), "nothing new to serve"
    assert metrics.CERT_RELOAD_FAILING._value.get() == 0


def test_files_moved_out_then_back(tmp_path: Path) -> None:
    cert_dir, old = fresh_dir(tmp_path)
    reloader = CertReloader(cert_dir, poll_interval=0.2, event_interval=0.05)

    async def main() -> None:
        async with serving(reloader) as port:
            assert await reloader.wait_ready(2)
            async with Hammer(port, {"ca": trusting_ca}, rate=20) as hammer:
                (cert_dir / "tls.crt").unlink()
                (cert_dir / "tls.key").unlink()
                await asyncio.sleep(0.6)
                assert reloader.errors.get("missing") == 1
                new = make_leaf(CA)
                (cert_dir / "tls.crt").write_bytes(new.cert_pem)
                (cert_dir / "tls.key").write_bytes(new.key_pem)
                seen = await hammer.wait_for_serial(new.serial, 2.0)
            assert seen is not None
            assert hammer.failures == []
            assert {s.serial for s in hammer.shots} == {old.serial, new.serial}

    run(main())


def test_connection_opened_before_swap_keeps_working(tmp_path: Path) -> None:
    cert_dir, old = fresh_dir(tmp_path)
    reloader = CertReloader(cert_dir, poll_interval=0.2, event_interval=0.05)

    async def main() -> None:
        async with serving(reloader) as port:
            assert await reloader.wait_ready(2)
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=trusting_ca(), server_hostname="127.0.0.1"
            )
            try:
                writer.write(b"before\n")
                assert await reader.readline() == b"before\n"
                new = make_leaf(CA)
                write_dir(cert_dir, leaf=new, ca_pem=CA.cert_pem)
                deadline = time.monotonic() + 2
                while reloader.current is None or reloader.current.serial != new.serial:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                fresh = await handshake(port, trusting_ca())
                assert fresh.serial == new.serial and fresh.alpn == "h2"
                writer.write(b"after\n")
                assert await reader.readline() == b"after\n"
                assert peer_serial(writer) == old.serial
            finally:
                await close(writer)

    run(main())


def test_missing_dir_at_start_is_waited_for(tmp_path: Path) -> None:
    cert_dir = tmp_path / "later"
    reloader = CertReloader(cert_dir, poll_interval=5.0, event_interval=0.05)
    with pytest.raises(CertReloadError, match="not found") as info:
        reloader.load_initial()
    assert info.value.reason == "missing"

    async def main() -> None:
        async with serving(reloader) as port:
            await asyncio.sleep(0.2)
            assert not reloader.ready
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await handshake(port, trusting_ca())
            leaf = make_leaf(CA)
            write_dir(cert_dir, leaf=leaf, ca_pem=CA.cert_pem)
            assert await reloader.wait_ready(1.0)
            assert (await handshake(port, trusting_ca())).serial == leaf.serial

    run(main())


def test_untrusted_pair_is_refused_and_callback_sees_only_good_pairs(tmp_path: Path) -> None:
    cert_dir, leaf = fresh_dir(tmp_path)
    seen: list[ServingPair] = []
    reloader = CertReloader(cert_dir, on_reload=seen.append)
    reloads_before = metrics.CERT_RELOADS._value.get()
    assert reloader.load_initial().serial == leaf.serial
    assert metrics.SERVING_CERT_EXPIRY._value.get() == leaf.cert.not_valid_after_utc.timestamp()
    assert metrics.CA_CERT_EXPIRY._value.get() == CA.cert.not_valid_after_utc.timestamp()

    stranger = make_leaf(make_ca("stranger"))
    write_dir(cert_dir, leaf=stranger, ca_pem=CA.cert_pem)
    assert reloader.reload_now() is False
    assert reloader.reload_now() is False  # same content: counted once
    assert reloader.errors == {"untrusted": 1}
    assert reloader.current is not None and reloader.current.serial == leaf.serial
    assert [p.serial for p in seen] == [leaf.serial]
    assert metrics.CERT_RELOADS._value.get() == reloads_before + 1


def test_bad_intervals_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        CertReloader(tmp_path, poll_interval=0)
    with pytest.raises(ValueError, match="event_interval"):
        CertReloader(tmp_path, event_interval=-1)
