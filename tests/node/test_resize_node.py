"""A sidecar's CPU and memory changed in place on the real kubelet: `pods/resize`, no restart.

The SidecarSet raises its sidecar's CPU limit and memory request; the controller resizes each pod
(maxUnavailable 1) and the kubelet applies the new values to the running container: the same pod,
the same container ID and restart count, the container's CPU quota in its cgroup raised, the new
values reported in the pod's status, and the SidecarSet counting every pod updated and ready.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.kube import images
from tests.kube.adminrest import ApiError
from tests.kube.client import eventually
from tests.node.conftest import Installed, NodeCluster, record
from tests.node.pods import is_ready, statuses
from tests.node.rollout import SIDECAR, create_workload

REPLICAS = 3
SMALL = {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}
CPU_PERIOD_US = 100_000  # the kubelet's CFS period: a limit of N millicores is a quota of N * 100 us


def _sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == SIDECAR)


def _cpu_quota(cluster: NodeCluster, container_id: str) -> int:
    """The running container's CFS quota, read from its cgroup through its process."""
    tasks = cluster.node.ctr("tasks", "ls")  # the node's ctr names the k8s.io namespace itself
    pid = next(line.split()[1] for line in tasks.splitlines()[1:] if line.split()[0] == container_id)
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: one hierarchy
            return int(Path(f"/sys/fs/cgroup{path}/cpu.max").read_text().split()[0])
        if "cpu" in controllers.split(","):
            root = next(p for p in Path("/sys/fs/cgroup").iterdir() if "cpu" in p.name.split(","))
            return int((root / path.lstrip("/") / "cpu.cfs_quota_us").read_text())
    raise AssertionError(f"no cpu cgroup for {container_id}")


def test_a_sidecar_cpu_limit_and_memory_request_are_resized_in_place_on_the_real_kubelet(
    cluster: NodeCluster, installed: Installed, namespace: str
) -> None:
    w = create_workload(
        cluster.api,
        namespace,
        image=images.sidecar_image("v1"),
        replicas=REPLICAS,
        max_unavailable=1,
        app="sized",
        resources=SMALL,
    )
    before = {p["metadata"]["name"]: p for p in w.pods()}
    ids = {n: statuses(p)[SIDECAR]["containerID"].removeprefix("containerd://") for n, p in before.items()}
    assert {n: _cpu_quota(cluster, i) for n, i in ids.items()} == dict.fromkeys(ids, 100 * CPU_PERIOD_US // 1000)

    started = time.monotonic()
    ops = [
        {"op": "replace", "path": "/spec/containers/0/resources/limits/cpu", "value": "200m"},
        {"op": "replace", "path": "/spec/containers/0/resources/requests/memory", "value": "48Mi"},
    ]
    cluster.api.patch(w.ss_path, ops, "json")

    def resized() -> list[dict[str, Any]] | None:
        got = w.pods()
        st = w.status()
        done = (
            len(got) == REPLICAS
            and all(is_ready(p) and statuses(p)[SIDECAR].get("resources") == _sidecar(p)["resources"] for p in got)
            and all(_sidecar(p)["resources"]["limits"]["cpu"] == "200m" for p in got)
            and (st.get("updatedPods"), st.get("updatedReadyPods")) == (REPLICAS, REPLICAS)
        )
        return got if done else None

    after = eventually(
        resized, timeout=90, interval=0.2, what="every pod resized, applied and counted", retrying=(ApiError,)
    )
    took = time.monotonic() - started
    record(f"in-place resize of {REPLICAS} pods (maxUnavailable 1): SidecarSet patch to all applied", took)
    for p in after:
        name = p["metadata"]["name"]
        assert p["metadata"]["uid"] == before[name]["metadata"]["uid"], "the same pod"
        sidecar = statuses(p)[SIDECAR]
        assert sidecar["containerID"] == statuses(before[name])[SIDECAR]["containerID"], "the same container"
        assert sidecar["restartCount"] == statuses(before[name])[SIDECAR]["restartCount"], "not restarted"
        assert sidecar["resources"]["requests"]["memory"] == "48Mi"
        assert _cpu_quota(cluster, ids[name]) == 200 * CPU_PERIOD_US // 1000, "the cgroup has the new quota"
        conditions = {c["type"] for c in p["status"].get("conditions") or [] if c.get("status") == "True"}
        assert not conditions & {"PodResizePending", "PodResizeInProgress"}, conditions
