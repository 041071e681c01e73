"""The Lease read before a reconcile's writes (sidecarsets.controller.leasereads): one per reconcile,
begun with the planning on a term's first look at an unfinished rollout, and none where nothing is
written.

Why these matter: each read is a request the first patch of a takeover waits for (0.3-0.6 s under
load at 10,000 pods), and a read per pass would be a request per pod event during a rollout.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kuberuntime.events import EventRecorder
from sidecarsets.controller.controller import RESYNC_SECONDS, SS_PATH, Controller
from sidecarsets.pods.projection import project
from tests.unit.controller.test_controller_reconcile import MANAGER_NS, NS, V1, V2, Rig


class Lease:
    """The elector's `confirm` as the controller sees it: counts the reads and notes how many API
    calls the reconcile had made when each began."""

    def __init__(self, rig: Rig, held: bool = True) -> None:
        self.rig = rig
        self.held = held
        self.began_after_calls: list[int] = []

    async def confirm(self) -> bool:
        self.began_after_calls.append(len(self.rig.api.calls))
        await asyncio.sleep(0.01)  # a request on its way, while the reconcile goes on
        return self.held


def watched(rig: Rig, lease: Lease) -> Lease:
    rig.controller.lease.may_write = lease.confirm
    return lease


def new_term(rig: Rig) -> None:
    """A new leader's controller over the same API server, fed what its caches hold."""
    rig.controller = Controller(
        rig.api,
        namespace=MANAGER_NS,
        namespaces=lambda: {NS: {"kubernetes.io/metadata.name": NS, "sidecar-injection": "enabled"}},
        recorder=EventRecorder(rig.api),
        clock=lambda: "2024-06-01T12:00:00Z",
        pod_pace=0.0,
    )
    for path, obj in list(rig.api.objects.items()):
        if path.startswith(SS_PATH):
            rig.controller.on_sidecarset("ADDED", None, obj)
    for path, obj in list(rig.api.objects.items()):
        if "/pods/" in path:
            rig.controller.on_pod("ADDED", None, project(obj))


def test_a_reconcile_that_writes_its_status_and_patches_pods_reads_the_lease_once() -> None:
    rig = Rig(V2)
    rig.deliver = False
    lease = watched(rig, Lease(rig))
    assert rig.reconcile() is None
    assert rig.status_writes() and rig.patched_pods() == ["p0"], "this reconcile writes both"
    assert len(lease.began_after_calls) == 1, "a Lease read for each write of one reconcile"


def with_latency(rig: Rig, seconds: float = 0.01) -> None:
    """Reads that take a moment on the network, as real ones do (the fake API answers at once)."""
    get = rig.api.get

    async def slow_get(path: str, **kw: Any) -> Any:
        await asyncio.sleep(seconds)
        return await get(path, **kw)

    rig.api.get = slow_get  # type: ignore[method-assign]


def test_a_terms_first_look_at_an_unfinished_rollout_reads_the_lease_before_its_first_write() -> None:
    rig = Rig(V2)
    rig.deliver = False
    with_latency(rig)
    lease = watched(rig, Lease(rig))
    assert rig.reconcile() is None
    first_write = next(i for i, (verb, _) in enumerate(rig.api.calls) if verb != "get")
    assert len(lease.began_after_calls) == 1
    assert lease.began_after_calls[0] <= first_write, "the read waited for the revision history's writes"
    # The same term again: its own patch is not in the cache yet, so it writes nothing and reads nothing.
    assert rig.reconcile() == 0.5
    assert len(lease.began_after_calls) == 1, "a Lease read by a reconcile that wrote nothing"
    # The next wave: read when it is about to write, after its other requests.
    rig.deliver = True
    rig.redeliver()
    rig.kubelet("p0")
    rig.deliver = False
    reads = len(lease.began_after_calls)
    calls = len(rig.api.calls)
    assert rig.reconcile() is None
    assert rig.patched_pods() == ["p0", "p1"]
    assert len(lease.began_after_calls) == reads + 1
    assert lease.began_after_calls[-1] >= calls


def test_a_new_term_reads_nothing_for_a_finished_rollout_it_has_nothing_to_write_for() -> None:
    rig = Rig(V1)
    assert rig.reconcile() is None  # the first leader writes the status: every pod is updated
    status = rig.api.objects[f"{SS_PATH}/mesh"]["status"]
    assert status["updatedPods"] == status["matchedPods"] == 3
    new_term(rig)
    lease = watched(rig, Lease(rig))
    writes = len(rig.api.writes())
    assert rig.reconcile() in (None, RESYNC_SECONDS)
    assert len(rig.api.writes()) == writes, "the new term wrote although nothing changed"
    assert lease.began_after_calls == [], "a Lease read for a rollout with nothing to do"


def test_a_lease_held_by_another_replica_stops_both_writes_of_the_reconcile() -> None:
    rig = Rig(V2)
    rig.deliver = False
    lease = watched(rig, Lease(rig, held=False))
    assert rig.reconcile() is None
    assert rig.status_writes() == [] and rig.patched_pods() == []
    assert len(lease.began_after_calls) == 1
