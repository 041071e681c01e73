"""A rollout beside a digest-pinning webhook, on the real kubelet.

A webhook of the test's own (tests/kube/neighbours.py, registered after sidecarctl's, on pod CREATE
and UPDATE) pins every image to the digest containerd really holds for it, as sigstore's
policy-controller or Kyverno's verifyImages do. So the kubelet runs `sidecar:v1@sha256:<real>` and,
after the in-place upgrade (whose patch the pinner rewrites too), `sidecar:v2@sha256:<real>`. The
SidecarSet must count those pods injected, updated and ready (its rule: a pinned sidecar's reported
imageID carries the pinned digest) and patch each pod exactly once for the rollout (the API server's
audit log), never mark one not upgradable.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from typing import Any

from sidecarsets.spec import names
from tests.kube import images
from tests.kube.adminrest import ApiError
from tests.kube.audit import pod_patches
from tests.kube.client import eventually
from tests.kube.loop import BackgroundLoop
from tests.kube.neighbours import digest_pinning_app, neighbour, pinned
from tests.node.conftest import Installed, NodeCluster, record
from tests.node.pods import app_container, is_ready, statuses
from tests.node.rollout import SIDECAR, create_workload

REPLICAS = 3


@contextlib.contextmanager
def _digests(cluster: NodeCluster, *refs: str) -> Iterator[dict[str, str]]:
    """The manifest digest containerd holds for each image (what a registry would have served), each
    also named `repo@digest` meanwhile, as a pull from a registry names it beside the tag (an import
    does not); the names are removed afterwards, so the tier's other tests see the images as before."""
    held = {name: row[2] for name, row in cluster.node.images().items() if len(row) > 2}
    missing = [r for r in refs if not held.get(r, "").startswith("sha256:")]
    assert not missing, f"containerd holds no digest for {missing}: {sorted(held)}"
    by_digest = {r: f"{r.rpartition(':')[0]}@{held[r]}" for r in refs}
    added = [name for name in by_digest.values() if name not in held]
    for r, name in by_digest.items():
        if name in added:
            cluster.node.ctr("images", "tag", r, name)
    try:
        yield {r: held[r] for r in refs}
    finally:
        if added:
            cluster.node.ctr("images", "rm", *added)


def _not_upgradable(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == names.POD_CONDITION_UPGRADABLE and c.get("status") == "False" for c in conditions)


def test_a_rollout_beside_a_digest_pinning_webhook_runs_the_digest_and_counts_it(
    cluster: NodeCluster, installed: Installed, namespace: str, aloop: BackgroundLoop
) -> None:
    v1, v2 = images.sidecar_image("v1"), images.sidecar_image("v2")
    with _digests(cluster, v1, v2, images.APP_IMAGE) as digests:  # the pinner pins the app's image too
        _roll_beside_the_pinner(cluster, namespace, aloop, digests)


def _roll_beside_the_pinner(
    cluster: NodeCluster, namespace: str, aloop: BackgroundLoop, digests: dict[str, str]
) -> None:
    v1, v2 = images.sidecar_image("v1"), images.sidecar_image("v2")
    calls: list[tuple[str, str]] = []
    probe_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"}}
    probe_pod["spec"] = {"containers": [app_container()]}
    probe = functools.partial(cluster.api.request, "POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe_pod)
    with neighbour(
        aloop,
        cluster.api,
        digest_pinning_app(digests, calls),
        config_name=f"zz-digest-{namespace[-6:]}",
        namespace=namespace,
        operations=("CREATE", "UPDATE"),
        probe=probe,
        called=lambda p: "@sha256:" in p["spec"]["containers"][0]["image"],
    ):
        w = create_workload(cluster.api, namespace, image=v1, replicas=REPLICAS, max_unavailable=1, app="pinned")
        before = {p["metadata"]["name"]: p for p in w.pods()}
        for name, p in before.items():
            sidecar = next(c for c in p["spec"]["containers"] if c["name"] == SIDECAR)
            assert sidecar["image"] == pinned(v1, digests), (name, sidecar["image"])
            assert statuses(p)[SIDECAR]["imageID"].endswith(digests[v1]), (name, statuses(p)[SIDECAR])
        for _ in range(6):  # counted and staying so: nothing patches the pods behind the status's back
            time.sleep(0.5)
            st = w.status()
            assert (st.get("updatedPods"), st.get("updatedReadyPods")) == (REPLICAS, REPLICAS), st

        start = cluster.cp.audit_log.stat().st_size
        patched_at = w.set_image(v2)

        def rolled() -> list[dict[str, Any]] | None:
            got = w.pods()
            on_v2 = [
                p
                for p in got
                if is_ready(p)
                and statuses(p)[SIDECAR]["imageID"].endswith(digests[v2])
                and statuses(p)[SIDECAR].get("ready")
            ]
            st = w.status()
            done = len(on_v2) == REPLICAS and (st.get("updatedPods"), st.get("updatedReadyPods")) == (
                REPLICAS,
                REPLICAS,
            )
            return got if done else None

        # 3 pods one at a time (maxUnavailable 1), each a container stop, start and readiness
        # probe (2-5 s here under the suite's load): 90 s is several times that, still a bound.
        after = eventually(
            rolled, timeout=90, interval=0.2, what="every pod running v2's digest and counted", retrying=(ApiError,)
        )
        took = time.monotonic() - patched_at
    patches = pod_patches(cluster.cp, start, namespace)
    assert sorted(patches) == sorted(before) and max(patches.values()) == 1, f"patches per pod: {patches}"
    assert {n for op, n in calls if op == "UPDATE"} == set(before), f"the pinner saw each upgrade: {calls}"
    for p in after:
        name = p["metadata"]["name"]
        assert p["metadata"]["uid"] == before[name]["metadata"]["uid"], f"{name} was recreated"
        sidecar = next(c for c in p["spec"]["containers"] if c["name"] == SIDECAR)
        assert sidecar["image"] == pinned(v2, digests), (name, sidecar["image"])
        assert statuses(p)[SIDECAR]["restartCount"] == statuses(before[name])[SIDECAR]["restartCount"] + 1
        assert statuses(p)["app"]["containerID"] == statuses(before[name])["app"]["containerID"]
        assert not _not_upgradable(p), f"{name} marked not upgradable"
    record(f"rollout beside a digest pinner ({REPLICAS} pods, maxUnavailable 1)", took)
