"""Sidecar CPU and memory rolled into running pods through `pods/resize`, on the real API server.

The fake kubelet acts as a 1.35 kubelet on a resize (tests/kube/fakekubelet.py): it reports the
applied values in each container's status `resources` after `resize_delay` (PodResizeInProgress
meanwhile), or, for the pods it is told cannot fit, keeps the old values and sets PodResizePending
with reason Infeasible. The API server itself decides what a resize may change; the patches are
the controller's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, create_ready_pods, pods, wait_injecting, wait_status
from tests.kube.client import Kube, eventually
from tests.kube.fakekubelet import FakeKubelet

PODS = 20
MAX_UNAVAILABLE = 5
RESIZE_DELAY = 0.5  # long enough for the sampler (every 50 ms) to see each resize in flight
SMALL = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}


def _proxy(pod: dict[str, Any]) -> dict[str, Any]:
    """The proxy container ({} while a dry-run pod is not injected yet)."""
    return next((c for c in pod["spec"]["containers"] if c["name"] == "proxy"), {})


def _applied(pod: dict[str, Any]) -> dict[str, Any]:
    """The proxy's resources as the kubelet reports them ({} before it reports any)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    status: dict[str, Any] = next((s for s in statuses if s["name"] == "proxy"), {})
    return dict(status.get("resources") or {})


def _cpu_limit(pod: dict[str, Any]) -> str | None:
    cpu = _proxy(pod).get("resources", {}).get("limits", {}).get("cpu")
    return None if cpu is None else str(cpu)


def _setup(
    kube: Kube, ns: str, app: str, sidecarsets: Callable[..., dict[str, Any]], count: int
) -> tuple[str, list[dict[str, Any]]]:
    ss = sidecarsets(
        app,
        initContainers=[],
        containers=[{"name": "proxy", "image": "proxy:1", "resources": SMALL}],
        updateStrategy={"type": "RollingUpdate", "maxUnavailable": MAX_UNAVAILABLE},
    )
    name = str(ss["metadata"]["name"])
    wait_injecting(kube, ns, app, lambda p: _cpu_limit(p) == "200m")
    before = create_ready_pods(kube, ns, app, count)
    wait_status(kube, name, matchedPods=count, updatedPods=count, readyPods=count, updatedReadyPods=count)
    return name, before


def _raise_cpu(kube: Kube, name: str, limit: str = "400m") -> None:
    ops = [
        {"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "150m"},
        {"op": "replace", "path": "/spec/containers/0/resources/limits/cpu", "value": limit},
    ]
    kube.patch(f"{SS_PATH}/{name}", ops, patch_type="json")


@contextmanager
def _in_flight(kube: Kube, ns: str, app: str) -> Iterator[list[int]]:
    """Samples, every 50 ms, how many pods run with other resources than their spec asks (or are
    not ready): the resizes in flight."""
    samples: list[int] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            got = pods(kube, ns, app)
            samples.append(sum(1 for p in got if _applied(p) != _proxy(p)["resources"]))
            time.sleep(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(timeout=10)


@pytest.mark.versions
def test_a_cpu_change_resizes_20_pods_in_place_within_max_unavailable(
    kube: Kube, injected_ns: str, kubelet: FakeKubelet, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    kubelet.resize_delay = RESIZE_DELAY
    try:
        name, before = _setup(kube, injected_ns, "resize", sidecarsets, PODS)
        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in before}
        restarts = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in before}
        started = time.monotonic()
        with _in_flight(kube, injected_ns, "resize") as samples:
            _raise_cpu(kube, name)

            def all_resized() -> bool:
                got = pods(kube, injected_ns, "resize")
                return len(got) == PODS and all(
                    _cpu_limit(p) == "400m" and _applied(p) == _proxy(p)["resources"] for p in got
                )

            eventually(all_resized, timeout=60, interval=0.2, what="every pod resized and applied")
        took = time.monotonic() - started
        status = wait_status(kube, name, matchedPods=PODS, updatedPods=PODS, readyPods=PODS, updatedReadyPods=PODS)
        after = pods(kube, injected_ns, "resize")
        print(f"\nresize of {PODS} pods: {took:.1f} s, at most {max(samples)} in flight ({len(samples)} samples)")
    finally:
        kubelet.resize_delay = 0.0
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in after} == uids, "the same pods"
    assert {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in after} == restarts
    assert all(_proxy(p)["resources"]["requests"]["cpu"] == "150m" for p in after)
    assert all(_proxy(p)["image"] == "proxy:1" for p in after)
    assert 0 < max(samples) <= MAX_UNAVAILABLE, samples
    # Each pod records the current revision: a later image change is an ordinary image change.
    recorded = {str(p["metadata"]["annotations"][names.ANN_HASH]) for p in after}
    assert all(status["latestRevision"] in r for r in recorded)
    # The policy path injects new pods with the new resources, as the webhook does.
    probe = wait_injecting(kube, injected_ns, "resize", lambda p: _cpu_limit(p) == "400m")
    assert _proxy(probe)["resources"]["requests"]["cpu"] == "150m"


def test_an_infeasible_resize_stops_at_its_pods_and_the_rest_are_resized(
    kube: Kube, injected_ns: str, kubelet: FakeKubelet, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    name, before = _setup(kube, injected_ns, "tight", sidecarsets, 6)
    stuck = sorted(p["metadata"]["name"] for p in before)[:2]
    for pod_name in stuck:
        kubelet.infeasible.add(f"{injected_ns}/{pod_name}")
    try:
        _raise_cpu(kube, name, limit="300m")

        def settled() -> bool:
            got = {p["metadata"]["name"]: p for p in pods(kube, injected_ns, "tight")}
            others = [p for n, p in got.items() if n not in stuck]
            return all(_cpu_limit(p) == "300m" and _applied(p) == _proxy(p)["resources"] for p in others)

        eventually(settled, timeout=60, interval=0.2, what="the four feasible pods resized")
        wait_status(kube, name, matchedPods=6, updatedPods=6, updatedReadyPods=4)

        def progressing() -> dict[str, Any] | None:
            conditions = (kube.get(f"{SS_PATH}/{name}").get("status") or {}).get("conditions") or []
            found = next((c for c in conditions if c["type"] == names.CONDITION_PROGRESSING), None)
            return found if found and found["reason"] == names.REASON_RESIZE_INFEASIBLE else None

        # The kubelet says Infeasible after the resize: the status names the pods once it has.
        condition = eventually(progressing, timeout=20, what="Progressing naming the infeasible pods")
        assert all(f"{injected_ns}/{n}" in condition["message"] for n in stuck), condition

        def said() -> str | None:
            # Each pass names the pods that became stuck in it: the two may come in separate Events.
            text = " ".join(
                e["message"]
                for e in kube.get("/api/v1/namespaces/default/events")["items"]
                if e["involvedObject"].get("name") == name and e["reason"] == "NotResizablePods"
            )
            return text if all(n in text for n in stuck) else None

        assert "infeasible" in eventually(said, timeout=20, what="Events naming both stuck pods")
        # The stuck pods keep running with their old values: no retry loop of resize writes.
        got = {p["metadata"]["name"]: p for p in pods(kube, injected_ns, "tight")}
        assert all(_applied(got[n])["limits"]["cpu"] == "200m" for n in stuck)
        versions = {n: got[n]["metadata"]["resourceVersion"] for n in stuck}
        time.sleep(2.0)
        again = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in pods(kube, injected_ns, "tight")}
        assert {n: again[n] for n in stuck} == versions, "nothing writes to the stuck pods"
    finally:
        for pod_name in stuck:
            kubelet.infeasible.discard(f"{injected_ns}/{pod_name}")
