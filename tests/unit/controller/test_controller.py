"""Controller bookkeeping that decides whether planning may run on the cache: expectations."""

from __future__ import annotations

import asyncio
from typing import Any

from kuberuntime.events import EventRecorder
from sidecarsets.controller.controller import Controller
from sidecarsets.controller.podwrites import POD_WRITES_IN_FLIGHT
from sidecarsets.pods.projection import project
from sidecarsets.rollout.planner import PodUpgrade
from sidecarsets.spec import names
from tests.kube import builders


def pod(rv: str) -> dict[str, Any]:
    """Pod shop/web-1 at resourceVersion `rv`, injected by `mesh`."""
    return builders.pod(
        "web-1",
        namespace="shop",
        labels={names.POD_INJECTED_LABEL: "true"},
        annotations={names.ANN_INJECTED_LIST: "mesh"},
        containers=[builders.container("proxy", "proxy:1")],
        metadata={"uid": "u1", "resourceVersion": rv},
    )


class FakeClient:
    """Answers a pod patch with resourceVersion 10, optionally delivering the watch event first."""

    def __init__(self, controller_ref: list[Controller], *, watch_first: bool) -> None:
        self.ref = controller_ref
        self.watch_first = watch_first
        self.patches: list[str] = []

    async def patch(self, path: str, body: Any, *, patch_type: str = "merge", params: Any = None) -> dict[str, Any]:
        self.patches.append(path)
        written = pod("10")
        if self.watch_first:
            self.ref[0].on_pod("MODIFIED", project(pod("5")), project(written))
        return written


def controller(watch_first: bool) -> tuple[Controller, FakeClient]:
    ref: list[Controller] = []
    client = FakeClient(ref, watch_first=watch_first)
    c = Controller(
        client,  # type: ignore[arg-type]
        namespace="sidecarctl-system",
        namespaces=lambda: {},
        recorder=EventRecorder(client),  # type: ignore[arg-type]
    )
    ref.append(c)
    c.on_pod("ADDED", None, project(pod("5")))
    return c, client


UPGRADE = PodUpgrade("shop", "web-1", "u1", "5", [{"op": "test", "path": "/metadata/resourceVersion", "value": "5"}])


def test_expectation_waits_for_the_watch_and_clears_on_it() -> None:
    c, client = controller(watch_first=False)
    assert asyncio.run(c._patch_pod(UPGRADE))
    assert client.patches == ["/api/v1/namespaces/shop/pods/web-1"]
    assert c.expected == {"shop/web-1": 10}
    c.on_pod("MODIFIED", project(pod("5")), project(pod("10")))
    assert c.expected == {}


def test_a_watch_event_that_beats_the_response_leaves_nothing_to_wait_for() -> None:
    c, _ = controller(watch_first=True)
    assert asyncio.run(c._patch_pod(UPGRADE))
    assert c.expected == {}, "planning would wait for an event that has already arrived"


def test_deleted_pod_drops_its_expectation() -> None:
    c, _ = controller(watch_first=False)
    asyncio.run(c._patch_pod(UPGRADE))
    c.on_pod("DELETED", project(pod("10")), None)
    assert c.expected == {} and c.pods == {}


def named(name: str, rv: str, injected: str) -> dict[str, Any]:
    p = pod(rv)
    p["metadata"].update(name=name, uid=f"u-{name}")
    p["metadata"]["annotations"][names.ANN_INJECTED_LIST] = injected
    return p


def test_a_sidecarsets_pods_come_in_the_order_first_seen_with_their_latest_projection() -> None:
    c, _ = controller(watch_first=False)
    for n in ("b", "a", "c"):
        c.on_pod("ADDED", None, project(named(n, "5", "mesh")))
    newer = project(named("a", "6", "mesh"))
    c.on_pod("MODIFIED", project(named("a", "5", "mesh")), newer)
    assert [p.name for p in c._pods_of("mesh")] == ["web-1", "b", "a", "c"]
    assert c._pods_of("mesh")[2] is newer
    c.on_pod("MODIFIED", newer, project(named("a", "7", "other")))
    assert [p.name for p in c._pods_of("mesh")] == ["web-1", "b", "c"]
    assert [p.name for p in c._pods_of("other")] == ["a"]
    c.on_pod("DELETED", project(named("b", "5", "mesh")), None)
    assert [p.name for p in c._pods_of("mesh")] == ["web-1", "c"]


def test_an_old_object_that_disagrees_with_the_cache_leaves_no_stale_pod_behind() -> None:
    """A pod is filed under what the projection held here says too, not only the informer's old object."""
    c, _ = controller(watch_first=False)
    c.on_pod("MODIFIED", project(named("web-1", "5", "other")), project(named("web-1", "6", "other")))
    assert c._pods_of("mesh") == [] and [p.name for p in c._pods_of("other")] == ["web-1"]


def test_a_rollout_of_many_pods_keeps_at_most_half_the_client_pool_busy() -> None:
    """A rollout at maxUnavailable 100% plans every pod at once. Sent all at once, 10,000 patches
    queued on the client's 64-connection pool, which the Lease renewal and the policy sync share,
    and the queued requests outlived the client's timeout: the writes go 32 at a time."""
    c, client = controller(watch_first=False)
    in_flight, most = 0, 0

    async def slow_patch(path: str, body: Any, *, patch_type: str = "merge", params: Any = None) -> dict[str, Any]:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        client.patches.append(path)
        return pod("10")

    client.patch = slow_patch  # type: ignore[method-assign]
    upgrades = [
        PodUpgrade(
            "shop", f"web-{i}", f"u{i}", "5", [{"op": "test", "path": "/metadata/resourceVersion", "value": "5"}]
        )
        for i in range(200)
    ]

    async def go() -> list[bool]:
        return await asyncio.gather(*(c._patch_pod(u) for u in upgrades))

    assert all(asyncio.run(go()))
    assert len(client.patches) == 200
    assert most == POD_WRITES_IN_FLIGHT == 32
