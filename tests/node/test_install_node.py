"""The install a user runs, on the real node, with the image the Dockerfile builds.

`kubectl apply -k` of tests/node/install (config/default plus only what this machine forces):
both manager replicas start from the image and become Ready, which needs the in-cluster
credentials (pods reach the API server), the self-signed Secret and caBundle, and a TLS handshake
to their own webhook. The running manager processes are checked on the host, not in the spec: UID
and GID 65532, no capabilities at all, no-new-privileges, a read-only root filesystem. Then the API
server calls both webhooks through the `sidecarctl-webhook` Service (there is no kube-proxy: it
dials the endpoints): a SidecarSet passes /validate-sidecarset, and a pod in a labelled namespace
is injected by /inject and runs its sidecar on containerd.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tests.kube import images
from tests.kube.adminrest import ApiError
from tests.kube.client import eventually
from tests.node.conftest import LEASE, MANAGER_NS, Installed, NodeCluster, manager_pods, record
from tests.node.pods import app_container, create_and_wait_ready, fetch, pod

UID = 65532
SS_PATH = "/apis/sidecarctl.io/v1alpha1/sidecarsets"


def _process_of(cluster: NodeCluster, container_id: str) -> int:
    """The host PID of a container's first process, from the node's containerd."""
    cid = container_id.removeprefix("containerd://")
    out = cluster.node.ctr("tasks", "ps", cid)
    return int(out.splitlines()[1].split()[0])


def _status_fields(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _root_mount_options(pid: int) -> list[str]:
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        parts = line.split()
        if parts[4] == "/":
            return parts[5].split(",")
    raise AssertionError(f"no root mount for pid {pid}")


def test_manager_replicas_run_unprivileged_from_the_image(cluster: NodeCluster, installed: Installed) -> None:
    api = cluster.api
    pods = manager_pods(cluster)
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert len(running) == 2
    for p in running:
        (status,) = p["status"]["containerStatuses"]
        assert status["ready"] and status["restartCount"] == 0, status
        pid = _process_of(cluster, status["containerID"])
        fields = _status_fields(pid)
        assert fields["Uid"].split() == [str(UID)] * 4, fields["Uid"]
        assert fields["Gid"].split() == [str(UID)] * 4, fields["Gid"]
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(fields[cap], 16) == 0, f"{cap} {fields[cap]}"
        assert fields["NoNewPrivs"] == "1"
        assert "ro" in _root_mount_options(pid), "root filesystem is writable"
        assert fields["Seccomp"] == "2", "RuntimeDefault seccomp profile in force"

    secret = api.get(f"/api/v1/namespaces/{MANAGER_NS}/secrets/sidecarctl-webhook-certs")
    assert {"tls.crt", "tls.key", "ca.crt"} <= set(secret["data"])
    lease = api.get(LEASE)
    holder = lease["spec"].get("holderIdentity") or ""
    assert any(holder.startswith(p["metadata"]["name"]) for p in running), f"Lease held by {holder!r}"
    for path in (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/sidecarctl-injector",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/sidecarctl-validator",
    ):
        bundle = api.get(path)["webhooks"][0]["clientConfig"].get("caBundle", "")
        assert base64.b64decode(bundle) == base64.b64decode(secret["data"]["ca.crt"])


def test_api_server_calls_the_webhooks_through_the_service(
    cluster: NodeCluster, installed: Installed, namespace: str
) -> None:
    api = cluster.api
    name = f"node-proxy-{namespace[-6:]}"
    sidecarset = {
        "apiVersion": "sidecarctl.io/v1alpha1",
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "namespace": namespace,
            "containers": [
                {
                    "name": "proxy",
                    "image": images.sidecar_image("v1"),
                    "imagePullPolicy": "IfNotPresent",
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": images.SIDECAR_PORT}, "periodSeconds": 1},
                }
            ],
        },
    }
    api.create(SS_PATH, sidecarset)
    # Only the webhook can know about other SidecarSets: a second one injecting a container of the
    # same name into the same pods must be refused by /validate-sidecarset, once the manager's store
    # has the first one (a dry run calls the webhook and creates nothing).
    rival = {**sidecarset, "metadata": {"name": f"{name}-rival"}}

    def rival_refused() -> bool:
        try:
            api.request("POST", f"{SS_PATH}?dryRun=All", rival)
        except ApiError as e:
            assert e.status in (400, 403, 422), e
            return "validate.sidecarctl.io" in str(e)
        return False

    eventually(
        rival_refused,
        timeout=30,
        interval=0.2,
        what="conflicting SidecarSet refused by the webhook",
        retrying=(ApiError,),
    )
    try:
        api.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {"sidecar-injection": "enabled"}}})

        def injected() -> Any:
            # The manager's store sees the SidecarSet and the label a moment after they are written.
            probe = pod("probe", [app_container()], app="web")
            try:
                got = api.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
            except ApiError:
                return None
            return got if [c["name"] for c in got["spec"]["containers"]] == ["proxy", "app"] else None

        eventually(
            injected, timeout=30, interval=0.2, what="dry-run pod injected through the Service", retrying=(ApiError,)
        )
        created, took = create_and_wait_ready(api, namespace, pod("web-1", [app_container()], app="web"))
        record("injected pod create to Ready", took)
        assert [c["name"] for c in created["spec"]["containers"]] == ["proxy", "app"]
        assert created["metadata"]["labels"].get("sidecarctl.io/injected") == "true"
        assert all(c["ready"] for c in created["status"]["containerStatuses"])
        assert fetch(created["status"]["podIP"], images.SIDECAR_PORT, "/version") == "v1"
    finally:
        api.delete(f"{SS_PATH}/{name}")
