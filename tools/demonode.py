"""The demo on a real node (tools/demo.py runs it when this machine can run one).

A control plane and a real node (tests/kube/node.py: containerd, runc, kubelet, kube-scheduler,
undone by a reaper even if this process is killed); the manager's image from the Dockerfile and
busybox stand-ins for the samples' images, imported into containerd; the install a user runs
(`kubectl apply -k tests/node/install`); config/samples; the pods' containers as containerd runs
them; the proxy image bumped, and the in-place upgrade printed as the kubelet reports it.

Anything that keeps the real node from starting (images that cannot be built, binaries missing,
another node holding the machine's lock) raises NoRealNode before the demo shows anything, so the
caller can fall back to the fake kubelet; a failure after that is an error.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tests.kube import images, managerimage, node
from tests.kube.adminrest import AdminRest, ApiError
from tests.kube.client import eventually
from tests.kube.controlplane import REPO, ControlPlane, ControlPlaneError

INSTALL = REPO / "tests" / "node" / "install"
SAMPLES = REPO / "config" / "samples"
MANAGER_NS = "sidecarctl-system"
DEMO_NS = "demo-shop"
REPLICAS = 3  # mesh-proxy's maxUnavailable 20% rounds up to one pod at a time
SS = "/apis/sidecarctl.io/v1alpha1/sidecarsets/mesh-proxy"


class NoRealNode(RuntimeError):
    """The real node cannot be used after all; the message says why."""


def unavailable_reason() -> str | None:
    return node.unavailable_reason()


def sample_files() -> tuple[list[Path], list[Path]]:
    """(the namespace and the SidecarSets, the workloads) of config/samples.

    SidecarSets go in first and the workloads once a dry-run pod shows them injected: a pod admitted
    before the webhook (or a policy) knows its SidecarSets runs without them, as with Kruise
    (the manager then reports it as missing its sidecars, README "Pods that missed their sidecars").
    """
    files = sorted(SAMPLES.glob("*.yaml"))
    workloads = [f for f in files if any(d.get("kind") == "Deployment" for d in _docs(f))]
    return [f for f in files if f not in workloads], workloads


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if isinstance(d, dict)]


def probe_pod() -> dict[str, Any]:
    """A pod like the sample Deployment's, for a dry-run create."""
    _, workloads = sample_files()
    (deployment,) = [d for f in workloads for d in _docs(f) if d.get("kind") == "Deployment"]
    template = deployment["spec"]["template"]
    meta = {"generateName": "probe-", "labels": template["metadata"]["labels"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def injected(pod: dict[str, Any]) -> bool:
    """Both sample SidecarSets' sidecars are in the pod."""
    names_ = {c["name"] for c in pod["spec"]["containers"]}
    return {"proxy", "log-agent"} <= names_


def say(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12] if image_id else "-"


def is_ready(pod: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
    return conds.get("Ready") == "True"


def statuses(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in (pod.get("status") or {}).get("containerStatuses") or []}


class Demo:
    def __init__(self, cp: ControlPlane, rn: node.RealNode) -> None:
        self.cp, self.node, self.api = cp, rn, AdminRest(cp)
        self.kubectl_bin = str(cp.bin_dir / "kubectl")

    def kubectl(self, *args: str, show: bool = True, timeout: float = 180) -> str:
        if show:
            print(f"$ kubectl {' '.join(args)}", flush=True)
        proc = subprocess.run(
            [self.kubectl_bin, f"--kubeconfig={self.cp.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{proc.stderr.strip()}")
        if show and proc.stdout.strip():
            print(proc.stdout.rstrip(), flush=True)
        return proc.stdout

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.api.get(f"/api/v1/namespaces/{DEMO_NS}/pods")["items"]
        live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        return sorted(live, key=lambda p: p["metadata"]["name"])

    def install(self) -> None:
        say("Installing sidecarctl as a user does: kubectl apply -k (config/default, through tests/node/install)")
        print(
            "tests/node/install changes only what this machine forces: imagePullPolicy Never (the image was\n"
            "imported, no registry) and KUBERNETES_SERVICE_HOST/PORT from the ConfigMap node-apiserver (no kube-proxy)."
        )
        self.kubectl("create", "namespace", MANAGER_NS)
        self.kubectl(
            "-n",
            MANAGER_NS,
            "create",
            "configmap",
            "node-apiserver",
            f"--from-literal=host={self.node.gateway}",
            f"--from-literal=port={self.cp.port}",
        )
        started = time.monotonic()
        self.kubectl("apply", "-k", str(INSTALL))
        self.kubectl("-n", MANAGER_NS, "rollout", "status", "deployment/sidecarctl", "--timeout=180s", timeout=200)
        print(f"(2 replicas Ready {time.monotonic() - started:.1f}s after the apply)")
        self.kubectl("-n", MANAGER_NS, "get", "pods", "-o", "wide")

    def samples(self) -> list[dict[str, Any]]:
        say("Applying the samples: a namespace labelled for injection, two SidecarSets, then a Deployment")
        setup_files, workload_files = sample_files()
        for sample in setup_files:
            self.kubectl("apply", "-f", str(sample))
        dry_run = f"/api/v1/namespaces/{DEMO_NS}/pods?dryRun=All"
        eventually(
            lambda: injected(self.api.create(dry_run, probe_pod())),
            timeout=30,
            what="the SidecarSets in force",
            retrying=(ApiError,),
        )
        for sample in workload_files:
            self.kubectl("apply", "-f", str(sample))
        self.kubectl("get", "namespace", DEMO_NS, "-L", "sidecar-injection")
        self.kubectl("-n", DEMO_NS, "scale", "deployment/shop", f"--replicas={REPLICAS}")

        def running() -> list[dict[str, Any]] | None:
            pods = self.pods()
            return pods if len(pods) == REPLICAS and all(is_ready(p) for p in pods) else None

        pods = eventually(running, timeout=180, interval=0.2, what=f"{REPLICAS} demo pods Ready", retrying=(ApiError,))
        say("The pods came out of admission with their sidecars")
        self.kubectl(
            "get",
            "pods",
            "-n",
            DEMO_NS,
            "-o",
            "custom-columns=POD:.metadata.name,INIT:.spec.initContainers[*].name,CONTAINERS:.spec.containers[*].name,"
            "READY:.status.conditions[?(@.type=='Ready')].status,"
            "INJECTED-BY:.metadata.annotations.sidecarctl\\.io/injected-by",
        )
        self.kubectl("get", "sidecarsets")
        return pods

    def containerd(self, pods: list[dict[str, Any]]) -> None:
        say("containerd runs them (ctr -n k8s.io containers ls / tasks ls on the node's own containerd)")
        images_by_id = {
            line.split()[0]: line.split()[1] for line in self.node.ctr("containers", "ls").splitlines()[1:] if line
        }
        tasks = {line.split()[0]: line.split()[2] for line in self.node.ctr("tasks", "ls").splitlines()[1:] if line}
        print(f"{'POD':<24} {'CONTAINER':<10} {'CONTAINERD ID':<14} {'TASK':<8} IMAGE")
        for p in pods:
            for name, st in statuses(p).items():
                cid = st["containerID"].removeprefix("containerd://")
                row = f"{p['metadata']['name']:<24} {name:<10} {cid[:12]:<14} {tasks.get(cid, '?'):<8}"
                print(f"{row} {images_by_id.get(cid, '?')}")
        print("(every image here is a busybox stand-in under the sample's name: no registry is reachable)")

    def upgrade(self, pods: list[dict[str, Any]]) -> None:
        ss = self.api.get(SS)
        index = next(i for i, c in enumerate(ss["spec"]["containers"]) if c["name"] == "proxy")
        old = ss["spec"]["containers"][index]["image"]
        new = images.next_patch_version(old)
        say(f"Rolling the proxy in place: {old} -> {new} (mesh-proxy, maxUnavailable 20%)")
        before = {p["metadata"]["name"]: p for p in pods}
        patch = json.dumps([{"op": "replace", "path": f"/spec/containers/{index}/image", "value": new}])
        started = time.monotonic()
        self.kubectl("patch", "sidecarset", "mesh-proxy", "--type=json", f"-p={patch}")
        shown: dict[str, tuple[Any, ...]] = {}
        deadline = started + 180
        while time.monotonic() < deadline:
            now = self.pods()
            for p in now:
                name = p["metadata"]["name"]
                st = statuses(p).get("proxy") or {}
                spec_image = next(c["image"] for c in p["spec"]["containers"] if c["name"] == "proxy")
                state = next(iter(st.get("state") or {"-": 0}))
                view = (spec_image, st.get("imageID", ""), st.get("restartCount", 0), st.get("ready"), state)
                if shown.get(name) != view:
                    shown[name] = view
                    tag = spec_image.rpartition(":")[2]
                    print(
                        f"  {time.monotonic() - started:5.1f}s {name:<24} proxy spec {tag:<8} "
                        f"runs {short(st.get('imageID', '')):<12} restarts {st.get('restartCount', 0)} "
                        f"{state:<8} {'ready' if st.get('ready') else 'not ready'}",
                        flush=True,
                    )
            status = self.api.get(SS).get("status") or {}
            if (
                status.get("observedGeneration") == self.api.get(SS)["metadata"]["generation"]
                and status.get("updatedReadyPods") == len(now) == REPLICAS
            ):
                break
            time.sleep(0.25)
        else:
            raise RuntimeError("the in-place upgrade did not finish within 180 s")
        took = time.monotonic() - started
        self.kubectl("get", "sidecarsets")
        after = self.pods()
        same = sorted(before) == [p["metadata"]["name"] for p in after] and all(
            before[p["metadata"]["name"]]["metadata"]["uid"] == p["metadata"]["uid"] for p in after
        )
        app_same = same and all(
            statuses(p)["app"]["containerID"] == statuses(before[p["metadata"]["name"]])["app"]["containerID"]
            and statuses(p)["app"]["restartCount"] == 0
            for p in after
        )
        restarts = sorted({statuses(p)["proxy"]["restartCount"] for p in after})
        print(
            f"\nUpgraded in {took:.1f}s. Same pods (UIDs unchanged): {same}; app containers untouched (same "
            f"containerID, 0 restarts): {app_same}; proxy restarts per pod: {restarts}."
        )

    def remove(self) -> None:
        say("Removing everything")
        self.kubectl("delete", "-f", str(SAMPLES), "--wait=false")
        self.kubectl("delete", "-k", str(INSTALL), "--ignore-not-found", "--wait=false")
        print("stopping the node: its processes, mounts, cgroups, bridge and files go (tests/kube/node.py)")


def run() -> None:
    started = time.monotonic()
    say("Images: built locally, no registry is reachable")
    try:
        sample_images = images.samples_archive()
        print("manager image: the repository's Dockerfile, built with buildah on a local Debian base (cached)...")
        built = managerimage.manager_archive()
    except (managerimage.ImageBuildError, FileNotFoundError) as e:
        raise NoRealNode(f"images: {' '.join(str(e).split())[:200]}") from None
    state = "from the cache" if built.cached else f"built in {built.seconds:.0f}s"
    print(f"{built.ref}: {built.size / 2**20:.0f} MiB archive, {state}")
    print(f"stand-ins for the samples' images, from Debian's busybox: {sample_images.name}")

    say("A control plane and a real node on this machine")
    with contextlib.ExitStack() as stack:
        try:
            cp, rn = stack.enter_context(node.node_cluster(lock_timeout=2))
        except (node.NodeUnavailable, node.NodeError, ControlPlaneError) as e:
            raise NoRealNode(" ".join(str(e).split())[:200]) from None
        print(
            f"node {rn.name} Ready: containerd {rn.timings.get('containerd', 0):.1f}s, "
            f"node {rn.timings.get('node ready', 0):.1f}s, control plane {rn.timings.get('control plane', 0):.1f}s; "
            f"API server {cp.url}"
        )
        demo = Demo(cp, rn)
        took = rn.import_image(sample_images) + rn.import_image(built.archive)
        print(f"imported the manager image and the sample stand-ins into containerd in {took:.1f}s")
        demo.install()
        pods = demo.samples()
        demo.containerd(pods)
        demo.upgrade(pods)
        demo.remove()
        say(f"Done in {time.monotonic() - started:.0f}s; cleaning up")
    print("node removed.")
