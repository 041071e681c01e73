"""The cluster the reliability tests run the real `sidecarctl run` process tree in, and what they
read from it besides the measurements of tests/kube/measure.py.

- `ReliabilityCluster`: one control plane per test module (etcd, kube-apiserver with its JSON audit log,
  kube-controller-manager), the SidecarSet CRD, the manager's namespace, a ServiceAccount bound to
  cluster-admin whose token kubeconfig makes every manager request attributable in the audit log,
  a serving certificate for 127.0.0.1, and `start_manager`, which runs `sidecarctl run` as a child
  process (supervisor, control process, two admission workers).
- `LeaseMonitor`: the Lease read every 200 ms from its own thread: holders and renewTime gaps.
- `audit_events`: the API server's audit log, one record per request, with epoch timestamps.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from kuberuntime import api
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from tests.kube import builders
from tests.kube.adminrest import AdminRest
from tests.kube.audit import audit_lines
from tests.kube.client import eventually
from tests.kube.cluster import PrivateCluster, install_crd
from tests.kube.controlplane import REPO
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import (
    MANAGER_NS,
    MWC_PATH,
    VWC_PATH,
    ManagerProcess,
    ensure_namespace,
    start_process,
    wait_ready,
    webhook_configs,
)
from tests.kube.measure import WebhookClient, descendants, injected_names, pod_review

SS_PATH = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/sidecarctl-controller"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SA_NAME = "sidecarctl-reliability"
MANAGER_USER = f"system:serviceaccount:{MANAGER_NS}:{SA_NAME}"
WORKERS = 2


# -- the Lease --------------------------------------------------------------------------------------
@dataclass
class LeaseMonitor:
    """Reads the Lease every `interval` seconds from a thread of its own (never the test loop)."""

    rest: AdminRest
    interval: float = 0.2
    seen: list[tuple[float, str, str]] = field(default_factory=list)  # (wall time, holder, renewTime)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                spec = self.rest.get(LEASE_PATH).get("spec") or {}
                self.seen.append((time.time(), str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or "")))
            except Exception:
                self.errors += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> LeaseMonitor:
        self._thread = threading.Thread(target=self._run, name="lease-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def holders(self) -> set[str]:
        return {h for _, h, _ in self.seen}

    def renewals(self) -> list[float]:
        """Distinct renewTimes seen, as epoch seconds, in order."""
        out: list[float] = []
        for _, _, renew in self.seen:
            if renew:
                t = parse_time(renew)
                if not out or t != out[-1]:
                    out.append(t)
        return out

    def max_gap(self, until: float) -> float:
        """The longest time without a renewal, the last one counted up to `until` (epoch)."""
        times = self.renewals()
        if not times:
            return float("inf")
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return max([*gaps, until - times[-1]])


# -- the audit log --------------------------------------------------------------------------------
def parse_time(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class AuditEvent:
    verb: str
    user: str
    user_agent: str
    resource: str  # with "/subresource"
    namespace: str
    name: str
    uri: str
    code: int
    received: float
    completed: float

    @property
    def write(self) -> bool:
        return self.verb in ("create", "update", "patch", "delete", "deletecollection")


def audit_events(path: Path, *, user: str | None = None) -> list[AuditEvent]:
    """One record per request, optionally of one user only, in the order the API server received them.

    A request's last stage wins (ResponseComplete, or Panic), except that a watch still open has only
    its ResponseStarted: it is counted from that, so open watches are seen too.
    """
    stages: dict[str, dict[str, Any]] = {}
    needle = f'"username":"{user}"'.encode() if user else b""
    for line in audit_lines(path):
        if needle and needle not in line:
            continue
        e = orjson.loads(line)
        if e.get("stage") not in ("ResponseStarted", "ResponseComplete", "Panic"):
            continue
        known = stages.get(e["auditID"])
        if known is None or known.get("stage") == "ResponseStarted":
            stages[e["auditID"]] = e
    out: list[AuditEvent] = []
    for e in stages.values():
        ref = e.get("objectRef") or {}
        resource = str(ref.get("resource") or "")
        if ref.get("subresource"):
            resource += "/" + str(ref["subresource"])
        out.append(
            AuditEvent(
                verb=str(e.get("verb")),
                user=str((e.get("user") or {}).get("username")),
                user_agent=str(e.get("userAgent") or ""),
                resource=resource,
                namespace=str(ref.get("namespace") or ""),
                name=str(ref.get("name") or ""),
                uri=str(e.get("requestURI") or ""),
                code=int((e.get("responseStatus") or {}).get("code") or 0),
                received=parse_time(e["requestReceivedTimestamp"]),
                completed=parse_time(e["stageTimestamp"]),
            )
        )
    out.sort(key=lambda ev: ev.received)
    return out


# -- the cluster ------------------------------------------------------------------------------------
class ReliabilityCluster(PrivateCluster):
    """A control plane of the module's own, ready for `sidecarctl run`; `close()` undoes everything."""

    def __init__(self, aloop: BackgroundLoop, bin_dir: Path, *, kubelet_restart_delay: float | None = None) -> None:
        self.managers: list[ManagerProcess] = []
        super().__init__(
            aloop,
            bin_dir=bin_dir,
            kubelet_node=None if kubelet_restart_delay is None else "reliability-node",
            kubelet_restart_delay=kubelet_restart_delay or 0.0,
            prefix="sidecarctl-reliability-",
        )
        try:
            self.rest = AdminRest(self.cp)
            install_crd(self.kube, yaml.safe_load((REPO / "config/crd/sidecarctl.io_sidecarsets.yaml").read_text()))
            ensure_namespace(self.kube, MANAGER_NS)
            self.ca_file = self.cert_dir / "ca.crt"
            self.token_kubeconfig = self._service_account_kubeconfig()
        except BaseException:
            self.close()
            raise

    def _service_account_kubeconfig(self) -> Path:
        """A token of a ServiceAccount bound to cluster-admin: the manager's requests carry its name."""
        sa_path = f"/api/v1/namespaces/{MANAGER_NS}/serviceaccounts"
        with contextlib.suppress(api.Conflict):
            self.kube.create(sa_path, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA_NAME}})
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": SA_NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": SA_NAME, "namespace": MANAGER_NS}],
        }
        self.kube.apply("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        token = self.kube.create(
            f"{sa_path}/{SA_NAME}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}},
        )["status"]["token"]
        self.token = str(token)
        return self.cp.token_kubeconfig(self.workdir / "manager.kubeconfig", self.token)

    def kubeconfig_for(self, server: str, *, token: bool = True) -> Path:
        """A kubeconfig naming `server` (a proxy's plain-HTTP URL), with the manager's token or none."""
        user: JsonObj = {"token": self.token} if token else {}
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": server}}],
            "users": [{"name": "manager", "user": user}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "manager"}}],
            "current-context": "proxy",
        }
        path = self.workdir / f"proxy-{secrets.token_hex(3)}.kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        return path

    # -- the manager ------------------------------------------------------------------------------
    def start_manager(
        self,
        identity: str,
        *,
        kubeconfig_path: Path | None = None,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> ManagerProcess:
        """`sidecarctl run` with two admission workers, the manager's token (or `kubeconfig_path`);
        `env` is added to the environment of its processes."""
        m = start_process(
            self.cp,
            self.cert_dir,
            identity=identity,
            extra=(
                f"--kubeconfig={kubeconfig_path or self.token_kubeconfig}",
                f"--webhook-workers={WORKERS}",
                "--log-format=text",
                *extra,
            ),
            env=env,
        )
        self.managers.append(m)
        try:
            wait_ready(m, timeout=60)
        except AssertionError:
            m.kill()
            raise AssertionError(f"manager not ready:\n{m.log_tail(80)}") from None
        return m

    def stop_manager(self, m: ManagerProcess) -> None:
        m.terminate()
        if m in self.managers:
            self.managers.remove(m)

    def register_webhooks(self, m: ManagerProcess, app: str) -> None:
        """The shipped webhook configurations, pointed at `m` by URL; returns once the API server calls
        the SidecarSet webhook and pods of `app` get their sidecar."""
        mwc, vwc = webhook_configs(
            m.webhook_url, mutating=names.MUTATING_WEBHOOK_CONFIG, validating=names.VALIDATING_WEBHOOK_CONFIG
        )
        self.kube.apply(MWC_PATH, mwc)
        self.kube.apply(VWC_PATH, vwc)

        def bundles() -> bool:
            for path in (
                f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}",
                f"{VWC_PATH}/{names.VALIDATING_WEBHOOK_CONFIG}",
            ):
                if not self.kube.get(path)["webhooks"][0]["clientConfig"].get("caBundle"):
                    return False
            return True

        eventually(bundles, timeout=30, what="caBundle filled by the manager")

        def validated() -> bool:
            try:
                self.kube.create(SS_PATH, builders.sidecarset("probe"), dryRun="All")
                return True
            except api.ApiError:
                return False

        eventually(validated, timeout=30, interval=0.2, what="the API server calls /validate-sidecarset")
        probe_ns = self.labelled_namespace("probe")
        self.wait_injecting(probe_ns, app)

    def wait_injecting(self, namespace: str, app: str, container: str = "proxy", timeout: float = 60.0) -> JsonObj:
        def attempt() -> JsonObj | None:
            try:
                p = self.kube.create(
                    f"/api/v1/namespaces/{namespace}/pods", builders.pod("probe", labels={"app": app}), dryRun="All"
                )
            except api.ApiError:
                return None
            return p if container in [c["name"] for c in p["spec"]["containers"]] else None

        return eventually(attempt, timeout=timeout, interval=0.1, what=f"the API server's pods get {container}")

    def labelled_namespace(self, prefix: str, *, kubelet: bool = False) -> str:
        name = f"{prefix}-{secrets.token_hex(3)}"
        self.kube.create(
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}},
            },
        )
        with contextlib.suppress(api.Conflict):  # the controller-manager makes it too, a moment later
            self.kube.create(
                f"/api/v1/namespaces/{name}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            )
        if kubelet:
            assert self.kubelet is not None, "this cluster has no fake kubelet"
            self.kubelet.namespaces.add(name)
        return name

    def sidecarset(self, name: str, app: str, image: str = "proxy:1", **spec: Any) -> JsonObj:
        """A SidecarSet with one `proxy` sidecar for `app` pods, created once the validating webhook allows it."""
        obj = builders.sidecarset(name, containers=[builders.container("proxy", image)], app=app, **spec)

        def create() -> JsonObj | None:
            try:
                return self.kube.create(SS_PATH, obj)
            except api.Conflict:
                return self.kube.get(f"{SS_PATH}/{name}")
            except api.ApiError:
                return None  # the validating webhook is not reachable yet

        return eventually(create, timeout=30, interval=0.2, what=f"SidecarSet {name} created")

    def close(self) -> None:
        for m in self.managers:
            m.kill()
        self.managers.clear()
        super().close()


def ready_to_inject(cluster: ReliabilityCluster, m: ManagerProcess) -> tuple[str, WebhookClient]:
    """A labelled namespace whose pods the manager injects, and a client that has seen it do so."""
    ns = cluster.labelled_namespace("shop")
    client = WebhookClient(m.webhook_url, cluster.ca_file)
    deadline = time.monotonic() + 30
    while True:
        # Each worker must know the namespace and the SidecarSet; two connections reach both often enough.
        status, body, _ = client.post(names.INJECT_PATH, pod_review(ns, f"warm-{time.monotonic_ns()}"))
        if status == 200 and "proxy" in injected_names(body):
            break
        assert time.monotonic() < deadline, f"the manager does not inject in {ns}: {status} {body[:300]!r}"
        time.sleep(0.1)
    return ns, client


def supervisor_restarts(m: ManagerProcess) -> list[str]:
    """The supervisor's log lines about a child that exited (a crash, a kill, an OOM)."""
    return [line for line in m.log_path.read_text(errors="replace").splitlines() if "exited with" in line]


def child_pids(m: ManagerProcess) -> set[int]:
    return set(descendants(m.proc.pid)) - {m.proc.pid}


def report(title: str, rows: dict[str, object]) -> None:
    """Print a test's measured figures (pytest -s, or the captured output of a failure)."""
    width = max(len(k) for k in rows)
    print(f"\n== {title}")
    for k, v in rows.items():
        print(f"   {k.ljust(width)}  {v}")


@contextlib.contextmanager
def background(fn: Callable[[threading.Event], None], name: str) -> Iterator[threading.Event]:
    """Run `fn(stop)` in a thread for the duration of the block; its exception is raised at the end."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(stop)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=30)
    if errors:
        raise errors[0]
