"""CA rotation end to end inside one process: cert dir -> CertReloader -> CABundleSyncer -> (fake) API,
with real TLS clients that trust only what was published. The old CA is short-lived for real (a few
seconds) so that its departure from the bundle is observed, not simulated."""

from __future__ import annotations

import asyncio
import ssl
import time
from datetime import timedelta
from pathlib import Path

import pytest

from cabundle.syncer import CABundleSyncer, WebhookConfigRef
from certwatcher import pem
from certwatcher.reloader import CertReloader
from tests.certutil import (
    MWC_PATH,
    Hammer,
    bundle_of,
    client_context,
    echo_server,
    make_ca,
    make_leaf,
    now,
    pems,
    webhook_config,
    write_dir,
)
from tests.kube.fakeapi import FakeApiServer

pytestmark = pytest.mark.serial  # bounds elapsed time: runs alone, not beside other tests

MWC = f"{MWC_PATH}/sidecarctl-injector"


def published_serials(api: FakeApiServer) -> set[int]:
    return {c.serial_number for c in pem.certificates(bundle_of(api.objects[MWC]))}


async def until(predicate: object, timeout: float) -> float:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
    return time.monotonic()


def test_ca_rotation_with_overlap(tmp_path: Path) -> None:
    t0 = now()
    ca1 = make_ca("ca-1", not_before=t0 - timedelta(minutes=1), not_after=t0 + timedelta(seconds=4))
    ca2 = make_ca("ca-2", lifetime=timedelta(days=30))
    leaf1 = make_leaf(ca1, not_after=ca1.cert.not_valid_after_utc)
    leaf2 = make_leaf(ca2)
    leaf3 = make_leaf(ca2)
    cert_dir = tmp_path / "certs"
    write_dir(cert_dir, leaf=leaf1, ca_pem=pems(ca1))

    api = FakeApiServer()
    api.put(MWC, webhook_config("mutating", "sidecarctl-injector", ["inject.sidecarctl.io"]))
    syncer = CABundleSyncer(api, configs=[WebhookConfigRef("mutating", "sidecarctl-injector")], resync_interval=0.2)
    reloader = CertReloader(
        cert_dir, poll_interval=1.0, event_interval=0.05, on_reload=lambda pair: syncer.set_local_ca(pair.ca_pem)
    )

    def published() -> ssl.SSLContext:
        return client_context(bundle_of(api.objects[MWC]))

    async def main() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(reloader.run(stop)), asyncio.create_task(syncer.run(stop))]
        async with echo_server(reloader.front_context) as server:
            await until(lambda: published_serials(api) == {ca1.serial}, 2)
            b1 = bundle_of(api.objects[MWC])
            async with Hammer(server.port, {"published": published, "b1": lambda: client_context(b1)}) as hammer:
                await asyncio.sleep(0.3)

                # Phase 1: the new CA joins ca.crt; the leaf from the old CA keeps serving.
                write_dir(cert_dir, leaf=leaf1, ca_pem=pems(ca2, ca1))
                await until(lambda: published_serials(api) == {ca1.serial, ca2.serial}, 1.5)
                b2 = bundle_of(api.objects[MWC])
                hammer.clients["b2"] = lambda: client_context(b2)
                await asyncio.sleep(0.4)
                assert {s.serial for s in hammer.shots} == {leaf1.serial}
                writes_before_leaf_change = syncer.write_count

                # Phase 2: leaf re-signed by the new CA; the bundle already has it, so no write.
                del hammer.clients["b1"]  # B1 is no longer what anyone publishes
                await asyncio.sleep(0.1)
                write_dir(cert_dir, leaf=leaf2, ca_pem=pems(ca2, ca1))
                await hammer.wait_for_serial(leaf2.serial, 1.5)
                # A leaf rotation under the same CA is also free.
                write_dir(cert_dir, leaf=leaf3, ca_pem=pems(ca2))
                await hammer.wait_for_serial(leaf3.serial, 1.5)
                assert syncer.write_count == writes_before_leaf_change

                # The old CA stays published until it expires, then goes (same object, one write).
                while time.time() < ca1.cert.not_valid_after_utc.timestamp():
                    assert ca1.serial in published_serials(api)
                    await asyncio.sleep(0.05)
                await until(lambda: published_serials(api) == {ca2.serial}, 1.5)
                await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*tasks)

        assert hammer.failures == [], hammer.failures[:3]
        by_client = {name: {s.serial for s in hammer.shots if s.client == name} for name in ("b1", "b2", "published")}
        assert by_client["b1"] == {leaf1.serial}
        assert by_client["b2"] >= {leaf1.serial, leaf2.serial, leaf3.serial}
        assert len([s for s in hammer.shots if s.client == "b1"]) >= 10
        assert syncer.write_count == 3  # CA1 published, CA2 added, CA1 removed after expiry

    asyncio.run(main())
