"""A per-pod override on the real kubelet: one running pod re-annotated for a bigger proxy CPU limit
is resized in place by the controller (`pods/resize`), and the container's cgroup shows it.

The SidecarSet allows the proxy's CPU to be overridden (`spec.overrides`, a bounds-only change that
touches no pod); the pod, created without overrides, gets `sidecarctl.io/overrides` asking for a
300m limit. The same pod and container ID, the restart count unchanged, the CFS quota raised, the
value reported in the pod's status; the other replica untouched.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.kube import images
from tests.kube.adminrest import ApiError
from tests.kube.client import eventually
from tests.node.conftest import Installed, NodeCluster, record
from tests.node.pods import is_ready, statuses
from tests.node.rollout import SIDECAR, create_workload
from tests.node.test_resize_node import CPU_PERIOD_US, SMALL, _cpu_quota, _sidecar

OVERRIDES = "sidecarctl.io/overrides"


def test_a_pod_reannotated_for_a_bigger_proxy_cpu_limit_is_resized_in_place_on_the_real_kubelet(
    cluster: NodeCluster, installed: Installed, namespace: str
) -> None:
    w = create_workload(
        cluster.api,
        namespace,
        image=images.sidecar_image("v1"),
        replicas=2,
        max_unavailable=1,
        app="own",
        resources=SMALL,
    )
    bounds = [{"containerName": SIDECAR, "resources": {"cpu": {"min": "50m", "max": "500m"}}}]
    cluster.api.patch(w.ss_path, {"spec": {"overrides": bounds}}, "merge")
    target, other = w.pods()
    name = target["metadata"]["name"]
    ids = {
        p["metadata"]["name"]: statuses(p)[SIDECAR]["containerID"].removeprefix("containerd://")
        for p in (target, other)
    }
    assert _cpu_quota(cluster, ids[name]) == 100 * CPU_PERIOD_US // 1000

    started = time.monotonic()
    asked = {SIDECAR: {"resources": {"limits": {"cpu": "300m"}}}}
    cluster.api.patch(
        f"/api/v1/namespaces/{namespace}/pods/{name}",
        {"metadata": {"annotations": {OVERRIDES: json.dumps(asked)}}},
        "merge",
    )

    def resized() -> dict[str, Any] | None:
        got = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        sidecar = statuses(got)[SIDECAR]
        done = (
            is_ready(got)
            and _sidecar(got)["resources"]["limits"]["cpu"] == "300m"
            and sidecar.get("resources") == _sidecar(got)["resources"]
        )
        return got if done else None

    after = eventually(resized, timeout=90, interval=0.2, what="the proxy resized and applied", retrying=(ApiError,))
    record("per-pod override: annotate to the proxy's new CPU limit applied", time.monotonic() - started)
    sidecar = statuses(after)[SIDECAR]
    assert after["metadata"]["uid"] == target["metadata"]["uid"], "the same pod"
    assert sidecar["containerID"] == statuses(target)[SIDECAR]["containerID"], "the same container"
    assert sidecar["restartCount"] == statuses(target)[SIDECAR]["restartCount"], "not restarted"
    assert _sidecar(after)["resources"]["requests"] == SMALL["requests"], "only the field the pod names"
    assert _cpu_quota(cluster, ids[name]) == 300 * CPU_PERIOD_US // 1000, "the cgroup has the new quota"
    untouched = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods/{other['metadata']['name']}")
    assert _sidecar(untouched)["resources"]["limits"]["cpu"] == "100m"
    assert _cpu_quota(cluster, ids[other["metadata"]["name"]]) == 100 * CPU_PERIOD_US // 1000
