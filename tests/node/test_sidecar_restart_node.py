"""What the real kubelet does when a running pod's sidecar image is patched: the fact every in-place
upgrade rests on, checked on containerd + runc instead of the fake kubelet of the e2e tier.

It restarts that one container: same pod (UID), same sandbox, the app container untouched (same
containerID and startedAt, no restart), the sidecar with restartCount 1, a new containerID and the
new image's imageID; the new container really serves the new version.
"""

from __future__ import annotations

import time
from typing import Any

from tests.kube import images
from tests.kube.adminrest import ApiError
from tests.kube.client import eventually
from tests.node.conftest import NodeCluster, record
from tests.node.pods import app_container, create_and_wait_ready, fetch, is_ready, pod, sidecar_container, statuses


def test_patching_the_sidecar_image_restarts_only_the_sidecar(cluster: NodeCluster, namespace: str) -> None:
    api = cluster.api
    body = pod("web", [app_container(), sidecar_container(images.sidecar_image("v1"))])
    created, took = create_and_wait_ready(api, namespace, body)
    record("pod create to Ready (app + sidecar)", took)
    path = f"/api/v1/namespaces/{namespace}/pods/web"
    before = statuses(created)
    ip = created["status"]["podIP"]
    assert fetch(ip, images.SIDECAR_PORT, "/version") == "v1"
    assert fetch(ip, images.APP_PORT, "/") == "app"

    started = time.monotonic()
    api.patch(
        path,
        [
            {"op": "test", "path": "/spec/containers/1/name", "value": "proxy"},
            {"op": "replace", "path": "/spec/containers/1/image", "value": images.sidecar_image("v2")},
        ],
        "json",
    )

    def restarted() -> dict[str, Any] | None:
        got: dict[str, Any] = api.get(path)
        proxy = statuses(got)["proxy"]
        done = proxy["restartCount"] == 1 and proxy.get("ready") and is_ready(got)
        return got if done and proxy["imageID"] != before["proxy"]["imageID"] else None

    after_pod = eventually(
        restarted, timeout=60, interval=0.05, what="sidecar restarted on v2 and pod Ready", retrying=(ApiError,)
    )
    record("sidecar image patch to pod Ready again", time.monotonic() - started)
    after = statuses(after_pod)

    assert after_pod["metadata"]["uid"] == created["metadata"]["uid"]
    assert after_pod["status"]["podIP"] == ip, "same sandbox, same network namespace"
    app_before, app_after = before["app"], after["app"]
    assert app_after["containerID"] == app_before["containerID"]
    assert app_after["state"]["running"]["startedAt"] == app_before["state"]["running"]["startedAt"]
    assert app_after["restartCount"] == 0
    proxy_before, proxy_after = before["proxy"], after["proxy"]
    assert proxy_after["restartCount"] == 1
    assert proxy_after["containerID"] != proxy_before["containerID"]
    assert proxy_after["imageID"].startswith("sha256:") and proxy_after["imageID"] != proxy_before["imageID"]
    assert proxy_after["image"] == images.sidecar_image("v2")
    assert "running" in proxy_after["state"]
    assert proxy_after["lastState"]["terminated"]["exitCode"] == 0, "the v1 sidecar exits 0 on SIGTERM"
    assert fetch(ip, images.SIDECAR_PORT, "/version") == "v2"
    assert fetch(ip, images.APP_PORT, "/") == "app"
