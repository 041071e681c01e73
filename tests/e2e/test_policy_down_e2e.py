"""Every manager process SIGKILLed: pods only policies serve are still created and injected;
pods that need the webhook are refused (fail-closed) until the manager returns.

On a control plane of its own (the session's manager runs in process and cannot be killed), with
`sidecarctl run --injection=auto` as a user runs it: a supervisor, the control process and the
admission workers.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kuberuntime import api
from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, make_pod, make_sidecarset
from tests.e2e.policysupport import (
    PolicyCluster,
    descendants,
    private_cluster,
    stored_pod,
    webhook_pod,
)
from tests.e2e.test_metrics_e2e import scrape
from tests.kube import builders
from tests.kube.client import eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop

NS = "down-shop"
PLAIN = "down-plain"  # not labelled: pods stored here are what the webhook would be sent
PODS = "/api/v1/namespaces/{}/pods"
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}


@pytest.fixture(scope="module")
def cluster(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[PolicyCluster]:
    """The cluster, with a fake kubelet running its pods (in-place upgrades need running pods)."""
    with private_cluster(aloop, control_plane.bin_dir, injection="auto", extra=("--webhook-workers=2",)) as c:
        kubelet = FakeKubelet(c.client, node="down-node", restart_delay=0.1)
        aloop.run(kubelet.start())
        kubelet.namespaces.add(NS)
        try:
            yield c
        finally:
            aloop.run(kubelet.stop())


def expected_pod(c: PolicyCluster, ss_name: str, pod: dict[str, object]) -> dict[str, object]:
    return webhook_pod(c, ss_name, pod, namespace=NS, plain=PLAIN)


def test_with_every_manager_process_killed_policy_pods_are_injected_and_webhook_pods_refused(
    cluster: PolicyCluster,
) -> None:
    c = cluster
    c.namespace(NS, ENABLED)
    c.namespace(PLAIN, {})
    served = make_sidecarset("down-mesh", "pol", updateStrategy={"type": "RollingUpdate", "maxUnavailable": "50%"})
    hot = make_sidecarset(
        "down-hot",
        "hot",
        containers=[
            builders.container(
                "proxy", "proxy:1", upgradeStrategy={"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}
            )
        ],
    )
    for body in (served, hot):
        c.kube.create(SS_PATH, body)

    def condition(name: str) -> str | None:
        status = c.kube.get(f"{SS_PATH}/{name}").get("status") or {}
        if not status.get("latestRevision"):
            return None
        found = [x for x in status.get("conditions") or [] if x["type"] == names.CONDITION_POLICY_INJECTION]
        return found[0]["status"] if found else None

    eventually(lambda: condition("down-mesh") == "True", timeout=30, what="down-mesh served by a policy")
    eventually(lambda: condition("down-hot") == "False", timeout=30, what="down-hot on the webhook")

    def by_policy() -> bool:
        p = c.kube.create(PODS.format(NS), make_pod("probe", "pol"), dryRun="All")
        return (p["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY) == "policy"

    eventually(by_policy, timeout=20, what="the policy enforced")
    # The webhook narrowed again: the canary's barrier found the policy enforced (the narrowed condition
    # is written in the same pass), then half a second for kube-apiserver's watch of the configuration.
    assert c.manager is not None
    manager = c.manager
    eventually(
        lambda: scrape(manager).value("sidecarctl_policy_barriers_total", outcome="enforced") >= 1,
        timeout=30,
        what="the canary's barrier passed",
    )
    time.sleep(0.5)
    want = expected_pod(c, "down-mesh", make_pod("pol-x", "pol"))

    assert c.manager is not None
    pids = descendants(c.manager.proc.pid)
    assert len(pids) >= 4, f"supervisor, control and two workers expected: {pids}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    c.manager.proc.wait(timeout=10)
    eventually(lambda: not any(Path(f"/proc/{p}").exists() for p in pids), timeout=10, what="every process gone")

    t0 = time.monotonic()
    created = [c.kube.create(PODS.format(NS), make_pod(f"pol-{i}", "pol")) for i in range(100)]
    took = time.monotonic() - t0
    assert len(created) == 100
    for pod in created:
        assert pod["metadata"]["annotations"][names.ANN_INJECTED_BY] == "policy"
        assert stored_pod(pod) == want, pod["metadata"]["name"]
    refusals = []
    for i in range(10):
        try:
            c.kube.create(PODS.format(NS), make_pod(f"hot-{i}", "hot"))
        except api.ApiError as e:
            refusals.append(e.message)
    assert len(refusals) == 10, "a pod that needs the webhook was admitted with the manager down"
    assert all("inject.sidecarctl.io" in m for m in refusals), refusals[0]
    print(f"\nmanager down: 100 policy pods created and injected in {took:.2f}s; webhook pods: {refusals[0]}")

    c.start_manager()
    for i in range(10):  # what a ReplicaSet controller does: retry
        retry = make_pod(f"hot-{i}", "hot")
        pod = eventually(functools.partial(_try_create, c, retry), timeout=30, what="webhook pods admitted")
        assert pod["metadata"]["annotations"][names.ANN_INJECTED_BY] == "webhook"
        assert {"proxy-1", "proxy-2"} <= {x["name"] for x in pod["spec"]["containers"]}

    # In-place upgrades resume: the 100 pods the policy injected move to the new image.
    c.kube.patch(f"{SS_PATH}/down-mesh", {"spec": {"containers": [builders.container("proxy", "proxy:2")]}})

    def upgraded() -> bool:
        items = c.kube.get(PODS.format(NS), labelSelector="app=pol")["items"]
        return len(items) == 100 and all(
            next(x["image"] for x in p["spec"]["containers"] if x["name"] == "proxy") == "proxy:2" for p in items
        )

    eventually(upgraded, timeout=90, interval=0.5, what="the 100 policy-injected pods upgraded in place")


def _try_create(c: PolicyCluster, pod: dict[str, object]) -> dict[str, object] | None:
    try:
        return c.kube.create(PODS.format(NS), pod)
    except api.Conflict:
        return c.kube.get(f"{PODS.format(NS)}/{pod['metadata']['name']}")  # type: ignore[index]
    except api.ApiError:
        return None
