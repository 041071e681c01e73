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
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kube import images
from tests.kube.adminrest import ApiError, wait_for
from tests.kube.managerimage import Built
from tests.node.conftest import Cluster, record
from tests.node.pods import app_container, create_and_wait_ready, fetch, pod

INSTALL = Path(__file__).with_name("install")
MANAGER_NS = "sidecarctl-system"
UID = 65532
SS_PATH = "/apis/sidecarctl.io/v1alpha1/sidecarsets"


def kubectl(cluster: Cluster, *args: str) -> str:
    proc = subprocess.run(
        [str(cluster.kubectl), f"--kubeconfig={cluster.cp.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _process_of(cluster: Cluster, container_id: str) -> int:
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


@pytest.fixture(scope="module")
def installed(cluster: Cluster, manager_image: Built) -> Any:
    api = cluster.api
    if api.get_or_none(f"/api/v1/namespaces/{MANAGER_NS}") is None:
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MANAGER_NS}})
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "node-apiserver"},
        "data": {"host": cluster.node.gateway, "port": str(cluster.cp.port)},
    }
    api.create(f"/api/v1/namespaces/{MANAGER_NS}/configmaps", config_map)
    started = time.monotonic()
    kubectl(cluster, "apply", "-k", str(INSTALL))
    deployment = f"/apis/apps/v1/namespaces/{MANAGER_NS}/deployments/sidecarctl"

    def both_ready() -> bool:
        status = api.get(deployment).get("status") or {}
        return bool(status.get("readyReplicas") == 2 and status.get("updatedReplicas") == 2)

    try:
        wait_for(both_ready, timeout=180, interval=0.2, what="2 manager replicas Ready")
    except AssertionError:
        pods = kubectl(cluster, "-n", MANAGER_NS, "get", "pods,events", "-o", "wide")
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted((cluster.node.workdir / "kubelet" / "pod-logs").rglob("*.log"))
        )
        raise AssertionError(f"manager Deployment not ready:\n{pods}\n{logs}") from None
    record("install: apply -k to 2 manager replicas Ready", time.monotonic() - started)
    yield
    kubectl(cluster, "delete", "-k", str(INSTALL), "--ignore-not-found", "--wait=false")


def test_manager_replicas_run_unprivileged_from_the_image(cluster: Cluster, installed: Any) -> None:
    api = cluster.api
    selector = "app.kubernetes.io/name%3Dsidecarctl"
    pods = api.get(f"/api/v1/namespaces/{MANAGER_NS}/pods?labelSelector={selector}")["items"]
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
    lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/sidecarctl-controller")
    holder = lease["spec"].get("holderIdentity") or ""
    assert any(holder.startswith(p["metadata"]["name"]) for p in running), f"Lease held by {holder!r}"
    for path in (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/sidecarctl-injector",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/sidecarctl-validator",
    ):
        bundle = api.get(path)["webhooks"][0]["clientConfig"].get("caBundle", "")
        assert base64.b64decode(bundle) == base64.b64decode(secret["data"]["ca.crt"])


def test_api_server_calls_the_webhooks_through_the_service(cluster: Cluster, installed: Any, namespace: str) -> None:
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

    wait_for(rival_refused, timeout=30, interval=0.2, what="conflicting SidecarSet refused by the webhook")
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

        wait_for(injected, timeout=30, interval=0.2, what="dry-run pod injected through the Service")
        created, took = create_and_wait_ready(api, namespace, pod("web-1", [app_container()], app="web"))
        record("injected pod create to Ready", took)
        assert [c["name"] for c in created["spec"]["containers"]] == ["proxy", "app"]
        assert created["metadata"]["labels"].get("sidecarctl.io/injected") == "true"
        assert all(c["ready"] for c in created["status"]["containerStatuses"])
        assert fetch(created["status"]["podIP"], images.SIDECAR_PORT, "/version") == "v1"
    finally:
        api.delete(f"{SS_PATH}/{name}")
