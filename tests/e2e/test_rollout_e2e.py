"""A 50-pod rollout under maxUnavailable 10%, sampled throughout, with the leader killed mid-way.

Runs on its own control plane so that the managers started here are the only controllers
acting on its pods: the session manager never sees them.
"""

from __future__ import annotations

import secrets
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kuberuntime import api
from sidecarsets.spec import names
from tests.e2e.helpers import (
    SS_PATH,
    container_status,
    create_ready_pods,
    image_of,
    make_sidecarset,
    pods,
    ready,
    set_image,
    wait_injecting,
    wait_status,
)
from tests.kube.client import Kube, eventually
from tests.kube.cluster import PrivateCluster, install_crd
from tests.kube.controlplane import REPO, ControlPlane
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import (
    MANAGER_NS,
    MWC_PATH,
    VWC_PATH,
    ManagerProcess,
    ensure_namespace,
    start_process,
    wait_ready,
    webhook_configs,
)

PODS = 50
MAX_UNAVAILABLE = 5  # 10% of 50
MAX_SAMPLE_GAP = 1.0  # seconds between two LISTs: a longer stall would leave part of the rollout unwatched


@pytest.fixture(scope="module")
def cluster(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[PrivateCluster]:
    c = PrivateCluster(aloop, bin_dir=control_plane.bin_dir, kubelet_node="rollout-node", kubelet_restart_delay=0.3)
    try:
        crd = yaml.safe_load((REPO / "config/crd/sidecarctl.io_sidecarsets.yaml").read_text())
        install_crd(c.kube, crd)
        ensure_namespace(c.kube, MANAGER_NS)
        yield c
    finally:
        c.close()


class UnavailableSampler:
    """Counts not-Ready pods every 50 ms from another thread, with the time each LIST returned.

    What matters is that no stretch of the rollout went unwatched, so the test bounds the longest
    gap between two samples, not their number (a fast rollout takes few samples).
    """

    def __init__(self, kube: Kube, namespace: str, app: str) -> None:
        self.kube, self.namespace, self.app = kube, namespace, app
        self.samples: list[int] = []
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            got = pods(self.kube, self.namespace, self.app)
            self.samples.append(sum(1 for p in got if not ready(p)))
            self.times.append(time.monotonic())
            time.sleep(0.05)

    def longest_gap(self) -> float:
        return max((b - a for a, b in zip(self.times, self.times[1:], strict=False)), default=float("inf"))

    def __enter__(self) -> UnavailableSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _start(cluster: PrivateCluster, identity: str, port: int | None = None) -> ManagerProcess:
    return start_process(cluster.cp, cluster.cert_dir, identity=identity, webhook_port=port, lease_duration=3)


def test_rollout_of_50_pods_never_exceeds_max_unavailable_across_a_leader_kill(cluster: PrivateCluster) -> None:
    kube = cluster.kube
    first = _start(cluster, "rollout-a")
    standby: ManagerProcess | None = None
    try:
        mwc, vwc = webhook_configs(
            first.webhook_url, mutating=names.MUTATING_WEBHOOK_CONFIG, validating=names.VALIDATING_WEBHOOK_CONFIG
        )
        kube.apply(MWC_PATH, mwc)
        kube.apply(VWC_PATH, vwc)
        wait_ready(first)
        standby = _start(cluster, "rollout-b")
        wait_ready(standby)
        # Two managers: both serve webhooks, exactly one runs the controller.
        eventually(lambda: sorted(_leading(m) for m in (first, standby)) == [0.0, 1.0], timeout=20, what="one leader")

        ns = f"rollout-{secrets.token_hex(3)}"
        kube.create(
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {names.NS_INJECTION_LABEL: "enabled"}},
            },
        )
        assert cluster.kubelet is not None
        cluster.kubelet.namespaces.add(ns)
        eventually(lambda: kube.get_or_none(f"/api/v1/namespaces/{ns}/serviceaccounts/default"), timeout=30)
        ss = make_sidecarset("rollout", "roll", initContainers=[], updateStrategy={"maxUnavailable": "10%"})
        eventually(lambda: _create_ok(kube, ss), timeout=20, what="SidecarSet admitted")
        wait_injecting(kube, ns, "roll", lambda p: p["spec"]["containers"][0]["name"] == "proxy")
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in create_ready_pods(kube, ns, "roll", PODS)}
        wait_status(kube, "rollout", matchedPods=PODS, updatedPods=PODS, readyPods=PODS, timeout=60)

        with UnavailableSampler(kube, ns, "roll") as sampler:
            set_image(kube, "rollout", "proxy:2")
            eventually(
                lambda: sum(image_of(p, "proxy") == "proxy:2" for p in pods(kube, ns, "roll")) >= 15,
                timeout=60,
                what="rollout under way",
            )
            leader = first if _leader(kube) == "rollout-a" else standby
            survivor = standby if leader is first else first
            kill_sample = len(sampler.samples)
            leader.kill()  # SIGKILL: no Lease release, no cleanup
            killed_at = sum(image_of(p, "proxy") == "proxy:2" for p in pods(kube, ns, "roll"))
            assert 0 < killed_at < PODS, "the kill must land in the middle of the rollout"

            def finished() -> bool:
                got = pods(kube, ns, "roll")
                return all(image_of(p, "proxy") == "proxy:2" and ready(p) for p in got)

            eventually(finished, timeout=120, interval=0.2, what="rollout completed by the survivor")
            assert _leader(kube) == ("rollout-b" if survivor is standby else "rollout-a")
        wait_status(kube, "rollout", matchedPods=PODS, updatedPods=PODS, readyPods=PODS, updatedReadyPods=PODS)

        gap = sampler.longest_gap()
        assert len(sampler.samples) >= 10 and gap < MAX_SAMPLE_GAP, (
            f"the sampler must have watched the whole rollout: {len(sampler.samples)} samples, longest gap {gap:.2f} s"
        )
        if max(sampler.samples) > MAX_UNAVAILABLE:
            print(first.log_tail(400))
            if standby is not None:
                print(standby.log_tail(400))
        assert max(sampler.samples) <= MAX_UNAVAILABLE, (
            f"unavailable peaked at {max(sampler.samples)}; samples {sampler.samples}, leader killed at {kill_sample}"
        )
        assert max(sampler.samples) > 0, "the sampler never saw a pod restarting"
        for p in pods(kube, ns, "roll"):
            assert p["metadata"]["uid"] == before[p["metadata"]["name"]], "pod recreated"
            assert container_status(p, "proxy")["restartCount"] == 1, f"{p['metadata']['name']} patched twice"
            assert container_status(p, "app")["restartCount"] == 0
        print(
            f"\nrollout: {PODS} pods, {len(sampler.samples)} samples, "
            f"longest gap {gap * 1000:.0f} ms, max unavailable {max(sampler.samples)}, "
            f"leader killed after {killed_at} updated"
        )
    finally:
        for m in (first, standby):
            if m is not None:
                m.kill()


def _create_ok(kube: Kube, ss: dict[str, Any]) -> bool:
    try:
        kube.create(SS_PATH, ss)
    except api.Conflict:
        return True
    except api.ApiError:
        return False
    return True


def _leading(m: ManagerProcess) -> float:
    with urllib.request.urlopen(m.probe_url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'sidecarctl_leader{{lease="{MANAGER_NS}/sidecarctl-controller"}} '):
                return float(line.split()[1])
    return -1.0


def _leader(kube: Kube) -> str:
    lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/sidecarctl-controller")
    return str(lease["spec"].get("holderIdentity") or "")
