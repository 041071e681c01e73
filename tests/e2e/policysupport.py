"""A control plane of its own with `sidecarctl run` in one injection mode, for the policy tiers.

The session's manager runs in process and cannot be SIGKILLed, and two managers in different
modes cannot share an API server (both would keep the same policies). So the differential tier
and the manager-down test each start a kube-apiserver + etcd of their own, install the CRD and
the webhook configurations of config/ (pointed at a loopback URL), and run the real manager
process tree against it.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from injector.policysync.narrowing import CONDITION_NAME
from kuberuntime import api
from sidecarsets.spec import names
from tests.kube.balancer import Balancer
from tests.kube.client import Kube, eventually
from tests.kube.cluster import PrivateCluster, install_crd
from tests.kube.controlplane import free_port
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import (
    MANAGER_NS,
    MWC_PATH,
    VWC_PATH,
    ManagerProcess,
    conversion_bundle_synced,
    conversion_crd,
    namespaced_crd,
    start_process,
    wait_ready,
    webhook_configs,
)

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/sidecarctl-controller"


class PolicyCluster(PrivateCluster):
    """A control plane of its own led by `sidecarctl run --injection=<injection>` on `port`.

    `peers`: binary directories of more kube-apiservers to run on the same etcd (an HA control plane,
    of one minor or of several, as during an upgrade); the manager then talks to all of them through
    a load balancer (`balancer`), as it does through the `kubernetes` Service."""

    def __init__(
        self,
        aloop: BackgroundLoop,
        bin_dir: Path,
        *,
        injection: str,
        extra: tuple[str, ...],
        controller_manager: bool,
        apiserver_flags: tuple[str, ...] = (),
        peers: tuple[Path, ...] = (),
    ) -> None:
        super().__init__(
            aloop,
            bin_dir=bin_dir,
            controller_manager=controller_manager,
            prefix=f"sidecarctl-{injection}-",
            apiserver_flags=apiserver_flags,
        )
        self.injection = injection
        self.extra = extra
        self.port = free_port()
        self.manager: ManagerProcess | None = None
        self.balancer: Balancer | None = None
        if peers:
            ports = [self.cp.port] + [int(self.cp.add_apiserver(peer).rsplit(":", 1)[1]) for peer in peers]
            self.balancer = Balancer(aloop, ports).start()

    def close(self) -> None:
        if self.balancer is not None:
            self.balancer.stop()
        super().close()

    def start_manager(self) -> ManagerProcess:
        m = start_process(
            self.cp,
            self.cert_dir,
            identity=f"policy-{self.injection}",
            webhook_port=self.port,
            extra=(f"--injection={self.injection}", "--log-format=text", *self.extra),
            kubeconfig=None if self.balancer is None else self.cp.kubeconfig_for(self.balancer.url),
        )
        try:
            wait_ready(m, timeout=40)
        except AssertionError:
            m.kill()
            raise
        self.manager = m
        eventually(
            lambda: (self.kube.get(LEASE_PATH)["spec"].get("holderIdentity") or "").startswith("policy-"),
            timeout=30,
            what="the manager leads",
        )
        return m

    def namespace(self, name: str, labels: dict[str, str]) -> None:
        """A namespace with these labels and its default ServiceAccount (no controller-manager here)."""
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        try:
            self.kube.create("/api/v1/namespaces", body)
        except api.Conflict:
            self.kube.patch(f"/api/v1/namespaces/{name}", {"metadata": {"labels": labels}})
        with contextlib.suppress(api.Conflict):
            self.kube.create(
                f"/api/v1/namespaces/{name}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
            )


def _install(kube: Kube, url: str) -> None:
    install_crd(kube, conversion_crd(url))
    install_crd(kube, namespaced_crd())
    with contextlib.suppress(api.Conflict):
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MANAGER_NS}})
    mwc, vwc = webhook_configs(url, mutating=names.MUTATING_WEBHOOK_CONFIG, validating=names.VALIDATING_WEBHOOK_CONFIG)
    kube.apply(MWC_PATH, mwc)
    kube.apply(VWC_PATH, vwc)


def bundle_synced(kube: Kube) -> bool:
    hook = kube.get(f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}")["webhooks"][0]
    filled = b"BEGIN CERTIFICATE" in base64.b64decode(hook["clientConfig"].get("caBundle", ""))
    return filled and conversion_bundle_synced(kube)


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def kill_all(m: ManagerProcess) -> None:
    """SIGKILL every process of a `sidecarctl run` (its children would otherwise drain, release
    the Lease and answer for a moment on their own)."""
    pids = descendants(m.proc.pid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    m.proc.wait(timeout=10)
    eventually(lambda: not any(Path(f"/proc/{p}").exists() for p in pids), timeout=10, what="every process gone")


@contextlib.contextmanager
def private_cluster(
    aloop: BackgroundLoop,
    bin_dir: Path,
    *,
    injection: str,
    extra: tuple[str, ...] = (),
    controller_manager: bool = False,
    apiserver_flags: tuple[str, ...] = (),
    peers: tuple[Path, ...] = (),
    start: bool = True,
) -> Iterator[PolicyCluster]:
    """A control plane of its own (with kube-controller-manager if asked: ReplicaSets, disruption
    budgets; more kube-apiserver flags, more kube-apiservers (PolicyCluster)) and
    `sidecarctl run --injection=<injection>` leading it (`start=False`: installed, not started; the
    caller starts it with `start_manager`)."""
    cluster = PolicyCluster(
        aloop,
        bin_dir,
        injection=injection,
        extra=extra,
        controller_manager=controller_manager,
        apiserver_flags=apiserver_flags,
        peers=peers,
    )
    try:
        _install(cluster.kube, f"https://127.0.0.1:{cluster.port}")
        if start:
            cluster.start_manager()
            eventually(lambda: bundle_synced(cluster.kube), timeout=20, what="caBundle synced")
        yield cluster
    finally:
        if cluster.manager is not None:
            cluster.manager.kill()
        cluster.close()


@contextlib.contextmanager
def private_clusters(
    aloop: BackgroundLoop, bin_dir: Path, *injections: str, extra: tuple[str, ...] = ()
) -> Iterator[list[PolicyCluster]]:
    """Several private clusters started side by side (two took 16 s one after the other, 11 s
    together: each start mostly waits on its own API server and manager); `extra`: flags for each manager."""

    def enter(injection: str) -> tuple[contextlib.AbstractContextManager[PolicyCluster], PolicyCluster]:
        cm = private_cluster(aloop, bin_dir, injection=injection, extra=extra)
        return cm, cm.__enter__()

    # The pool outlives the clusters: their processes get SIGKILL when the thread that started them
    # ends (PR_SET_PDEATHSIG follows the parent thread, not the process), so the threads wait here.
    with ThreadPoolExecutor(max_workers=len(injections)) as pool, contextlib.ExitStack() as stack:
        futures = [pool.submit(enter, injection) for injection in injections]
        started = [f.result() for f in futures if f.exception() is None]  # f.exception() waits for f
        for cm, _ in started:  # every one that started is stopped, whichever failed
            stack.push(cm.__exit__)
        for f in futures:
            if (failure := f.exception()) is not None:
                raise failure
        yield [cluster for _, cluster in started]


def stored_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A stored pod with what differs between two creates of it masked: name, uid, times, versions,
    status, who injected it, the time in the hash annotations, the token volume's random suffix."""
    import json
    import re

    p = json.loads(json.dumps(pod))
    meta = p["metadata"]
    for key in ("namespace", "uid", "creationTimestamp", "resourceVersion", "generateName", "name", "managedFields"):
        meta.pop(key, None)
    annotations = meta.get("annotations") or {}
    annotations.pop(names.ANN_INJECTED_BY, None)
    for key in (names.ANN_HASH, names.ANN_HASH_WITHOUT_IMAGE):
        if key in annotations:
            annotations[key] = re.sub(r'"updateTimestamp":"[^"]*"', '"updateTimestamp":"T"', annotations[key])
    if not annotations:
        meta.pop("annotations", None)
    p.pop("status", None)
    masked: dict[str, Any] = json.loads(re.sub(r"kube-api-access-[a-z0-9]{5}", "kube-api-access-X", json.dumps(p)))
    return masked


def policy_holding(kube: Kube, sidecarset: str) -> str | None:
    """The name of the manager's MutatingAdmissionPolicy that injects `sidecarset`, if one does."""
    from injector.policy.generate import ANN_MEMBERS
    from injector.policysync.support import POLICIES

    listed = kube.get(POLICIES, labelSelector="app.kubernetes.io/managed-by=sidecarctl")
    for policy in listed["items"]:
        members = ((policy["metadata"].get("annotations") or {}).get(ANN_MEMBERS) or "").replace(";", ",")
        if sidecarset in members.split(","):
            return str(policy["metadata"]["name"])
    return None


def webhook_pod(c: PolicyCluster, ss_name: str, pod: dict[str, Any], *, namespace: str, plain: str) -> dict[str, Any]:
    """The webhook's pod for `pod` in labelled `namespace`, as stored: the engine run on the pod as the
    API server hands it over (a dry run in the unlabelled `plain`), then stored by a dry run again."""
    import copy

    import jsonpatch

    from injector.engine import engine
    from tests.kube import builders

    path = f"/api/v1/namespaces/{plain}/pods"
    seen = c.kube.create(path, copy.deepcopy(pod), dryRun="All")
    ss = builders.model(c.kube.get(f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}/{ss_name}"))
    result = engine.inject(
        seen,
        namespace=namespace,
        namespace_labels={names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED, names.NS_NAME_LABEL: namespace},
        sidecarsets=[ss],
        now="2024-01-01T00:00:00Z",
    )
    assert result.patch, result
    injected: dict[str, Any] = jsonpatch.apply_patch(seen, result.patch)
    for key in ("uid", "creationTimestamp"):
        injected["metadata"].pop(key, None)
    injected.pop("status", None)
    return stored_pod(c.kube.create(path, injected, dryRun="All"))


def condition_in(mwc: dict[str, Any] | None) -> str | None:
    """Our matchCondition on the pod webhook of `mwc` (None: none, the webhook serves every pod)."""
    hook: dict[str, Any] = next(
        (h for h in (mwc or {}).get("webhooks") or [] if h["name"] == names.MUTATING_WEBHOOK_NAME), {}
    )
    return next((c["expression"] for c in hook.get("matchConditions") or [] if c["name"] == CONDITION_NAME), None)


def webhook_condition(kube: Kube) -> str | None:
    """Our matchCondition on the pod webhook as stored."""
    return condition_in(kube.get(f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}"))
