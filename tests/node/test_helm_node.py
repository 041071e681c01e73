"""`helm install` of charts/sidecarctl on the real node, with the image the Dockerfile builds.

The chart is installed the way the README says (`helm install sidecarctl charts/sidecarctl`), with
only what this machine forces set as values: `image.pullPolicy=Never` (the image is imported, no
registry) and the API server's address as `extraEnv` (no kube-proxy; see tests/node/install). Both
replicas become Ready, the SidecarSet webhook is called through the Service and a pod in a
labelled namespace is injected and runs its sidecar on containerd. `helm uninstall` then removes
every object the chart made, and with them every policy the manager made.

Runs before the kustomize install of the other node tests (tests/node/conftest.py FIRST_MODULES):
both install the same cluster-scoped objects.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecarsets.spec import names
from tests.kube import helm, images
from tests.kube.adminrest import ApiError
from tests.kube.client import eventually
from tests.kube.managerimage import Built
from tests.node.conftest import (
    LEASE,
    MANAGER_NS,
    NodeCluster,
    manager_pods,
    record,
    record_value,
    wait_manager_ready,
)
from tests.node.pods import app_container, create_and_wait_ready, fetch, pod
from tests.node.rollout import SS_PATH, sidecarset

RELEASE = "sidecarctl"
POLICY_GROUP = "/apis/admissionregistration.k8s.io/v1"
MANAGED_BY = "app.kubernetes.io/managed-by%3Dsidecarctl"


@dataclasses.dataclass
class Release:
    rendered: list[dict[str, Any]]
    env: dict[str, str]
    values: Path


def run_helm(cluster: NodeCluster, env: dict[str, str], *args: str, timeout: float = 300) -> str:
    binary = helm.cached_binary("helm")
    assert binary is not None, helm.missing_reason("helm")
    proc = subprocess.run(
        [str(binary), f"--kubeconfig={cluster.cp.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def object_path(obj: dict[str, Any]) -> str:
    """The REST path of a rendered object (the kinds the chart holds)."""
    kind, meta = obj["kind"], obj["metadata"]
    group_version = obj["apiVersion"]
    plural = {
        "Namespace": "namespaces",
        "CustomResourceDefinition": "customresourcedefinitions",
        "ServiceAccount": "serviceaccounts",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "Role": "roles",
        "RoleBinding": "rolebindings",
        "Service": "services",
        "Deployment": "deployments",
        "PodDisruptionBudget": "poddisruptionbudgets",
        "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
        "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
    }[kind]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    ns = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
    return f"{base}{ns}/{plural}/{meta['name']}"


@pytest.fixture(scope="module")
def release(cluster: NodeCluster, manager_image: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    api = cluster.api
    mwc = f"{POLICY_GROUP}/mutatingwebhookconfigurations/{names.MUTATING_WEBHOOK_CONFIG}"
    assert api.get_or_none(mwc) is None, "the manager is installed already: the Helm test must run first"
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    values = home / "node-values.yaml"
    values.write_text(
        json.dumps(
            {
                "image": {"pullPolicy": "Never"},
                "extraEnv": [
                    {"name": "KUBERNETES_SERVICE_HOST", "value": cluster.node.gateway},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": str(cluster.cp.port)},
                ],
            }
        )
    )
    rendered = helm.docs(run_helm(cluster, env, "template", RELEASE, str(helm.CHART), "-f", str(values)))
    started = time.monotonic()
    run_helm(cluster, env, "install", RELEASE, str(helm.CHART), "--namespace", "default", "-f", str(values))
    wait_manager_ready(cluster, what="2 manager replicas Ready after helm install")
    record("helm install to 2 manager replicas Ready", time.monotonic() - started)
    try:
        yield Release(rendered, env, values)
    finally:
        listing = run_helm(cluster, env, "list", "--namespace", "default", "--short")
        if RELEASE in listing.split():  # the uninstall test did not run or failed before uninstalling
            run_helm(cluster, env, "uninstall", RELEASE, "--namespace", "default", "--wait")
        _wait_gone(cluster, f"/api/v1/namespaces/{MANAGER_NS}", timeout=180)


def _wait_gone(cluster: NodeCluster, path: str, *, timeout: float) -> None:
    eventually(
        lambda: cluster.api.get_or_none(path) is None,
        timeout=timeout,
        interval=0.2,
        what=f"{path} deleted",
        retrying=(ApiError,),
    )


def test_helm_install_runs_the_manager_and_injects(cluster: NodeCluster, release: Release, namespace: str) -> None:
    api = cluster.api
    running = [p for p in manager_pods(cluster) if p["status"].get("phase") == "Running"]
    assert len(running) == 2
    for p in running:
        (status,) = p["status"]["containerStatuses"]
        assert status["ready"] and status["image"].endswith("sidecarctl:0.1.0")
    holder = api.get(LEASE)["spec"].get("holderIdentity") or ""
    assert any(holder.startswith(p["metadata"]["name"]) for p in running), holder

    name = f"helm-proxy-{namespace[-6:]}"
    obj = sidecarset(name, namespace, images.sidecar_image("v1"), max_unavailable=1, app="web")
    api.create(SS_PATH, obj)
    try:
        # /validate-sidecarset through the chart's Service and caBundle: a rival is refused.
        rival = {**obj, "metadata": {"name": f"{name}-rival"}}

        def rival_refused() -> bool:
            try:
                api.request("POST", f"{SS_PATH}?dryRun=All", rival)
            except ApiError as e:
                return "validate.sidecarctl.io" in str(e)
            return False

        eventually(
            rival_refused,
            timeout=30,
            interval=0.2,
            what="conflicting SidecarSet refused by the webhook",
            retrying=(ApiError,),
        )
        api.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {"sidecar-injection": "enabled"}}})

        def injected() -> bool:
            probe = pod("probe", [app_container()], app="web")
            try:
                got = api.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
            except ApiError:
                return False
            return [c["name"] for c in got["spec"]["containers"]] == ["proxy", "app"]

        eventually(injected, timeout=30, interval=0.2, what="a pod injected after helm install", retrying=(ApiError,))
        created, took = create_and_wait_ready(api, namespace, pod("web-1", [app_container()], app="web"))
        assert [c["name"] for c in created["spec"]["containers"]] == ["proxy", "app"]
        assert fetch(created["status"]["podIP"], images.SIDECAR_PORT, "/version") == "v1"
        by = created["metadata"]["annotations"].get(names.ANN_INJECTED_BY)
        assert by in (names.INJECTED_BY_POLICY, names.INJECTED_BY_WEBHOOK)
        record("helm install: injected pod create to Ready", took)
        record_value("helm install: pod injected by", str(by))
    finally:
        api.delete(f"{SS_PATH}/{name}")


@pytest.fixture(scope="module")
def uninstalled(cluster: NodeCluster, release: Release) -> float:
    started = time.monotonic()
    run_helm(cluster, release.env, "uninstall", RELEASE, "--namespace", "default", "--wait")
    took = time.monotonic() - started
    record("helm uninstall --wait", took)
    return took


def test_helm_uninstall_removes_what_the_chart_made(cluster: NodeCluster, release: Release, uninstalled: float) -> None:
    assert len(release.rendered) >= 14
    for obj in release.rendered:
        # The namespace and the CRD finish deleting in the background (their contents go first).
        _wait_gone(cluster, object_path(obj), timeout=180)

    # The policies the manager made (for SidecarSets, and its support probe) are owned by the
    # SidecarSets and by its namespace: the garbage collector removes them with those.
    eventually(
        lambda: not _managed_policies(cluster),
        timeout=60,
        interval=0.2,
        what="the manager's policies removed",
        retrying=(ApiError,),
    )


def _managed_policies(cluster: NodeCluster) -> list[str]:
    return [
        f"{kind}/{p['metadata']['name']}"
        for kind in ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings")
        for p in cluster.api.get(f"{POLICY_GROUP}/{kind}?labelSelector={MANAGED_BY}")["items"]
    ]
