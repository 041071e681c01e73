"""A local demo of sidecarctl, end to end. Run it with `bash tools/demo.sh` (`--fake` forces the
fallback below).

On a real node, when this machine can run one (root, Debian's containerd and runc, the kubelet
build; see tests/kube/node.py): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
a kubelet with containerd and runc on this machine; the manager from the image the repository's
Dockerfile builds, installed with the user's manifests (`kubectl apply -k tests/node/install`:
config/default plus only what this machine forces, the image pull policy and where pods find the
API server); config/samples applied; pods injected and running in containerd; the proxy image
bumped and upgraded in place, only the proxy container restarting; then everything removed. No
registry is reachable, so the samples' images are stand-ins built from Debian's busybox under the
samples' names (tests/kube/images.py says what each does).

Otherwise, the fallback (it says so in its first line): etcd, kube-apiserver and
kube-controller-manager, the manifests from config/, the manager as a local process with its
ServiceAccount's token (so the RBAC in config/rbac is enforced), admission through the API
server, the controller's in-place upgrade, and a fake kubelet in this process standing in for the
nodes (it binds pods to a fake Node, reports containers running and ready, and on an image change
reports the restarted container); the Deployment of config/manager cannot run there, so it is
scaled to zero and the API server reaches the local manager over 127.0.0.1.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kuberuntime import kubeapi  # noqa: E402
from kuberuntime.kubeconfig import load_config  # noqa: E402
from sidecarsets.spec import names  # noqa: E402
from tests.kube import images  # noqa: E402
from tests.kube.client import Kube, eventually  # noqa: E402
from tests.kube.controlplane import ControlPlane  # noqa: E402
from tests.kube.fakekubelet import FakeKubelet  # noqa: E402
from tests.kube.loop import BackgroundLoop  # noqa: E402
from tests.kube.managerharness import MWC_PATH, VWC_PATH, start_process, wait_ready  # noqa: E402
from tools import demonode  # noqa: E402

NS = names.DEFAULT_MANAGER_NAMESPACE
DEMO_NS = "demo-shop"


def say(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


class Demo:
    def __init__(self, cp: ControlPlane, loop: BackgroundLoop) -> None:
        self.cp = cp
        self.loop = loop
        self.client = kubeapi.KubeClient(load_config(str(cp.kubeconfig)))
        self.kube = Kube(loop, self.client)
        self.kubectl_bin = str(cp.bin_dir / "kubectl")

    def kubectl(self, *args: str, show: bool = True, check: bool = True) -> str:
        cmd = [self.kubectl_bin, f"--kubeconfig={self.cp.kubeconfig}", *args]
        if show:
            print(f"$ kubectl {' '.join(args)}", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{proc.stderr}")
        if show:
            print(proc.stdout.rstrip(), flush=True)
        return proc.stdout

    def wait_established(self, crd: str, timeout: float = 30.0) -> None:
        """Until the CRD is Established (read from the API server: `kubectl wait --for=condition=...`
        fails, instead of waiting, while the new CRD has no status.conditions yet)."""
        deadline = time.monotonic() + timeout
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
        while True:
            conditions = (self.kube.get(path).get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                print(f"customresourcedefinition.apiextensions.k8s.io/{crd} condition met", flush=True)
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRD {crd} not Established within {timeout:.0f}s")
            time.sleep(0.1)

    def pod_table(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.kube.get(f"/api/v1/namespaces/{DEMO_NS}/pods")["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])


def _ready(p: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or []
    )


def _proxy(p: dict[str, Any]) -> tuple[str, int]:
    image = next(c["image"] for c in p["spec"]["containers"] if c["name"] == "proxy")
    restarts = next(
        (s["restartCount"] for s in (p.get("status") or {}).get("containerStatuses") or [] if s["name"] == "proxy"), 0
    )
    return image, int(restarts)


def run(workdir: Path) -> None:
    started = time.monotonic()
    say("Starting a local control plane: etcd + kube-apiserver + kube-controller-manager on 127.0.0.1")
    cp = ControlPlane().start()
    loop = BackgroundLoop()
    manager = None
    demo = Demo(cp, loop)
    kubelet = FakeKubelet(demo.client, node="demo-node", restart_delay=1.0)
    try:
        print(f"API server {cp.url} (kubeconfig {cp.kubeconfig}); up in {time.monotonic() - started:.1f}s")
        print("There are no real nodes: a fake kubelet in this process stands in for them.")
        loop.run(kubelet.start())
        kubelet.namespaces.add(DEMO_NS)

        say("Installing sidecarctl: kubectl apply -k config/default")
        demo.kubectl("apply", "--server-side", "-k", str(REPO / "config/default"))
        demo.wait_established("sidecarsets.sidecarctl.io")
        print("(no container runtime here: the Deployment is scaled to 0 and the manager runs as a local process)")
        demo.kubectl("-n", NS, "scale", "deployment/sidecarctl", "--replicas=0", show=False, check=False)

        say("Running the manager with its ServiceAccount's token (RBAC from config/rbac is enforced)")
        token = demo.kube.create(
            f"/api/v1/namespaces/{NS}/serviceaccounts/sidecarctl/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
        )["status"]["token"]
        sa_kubeconfig = cp.token_kubeconfig(workdir / "sidecarctl.kubeconfig", token)
        print(f"$ sidecarctl run --kubeconfig {sa_kubeconfig.name} --self-signed --extra-ip 127.0.0.1 ...")
        cert_dir = workdir / "certs"
        manager = start_process(
            cp,
            cert_dir,
            identity="demo",
            extra=("--self-signed", "--extra-ip=127.0.0.1", f"--kubeconfig={sa_kubeconfig}"),
        )
        # The installed webhook configurations point at the in-cluster Service; here the API server
        # reaches the local process by URL instead.
        for path, hook_path in ((MWC_PATH, names.INJECT_PATH), (VWC_PATH, names.VALIDATE_PATH)):
            name = names.MUTATING_WEBHOOK_CONFIG if path == MWC_PATH else names.VALIDATING_WEBHOOK_CONFIG
            obj = demo.kube.get(f"{path}/{name}")
            for i, _ in enumerate(obj["webhooks"]):
                demo.kube.patch(
                    f"{path}/{name}",
                    [
                        {
                            "op": "replace",
                            "path": f"/webhooks/{i}/clientConfig",
                            "value": {"url": manager.webhook_url + hook_path},
                        }
                    ],
                    patch_type="json",
                )
        # So does the CRD's conversion webhook (kubectl reads SidecarSets in v1beta1, the preferred
        # version, converted by the manager from the stored v1alpha1).
        crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{names.CRD_NAME}"
        demo.kube.patch(
            crd_path,
            [
                {
                    "op": "replace",
                    "path": "/spec/conversion/webhook/clientConfig",
                    "value": {"url": manager.webhook_url + names.CONVERT_PATH},
                }
            ],
            patch_type="json",
        )
        try:
            wait_ready(manager, timeout=60)
        except AssertionError:
            print(manager.log_tail(30))
            raise

        def bundle_synced() -> bool:
            obj = demo.kube.get(f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}")
            raw = obj["webhooks"][0]["clientConfig"].get("caBundle") or ""
            crd = demo.kube.get(crd_path)["spec"]["conversion"]["webhook"]["clientConfig"]
            return all(b"BEGIN CERTIFICATE" in base64.b64decode(b) for b in (raw, crd.get("caBundle") or ""))

        eventually(bundle_synced, timeout=30, what="caBundle synced")
        print("manager ready; it generated a CA and serving certificate and wrote the CA into caBundle:")
        demo.kubectl(
            "get",
            "mutatingwebhookconfiguration",
            names.MUTATING_WEBHOOK_CONFIG,
            "-o",
            "jsonpath={.webhooks[0].name} caBundle={.webhooks[0].clientConfig.caBundle}",
            show=False,
        )
        print(f"  {names.MUTATING_WEBHOOK_CONFIG}: caBundle set")

        say("Applying the samples: a namespace labelled for injection, two SidecarSets, then a Deployment")
        setup_files, workload_files = demonode.sample_files()
        for sample in setup_files:
            demo.kubectl("apply", "-f", str(sample))
        pods_path = f"/api/v1/namespaces/{DEMO_NS}/pods"
        eventually(
            lambda: demonode.injected(demo.kube.create(pods_path, demonode.probe_pod(), dryRun="All")),
            timeout=30,
            what="the SidecarSets in force",
        )
        for sample in workload_files:
            demo.kubectl("apply", "-f", str(sample))
        demo.kubectl("-n", DEMO_NS, "scale", "deployment/shop", "--replicas=5")

        def all_running() -> list[dict[str, Any]] | None:
            pods = demo.pod_table()
            return pods if len(pods) == 5 and all(_ready(p) for p in pods) else None

        pods = eventually(all_running, timeout=60, what="demo pods Ready")
        say("The pods came out of admission with their sidecars")
        demo.kubectl(
            "get",
            "pods",
            "-n",
            DEMO_NS,
            "-o",
            "custom-columns=POD:.metadata.name,INIT:.spec.initContainers[*].name,CONTAINERS:.spec.containers[*].name,"
            "READY:.status.conditions[?(@.type=='Ready')].status",
        )
        demo.kubectl("get", "sidecarsets")
        first = pods[0]
        ann = first["metadata"]["annotations"]
        print(f"\n{first['metadata']['name']} annotations:")
        for key in (names.ANN_INJECTED_LIST, names.ANN_HASH):
            print(f"  {key}: {ann[key][:110]}{'...' if len(ann[key]) > 110 else ''}")

        say("Rolling a new proxy image in place: kubectl patch sidecarset mesh-proxy (maxUnavailable 20%)")
        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
        sidecarset = demo.kube.get("/apis/sidecarctl.io/v1alpha1/sidecarsets/mesh-proxy")
        index = next(i for i, c in enumerate(sidecarset["spec"]["containers"]) if c["name"] == "proxy")
        old_image = sidecarset["spec"]["containers"][index]["image"]
        new_image = images.next_patch_version(old_image)
        patch = json.dumps([{"op": "replace", "path": f"/spec/containers/{index}/image", "value": new_image}])
        demo.kubectl("patch", "sidecarset", "mesh-proxy", "--type=json", f"-p={patch}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = demo.pod_table()
            done = sum(1 for p in pods if _proxy(p)[0] == new_image and _ready(p))
            row = "  ".join(
                f"{p['metadata']['name'][-5:]}:{'new' if _proxy(p)[0] == new_image else 'old'}"
                f"{'' if _ready(p) else '(restarting)'}"
                for p in pods
            )
            print(f"  {done}/{len(pods)} upgraded  {row}", flush=True)
            if done == len(pods):
                break
            time.sleep(0.5)
        else:
            raise RuntimeError("the upgrade did not finish within 120 s")
        demo.kubectl("get", "sidecarsets")
        same = all(uids.get(p["metadata"]["name"]) == p["metadata"]["uid"] for p in pods)
        restarts = {p["metadata"]["name"]: _proxy(p)[1] for p in pods}
        app_restarts = sum(
            s["restartCount"] for p in pods for s in p["status"]["containerStatuses"] if s["name"] == "app"
        )
        print(
            f"\nSame pods (UIDs unchanged): {same}; proxy restarts per pod: {sorted(set(restarts.values()))}; "
            f"app container restarts: {app_restarts}."
        )
        say(f"Done in {time.monotonic() - started:.0f}s; cleaning up")
    finally:
        if manager is not None:
            manager.terminate()
        loop.run(kubelet.stop())
        loop.run(demo.client.close())
        loop.close()
        cp.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake", action="store_true", help="use the fake kubelet even where a real node can run")
    args = parser.parse_args()
    reason = "--fake given" if args.fake else demonode.unavailable_reason()
    try:
        if reason is None:
            print(
                "sidecarctl demo on a real node: kubelet, containerd and runc on this machine, the manager from "
                "the Dockerfile's image, installed with kubectl apply -k",
                flush=True,
            )
            try:
                demonode.run()
                return 0
            except demonode.NoRealNode as e:
                print(f"\nno real node after all ({e}): falling back to the fake kubelet", flush=True)
        else:
            print(
                f"sidecarctl demo WITHOUT a real node ({reason}): a fake kubelet stands in for the nodes and the "
                "manager runs as a local process",
                flush=True,
            )
        with tempfile.TemporaryDirectory(prefix="sidecarctl-demo-") as tmp:
            run(Path(tmp))
    except Exception as e:  # one clear line, not a traceback, for a demo
        print(f"\ndemo failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(REPO))
    sys.exit(main())
