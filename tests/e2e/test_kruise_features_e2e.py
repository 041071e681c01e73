"""Kruise's resourcesPolicy and canary SidecarSets through the real API server and the manager.

The golden cases (tests/golden/resources-policy-*, canary-replaces-base) pin the injected pod byte
for byte; here the same rules are checked where they matter: on pods the API server stores (after
its own defaulting and quantity canonicalisation) and in the status the controller writes.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import orjson

from sidecarsets.spec import names
from tests.e2e.helpers import create_ready_pods, image_of, status_of, wait_status
from tests.kube import builders
from tests.kube.client import Kube, eventually
from tests.kube.fakekubelet import FakeKubelet

COUNTERS = ("matchedPods", "updatedPods", "readyPods", "updatedReadyPods")
RESOURCES_POLICY = {
    "targetContainersMode": "sum",
    "targetContainersNameRegex": ".*",
    "resourcesExpr": {
        "requests": {"cpu": "max(cpu*50%, 50m)", "memory": "memory*50%"},
        "limits": {"cpu": "cpu", "memory": "memory"},
    },
}


def _sized(name: str, image: str, requests: dict[str, str], limits: dict[str, str] | None = None) -> dict[str, Any]:
    # Every container states its requests: the API server copies limits into missing requests
    # before admission, which would make the case say something other than it seems to.
    resources: dict[str, Any] = {"requests": requests}
    if limits is not None:
        resources["limits"] = limits
    return builders.container(name, image, resources=resources)


def _pod(name: str, app: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    return builders.pod(name, labels={"app": app}, containers=containers, terminationGracePeriodSeconds=1)


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(next(c for c in pod["spec"]["containers"] if c["name"] == name))


def test_resources_policy_sizes_the_sidecar_from_the_stored_pod(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    """Mode sum: requests 200m+300m cpu and 128Mi+128Mi memory, limits 1+500m and 512Mi+256Mi;
    a pod with one container unbounded gets a proxy with requests only."""
    proxy = builders.container("proxy", "proxy:1", resourcesPolicy=RESOURCES_POLICY)
    sidecarsets("respol", initContainers=[], containers=[proxy])
    app = _sized("app", "app:1", {"cpu": "200m", "memory": "128Mi"}, {"cpu": "1", "memory": "512Mi"})
    worker = _sized("worker", "worker:1", {"cpu": "300m", "memory": "128Mi"}, {"cpu": "500m", "memory": "256Mi"})
    bounded = _pod("bounded", "respol", [app, worker])
    path = f"/api/v1/namespaces/{injected_ns}/pods"

    def injected() -> bool:
        probe = kube.create(path, bounded, dryRun="All")
        return "proxy" in [c["name"] for c in probe["spec"]["containers"]]

    eventually(injected, timeout=20, what="the webhook injects the resourcesPolicy SidecarSet")
    kube.create(path, bounded)
    stored = _container(kube.get(f"{path}/bounded"), "proxy")
    assert stored["resources"] == {
        "requests": {"cpu": "250m", "memory": "128Mi"},
        "limits": {"cpu": "1500m", "memory": "768Mi"},
    }

    unbounded_worker = _sized("worker", "worker:1", {"cpu": "300m", "memory": "128Mi"})
    kube.create(path, _pod("unbounded", "respol", [app, unbounded_worker]))
    stored = _container(kube.get(f"{path}/unbounded"), "proxy")
    # Kruise: one target without a limit makes the aggregate limit unbounded, so none is set.
    assert stored["resources"] == {"requests": {"cpu": "250m", "memory": "128Mi"}}
    # The app containers keep what they asked for.
    assert _container(kube.get(f"{path}/unbounded"), "app")["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}


def test_a_canary_replaces_its_base_in_the_pods_it_selects_and_in_their_count(
    kube: Kube, injected_ns: str, kubelet: FakeKubelet, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    """The canary pod gets the canary's proxy and is counted by the canary only; the stable pod,
    selected by the base alone, gets the base's proxy and is the base's one pod."""
    mesh = f"kf-{secrets.token_hex(3)}"  # both SidecarSets select on it, so no other test's pod counts
    path = f"/api/v1/namespaces/{injected_ns}/pods"

    def probe_image(**labels: str) -> str | None:
        probe = kube.create(path, builders.pod("probe", labels={"app": "probe", "mesh": mesh, **labels}), dryRun="All")
        return next((c["image"] for c in probe["spec"]["containers"] if c["name"] == "proxy"), None)

    base = sidecarsets(
        "kfbase",
        initContainers=[],
        selector={"matchLabels": {"mesh": mesh}},
        containers=[builders.container("proxy", "proxy:stable")],
    )
    base_name = base["metadata"]["name"]
    # The canary is validated against the manager's store, which must hold its base by then.
    eventually(lambda: probe_image() == "proxy:stable", timeout=20, what="the webhook knows the base")
    canary = sidecarsets(
        "kfcanary",
        initContainers=[],
        selector={"matchLabels": {"mesh": mesh, "track": "canary"}},
        containers=[builders.container("proxy", "proxy:canary")],
        updateStrategy={"type": "NotUpdate"},
        metadata={"annotations": {names.ANN_CANARY: "true", names.ANN_BASE: base_name}},
    )
    canary_name = canary["metadata"]["name"]
    eventually(lambda: probe_image(track="canary") == "proxy:canary", timeout=20, what="the webhook knows the canary")
    assert probe_image() == "proxy:stable"

    (stable_pod,) = create_ready_pods(kube, injected_ns, "kfstable", 1, mesh=mesh)
    assert image_of(stable_pod, "proxy") == "proxy:stable"
    assert stable_pod["metadata"]["annotations"][names.ANN_INJECTED_LIST] == base_name
    wait_status(kube, base_name, matchedPods=1, updatedPods=1, readyPods=1, updatedReadyPods=1)

    (canary_pod,) = create_ready_pods(kube, injected_ns, "kfcanary", 1, mesh=mesh, track="canary")
    assert [c["name"] for c in canary_pod["spec"]["containers"]] == ["proxy", "app"]
    assert image_of(canary_pod, "proxy") == "proxy:canary"
    annotations = canary_pod["metadata"]["annotations"]
    assert annotations[names.ANN_INJECTED_LIST] == canary_name
    assert list(orjson.loads(annotations[names.ANN_HASH])) == [canary_name]
    wait_status(kube, canary_name, matchedPods=1, updatedPods=1, readyPods=1, updatedReadyPods=1)

    # The base's selector matches the canary's pod too, but it owns only pods it was injected
    # into: once the canary has counted its pod, give the base's reconcile of that pod time to
    # run, then its count must still be the stable pod alone.
    time.sleep(2)
    assert {k: v for k, v in status_of(kube, base_name).items() if k in COUNTERS} == dict.fromkeys(COUNTERS, 1)
