"""The webhook's first narrowing, when the manager finds policies enforced, drops no SidecarSet it served.

Until the manager knows that kube-apiserver enforces MutatingAdmissionPolicies the pod webhook has no
condition of ours and takes every pod of an enabled namespace. The first condition it writes narrows
that to the pods only the webhook can serve, planned from the SidecarSets the manager has seen: one
created a moment before, already injected by the webhook, must not be left with neither the webhook
nor a policy until the next pass.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

import pytest

from kuberuntime import api
from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, make_pod, make_sidecarset
from tests.e2e.policysupport import PolicyCluster, private_cluster, webhook_condition
from tests.kube.client import eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.loop import BackgroundLoop

NS = "adoption"
PODS = f"/api/v1/namespaces/{NS}/pods"
# The newest SidecarSets the pods are probed for, in turn: a SidecarSet created around the first
# narrowing is probed every few tens of milliseconds, the length of the gap this test is about.
PROBED = 4


@pytest.fixture
def cluster(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[PolicyCluster]:
    with private_cluster(aloop, control_plane.bin_dir, injection="auto", start=False) as c:
        c.namespace(NS, {names.NS_INJECTION_LABEL: "enabled"})
        yield c


def _injected(pod: dict[str, object]) -> bool:
    spec = pod["spec"]
    assert isinstance(spec, dict)
    return [c["name"] for c in spec["containers"]] == ["proxy", "app"]


def test_sidecarsets_created_while_the_manager_adopts_policies_keep_their_pods_injected(
    cluster: PolicyCluster,
) -> None:
    """SidecarSets are created 20 ms apart from the moment the manager serves until two seconds after
    it narrowed the webhook; pods of the newest ones are dry-run created all along. A SidecarSet whose
    pods were once injected must have every later pod injected too (by the webhook or by its policy)."""
    kube = cluster.kube
    created: list[str] = []
    seen: dict[str, list[tuple[float, bool]]] = {}
    stop_creating, stop_probing = threading.Event(), threading.Event()
    failures: list[str] = []

    def create() -> None:
        while not stop_creating.is_set():
            app = f"a{len(created)}-{secrets.token_hex(2)}"
            try:
                kube.create(SS_PATH, make_sidecarset(app, app))
            except api.ApiError:  # the validating webhook fails closed until the manager serves
                time.sleep(0.05)
                continue
            created.append(app)
            time.sleep(0.02)

    def probe(offset: int) -> None:
        turn = offset
        while not stop_probing.is_set():
            newest = created[-PROBED:]
            if not newest:
                time.sleep(0.01)
                continue
            app = newest[turn % len(newest)]
            turn += 1
            try:
                pod = kube.create(PODS, make_pod("probe", app), dryRun="All")
            except api.ApiError as e:
                if seen.get(app):
                    failures.append(f"{app}: {e}")
                continue
            seen.setdefault(app, []).append((time.monotonic(), _injected(pod)))

    threads = [threading.Thread(target=create)] + [threading.Thread(target=probe, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        cluster.start_manager()
        eventually(lambda: webhook_condition(kube) is not None, timeout=30, interval=0.02, what="the first narrowing")
        narrowed = time.monotonic()
        time.sleep(2.0)
        stop_creating.set()
        time.sleep(1.0)
    finally:
        stop_creating.set()
        stop_probing.set()
        for t in threads:
            t.join()
    lost = {}
    for app, samples in seen.items():
        first = next((t for t, ok in samples if ok), None)
        after = [round(t - narrowed, 3) for t, ok in samples if first is not None and t > first and not ok]
        if after:
            lost[app] = after
    assert not failures, failures[:5]
    assert not lost, f"pods admitted without sidecars after earlier pods of their SidecarSet had them: {lost}"
    around = [app for app in seen if any(abs(t - narrowed) < 0.5 for t, _ in seen[app])]
    assert around, "no SidecarSet was probed within half a second of the first narrowing"
