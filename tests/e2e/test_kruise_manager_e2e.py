"""OpenKruise v1.9.1's own manager on the test control plane: it injects a pod through its URL
webhook and rolls an image change in place, with the fake kubelet reporting the restart.

This is the smoke test of `tests/kube/kruisemanager.py`, which `bench/bench_vs_kruise.py` measures
sidecarctl against. It runs on a control plane of its own: Kruise's pod webhook is cluster-wide
(every namespace without a `control-plane` label) with failurePolicy Fail, so on the shared control
plane it would see every other test's pods.

What Kruise reads of the kubelet's report to call a pod upgraded (pkg/control/sidecarcontrol): the
container's `status.imageID` must have moved away from the one it recorded in the pod's
`kruise.io/sidecarset-inplace-update-state` before patching (or `status.image` must equal the spec's
image), with as many `containerStatuses` as spec containers, and the pod Running and Ready. The fake
kubelet reports exactly that: the restarted container, not ready for `restart_delay`, then the new
image with a new imageID (`builders.image_id`) and restartCount + 1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kuberuntime import api, kubeapi, kubeconfig
from tests.kube import builders
from tests.kube import kruisemanager as km
from tests.kube.audit import audit_events
from tests.kube.ci import IN_CI
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane, ControlPlaneError, binaries_dir
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop

NS = "kruise-smoke"
PODS = 3


class Rig:
    def __init__(self, cp: ControlPlane, kube: Kube, kubelet: FakeKubelet, manager: km.KruiseManager) -> None:
        self.cp, self.kube, self.kubelet, self.manager = cp, kube, kubelet, manager


@pytest.fixture(scope="module")
def rig(aloop: BackgroundLoop) -> Iterator[Rig]:
    path = km.binary()
    if not path.exists():
        if IN_CI:
            pytest.fail(f"Kruise's manager {path} is missing: run tools/build-kruise-manager.sh")
        pytest.skip(f"Kruise's manager {path} is not built: run tools/build-kruise-manager.sh")
    try:
        cp = ControlPlane(bin_dir=binaries_dir(), controller_manager=False).start()
    except ControlPlaneError as e:
        if IN_CI:
            pytest.fail(f"cannot start the test control plane: {e}")
        pytest.skip(f"no test control plane: {e}")
    client = kubeapi.KubeClient(kubeconfig.load_config(str(cp.kubeconfig)))
    kube = Kube(aloop, client)
    kubelet = FakeKubelet(client, node="kruise-node", restart_delay=0.3)
    manager: km.KruiseManager | None = None
    try:
        aloop.run(kubelet.start())
        aloop.run(km.install_crds(client))
        aloop.run(km.install_webhooks(client))
        aloop.run(km.ensure_namespace(client, NS))
        # No controller-manager here: the ServiceAccount pods default to is made by hand.
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
        kube.create(f"/api/v1/namespaces/{NS}/serviceaccounts", sa)
        kubelet.namespaces.add(NS)
        manager = km.start(cp)
        manager.wait_ready(timeout=120)
        eventually(lambda: aloop.run(km.webhooks_served(client)), timeout=30, what="Kruise rewrote its webhooks")
        eventually(manager.leading, timeout=60, what="Kruise's manager leads")
        yield Rig(cp, kube, kubelet, manager)
    finally:
        if manager is not None:
            manager.terminate()
        aloop.run(kubelet.stop())
        aloop.run(client.close())
        cp.stop()


def _sidecarset(image: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{km.GROUP}/v1beta1",
        "kind": "SidecarSet",
        "metadata": {"name": "smoke-proxy"},
        "spec": {
            "selector": {"matchLabels": {"app": "smoke"}},
            "containers": [{"name": "proxy", "image": image, "podInjectPolicy": "BeforeAppContainer"}],
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": "100%"},
        },
    }


def _pod(name: str) -> dict[str, Any]:
    return builders.pod(name, labels={"app": "smoke"}, terminationGracePeriodSeconds=1)


def _status(kube: Kube) -> dict[str, int]:
    return km.sidecarset_status(kube.get(f"{km.SS_PATH}/smoke-proxy"))


def test_kruise_injects_and_upgrades_in_place(rig: Rig) -> None:
    kube = rig.kube
    pods_path = f"/api/v1/namespaces/{NS}/pods"
    kube.create(km.SS_PATH, _sidecarset("proxy:1"))
    ss = kube.get(f"{km.SS_PATH}/smoke-proxy")
    assert ss["metadata"]["annotations"].get(km.ANN_HASH), "Kruise's SidecarSet webhook wrote no hash"

    def injecting() -> bool:  # Kruise's informer cache lags the create
        probe = kube.create(pods_path, _pod("probe"), dryRun="All")
        return [c["name"] for c in probe["spec"]["containers"]] == ["proxy", "app"]

    eventually(injecting, timeout=30, what="Kruise's webhook injects the new SidecarSet")
    for i in range(PODS):
        got = kube.create(pods_path, _pod(f"smoke-{i}"))
        assert [c["name"] for c in got["spec"]["containers"]] == ["proxy", "app"]
        assert got["metadata"]["annotations"][km.ANN_INJECTED_LIST] == "smoke-proxy"

    done = {"matchedPods": PODS, "updatedPods": PODS, "readyPods": PODS, "updatedReadyPods": PODS, "current": 1}
    eventually(lambda: _status(kube) == done, timeout=60, what=f"status {done}")
    before = {p["metadata"]["name"]: p for p in kube.get(pods_path)["items"]}
    audit_from = rig.cp.audit_log.stat().st_size

    ss = kube.get(f"{km.SS_PATH}/smoke-proxy")
    ss["spec"]["containers"][0]["image"] = "proxy:2"
    kube.update(f"{km.SS_PATH}/smoke-proxy", ss)

    def upgraded() -> bool:
        if _status(kube) != done:
            return False
        return all(
            p["spec"]["containers"][0]["image"] == "proxy:2"
            and p["status"]["containerStatuses"][0]["imageID"] == builders.image_id("proxy:2")
            for p in kube.get(pods_path)["items"]
        )

    eventually(upgraded, timeout=90, interval=0.2, what="every pod on proxy:2, the status of the new generation")
    for p in kube.get(pods_path)["items"]:
        name = p["metadata"]["name"]
        assert p["metadata"]["uid"] == before[name]["metadata"]["uid"], "upgraded in place, not recreated"
        proxy = next(s for s in p["status"]["containerStatuses"] if s["name"] == "proxy")
        app = next(s for s in p["status"]["containerStatuses"] if s["name"] == "app")
        assert (proxy["restartCount"], app["restartCount"]) == (1, 0)
        state = json.loads(p["metadata"]["annotations"][km.ANN_INPLACE_STATE])["smoke-proxy"]
        assert state["lastContainerStatuses"] == {"proxy": {"imageID": builders.image_id("proxy:1")}}
    writes = [
        e
        for e in audit_events(rig.cp, audit_from)
        if (e.get("objectRef") or {}).get("resource") == "pods"
        and not (e.get("objectRef") or {}).get("subresource")
        and e["verb"] in ("update", "patch")
        and (e.get("responseStatus") or {}).get("code", 0) < 300
    ]
    assert {e["userAgent"].split("/")[0] for e in writes} == {"kruise-manager"}
    assert sorted(e["objectRef"]["name"] for e in writes) == sorted(before)


def test_sidecarset_validation_is_kruises(rig: Rig) -> None:
    """Kruise's validating webhook answers by URL too (a SidecarSet without containers is refused)."""
    bad = _sidecarset("proxy:1")
    bad["metadata"]["name"] = "smoke-empty"
    bad["spec"]["containers"] = []
    with pytest.raises(api.ApiError) as refused:
        rig.kube.create(km.SS_PATH, bad)
    assert "no initContainer or container defined for SidecarSet" in refused.value.message
