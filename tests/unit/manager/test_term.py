"""Leadership terms on the warm caches (sidecarctl.manager.warm, sidecarctl.manager.term), against
watches served as kube-apiserver's watch cache serves them (tests/kube/fakewatch.py).

The rule under test: a replica that wins the Lease plans only from caches caught up with a quorum
read made after it won, whatever its watches missed while it stood by, and it carries nothing a
term decided into the next term.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from kuberuntime.events import EventRecorder
from sidecarctl.manager import term as term_mod
from sidecarctl.manager.options import ManagerOptions
from sidecarctl.manager.warm import WarmCaches
from sidecarsets.controller.controller import SS_PATH
from sidecarsets.spec import names
from tests.kube.builders import injected_pod, shop_sidecarset
from tests.kube.fakeapi import FakeApiServer

NS = "shop"
PODS = "/api/v1/pods"
SECOND = 0.01  # one watch-cache second, in real seconds (tests/kube/fakewatch.py)
V1 = shop_sidecarset()


def pod_path(name: str) -> str:
    return f"/api/v1/namespaces/{NS}/pods/{name}"


def cluster(pods: int = 3) -> FakeApiServer:
    server = FakeApiServer()
    server.serve_watches(second=SECOND)
    labels = {names.NS_NAME_LABEL: NS, names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
    server.put(f"/api/v1/namespaces/{NS}", {"metadata": {"name": NS, "labels": labels}})
    server.put(f"{SS_PATH}/{V1['metadata']['name']}", V1)
    for i in range(pods):
        server.put(pod_path(f"p{i}"), injected_pod(f"p{i}", V1))
    return server


def wiring(server: FakeApiServer) -> term_mod.Wiring:
    opts = ManagerOptions.build(namespace="sidecarctl-system", watch_timeout=4000)  # no bookmark of its own
    return term_mod.Wiring(opts, server, server, EventRecorder(server), None)  # type: ignore[arg-type]


def standing_by(server: FakeApiServer, body: Callable[[WarmCaches], Awaitable[None]]) -> None:
    """The caches of a standby on `server`, synced, while `body` runs."""

    async def main() -> None:
        caches = WarmCaches(server, wiring(server).opts)  # type: ignore[arg-type]
        stop = asyncio.Event()
        task = asyncio.create_task(caches.run(stop))
        try:
            await asyncio.wait_for(caches.synced(), timeout=5)
            await body(caches)
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=2)

    asyncio.run(main())


def keys(pods: Any) -> set[str]:
    return set(pods)


def test_a_standby_that_missed_changes_plans_only_once_its_caches_hold_them() -> None:
    server = cluster()
    assert server.watches is not None

    async def body(caches: WarmCaches) -> None:
        assert server.watches is not None
        while not server.watches.open(PODS):
            await asyncio.sleep(SECOND)
        server.watches.stall(PODS)  # partitioned: its pod watch delivers nothing more
        await server.delete(pod_path("p1"))
        server.put(pod_path("p3"), injected_pod("p3", V1))
        changed = server.resource_version
        await asyncio.sleep(20 * SECOND)
        assert keys(caches.pods.store) == {f"{NS}/p0", f"{NS}/p1", f"{NS}/p2"}, "the stall did not hold it back"
        term = await asyncio.wait_for(term_mod.start(wiring(server), caches, None), timeout=2)
        try:
            assert keys(term.controller.pods) == {f"{NS}/p0", f"{NS}/p2", f"{NS}/p3"}
            assert keys(term.controller.pods_by_ss[V1["metadata"]["name"]]) == keys(term.controller.pods)
            assert term.caught_up["pods"] >= changed
        finally:
            await term_mod.end(term, caches)

    standing_by(server, body)
    ours = [(verb, path) for verb, path in server.calls if verb != "get" and path != pod_path("p1")]
    assert not ours, f"a standby wrote: {ours}"


def test_a_new_term_carries_nothing_the_last_one_decided() -> None:
    server = cluster()

    async def body(caches: WarmCaches) -> None:
        first = await term_mod.start(wiring(server), caches, None)
        # What a term decides from: a patch whose answer its watch never delivered, a pod backing off.
        first.controller.expected[f"{NS}/p0"] = 10**9
        first.controller.failures.failed(f"{NS}/p1", "422 Invalid: refused")
        await term_mod.end(first, caches)
        server.put(pod_path("p3"), injected_pod("p3", V1))
        while f"{NS}/p3" not in caches.pods.store:
            await asyncio.sleep(SECOND)
        assert f"{NS}/p3" not in first.controller.pods, "an ended term still hears the watches"
        second = await term_mod.start(wiring(server), caches, None)
        try:
            assert second.controller is not first.controller
            assert second.controller.expected == {}
            assert f"{NS}/p1" not in second.controller.failures
            assert keys(second.controller.pods) == {f"{NS}/p{i}" for i in range(4)}
            assert set(second.controller.sidecarsets) == {V1["metadata"]["name"]}
        finally:
            await term_mod.end(second, caches)

    standing_by(server, body)
