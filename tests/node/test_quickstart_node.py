"""The README's quickstart, run as written on the real node, then the documented uninstall.

The commands are read from README.md, from the fenced blocks after the markers
`<!-- quickstart:image -->`, `<!-- quickstart:install -->` and `<!-- quickstart:upgrade -->`, and run
by bash with `set -euo pipefail` in the repository's root, with the node's kubectl first on PATH and
KUBECONFIG naming this cluster. Only the image step is swapped: instead of `docker build` and
`kind load`, the Dockerfile's image is built here (buildah) and imported into the node's containerd
(the `manager_image` fixture), under the name the image step tags. A change to the README that
breaks a command, the SidecarSet or the expected result fails this test.

What the node cannot provide, the cluster around the commands provides, as a real cluster would:

- no registry is reachable, so every image the quickstart names (`busybox:...`) is imported as a
  stand-in built from Debian's static busybox, each version with its own image ID;
- there is no kube-proxy, so the `kubernetes` Service's address leads nowhere from a pod: a
  MutatingAdmissionPolicy of this test gives pods in the manager's namespace the API server's real
  address (KUBERNETES_SERVICE_HOST/PORT, which win over the kubelet's service variables), which is
  what kube-proxy does for every pod of a real cluster.

Checked: the Deployment's pods were injected (the sidecar container, the injected label, the path
annotation) and run it; after the image change the same pods (UIDs) run the sidecar on the new image
with one more restart and a new image ID, and the app container was not restarted. Then the uninstall
block of docs/operations/upgrade.md (marker `<!-- uninstall -->`) removes everything, webhook
configurations first, and a pod in the formerly injected namespace is created without a sidecar.

Runs before the other modules' kustomize install (tests/node/conftest.py FIRST_MODULES): both make
the same cluster-scoped objects.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecarsets.spec import names
from tests.kube import images
from tests.kube.adminrest import ApiError
from tests.kube.client import eventually
from tests.kube.managerimage import Built
from tests.node.conftest import MANAGER_NS, NodeCluster, record
from tests.node.pods import statuses

pytestmark = pytest.mark.node

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
UNINSTALL_PAGE = REPO / "docs" / "operations" / "upgrade.md"
STEPS = ("image", "install", "upgrade")
POLICIES = "/apis/admissionregistration.k8s.io/v1"
SHIM = "quickstart-test-apiserver-address"
MANAGED_POLICIES = f"{POLICIES}/mutatingadmissionpolicies?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dsidecarctl"


def fenced_after(text: str, marker: str) -> str:
    """The body of the ```sh block right after `<!-- marker -->` (exactly one such marker)."""
    found = re.findall(rf"^<!-- {re.escape(marker)} -->\n```sh\n(.*?)^```$", text, re.M | re.S)
    assert len(found) == 1, f"{marker}: expected one marked sh block, found {len(found)}"
    body: str = found[0]
    return body


def quickstart() -> dict[str, str]:
    text = README.read_text(encoding="utf-8")
    return {step: fenced_after(text, f"quickstart:{step}") for step in STEPS}


def docker_ref(image: str) -> str:
    """`busybox:1.36` as containerd names it (docker.io/library/busybox:1.36)."""
    first = image.split("/")[0]
    if "/" not in image:
        return f"docker.io/library/{image}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{image}"
    return image


def images_named(script: str) -> set[str]:
    """Every image a quickstart block names: `image:` lines of its manifests and `--image=` flags."""
    found = set(re.findall(r"^\s*image:\s*(\S+)\s*$", script, re.M))
    found |= set(re.findall(r"--image=(\S+)", script))
    found |= set(re.findall(r'"value":\s*"([^"]+:[^"]+)"', script))  # the image a JSON patch sets
    return found


def stand_ins(refs: set[str], path: Path) -> Path:
    specs = tuple(
        images.Spec(
            ref=docker_ref(ref),
            entrypoint=("/bin/sh",),
            files=(("etc/stand-in", f"{ref}: stand-in built from Debian's busybox (no registry reachable)\n"),),
            labels=(("org.opencontainers.image.version", ref.rpartition(":")[2]),),
        )
        for ref in sorted(refs)
    )
    images.write_archive(path, specs, images.BUSYBOX.read_bytes())
    return path


def apiserver_address_policy(cluster: NodeCluster) -> list[dict[str, Any]]:
    """kube-proxy's part for the manager's pods: the API server's address as explicit env."""
    env = [
        f'Object.spec.containers.env{{name: "KUBERNETES_SERVICE_HOST", value: "{cluster.node.gateway}"}}',
        f'Object.spec.containers.env{{name: "KUBERNETES_SERVICE_PORT", value: "{cluster.cp.port}"}}',
    ]
    expression = (
        "Object{spec: Object.spec{containers: object.spec.containers.map(c, "
        f"Object.spec.containers{{name: c.name, env: [{', '.join(env)}]}})}}}}"
    )
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": SHIM},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [MANAGER_NS, "default"]}
                    ]
                },
            },
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": SHIM},
        "spec": {"policyName": SHIM},
    }
    return [policy, binding]


def run_block(cluster: NodeCluster, script: str, what: str, *, timeout: float = 600) -> str:
    assert cluster.node.bin_dir is not None
    env = {
        **{k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR")},
        "PATH": f"{cluster.node.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
        "KUBECONFIG": str(cluster.cp.kubeconfig),
    }
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    record(f"quickstart: {what}", time.monotonic() - started)
    assert proc.returncode == 0, f"the {what} commands failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def hello_pods(cluster: NodeCluster) -> dict[str, dict[str, Any]]:
    items = cluster.api.get("/api/v1/namespaces/shop/pods?labelSelector=app%3Dhello")["items"]
    return {p["metadata"]["uid"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def container_image(p: dict[str, Any], name: str) -> str:
    image: str = next(c["image"] for c in p["spec"]["containers"] if c["name"] == name)
    return image


@pytest.fixture
def environment(cluster: NodeCluster, manager_image: Built, tmp_path: Path) -> Iterator[dict[str, str]]:
    """What a real cluster has and this node lacks: the quickstart's images and kube-proxy's routing."""
    api = cluster.api
    mwc = f"{POLICIES}/mutatingwebhookconfigurations/{names.MUTATING_WEBHOOK_CONFIG}"
    assert api.get_or_none(mwc) is None, "the manager is installed already: the quickstart must run first"
    blocks = quickstart()
    refs = set().union(*(images_named(b) for b in blocks.values()))
    assert refs, "the quickstart names no image for its pods"
    cluster.node.import_image(stand_ins(refs, tmp_path / "quickstart-images.tar"))
    for obj in apiserver_address_policy(cluster):
        plural = {"MutatingAdmissionPolicy": "mutatingadmissionpolicies"}.get(obj["kind"], f"{obj['kind'].lower()}s")
        api.create(f"{POLICIES}/{plural}", obj)

    def enforced() -> bool:
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "probe-"},
            "spec": {"containers": [{"name": "c", "image": images.APP_IMAGE}]},
        }
        got = api.request("POST", "/api/v1/namespaces/default/pods?dryRun=All", probe)
        env = {e["name"]: e.get("value") for e in got["spec"]["containers"][0].get("env") or []}
        return bool(env.get("KUBERNETES_SERVICE_HOST") == cluster.node.gateway)

    eventually(enforced, timeout=60, interval=0.5, what="the API server address policy in force", retrying=(ApiError,))
    try:
        yield blocks
    finally:
        kubectl = [str(cluster.kubectl), f"--kubeconfig={cluster.cp.kubeconfig}"]
        for args in (
            ["delete", "mutatingwebhookconfiguration", names.MUTATING_WEBHOOK_CONFIG, "--ignore-not-found"],
            ["delete", "validatingwebhookconfiguration", names.VALIDATING_WEBHOOK_CONFIG, "--ignore-not-found"],
            ["delete", "sidecarsets.v1alpha1.sidecarctl.io", "--all", "--ignore-not-found"],
            ["delete", "namespace", "shop", "--ignore-not-found", "--wait=false"],
            ["delete", "-k", str(REPO / "config" / "default"), "--ignore-not-found", "--wait=false"],
        ):
            subprocess.run([*kubectl, *args], capture_output=True, timeout=120, check=False)
        for kind in ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies"):
            with contextlib.suppress(ApiError):
                api.delete(f"{POLICIES}/{kind}/{SHIM}")
        for path in (
            f"/api/v1/namespaces/{MANAGER_NS}",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/sidecarsets.sidecarctl.io",
            "/api/v1/namespaces/shop",
        ):
            eventually(
                lambda p=path: api.get_or_none(p) is None,  # type: ignore[misc]
                timeout=180,
                interval=0.2,
                what=f"{path} deleted",
                retrying=(ApiError,),
            )


def test_the_readme_quickstart_runs_as_written(
    cluster: NodeCluster, manager_image: Built, environment: dict[str, str]
) -> None:
    api = cluster.api
    blocks = environment
    # The swapped step: the image it builds is the one the fixture built from the same Dockerfile.
    tags = re.findall(r"docker build -t (\S+) \.", blocks["image"])
    assert tags and {docker_ref(t) for t in tags} == {manager_image.ref}, (tags, manager_image.ref)

    out = run_block(cluster, blocks["install"], "install, namespace, SidecarSet, Deployment")
    before = hello_pods(cluster)
    assert len(before) == 2, out
    for p in before.values():
        names_ = [c["name"] for c in p["spec"]["containers"]]
        assert names_[0] == "sidecar" and len(names_) == 2, names_
        assert p["metadata"]["labels"].get(names.POD_INJECTED_LABEL) == "true"
        assert p["metadata"]["annotations"].get(names.ANN_INJECTED_BY) in ("policy", "webhook")
        st = statuses(p)
        assert st["sidecar"]["ready"] and st["sidecar"]["state"].get("running"), st
        assert container_image(p, "sidecar") == "busybox:1.36"
    assert "2/2" in out, out

    out = run_block(cluster, blocks["upgrade"], "sidecar image rolled in place")
    after = hello_pods(cluster)
    assert set(after) == set(before), "the pods were replaced, not upgraded in place"
    for uid, p in after.items():
        old, new = statuses(before[uid]), statuses(p)
        app = next(c["name"] for c in p["spec"]["containers"] if c["name"] != "sidecar")
        assert container_image(p, "sidecar") == "busybox:1.37"
        assert new["sidecar"]["image"] == docker_ref("busybox:1.37")
        assert new["sidecar"]["restartCount"] == old["sidecar"]["restartCount"] + 1
        assert new["sidecar"]["imageID"] != old["sidecar"]["imageID"]
        assert new["sidecar"]["ready"]
        assert new[app]["containerID"] == old[app]["containerID"]
        assert new[app]["restartCount"] == old[app]["restartCount"]
        assert p["metadata"]["name"] in out and uid in out
    ss = yaml.safe_load(run_block(cluster, "kubectl get sidecarset hello-sidecar -o yaml", "read the SidecarSet"))
    assert ss["status"]["updatedReadyPods"] == ss["status"]["matchedPods"] == 2

    # The documented uninstall: webhook configurations first, then SidecarSets, labels, the rest.
    uninstall = fenced_after(UNINSTALL_PAGE.read_text(encoding="utf-8"), "uninstall")
    run_block(cluster, uninstall, "documented uninstall")
    for path in (
        f"{POLICIES}/mutatingwebhookconfigurations/{names.MUTATING_WEBHOOK_CONFIG}",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/sidecarsets.sidecarctl.io",
        f"/api/v1/namespaces/{MANAGER_NS}",
    ):
        eventually(
            lambda p=path: api.get_or_none(p) is None,  # type: ignore[misc]
            timeout=180,
            interval=0.2,
            what=f"{path} deleted",
            retrying=(ApiError,),
        )
    eventually(
        lambda: not api.get(MANAGED_POLICIES)["items"],
        timeout=120,
        interval=0.5,
        what="the manager's policies garbage-collected",
        retrying=(ApiError,),
    )
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "after-", "labels": {"app": "hello"}},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.37", "command": ["true"]}]},
    }
    got = api.request("POST", "/api/v1/namespaces/shop/pods?dryRun=All", probe)
    assert [c["name"] for c in got["spec"]["containers"]] == ["app"], "a pod after the uninstall got a sidecar"
