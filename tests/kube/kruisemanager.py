"""OpenKruise v1.9.1's own manager as a process on the test control plane, for side-by-side runs.

`tools/build-kruise-manager.sh` builds the binary Kruise ships (`main.go` at the root of the module
github.com/openkruise/kruise@v1.9.1) once per machine; everything it is given here comes from the
same module version in the Go module cache: the CRDs (`config/crd`: every base, with the kustomize
patches that make the SidecarSet, Advanced StatefulSet and Advanced DaemonSet CRDs convert by
webhook) and the webhook configurations (`config/webhook/manifests.yaml` with
`patch_manifests.yaml` and the `kruise-` name prefix of `config/default`).

What runs, and why (read from Kruise v1.9.1's source):

- Webhooks. The webhook server registers every handler whose gate allows it, but the API server
  calls only what the webhook configurations name, and Kruise's webhook controller only keeps (it
  never adds) entries it has a handler for. The configurations installed here name the SidecarSet
  ones only: `mpod.kb.io` (`/mutate-pod`, pod CREATE, namespaceSelector `control-plane
  DoesNotExist` as shipped), `msidecarset.kb.io` and `vsidecarset.kb.io`, plus the CRD
  conversions (`/convert`: SidecarSet, Advanced StatefulSet and DaemonSet). The pod handler also
  runs its other steps on every pod; with the gates below they return at their first check
  (readiness gate: the pod is not Kruise-owned; container launch priority: no priority env;
  PersistentPodState: the pod has no owner in its whitelist, read from the ConfigMap
  `kruise-configuration`).
- Controllers. `main.go` has no flag choosing controllers: each one's `Add` starts it only when its
  CRD is served (discovery) and its feature gate is on. Every CRD of Kruise's install is installed
  (`config/crd/kustomization.yaml`): Kruise asks discovery about each kind it knows, and a kind
  that is not served costs 15.7 s of retries (4 tries, backoff 0.5 s x 5) before its controller or
  webhook is skipped: with only the SidecarSet and ImagePullJob CRDs its readiness took 66 s here,
  and six controllers ahead of the SidecarSet one in its list would each have waited as long
  again before it was set up. Running, with the gates below: `sidecarset` (the only one
  with objects to act on), the CRD-backed `advancedcronjob`, `broadcastjob`, `cloneset`,
  `daemonset`, `statefulset`, `uniteddeployment`, `ephemeraljob` and `persistentpodstate` (idle:
  none of their objects exist), and `podreadiness` and `containerlaunchpriority`, which `Add`
  unconditionally and only act on pods carrying Kruise's readiness gate or a launch-priority env
  (none here). Off: ContainerRecreateRequest, NodeImage, ImagePullJob, ImageListPullJob,
  PodProbeMarker, NodePodProbe and SidecarTerminator (KruiseDaemon off), PodUnavailableBudget and
  WorkloadSpread (gates off), ResourceDistribution (gate off by default).
- Feature gates (`FEATURE_GATES`): PodWebhook on (injection); KruiseDaemon off (there is no
  kruise-daemon here; Kruise then turns off the gates of its node-side features); WorkloadSpread and
  PodUnavailableBudgetDeleteGate off (on by default: their steps in the pod webhook look up
  WorkloadSpreads and PodUnavailableBudgets on every pod create, features not in use here).
- Webhook serving: `WEBHOOK_HOST=127.0.0.1` makes Kruise's webhook controller rewrite every
  webhook's Service reference (and the conversion's) to `https://127.0.0.1:WEBHOOK_PORT/<path>`
  and fill caBundle with the CA it generates into `WEBHOOK_CERT_DIR` (its "fs" cert writer, the
  default when WEBHOOK_HOST is set); the serving certificate then has IP SAN 127.0.0.1 and DNS SAN
  localhost. Two replicas cannot do that side by side on one host: each would rewrite the URL to its
  own port on every change the other makes, without end. So `external_certs=True` uses Kruise's
  `EnableExternalCerts` gate instead: certificates from the Secret `kruise-webhook-certs` (which
  `install` writes), and configurations that Kruise only checks, written here with a URL the
  caller chooses (a forwarder in front of both replicas, as a Service would be).
- Leader election on (Lease `kruise-system/kruise-manager`, 15 s / 10 s / 2 s as shipped; not
  released on SIGTERM, so a restart waits for it to expire unless it is deleted), metrics and health
  on free loopback ports, pprof off, `--protection-log-path` in a temp dir (its default `/log` is
  the image's), the API client's QPS 30 / burst 50 as shipped (its SidecarSet controller updates the
  pods of a rollout one after another through that client).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as dt
import functools
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kuberuntime import api, kubeapi
from kuberuntime.jsontypes import JsonObj
from tests.certutil import make_ca, make_leaf
from tests.kube.controlplane import REPO, ControlPlane, free_port

KRUISE_VERSION = "v1.9.1"
MODULE = "github.com/openkruise/kruise"
BUILD_SCRIPT = REPO / "tools" / "build-kruise-manager.sh"
WRAPPER = REPO / "tools" / "kruisemanager"

KRUISE_NS = "kruise-system"
MWC_NAME = "kruise-mutating-webhook-configuration"
VWC_NAME = "kruise-validating-webhook-configuration"
SERVICE_NAME = "kruise-webhook-service"
SECRET_NAME = "kruise-webhook-certs"
LEASE_NAME = "kruise-manager"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{KRUISE_NS}/leases/{LEASE_NAME}"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VWC_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
GROUP = "apps.kruise.io"
SS_PATH = f"/apis/{GROUP}/v1beta1/sidecarsets"
REVISIONS_PATH = f"/apis/apps/v1/namespaces/{KRUISE_NS}/controllerrevisions"

MUTATING_WEBHOOKS = ("mpod.kb.io", "msidecarset.kb.io")
VALIDATING_WEBHOOKS = ("vsidecarset.kb.io",)
FEATURE_GATES = {
    "PodWebhook": True,
    "KruiseDaemon": False,
    "WorkloadSpread": False,
    "PodUnavailableBudgetDeleteGate": False,
}

# Pod bookkeeping Kruise's controller reads and writes (pkg/control/sidecarcontrol).
ANN_HASH = "kruise.io/sidecarset-hash"
ANN_INJECTED_LIST = "kruise.io/sidecarset-injected-list"
ANN_INPLACE_STATE = "kruise.io/sidecarset-inplace-update-state"


# -- the binary and the module ----------------------------------------------------------------------
def binary() -> Path:
    """Where the build script leaves the binary (it may not be there yet)."""
    cache = Path(
        os.environ.get("SIDECARCTL_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sidecarctl"
    )
    return cache / "kruise-manager" / KRUISE_VERSION / "kruise-manager"


def build() -> Path:
    """The binary, built first if missing (several minutes cold on 2 cores)."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@functools.cache
def module_dir() -> Path:
    """Kruise's module at exactly v1.9.1 in the Go module cache (downloaded if missing)."""
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{KRUISE_VERSION}"],
        cwd=WRAPPER,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"go mod download {MODULE}@{KRUISE_VERSION} failed: {proc.stderr or proc.stdout}")
    return Path(json.loads(proc.stdout)["Dir"])


def _yaml_docs(path: Path) -> list[JsonObj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def crds() -> list[JsonObj]:
    """Kruise's CRDs as its `config/crd/kustomization.yaml` renders them: every base, and the
    conversion webhooks its patches add (SidecarSet, Advanced StatefulSet and DaemonSet; Service
    references that Kruise's webhook controller rewrites)."""
    base = module_dir() / "config" / "crd"
    (kustomization,) = _yaml_docs(base / "kustomization.yaml")
    conversions = {}
    for patch_file in kustomization.get("patchesStrategicMerge") or []:
        (patch,) = _yaml_docs(base / patch_file)
        conversion = copy.deepcopy(patch["spec"]["conversion"])
        conversion["webhook"]["clientConfig"]["service"].update(namespace=KRUISE_NS, name=SERVICE_NAME)
        conversions[patch["metadata"]["name"]] = conversion
    out = []
    for resource in kustomization["resources"]:
        (crd,) = _yaml_docs(base / resource)
        if crd["metadata"]["name"] in conversions:
            crd["spec"]["conversion"] = conversions[crd["metadata"]["name"]]
        out.append(crd)
    return out


def webhook_configurations() -> tuple[JsonObj, JsonObj]:
    """Kruise's mutating and validating configurations as `config/default` renders them (names
    prefixed `kruise-`, Service `kruise-system/kruise-webhook-service`, `patch_manifests.yaml`'s
    selectors), keeping only the SidecarSet webhooks."""
    where = module_dir() / "config" / "webhook"
    patches = {d["kind"]: {w["name"]: w for w in d["webhooks"]} for d in _yaml_docs(where / "patch_manifests.yaml")}
    out: list[JsonObj] = []
    for doc, keep, name in zip(
        _yaml_docs(where / "manifests.yaml"),
        (MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS),
        (MWC_NAME, VWC_NAME),
        strict=True,
    ):
        hooks = []
        for hook in doc["webhooks"]:
            if hook["name"] not in keep:
                continue
            hook = {
                **hook,
                **{k: v for k, v in patches.get(doc["kind"], {}).get(hook["name"], {}).items() if k != "name"},
            }
            hook["clientConfig"]["service"].update(namespace=KRUISE_NS, name=SERVICE_NAME)
            hooks.append(hook)
        out.append({**doc, "metadata": {"name": name}, "webhooks": hooks})
    return out[0], out[1]


# -- installing it ----------------------------------------------------------------------------------
@dataclass
class ExternalCerts:
    """A CA and a serving certificate for 127.0.0.1 and localhost, in the Secret layout of Kruise's
    external cert writer (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`)."""

    ca_cert: bytes
    files: dict[str, bytes]

    @classmethod
    def make(cls) -> ExternalCerts:
        week = dt.timedelta(days=7)
        ca = make_ca("kruise-test-webhook-ca", lifetime=week)
        leaf = make_leaf(ca, dns=("localhost",), ips=("127.0.0.1",), lifetime=week, cn="127.0.0.1")
        files = {"ca.crt": ca.cert_pem, "ca.key": ca.key_pem, "tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem}
        return cls(ca.cert_pem, files)


async def _put(client: kubeapi.KubeClient, path: str, obj: JsonObj) -> None:
    """Create, or replace keeping the server's resourceVersion."""
    try:
        await client.create(path, obj)
        return
    except api.Conflict:
        pass
    for _ in range(5):
        current = await client.get(f"{path}/{obj['metadata']['name']}")
        body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
        try:
            await client.update(f"{path}/{obj['metadata']['name']}", body)
            return
        except api.Conflict:
            continue
    raise RuntimeError(f"could not replace {path}/{obj['metadata']['name']}")


async def ensure_namespace(client: kubeapi.KubeClient, name: str, labels: dict[str, str] | None = None) -> None:
    body: JsonObj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    with contextlib.suppress(api.Conflict):
        await client.create("/api/v1/namespaces", body)


async def install_crds(client: kubeapi.KubeClient) -> None:
    """Kruise's CRDs, created and served (discovery lists every kind)."""
    wanted = crds()
    for crd in wanted:
        await _put(client, CRD_PATH, crd)
    for _ in range(600):
        served: set[str] = set()
        for group in {c["spec"]["group"] for c in wanted}:
            with contextlib.suppress(api.NotFound):
                for version in (await client.get(f"/apis/{group}"))["versions"]:
                    got = await client.get(f"/apis/{version['groupVersion']}")
                    served |= {f"{r['name']}.{group}" for r in got["resources"] if "/" not in r["name"]}
        if {c["metadata"]["name"] for c in wanted} <= served:
            with contextlib.suppress(api.ApiError):
                await client.get(SS_PATH)
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("Kruise's CRDs were not served within 60 s")


async def install_webhooks(
    client: kubeapi.KubeClient, *, url: str | None = None, certs: ExternalCerts | None = None
) -> None:
    """Kruise's namespace and webhook configurations (SidecarSet webhooks only).

    Without `url`: as an install ships them (Service references, no caBundle), for a manager started
    with WEBHOOK_HOST to rewrite. With `url` and `certs` (EnableExternalCerts): every webhook and the
    SidecarSet CRD's conversion by that URL with the CA in caBundle, and the certs in the Secret
    Kruise reads them from."""
    await ensure_namespace(client, KRUISE_NS)
    mwc, vwc = webhook_configurations()
    if url is not None:
        if certs is None:
            raise ValueError("a URL needs the certificates it serves with")
        bundle = base64.b64encode(certs.ca_cert).decode()
        for conf in (mwc, vwc):
            for hook in conf["webhooks"]:
                hook["clientConfig"] = {"url": url + hook["clientConfig"]["service"]["path"], "caBundle": bundle}
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET_NAME, "namespace": KRUISE_NS},
            "data": {k: base64.b64encode(v).decode() for k, v in certs.files.items()},
        }
        await _put(client, f"/api/v1/namespaces/{KRUISE_NS}/secrets", secret)
        for name in [c["metadata"]["name"] for c in crds() if c["spec"].get("conversion")]:
            crd = await client.get(f"{CRD_PATH}/{name}")
            crd["spec"]["conversion"]["webhook"]["clientConfig"] = {"url": url + "/convert", "caBundle": bundle}
            await client.update(f"{CRD_PATH}/{name}", crd)
    await _put(client, MWC_PATH, mwc)
    await _put(client, VWC_PATH, vwc)


async def remove_webhooks(client: kubeapi.KubeClient) -> None:
    """Delete Kruise's webhook configurations (its pod webhook is cluster-wide with failurePolicy
    Fail: no pod could be created while it names a manager that is gone)."""
    for path in (f"{MWC_PATH}/{MWC_NAME}", f"{VWC_PATH}/{VWC_NAME}"):
        with contextlib.suppress(api.NotFound):
            await client.delete(path)


async def webhooks_served(client: kubeapi.KubeClient) -> bool:
    """Whether every installed Kruise webhook names a URL with a caBundle (the manager rewrote them)."""
    for path in (f"{MWC_PATH}/{MWC_NAME}", f"{VWC_PATH}/{VWC_NAME}"):
        try:
            conf = await client.get(path)
        except api.NotFound:
            return False
        for hook in conf.get("webhooks") or []:
            cc = hook.get("clientConfig") or {}
            if not cc.get("url") or not cc.get("caBundle"):
                return False
    return True


# -- the process ------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    from tests.kube import controlplane

    controlplane._die_with_parent()


@dataclass
class KruiseManager:
    """One `kruise-manager` process; `kill()` is SIGKILL to its process group."""

    proc: subprocess.Popen[bytes]
    webhook_port: int
    metrics_url: str
    health_url: str
    log_path: Path
    workdir: Path
    started: float  # time.monotonic() just before the process was started
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self) -> bool:
        """Kruise's /readyz: its webhook controller has synced and its webhook port answers TLS."""
        return _status(self.health_url + "/readyz") == 200

    def metric(self, sample: str) -> float | None:
        """One sample of its /metrics, named with its labels as exposed (None if absent or unreachable)."""
        try:
            with urllib.request.urlopen(self.metrics_url + "/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[1])
        return None

    def leading(self) -> bool:
        """controller-runtime's gauge. (Kruise's own `kruise_manager_is_leader` stays 0: client-go takes
        the first leader-election metrics provider set, and controller-runtime's is set first.)"""
        return self.metric(f'leader_election_master_status{{name="{LEASE_NAME}"}}') == 1.0

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kruise-manager exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"kruise-manager not ready within {timeout:.0f} s:\n{self.log_tail()}")

    def terminate(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def start(
    cp: ControlPlane,
    *,
    path: Path | None = None,
    webhook_port: int | None = None,
    external_certs: bool = False,
    feature_gates: dict[str, bool] | None = None,
    extra: tuple[str, ...] = (),
    name: str = "kruise",
) -> KruiseManager:
    """Start Kruise's manager against `cp` (install the CRDs and webhook configurations first)."""
    path = path or binary()
    workdir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    (workdir / "log").mkdir()
    webhook_port = webhook_port or free_port()
    metrics_port, health_port = free_port(), free_port()
    gates = {**FEATURE_GATES, **(feature_gates or {})}
    if external_certs:
        gates["EnableExternalCerts"] = True
    args = [
        str(path),
        f"--metrics-addr=127.0.0.1:{metrics_port}",
        f"--health-probe-addr=127.0.0.1:{health_port}",
        "--enable-pprof=false",
        "--enable-leader-election=true",
        f"--leader-election-namespace={KRUISE_NS}",
        f"--protection-log-path={workdir / 'log'}",
        "--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items())),
        *extra,
    ]
    env = {
        "KUBECONFIG": str(cp.kubeconfig),
        "POD_NAMESPACE": KRUISE_NS,
        "WEBHOOK_HOST": "127.0.0.1",
        "WEBHOOK_PORT": str(webhook_port),
        "WEBHOOK_CERT_DIR": str(workdir / "certs"),
    }
    log_path = workdir / "manager.log"
    out = open(log_path, "wb")  # noqa: SIM115 - owned by the child
    started = time.monotonic()
    proc = subprocess.Popen(
        args,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR")}, **env},
        preexec_fn=_die_with_parent,
    )
    out.close()
    return KruiseManager(
        proc,
        webhook_port,
        f"http://127.0.0.1:{metrics_port}",
        f"http://127.0.0.1:{health_port}",
        log_path,
        workdir,
        started,
        args,
        env,
    )


# -- objects ----------------------------------------------------------------------------------------
def sidecarset_status(obj: JsonObj) -> dict[str, int]:
    """The counters of a SidecarSet's status (Kruise's and ours have the same names), 0 if absent,
    and whether the status is of the current generation (`current`: 1 or 0)."""
    st = obj.get("status") or {}
    out = {k: int(st.get(k) or 0) for k in ("matchedPods", "updatedPods", "readyPods", "updatedReadyPods")}
    out["current"] = int(st.get("observedGeneration") == obj["metadata"].get("generation"))
    return out
