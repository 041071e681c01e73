"""The test foundation itself, on the real control plane: CRD, admission path, fake kubelet, GC."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from kuberuntime import api
from tests.kube import builders
from tests.kube.builders import image_id, sidecarset
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import REPO, ControlPlane, supported_versions
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop
from tests.kube.webhook import labeling_webhook

SS_PATH = "/apis/sidecarctl.io/v1alpha1/sidecarsets"


def pod(name: str) -> dict[str, Any]:
    """The default pod, labelled `app: <name>`, that stops at once when deleted."""
    return builders.pod(name, labels={"app": name}, terminationGracePeriodSeconds=1)


def _asked_version() -> str | None:
    """The version the binaries must be: the one the versions tier asks for, else the newest the build
    script supports; None when $KUBEBUILDER_ASSETS provides them (any version it holds)."""
    asked = os.environ.get("SIDECARCTL_K8S_VERSION")
    if asked:
        return asked
    return None if os.environ.get("KUBEBUILDER_ASSETS") else supported_versions()[-1]


@pytest.mark.versions
def test_api_server_is_the_real_one(kube: Kube, control_plane: ControlPlane) -> None:
    """The server answering is the kube-apiserver binary the control plane started, of the version
    the tier asked for (or the one $KUBEBUILDER_ASSETS holds)."""
    version = kube.get("/version")
    binary = control_plane.bin_dir / "kube-apiserver"
    says = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=True)
    assert says.stdout.split() == ["Kubernetes", version["gitVersion"]]
    assert version["major"] == "1"
    asked = _asked_version()
    if asked is not None:
        served = version["gitVersion"].removeprefix("v")
        assert served == asked or served.startswith(asked + "."), (served, asked)


@pytest.mark.versions
def test_sidecarset_crd_accepts_valid_and_schema_rejects_invalid(kube: Kube, crd: dict[str, Any]) -> None:
    created = kube.create(SS_PATH, sidecarset("foundation-valid"))
    try:
        spec = created["spec"]
        # Schema defaults are applied by the API server.
        assert spec["updateStrategy"]["type"] == "RollingUpdate"
        assert spec["revisionHistoryLimit"] == 10
        with pytest.raises(api.Invalid) as err:
            kube.create(SS_PATH, sidecarset("foundation-invalid", containers="not-a-list"))
        assert "spec.containers" in err.value.message
    finally:
        kube.delete(f"{SS_PATH}/foundation-valid")


def test_throwaway_webhook_mutates_through_real_admission(aloop: BackgroundLoop, kube: Kube, namespace: str) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    with labeling_webhook(
        aloop,
        kube,
        config_name=f"foundation-{namespace}",
        namespace=namespace,
        label="mutated-by",
        value="foundation-test",
        probe=lambda: kube.create(pods, pod("probe"), dryRun="All"),
    ):
        stored = kube.create(pods, pod("real"))
        assert stored["metadata"]["labels"]["mutated-by"] == "foundation-test"
        assert kube.get(f"{pods}/real")["metadata"]["labels"]["mutated-by"] == "foundation-test"


def _container(p: dict[str, Any] | None, name: str) -> dict[str, Any]:
    assert p is not None
    return next(s for s in p["status"]["containerStatuses"] if s["name"] == name)


def _ready(p: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))


def test_fake_kubelet_runs_pods_and_restarts_changed_images(kube: Kube, kubelet: FakeKubelet, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    body = pod("web")
    body["spec"]["containers"].append({"name": "proxy", "image": "proxy:1"})
    created = kube.create(path, body)

    def ready_pod() -> dict[str, Any] | None:
        p = kube.get(f"{path}/web")
        return p if _ready(p) else None

    running = eventually(ready_pod, what="pod Ready")
    assert running["spec"]["nodeName"] == kubelet.node
    assert running["status"]["phase"] == "Running"
    assert _container(running, "proxy")["imageID"] == image_id("proxy:1")
    assert _container(running, "proxy")["restartCount"] == 0

    ops = [
        {"op": "test", "path": "/spec/containers/1/name", "value": "proxy"},
        {"op": "replace", "path": "/spec/containers/1/image", "value": "proxy:2"},
    ]
    kube.patch(f"{path}/web", ops, patch_type="json")
    saw_not_ready = eventually(lambda: not _ready(kube.get(f"{path}/web")), timeout=5, what="not-ready window")
    assert saw_not_ready

    def upgraded() -> dict[str, Any] | None:
        p = kube.get(f"{path}/web")
        st = _container(p, "proxy")
        return p if _ready(p) and st["imageID"] == image_id("proxy:2") else None

    after = eventually(upgraded, what="proxy restarted on the new image")
    assert after is not None
    assert _container(after, "proxy")["restartCount"] == 1
    assert _container(after, "proxy")["image"] == "proxy:2"
    assert _container(after, "app")["restartCount"] == 0
    assert after["metadata"]["uid"] == created["metadata"]["uid"]

    # A bad image never becomes ready.
    kubelet.bad_images.add("proxy:bad")
    kube.patch(f"{path}/web", [{"op": "replace", "path": "/spec/containers/1/image", "value": "proxy:bad"}], "json")
    eventually(lambda: _container(kube.get(f"{path}/web"), "proxy")["image"] == "proxy:bad", what="bad image seen")
    time.sleep(1.0)
    stuck = kube.get(f"{path}/web")
    assert not _ready(stuck)
    assert _container(stuck, "proxy")["state"]["waiting"]["reason"] == "ImagePullBackOff"


def test_namespace_deletion_removes_its_pods(kube: Kube, kubelet: FakeKubelet) -> None:
    name = f"gc-{os.getpid()}-{int(time.time())}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kubelet.namespaces.add(name)
    eventually(lambda: kube.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default"), timeout=30)
    for i in range(3):
        kube.create(f"/api/v1/namespaces/{name}/pods", pod(f"p{i}"))
    eventually(lambda: all(_ready(p) for p in kube.get(f"/api/v1/namespaces/{name}/pods")["items"]), what="pods Ready")
    kube.delete(f"/api/v1/namespaces/{name}")
    eventually(lambda: kube.get_or_none(f"/api/v1/namespaces/{name}") is None, timeout=60, what="namespace gone")
    assert kube.get(f"/api/v1/namespaces/{name}/pods")["items"] == []


def test_killed_test_run_leaves_no_control_plane_process(control_plane: ControlPlane) -> None:
    """SIGKILL a process that started a control plane: its etcd and apiserver die with it."""
    script = (
        "import sys, time; from pathlib import Path; from tests.kube.controlplane import ControlPlane;"
        f"cp = ControlPlane(bin_dir=Path({str(control_plane.bin_dir)!r}), controller_manager=False).start();"
        "print(' '.join(str(p.pid) for p in cp.procs.values()), flush=True); time.sleep(600)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, cwd=REPO)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    def all_gone() -> bool:
        for pid in pids:
            try:
                os.kill(pid, 0)
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split()[2] != "Z":
                        return False
            except (ProcessLookupError, FileNotFoundError):
                continue
        return True

    eventually(all_gone, timeout=10, what="children of a killed run exit")


def test_two_control_planes_do_not_collide(control_plane: ControlPlane) -> None:
    other = ControlPlane(bin_dir=control_plane.bin_dir, controller_manager=False).start()
    try:
        assert other.port != control_plane.port
        assert other.workdir != control_plane.workdir
        status, _ = other._get("/readyz")
        assert status == 200
    finally:
        other.stop()
    assert not other.workdir.exists()
    assert control_plane._get("/readyz")[0] == 200
