"""sidecarctl side by side with OpenKruise v1.9.1's own manager: one cluster, the same pods.

One private control plane (etcd + kube-apiserver, no controller-manager), one fake kubelet
(`tests/kube/fakekubelet.py`: binds pods, reports them Running and Ready, and reports an in-place
image change as a container restart with the new image and imageID, the same way for both), the
same pod template (the Online Boutique `frontend` of the Kruise differential corpus,
`tests/kruise/corpus/pods/shop--frontend.yaml`) and the same SidecarSet in each API group (the
corpus' `istio-proxy-shop`: Istio's rendered init container and proxy, 6 volumes, an
imagePullSecret), scoped by `namespaceSelector` to its manager's namespace (`vs-kruise`,
`vs-sidecarctl`, created alike: the same labels, including sidecarctl's injection label, which
Kruise ignores) and with `maxUnavailable: 100%`.

Kruise's manager is the binary its v1.9.1 release builds (`tools/build-kruise-manager.sh`), started
as `tests/kube/kruisemanager.py` says (its SidecarSet webhooks by URL, only the SidecarSet
controller doing work); sidecarctl is the real `sidecarctl run` (supervisor, control process,
admission workers). Each manager is measured in its own phase: only that manager runs, only its
webhook configurations (and, for sidecarctl, its MutatingAdmissionPolicies) exist, and the pods of
the phase are deleted at its end. Phases alternate in order from round to round (`--rounds`), so
drift in the machine's load shows in the per-round figures.

Rows (ratio: how far sidecarctl is ahead, > 1 when it is, for each row's better direction):
1. pods/s: pods created through the API server by `--clients` clients for `--seconds` (pods stay
   unscheduled: admission only; each manager leads). Kruise's webhook; sidecarctl with
   `--injection=webhook`; sidecarctl with `--injection=auto`, which serves this SidecarSet by its
   MutatingAdmissionPolicy (checked: the pods say `injected-by: policy`).
2. in-place rollout of `--pods` pods: from the SidecarSet's image change to a status of the new
   generation with every pod updated and ready (the kubelet having reported the new image);
   kube-apiserver CPU over the rollout.
3. at each `--tracked` count: the manager's RSS (its whole process tree, from /proc, median of 3 s
   of samples once the status is right; and per tracked pod between two counts) and
   kube-apiserver CPU per pod for creating that many pods through the manager, the kubelet's bind
   and status writes, and the manager's tracking.
4. cold start at the largest `--tracked` count: the manager stopped, its Lease deleted and the
   SidecarSet's status zeroed; process start to the status being right again; kube-apiserver
   CPU per pod over that start.
5. takeover at the largest `--tracked` count: two replicas (their webhooks behind one forwarding
   port, as behind a Service; Kruise's replicas with `EnableExternalCerts`, see kruisemanager.py),
   an image change, and once `--kill-at` of the pods run the new image the leader's whole process
   tree is SIGKILLed. From the kill: the standby holding the Lease, the next pod write received
   by the API server (the audit log; Kruise updates pods, sidecarctl patches them; also from the
   Lease's expiry, its last renewal seen plus its duration, the issue's reference), and the next
   status of the current generation written by the new leader that counts every pod and at least
   the updated pods there were at the kill. Also the standby's RSS before the kill.

Run: `.venv/bin/python bench/bench_vs_kruise.py` (the issue's sizes: about 4-5 hours on 2 cores,
most of it creating 10,000 and 50,000 pods through each manager with the fake kubelet running
them, ~23 pods/s here; estimated from the smoke run's slopes, row 5 at 50,000 pods holds ~10 GB:
two Kruise replicas at ~60 KiB per pod each, the fake kubelet's ~31 KiB per pod, kube-apiserver),
or a smoke run: `--pods 300 --tracked 300,600 --seconds 5` (~9.5 min). The first run builds
Kruise's manager (minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.bench_policy import manager_cpu, run_load
from injector.policysync.support import BINDINGS, POLICIES, PROBE_LABEL
from kuberuntime import api
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from tests.kruise.compare import from_kruise
from tests.kube import builders
from tests.kube import kruisemanager as km
from tests.kube.audit import audit_events
from tests.kube.controlplane import free_port
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.measure import descendants, rss

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "kruise" / "corpus"
POD_FILE = CORPUS / "pods" / "shop--frontend.yaml"
SIDECARSET_FILE = CORPUS / "sidecarsets" / "istio-proxy-shop.yaml"
SS_NAME = "istio-proxy"
SIDECAR = "istio-proxy"
IMAGES = ("docker.io/istio/proxyv2:1.22.0", "docker.io/istio/proxyv2:1.22.1")
NS_LABELS = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
MIB = 1024 * 1024


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- objects --------------------------------------------------------------------------------------
def pod_template() -> JsonObj:
    (pod,) = [d for d in yaml.safe_load_all(POD_FILE.read_text()) if d]
    meta = pod["metadata"]
    meta.pop("namespace", None)
    meta["generateName"] = meta.pop("name") + "-"
    out: JsonObj = pod
    return out


def kruise_sidecarset(namespace: str) -> JsonObj:
    """The corpus SidecarSet in Kruise's v1beta1 (its storage version, so nothing converts it):
    `spec.namespace` is v1alpha1's spelling of this namespaceSelector."""
    (ss,) = [d for d in yaml.safe_load_all(SIDECARSET_FILE.read_text()) if d]
    ss["apiVersion"] = f"{km.GROUP}/v1beta1"
    ss["metadata"]["name"] = SS_NAME
    spec = ss["spec"]
    spec.pop("namespace", None)
    spec["namespaceSelector"] = {"matchLabels": {names.NS_NAME_LABEL: namespace}}
    spec["updateStrategy"] = {"type": "RollingUpdate", "maxUnavailable": "100%"}
    spec["containers"][0]["image"] = IMAGES[0]
    out: JsonObj = ss
    return out


def sidecarctl_sidecarset(namespace: str) -> JsonObj:
    """The same SidecarSet under sidecarctl's group and version."""
    ss = from_kruise(kruise_sidecarset(namespace))
    ss["apiVersion"] = names.API_VERSION
    return ss


# -- the managers ---------------------------------------------------------------------------------
@dataclass
class Replica:
    """One running replica of a manager, as the phases drive it."""

    root: int  # the pid whose process tree is the manager
    started: float  # time.monotonic() at its start
    stop: Callable[[], None]  # SIGTERM, wait
    leading: Callable[[], bool]
    ready: Callable[[], bool]
    log_tail: Callable[[], str]
    webhook_calls: Callable[[], float] | None = None  # sidecarctl's /inject calls so far

    def rss(self) -> int:
        return sum(rss(p) for p in descendants(self.root))

    def cpu(self) -> float:
        """CPU seconds used so far by the processes of the tree alive now."""
        return manager_cpu(descendants(self.root))

    def kill(self) -> None:
        """SIGKILL to every process of the tree at once, as the kubelet kills a container."""
        for pid in descendants(self.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class Side:
    """A manager under test: its namespace, SidecarSet, webhooks and processes."""

    key = ""
    label = ""
    namespace = ""
    ss_path = ""
    lease_path = ""
    revisions = ""  # (path, label selector) of its ControllerRevisions

    def __init__(self, c: common.Cluster) -> None:
        self.c = c

    def sidecarset(self) -> JsonObj:
        raise NotImplementedError

    async def install(self, url: str | None) -> None:
        raise NotImplementedError

    async def uninstall(self) -> None:
        raise NotImplementedError

    async def cleanup(self) -> None:
        """Delete its SidecarSet and the ControllerRevisions its manager kept for it."""
        raise NotImplementedError

    def start(self, *, port: int, identity: str, shared: bool) -> Replica:
        """`shared`: a second replica will serve the same webhooks (behind a forwarder)."""
        raise NotImplementedError

    def wait_served(self, timeout: float) -> None:
        """After the first replica starts: until its webhook configurations are usable."""

    def injected_by(self, pod: JsonObj) -> str | None:
        """How the pod was injected ("webhook", "policy"), None if it was not."""
        if not any(c["name"] == SIDECAR for c in pod["spec"]["containers"]):
            return None
        return str((pod["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY, "webhook"))

    expected_path = "webhook"


class KruiseSide(Side):
    key = "kruise"
    label = "Kruise v1.9.1"
    namespace = "vs-kruise"
    ss_path = km.SS_PATH
    lease_path = km.LEASE_PATH

    def __init__(self, c: common.Cluster, binary: Path) -> None:
        super().__init__(c)
        self.binary = binary
        self.certs = km.ExternalCerts.make()
        self.procs: list[km.KruiseManager] = []

    def sidecarset(self) -> JsonObj:
        return kruise_sidecarset(self.namespace)

    async def install(self, url: str | None) -> None:
        await km.install_webhooks(self.c.client, url=url, certs=self.certs if url else None)

    async def uninstall(self) -> None:
        await km.remove_webhooks(self.c.client)
        with contextlib.suppress(api.NotFound):
            await self.c.client.delete(f"/api/v1/namespaces/{km.KRUISE_NS}/secrets/{km.SECRET_NAME}")

    def start(self, *, port: int, identity: str, shared: bool) -> Replica:
        m = km.start(self.c.cp, path=self.binary, webhook_port=port, external_certs=shared, name=identity)
        self.procs.append(m)
        return Replica(m.pid, m.started, m.terminate, m.leading, m.ready, m.log_tail)

    def wait_served(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.c.run(km.webhooks_served(self.c.client)):
            if time.monotonic() > deadline:
                raise RuntimeError("Kruise did not rewrite its webhook configurations")
            time.sleep(0.2)

    async def cleanup(self) -> None:
        with contextlib.suppress(api.NotFound):
            await self.c.client.delete(f"{self.ss_path}/{SS_NAME}")
        await self.c.client.delete(km.REVISIONS_PATH, params={"labelSelector": f"kruise.io/sidecarset-name={SS_NAME}"})


class SidecarctlSide(Side):
    key = "sidecarctl"
    namespace = "vs-sidecarctl"
    ss_path = common.SS_PATH
    lease_path = (
        f"/apis/coordination.k8s.io/v1/namespaces/{names.DEFAULT_MANAGER_NAMESPACE}/leases/sidecarctl-controller"
    )

    def __init__(self, c: common.Cluster, injection: str) -> None:
        super().__init__(c)
        self.injection = injection
        self.label = f"sidecarctl --injection={injection}"
        self.expected_path = "webhook" if injection == "webhook" else "policy"
        self.cert_dir = common.temp_dir("bench-vs-kruise-certs-")
        from tests.kube.managerharness import write_cert_dir

        write_cert_dir(self.cert_dir)

    def sidecarset(self) -> JsonObj:
        return sidecarctl_sidecarset(self.namespace)

    async def install(self, url: str | None) -> None:
        from tests.kube.managerharness import MWC_PATH, VWC_PATH, webhook_configs

        mwc, vwc = webhook_configs(
            url or "https://127.0.0.1:0",
            mutating=names.MUTATING_WEBHOOK_CONFIG,
            validating=names.VALIDATING_WEBHOOK_CONFIG,
        )
        for path, obj in ((MWC_PATH, mwc), (VWC_PATH, vwc)):
            with contextlib.suppress(api.NotFound):
                await self.c.client.delete(f"{path}/{obj['metadata']['name']}")
            await self.c.client.create(path, obj)

    async def uninstall(self) -> None:
        from tests.kube.managerharness import MWC_PATH, VWC_PATH

        for path in (f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}", f"{VWC_PATH}/{names.VALIDATING_WEBHOOK_CONFIG}"):
            with contextlib.suppress(api.NotFound):
                await self.c.client.delete(path)
        # The canary's pair stays: with no binding naming PodTemplates for a second, kube-apiserver stops
        # that kind's parameter informer for good (kubernetes/kubernetes#130887) and the next round's
        # manager, finding its canary read from a stale copy, would serve every pod by its webhook.
        keep_canary = f"app.kubernetes.io/managed-by=sidecarctl,!{PROBE_LABEL}"
        for path in (BINDINGS, POLICIES):
            await self.c.client.delete(path, params={"labelSelector": keep_canary})

    def start(self, *, port: int, identity: str, shared: bool) -> Replica:
        from tests.kube.managerharness import start_process
        from tests.kube.measure import Metrics

        started = time.monotonic()
        m = start_process(
            self.c.cp,
            self.cert_dir,
            identity=identity,
            webhook_port=port,
            extra=(f"--injection={self.injection}", "--log-format=text"),
        )
        metrics = Metrics(m.probe_url)

        def leading() -> bool:
            try:
                return metrics.value("sidecarctl_leader") == 1.0
            except OSError:
                return False

        def calls() -> float:
            return metrics.value("sidecarctl_admissions_total", webhook="inject")

        return Replica(m.proc.pid, started, m.terminate, leading, m.ready, m.log_tail, calls)

    async def cleanup(self) -> None:
        with contextlib.suppress(api.NotFound):
            await self.c.client.delete(f"{self.ss_path}/{SS_NAME}")
        path = f"/apis/apps/v1/namespaces/{names.DEFAULT_MANAGER_NAMESPACE}/controllerrevisions"
        await self.c.client.delete(path, params={"labelSelector": f"{names.REVISION_LABEL_SIDECARSET}={SS_NAME}"})


# -- cluster helpers ------------------------------------------------------------------------------
async def _prepare(c: common.Cluster, sides: list[Side]) -> None:
    await km.install_crds(c.client)
    for ns in {s.namespace for s in sides}:
        await c.ensure_namespace(ns, NS_LABELS)
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "frontend"}}
        with contextlib.suppress(api.Conflict):
            await c.client.create(f"/api/v1/namespaces/{ns}/serviceaccounts", sa)
    for ns in (names.DEFAULT_MANAGER_NAMESPACE, km.KRUISE_NS):
        await c.ensure_namespace(ns)


async def _delete_pods(c: common.Cluster, namespace: str, timeout: float = 1800.0) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    deadline = time.monotonic() + timeout
    # The API server deletes a collection inside the one request: thousands of pods outlast the
    # client's default 30 s, so the request gets the whole wait. They can outlast the API server's own
    # request timeout (60 s) too: its 504 leaves the rest of the pods in place, so ask again.
    while True:
        try:
            await c.client.request("DELETE", path, body={"gracePeriodSeconds": 0}, timeout=timeout)
        except api.ApiError as e:
            if e.status != 504:
                raise
        if not (await c.client.get(path, params={"limit": 1}))["items"]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pods of {namespace} not gone within {timeout:.0f} s")
        await asyncio.sleep(0.5)


async def _create_pods(c: common.Cluster, namespace: str, body: JsonObj, count: int, *, limit: int = 16) -> int:
    """Create `count` pods (the manager's injection applies); returns how many came back injected."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    injected = 0

    async def one() -> None:
        nonlocal injected
        for attempt in range(5):
            try:
                got = await c.client.create(path, body)
            except api.ApiError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.5)
                continue
            injected += any(x["name"] == SIDECAR for x in got["spec"]["containers"])
            return

    await common.bounded([one for _ in range(count)], limit=limit)
    return injected


def _status(c: common.Cluster, side: Side) -> dict[str, int]:
    return km.sidecarset_status(c.run(c.client.get(f"{side.ss_path}/{SS_NAME}")))


def _wait_status(c: common.Cluster, side: Side, n: int, timeout: float, *, what: str) -> float:
    """Until the status is of the current generation with `n` pods matched, updated and ready;
    returns time.monotonic() then."""
    want = {"matchedPods": n, "updatedPods": n, "readyPods": n, "updatedReadyPods": n, "current": 1}
    deadline = time.monotonic() + timeout
    while True:
        got = _status(c, side)
        if got == want:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{side.label}: {what}: status {got} after {timeout:.0f} s, wanted {want}")
        time.sleep(0.1)


def _set_image(c: common.Cluster, side: Side, image: str) -> None:
    patch = [{"op": "replace", "path": "/spec/containers/0/image", "value": image}]
    c.run(c.client.patch(f"{side.ss_path}/{SS_NAME}", patch, patch_type="json"))


def _wait(check: Callable[[], bool], timeout: float, what: str, *, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout:.0f} s: {what}")
        time.sleep(interval)


def _apiserver_cpu(c: common.Cluster) -> float:
    return common.process_cpu(c.cp.procs["kube-apiserver"].pid)


class Forwarder:
    """A TCP port that hands each connection to the first of several local ports that accepts, as
    a Service does once a dead endpoint is gone: two replicas' webhooks behind one URL."""

    def __init__(self, c: common.Cluster, backends: list[int]) -> None:
        self.c, self.backends, self.port = c, backends, free_port()
        self.server: asyncio.AbstractServer | None = None

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for port in self.backends:
            try:
                br, bw = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            await asyncio.gather(self._pump(r, bw), self._pump(br, w))
            return
        w.close()

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    def __enter__(self) -> Forwarder:
        self.c.run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.close()


def _wall(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Sampler:
    """Polls the SidecarSet and the Lease every 0.1 s: (monotonic time, status), and each holder of
    the Lease: (monotonic time first seen, identity, its acquireTime).

    On a loop and a client of its own: on the bench's loop, the fake kubelet's work on thousands of
    freshly patched pods held its polls back by seconds, so the manager that patched fastest had its
    status seen latest."""

    def __init__(self, c: common.Cluster, side: Side) -> None:
        self.cluster, self.side = c, side
        self.c: Any = None  # a loop and client of its own (common.api_loop), from __enter__ to __exit__
        self._own = contextlib.ExitStack()
        self.statuses: list[tuple[float, dict[str, int]]] = []
        self.holders: list[tuple[float, str, float]] = []
        self.lease_expiry = 0.0  # wall clock: the last renewTime seen plus the Lease's duration
        self._stop = asyncio.Event()
        self._task: Any = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(api.ApiError, OSError, asyncio.TimeoutError):
                ss = await self.c.client.get(f"{self.side.ss_path}/{SS_NAME}")
                self.statuses.append((time.monotonic(), km.sidecarset_status(ss)))
                lease = await self.c.client.get(self.side.lease_path)
                spec = lease.get("spec") or {}
                holder = str(spec.get("holderIdentity") or "")
                if not self.holders or self.holders[-1][1] != holder:
                    acquired = _wall(spec["acquireTime"]) if spec.get("acquireTime") else float("nan")
                    self.holders.append((time.monotonic(), holder, acquired))
                if spec.get("renewTime"):
                    self.lease_expiry = _wall(spec["renewTime"]) + float(spec.get("leaseDurationSeconds") or 0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.1)

    def __enter__(self) -> Sampler:
        self.c = self._own.enter_context(common.api_loop(self.cluster.cp))
        self._task = self.c.loop.spawn(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        self.c.loop.loop.call_soon_threadsafe(self._stop.set)
        with contextlib.suppress(Exception):
            self._task.result(timeout=10)
        self._own.close()


@contextlib.contextmanager
def running(side: Side, c: common.Cluster, *, identity: str, timeout: float) -> Iterator[Replica]:
    """One replica of the side's manager, leading, its webhooks installed and served; stopped and its
    webhooks removed afterwards."""
    with contextlib.suppress(api.NotFound):
        c.run(c.client.delete(side.lease_path))
    port = free_port()
    c.run(side.install(None if side.key == "kruise" else f"https://127.0.0.1:{port}"))
    replica = side.start(port=port, identity=identity, shared=False)
    try:
        _wait(replica.ready, timeout, f"{side.label} ready:\n{replica.log_tail()}")
        side.wait_served(timeout)
        _wait(replica.leading, timeout, f"{side.label} leads")
        yield replica
    finally:
        replica.stop()
        c.run(side.uninstall())


def _wait_live(c: common.Cluster, side: Side, replica: Replica, body: JsonObj, timeout: float) -> None:
    """Until a dry-run pod is injected the way the side should inject it (its informers, the API
    server's webhook and policy caches caught up); for pods a policy serves, also until they no
    longer reach the webhook (the manager narrows it once its policies are enforced), twice in a
    row a second apart."""
    path = f"/api/v1/namespaces/{side.namespace}/pods"
    try:
        c.run(c.client.get(f"{side.ss_path}/{SS_NAME}"))
    except api.NotFound:
        # Created once the manager serves its webhooks, as on a cluster where it is installed:
        # Kruise's SidecarSet webhook writes the hash annotations its pod webhook copies.
        c.run(c.client.create(side.ss_path, side.sidecarset()))

    def live() -> bool:
        try:
            got = c.run(c.client.create(path, body, params={"dryRun": "All"}))
        except api.ApiError:
            return False
        return side.injected_by(got) == side.expected_path

    _wait(live, timeout, f"{side.label} injects {side.namespace}'s pods by {side.expected_path}")
    calls = replica.webhook_calls
    if side.expected_path != "policy" or calls is None:
        return
    quiet, deadline = 0, time.monotonic() + timeout
    while quiet < 2:
        before = calls()
        live()
        quiet = quiet + 1 if calls() == before else 0
        if time.monotonic() > deadline:
            raise RuntimeError(f"{side.label}: policy-served pods still reach the webhook after {timeout:.0f} s")
        time.sleep(1.0)


# -- the rows ---------------------------------------------------------------------------------------
@dataclass
class Figures:
    """Per side, per row key: one value per round."""

    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, side: str, key: str, value: float) -> None:
        self.values.setdefault((side, key), []).append(value)

    def get(self, side: str, key: str) -> list[float]:
        return self.values.get((side, key), [])


def row1(c: common.Cluster, sides: list[Side], body: JsonObj, args: argparse.Namespace, r: int, f: Figures) -> None:
    for side in sides if r % 2 == 0 else list(reversed(sides)):
        c.run(side.cleanup())
        with running(side, c, identity=f"{side.key}-r1-{r}", timeout=args.timeout) as replica:
            _wait_live(c, side, replica, body, args.timeout)
            kc = str(c.cp.kubeconfig)
            run_load(kc, side.namespace, body, 1.0, args.clients)  # warm-up
            c.run(_delete_pods(c, side.namespace), timeout=1900)
            before, manager_before = _apiserver_cpu(c), replica.cpu()
            result = run_load(kc, side.namespace, body, args.seconds, args.clients)
            cpu, by_manager = _apiserver_cpu(c) - before, replica.cpu() - manager_before
            count = len(result["latencies"])
            items = c.run(c.client.get(f"/api/v1/namespaces/{side.namespace}/pods"))["items"]
            paths: dict[str, int] = {}
            for p in items:
                by = side.injected_by(p) or "none"
                paths[by] = paths.get(by, 0) + 1
            key = side.key + ("" if side.key == "kruise" else f"-{side.expected_path}")
            f.add(key, "pods/s", count / result["elapsed"])
            lat = sorted(result["latencies"])
            if lat:
                f.add(key, "p50 ms", 1000 * common.percentile(lat, 50))
                f.add(key, "p99 ms", 1000 * common.percentile(lat, 99))
            f.add(key, "apiserver ms/pod", 1000 * cpu / max(count, 1))
            f.add(key, "manager ms/pod", 1000 * by_manager / max(count, 1))
            print(
                f"  row 1 round {r + 1} {side.label:26} {count / result['elapsed']:6.0f} pods/s,"
                f" {1000 * cpu / max(count, 1):.1f} ms apiserver CPU/pod,"
                f" {1000 * by_manager / max(count, 1):.1f} ms manager CPU/pod, injected: {paths},"
                f" errors: {result['error_count']} {result['errors'][:1]}",
                flush=True,
            )
            if paths.get(side.expected_path, 0) != len(items) or result["error_count"]:
                f.notes.append(f"row 1 round {r + 1} {side.label}: injected {paths}, {result['error_count']} errors")
            c.run(_delete_pods(c, side.namespace), timeout=1900)
        c.run(side.cleanup())


def _populate(c: common.Cluster, side: Side, body: JsonObj, have: int, n: int, timeout: float) -> int:
    injected = c.run(_create_pods(c, side.namespace, body, n - have), timeout=timeout)
    if injected != n - have:
        raise RuntimeError(f"{side.label}: {n - have - injected} of {n - have} pods created without the sidecar")
    return n


def row2(
    c: common.Cluster,
    kubelet: FakeKubelet,
    sides: list[Side],
    body: JsonObj,
    args: argparse.Namespace,
    r: int,
    f: Figures,
) -> None:
    for n in args.pods:
        for side in sides if r % 2 == 0 else list(reversed(sides)):
            c.run(side.cleanup())
            kubelet.namespaces.add(side.namespace)
            try:
                with running(side, c, identity=f"{side.key}-r2-{r}", timeout=args.timeout) as replica:
                    _wait_live(c, side, replica, body, args.timeout)
                    _populate(c, side, body, 0, n, args.timeout * (1 + n / 100))
                    _wait_status(c, side, n, args.timeout * (1 + n / 100), what=f"{n} pods ready")
                    audit_from = c.cp.audit_log.stat().st_size
                    cpu0 = _apiserver_cpu(c)
                    t0, wall0 = time.monotonic(), time.time()
                    _set_image(c, side, IMAGES[1])
                    done = _wait_status(c, side, n, args.timeout * (1 + n / 20), what=f"rollout of {n} pods")
                    cpu = _apiserver_cpu(c) - cpu0
                    writes = _pod_writes(c, audit_from, side.namespace)
                    first = min((w for w, _ in writes), default=float("nan")) - wall0
                    f.add(side.key, f"rollout {n}", done - t0)
                    f.add(side.key, f"rollout {n} apiserver s", cpu)
                    print(
                        f"  row 2 round {r + 1} {side.label:26} {n} pods: {done - t0:.1f} s to the status,"
                        f" first pod write {first:.2f} s after the change, {len(writes)} pod writes,"
                        f" {cpu:.1f} CPU-s of kube-apiserver",
                        flush=True,
                    )
                    if len(writes) != n:
                        f.notes.append(f"row 2 round {r + 1} {side.label} {n} pods: {len(writes)} pod writes")
                    landed, seen_by = _landed(kubelet, side.namespace), time.monotonic() + 5
                    while landed != n and time.monotonic() < seen_by:  # the bench's own watch may lag
                        time.sleep(0.1)
                        landed = _landed(kubelet, side.namespace)
                    if landed != n:
                        f.notes.append(
                            f"row 2 round {r + 1} {side.label} {n} pods: the status said done with {landed} pods"
                            " reported running the new image and ready by the kubelet"
                        )
            finally:
                kubelet.namespaces.discard(side.namespace)
                c.run(_delete_pods(c, side.namespace), timeout=1900)
                c.run(side.cleanup())


def _landed(kubelet: FakeKubelet, namespace: str) -> int:
    """Pods of `namespace` whose sidecar the kubelet reports running the new image, and Ready."""
    want = builders.image_id(IMAGES[1])
    count = 0
    for key, pod in list(kubelet.informer.store.items()):
        if not key.startswith(namespace + "/"):
            continue
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        sidecar = [c for c in status.get("containerStatuses") or [] if c.get("name") == SIDECAR]
        count += ready and bool(sidecar) and sidecar[0].get("imageID") == want and sidecar[0].get("ready") is True
    return count


def _pod_writes(c: common.Cluster, start: int, namespace: str) -> list[tuple[float, str]]:
    """(received at, wall clock; verb) of successful writes to pods (not their subresources)."""
    out = []
    for e in audit_events(c.cp, start):
        ref = e.get("objectRef") or {}
        if (
            e["verb"] in ("patch", "update")
            and ref.get("resource") == "pods"
            and not ref.get("subresource")
            and ref.get("namespace") == namespace
            and (e.get("responseStatus") or {}).get("code", 0) < 300
        ):
            received = dt.datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            out.append((received, str(e["verb"])))
    return out


def _zero_status(c: common.Cluster, side: Side) -> None:
    zero = {"matchedPods": 0, "updatedPods": 0, "readyPods": 0, "updatedReadyPods": 0, "observedGeneration": 0}
    c.run(c.client.patch(f"{side.ss_path}/{SS_NAME}/status", {"status": zero}, patch_type="merge"))


def rows345(
    c: common.Cluster,
    kubelet: FakeKubelet,
    sides: list[Side],
    body: JsonObj,
    args: argparse.Namespace,
    r: int,
    f: Figures,
) -> None:
    big = args.tracked[-1]
    for side in sides if r % 2 == 0 else list(reversed(sides)):
        c.run(side.cleanup())
        kubelet.namespaces.add(side.namespace)
        try:
            have = 0
            with running(side, c, identity=f"{side.key}-r3-{r}", timeout=args.timeout) as replica:
                _wait_live(c, side, replica, body, args.timeout)
                for n in args.tracked:
                    cpu0 = _apiserver_cpu(c)
                    t0 = time.monotonic()
                    added = n - have
                    have = _populate(c, side, body, have, n, args.timeout * (1 + n / 100))
                    _wait_status(c, side, n, args.timeout * (1 + n / 100), what=f"{n} pods tracked")
                    cpu = _apiserver_cpu(c) - cpu0
                    time.sleep(args.settle)
                    samples = []
                    for _ in range(30):
                        samples.append(replica.rss())
                        time.sleep(0.1)
                    mem = statistics.median(samples)
                    f.add(side.key, f"rss {n}", mem / MIB)
                    f.add(side.key, f"apiserver ms/pod {n}", 1000 * cpu / max(added, 1))
                    print(
                        f"  row 3 round {r + 1} {side.label:26} {n} pods: RSS {mem / MIB:.0f} MiB"
                        f" ({mem / n / 1024:.1f} KiB/pod), {1000 * cpu / max(added, 1):.2f} ms apiserver CPU/pod,"
                        f" populated in {time.monotonic() - t0:.0f} s",
                        flush=True,
                    )
            # The replica above is stopped and its webhooks are removed; its pods and status stay.
            if 4 in args.rows:
                row4(c, side, big, args, r, f)
            if 5 in args.rows:
                row5(c, kubelet, side, big, args, r, f)
        finally:
            kubelet.namespaces.discard(side.namespace)
            c.run(_delete_pods(c, side.namespace), timeout=1900)
            c.run(side.cleanup())


def row4(c: common.Cluster, side: Side, n: int, args: argparse.Namespace, r: int, f: Figures) -> None:
    with contextlib.suppress(api.NotFound):
        c.run(c.client.delete(side.lease_path))
    _zero_status(c, side)
    port = free_port()
    c.run(side.install(None if side.key == "kruise" else f"https://127.0.0.1:{port}"))
    cpu0 = _apiserver_cpu(c)
    replica = side.start(port=port, identity=f"{side.key}-r4-{r}", shared=False)
    try:
        done = _wait_status(c, side, n, args.timeout * (1 + n / 100), what=f"cold start at {n} pods")
        cpu = _apiserver_cpu(c) - cpu0
        f.add(side.key, f"cold {n}", done - replica.started)
        f.add(side.key, f"cold {n} apiserver ms/pod", 1000 * cpu / n)
        print(
            f"  row 4 round {r + 1} {side.label:26} {n} pods: first right status {done - replica.started:.1f} s"
            f" after the process started, {1000 * cpu / n:.2f} ms apiserver CPU/pod",
            flush=True,
        )
    finally:
        replica.stop()
        c.run(side.uninstall())


def row5(
    c: common.Cluster,
    kubelet: FakeKubelet,
    side: Side,
    n: int,
    args: argparse.Namespace,
    r: int,
    f: Figures,
) -> None:
    with contextlib.suppress(api.NotFound):
        c.run(c.client.delete(side.lease_path))
    ports = [free_port(), free_port()]
    replicas: list[Replica] = []
    with Forwarder(c, ports) as fwd:
        c.run(side.install(f"https://127.0.0.1:{fwd.port}"))
        try:
            a = side.start(port=ports[0], identity=f"{side.key}-r5-{r}-a", shared=True)
            replicas.append(a)
            _wait(a.ready, args.timeout, f"{side.label} replica a ready:\n{a.log_tail()}")
            _wait(a.leading, args.timeout, f"{side.label} replica a leads")
            b = side.start(port=ports[1], identity=f"{side.key}-r5-{r}-b", shared=True)
            replicas.append(b)
            _wait(b.ready, args.timeout, f"{side.label} replica b ready:\n{b.log_tail()}")
            _wait_status(c, side, n, args.timeout * (1 + n / 100), what=f"{n} pods before the takeover")
            time.sleep(args.settle)  # the standby's caches, if it keeps any, fill meanwhile
            standby_rss = statistics.median(b.rss() for _ in range(10))
            f.add(side.key, f"standby rss {n}", standby_rss / MIB)
            prefix = f"{side.namespace}/"
            audit_from = c.cp.audit_log.stat().st_size

            def updated() -> int:
                return sum(
                    1
                    for k, p in list(kubelet.informer.store.items())
                    if k.startswith(prefix)
                    and any(x["name"] == SIDECAR and x["image"] == IMAGES[1] for x in p["spec"]["containers"])
                )

            with Sampler(c, side) as sampler:
                _set_image(c, side, IMAGES[1])
                # Counted in the kubelet's store: every 0.5 s, as a pass over 50,000 pods takes a while.
                _wait(
                    lambda: updated() >= args.kill_at * n,
                    args.timeout * (1 + n / 20),
                    "pods updated before the kill",
                    interval=0.5,
                )
                at_kill = updated()
                t_kill, wall_kill = time.monotonic(), time.time()
                a.kill()
                expiry = sampler.lease_expiry  # of the last renewal seen: the dead leader's
                replicas.remove(a)
                holder_before = sampler.holders[-1][1] if sampler.holders else ""
                # the next status of the current generation from the new leader, right
                wait_for = args.timeout + 60 + n / 250  # sidecarctl lists every pod first: ~60 s at 50,000
                deadline = time.monotonic() + wait_for

                def new_leader_status() -> tuple[float, float] | None:
                    """(the new holder's acquireTime, wall clock; when its first right status was seen)"""
                    took = [(t, a) for t, h, a in sampler.holders if t > t_kill and h and h != holder_before]
                    if not took:
                        return None
                    for t, st in sampler.statuses:
                        if t > took[0][0] and st["current"] and st["matchedPods"] == n and st["updatedPods"] >= at_kill:
                            return took[0][1], t
                    return None

                got = None
                while got is None and time.monotonic() < deadline:
                    got = new_leader_status()
                    time.sleep(0.1)
                time.sleep(1.0)  # the audit log's last lines
            if got is None:
                raise RuntimeError(f"{side.label}: no right status from a new leader within {wait_for:.0f} s")
            acquired_wall, status_at = got
            acquired = acquired_wall - wall_kill  # seconds after the kill
            # The new leader's writes: received once it held the Lease (one the old leader had sent
            # just before its kill can be received after the kill, never after a takeover).
            writes = [w for w, _ in _pod_writes(c, audit_from, side.namespace) if w >= acquired_wall]
            f.add(side.key, f"takeover {n} lease", acquired)
            f.add(side.key, f"takeover {n} patch", (min(writes) - wall_kill) if writes else float("nan"))
            f.add(side.key, f"takeover {n} patch after expiry", (min(writes) - expiry) if writes else float("nan"))
            f.add(side.key, f"takeover {n} status", status_at - t_kill)
            patch_s = (min(writes) - wall_kill) if writes else float("nan")
            print(
                f"  row 5 round {r + 1} {side.label:26} {n} pods, killed at {at_kill} updated:"
                f" Lease taken {acquired:.1f} s after the kill (it expired at {expiry - wall_kill:.1f} s),"
                f" next pod write {patch_s:.1f} s,"
                f" right status {status_at - t_kill:.1f} s;"
                f" standby RSS {standby_rss / MIB:.0f} MiB",
                flush=True,
            )
        finally:
            for rep in replicas:
                rep.stop()
            c.run(side.uninstall())


# -- the report -------------------------------------------------------------------------------------
def _fmt(values: list[float], unit: str, digits: int) -> str:
    if not values:
        return "-"
    each = " / ".join(f"{v:.{digits}f}" for v in values)
    unit = f" {unit}" if unit else ""
    return f"{statistics.median(values):.{digits}f}{unit} ({each})" if len(values) > 1 else f"{each}{unit}"


def _ratio(kruise: list[float], ours: list[float], *, higher_better: bool) -> str:
    if not kruise or not ours:
        return "-"
    k, o = statistics.median(kruise), statistics.median(ours)
    if k != k or o != o or (o == 0 if not higher_better else k == 0):
        return "-"
    return f"{(o / k if higher_better else k / o):.2f}x"


def report(f: Figures, args: argparse.Namespace) -> None:
    rows: list[list[str]] = []

    def add(
        row: str, what: str, kkey: tuple[str, str], okey: tuple[str, str], unit: str, digits: int, hb: bool
    ) -> None:
        k, o = f.get(*kkey), f.get(*okey)
        if k or o:
            rows.append([row, what, _fmt(k, unit, digits), _fmt(o, unit, digits), _ratio(k, o, higher_better=hb)])

    if 1 in args.rows:
        for path in ("webhook", "policy"):
            ours = f"sidecarctl-{path}"
            add(
                "1",
                f"pods/s, {args.clients} clients (ours by {path})",
                ("kruise", "pods/s"),
                (ours, "pods/s"),
                "",
                0,
                True,
            )
            add("1", f"  p99 create latency (ours by {path})", ("kruise", "p99 ms"), (ours, "p99 ms"), "ms", 0, False)
            add(
                "1",
                f"  apiserver CPU per pod (ours by {path})",
                ("kruise", "apiserver ms/pod"),
                (ours, "apiserver ms/pod"),
                "ms",
                1,
                False,
            )
            add(
                "1",
                f"  manager CPU per pod (ours by {path})",
                ("kruise", "manager ms/pod"),
                (ours, "manager ms/pod"),
                "ms",
                1,
                False,
            )
    for n in args.pods if 2 in args.rows else []:
        add("2", f"rollout, {n} pods", ("kruise", f"rollout {n}"), ("sidecarctl", f"rollout {n}"), "s", 1, False)
        add(
            "2",
            f"  apiserver CPU, {n} pods",
            ("kruise", f"rollout {n} apiserver s"),
            ("sidecarctl", f"rollout {n} apiserver s"),
            "s",
            1,
            False,
        )
    for n in args.tracked if 3 in args.rows else []:
        add("3", f"RSS, {n} pods", ("kruise", f"rss {n}"), ("sidecarctl", f"rss {n}"), "MiB", 0, False)
        add(
            "3",
            f"  apiserver CPU per pod, {n} pods",
            ("kruise", f"apiserver ms/pod {n}"),
            ("sidecarctl", f"apiserver ms/pod {n}"),
            "ms",
            2,
            False,
        )
    if 3 in args.rows:
        for lo, hi in zip(args.tracked, args.tracked[1:], strict=False):
            for side in ("kruise", "sidecarctl"):
                slope = [
                    (b - a) * 1024 / (hi - lo)
                    for a, b in zip(f.get(side, f"rss {lo}"), f.get(side, f"rss {hi}"), strict=False)
                ]
                f.values[(side, f"rss slope {hi}")] = slope
            add(
                "3",
                f"RSS per tracked pod, {lo} -> {hi} pods",
                ("kruise", f"rss slope {hi}"),
                ("sidecarctl", f"rss slope {hi}"),
                "KiB",
                1,
                False,
            )
    big = args.tracked[-1]
    if 4 in args.rows:
        add("4", f"cold start, {big} pods", ("kruise", f"cold {big}"), ("sidecarctl", f"cold {big}"), "s", 1, False)
        add(
            "4",
            f"  apiserver CPU per pod, {big} pods",
            ("kruise", f"cold {big} apiserver ms/pod"),
            ("sidecarctl", f"cold {big} apiserver ms/pod"),
            "ms",
            2,
            False,
        )
    if 5 in args.rows:
        for key, what in (
            ("lease", "kill to Lease taken"),
            ("patch", "kill to next pod write"),
            ("patch after expiry", "  Lease expiry to next pod write"),
            ("status", "kill to next right status"),
        ):
            add(
                "5",
                f"{what}, {big} pods",
                ("kruise", f"takeover {big} {key}"),
                ("sidecarctl", f"takeover {big} {key}"),
                "s",
                1,
                False,
            )
        add(
            "5",
            f"  standby RSS, {big} pods",
            ("kruise", f"standby rss {big}"),
            ("sidecarctl", f"standby rss {big}"),
            "MiB",
            0,
            False,
        )
    print()
    print(
        common.table(
            ("row", "measure", "Kruise v1.9.1: median (rounds)", "sidecarctl: median (rounds)", "sidecarctl ahead by"),
            rows,
        )
    )
    for note in f.notes:
        print(f"note: {note}")


def _counts(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x]
    if not values or values != sorted(set(values)) or values[0] < 1:
        raise argparse.ArgumentTypeError("increasing positive numbers, comma-separated")
    return values


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=_counts, default=[1, 2, 3, 4, 5], help="rows to run (default 1,2,3,4,5)")
    parser.add_argument("--rounds", type=common.positive_int, default=2)
    parser.add_argument("--clients", type=common.positive_int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="row 1: seconds of load per manager and round")
    parser.add_argument("--pods", type=_counts, default=[1000, 10000], help="row 2: pods rolled out")
    parser.add_argument("--tracked", type=_counts, default=[10000, 50000], help="rows 3-5: pods tracked")
    parser.add_argument("--kill-at", type=float, default=0.1, help="row 5: share of pods updated at the kill")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before RSS is sampled")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for anything (scaled by pods)")
    args = parser.parse_args(argv)
    if not set(args.rows) <= {1, 2, 3, 4, 5}:
        parser.error("--rows: 1 to 5")
    common.print_machine(
        f"bench_vs_kruise: rows {args.rows}, {args.rounds} rounds; row 1 {args.clients} clients x {args.seconds:g} s;"
        f" rollouts {args.pods}; tracked {args.tracked}"
    )
    binary = km.build()
    started = time.monotonic()
    f = Figures()
    with common.cluster() as c:
        kruise = KruiseSide(c, binary)
        ours = {mode: SidecarctlSide(c, mode) for mode in ("webhook", "auto")}
        c.run(_prepare(c, [kruise, ours["auto"]]))
        kubelet = FakeKubelet(c.client, node="vs-node", restart_delay=0.3)
        c.run(kubelet.start())
        body = pod_template()
        try:
            for r in range(args.rounds):
                print(f"round {r + 1} of {args.rounds} ({time.monotonic() - started:.0f} s in)", flush=True)
                if 1 in args.rows:
                    row1(c, [kruise, ours["webhook"], ours["auto"]], body, args, r, f)
                if 2 in args.rows:
                    row2(c, kubelet, [kruise, ours["auto"]], body, args, r, f)
                if {3, 4, 5} & set(args.rows):
                    rows345(c, kubelet, [kruise, ours["auto"]], body, args, r, f)
        finally:
            c.run(kubelet.stop())
    print(f"\nwhole run: {time.monotonic() - started:.0f} s")
    report(f, args)
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, sys.argv[1:]))
