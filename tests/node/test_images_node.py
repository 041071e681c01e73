"""The test images behave on the real kubelet as the tiers above will rely on.

- the "bad" reference can never be pulled, and fails fast (nothing listens on 127.0.0.1:1);
- the stubborn sidecar ignores SIGTERM: on an image patch the kubelet waits out the grace period
  and kills it (exit 137), and the old container stays running and ready all that time.
"""

from __future__ import annotations

import time
from typing import Any

from tests.kube import images
from tests.kube.adminrest import ApiError
from tests.kube.client import eventually
from tests.node.conftest import NodeCluster, record
from tests.node.pods import app_container, create_and_wait_ready, pod, sidecar_container, statuses

GRACE = 2


def test_bad_image_is_never_pulled(cluster: NodeCluster, namespace: str) -> None:
    api = cluster.api
    body = pod("bad", [app_container(), sidecar_container(images.BAD_IMAGE)])
    started = time.monotonic()
    api.create(f"/api/v1/namespaces/{namespace}/pods", body)

    def pull_failed() -> dict[str, Any] | None:
        proxy = statuses(api.get(f"/api/v1/namespaces/{namespace}/pods/bad")).get("proxy") or {}
        waiting = (proxy.get("state") or {}).get("waiting") or {}
        return waiting if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    waiting = eventually(
        pull_failed, timeout=30, interval=0.1, what="ErrImagePull for the bad image", retrying=(ApiError,)
    )
    record("bad image: create to ErrImagePull", time.monotonic() - started)
    assert "connection refused" in waiting.get("message", ""), waiting


def test_stubborn_sidecar_is_killed_after_the_grace_period(cluster: NodeCluster, namespace: str) -> None:
    api = cluster.api
    body = pod("stubborn", [app_container(), sidecar_container(images.stubborn_image("v1"))], grace=GRACE)
    created, _ = create_and_wait_ready(api, namespace, body)
    path = f"/api/v1/namespaces/{namespace}/pods/stubborn"
    old_id = statuses(created)["proxy"]["containerID"]
    started = time.monotonic()
    patch = [{"op": "replace", "path": "/spec/containers/1/image", "value": images.stubborn_image("v2")}]
    api.patch(path, patch, "json")
    old_ready_until = 0.0
    while time.monotonic() - started < 60:
        proxy = statuses(api.get(path))["proxy"]
        if proxy["containerID"] == old_id:
            if proxy.get("ready"):
                old_ready_until = time.monotonic() - started
        elif proxy["restartCount"] == 1 and proxy.get("ready"):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"stubborn sidecar not restarted on v2 within 60 s: {proxy}")
    took = time.monotonic() - started
    record("stubborn sidecar: image patch to Ready again", took)
    assert proxy["lastState"]["terminated"]["exitCode"] == 137, proxy["lastState"]
    assert took >= GRACE, "SIGTERM was not ignored"
    assert old_ready_until >= GRACE * 0.8, f"the old container reported ready only for {old_ready_until:.1f}s"
