"""What every benchmark here shares: the machine report, tables, percentiles, and realistic objects.

The figures only mean something next to the machine they ran on and only compare when every
benchmark uses the same pods and SidecarSets, so those live here once: a Deployment-made pod
(three app containers with 40 env vars each, five volumes, the labels, annotations and owner a
ReplicaSet gives it) and three SidecarSets that exercise the engine's expensive paths (a mesh
proxy with an init container, a log agent with shareVolumePolicy and transferEnv, and one with
volumes and patchPodMetadata). Injected pods for the cluster benchmarks are produced by the real
engine, so they carry exactly what the webhook would write.

Also the cluster fixture of the cluster benchmarks: a private control plane (etcd + kube-apiserver)
on a background loop, stopped at the end whatever happens, so no process is left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import copy
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import jsonpatch
import yaml

from injector.engine import engine
from kuberuntime import api, kubeapi, kubeconfig
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent

SS_PATH = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"
NOW = "2024-05-01T10:00:00Z"
NODE = "bench-node-1"


# -- the machine ---------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_lines() -> list[str]:
    """CPU, cores, Python and the load when the run started (the machine may be shared)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"cpu: {cpu_model()}, {os.cpu_count()} cores ({usable} usable)",
        f"python: {platform.python_implementation()} {platform.python_version()} on Linux {platform.release()}",
        f"load average at start: {load}",
    ]


def print_machine(title: str) -> None:
    print(f"== {title}")
    for line in machine_lines():
        print(f"   {line}")
    print(flush=True)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A plain-text table that also reads as Markdown."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
            + " |"
        )

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, min(len(sorted_values), round(p / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (what `ps` and the kubelet report)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of another process so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by this process (all threads) and by named other processes between two points."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start = self._now()

    def _now(self) -> dict[str, float]:
        return {"this process": time.process_time(), **{name: process_cpu(pid) for name, pid in self.pids.items()}}

    def used(self) -> dict[str, float]:
        now = self._now()
        return {name: now[name] - self.start[name] for name in now}


def positive_int(text: str) -> int:
    """argparse type: a clear message instead of a traceback for a bad count."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be greater than 0")
    return value


# -- objects ------------------------------------------------------------------------------------
APP_CONTAINERS = ("app", "worker", "metrics")


def _env(container: str, count: int) -> list[JsonObj]:
    env: list[JsonObj] = [
        {"name": "LOG_LEVEL", "value": "info"},
        {"name": "APP_ENV", "value": "production"},
        {"name": "REGION", "value": "eu-west-1"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "shop-db", "key": "password"}}},
    ]
    i = 0
    while len(env) < count:
        env.append({"name": f"{container.upper()}_SETTING_{i:02d}", "value": f"value-{i}-for-{container}"})
        i += 1
    return env[:count]


def _app_container(name: str, *, env_vars: int) -> JsonObj:
    return builders.container(
        name,
        f"registry.example.com/shop/{name}:1.42.0",
        args=["--config=/etc/shop/config.yaml", f"--role={name}"],
        ports=[{"name": "http", "containerPort": 8080, "protocol": "TCP"}] if name == "app" else [],
        env=_env(name, env_vars),
        resources={"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        volumeMounts=[
            {"name": "config", "mountPath": "/etc/shop", "readOnly": True},
            {"name": "cache", "mountPath": "/var/cache/shop"},
            {"name": "tls", "mountPath": "/etc/tls", "readOnly": True},
            {"name": "kube-api-access-7xk2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
        readinessProbe={"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
        terminationMessagePath="/dev/termination-log",
        terminationMessagePolicy="File",
        imagePullPolicy="IfNotPresent",
    )


def deployment_pod(*, app: str = "shop", env_vars: int = 40, name: str | None = None) -> JsonObj:
    """A pod as the ReplicaSet controller creates it, after the built-in admission plugins ran."""
    template = "7d9f8b6c5"
    labels = {
        "app": app,
        "pod-template-hash": template,
        "version": "1.42.0",
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/part-of": "shop",
        "app.kubernetes.io/component": "frontend",
        "team": "checkout",
    }
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9102",
        "kubectl.kubernetes.io/restartedAt": "2024-04-30T08:00:00Z",
        "team.example.com/owner": "checkout",
        "logs.example.com/source": "worker",
    }
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": f"{app}-{template}",
        "uid": "4c1f2b3a-1c2d-4e5f-8a9b-0123456789ab",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return builders.pod(
        name,
        labels=labels,
        annotations=annotations,
        metadata={"generateName": f"{app}-{template}-", "ownerReferences": [owner]},
        containers=[_app_container(c, env_vars=env_vars) for c in APP_CONTAINERS],
        volumes=[
            {"name": "config", "configMap": {"name": "shop-config", "defaultMode": 420}},
            {"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "tls", "secret": {"secretName": "shop-tls", "defaultMode": 420}},
            {"name": "data", "emptyDir": {}},
            {
                "name": "kube-api-access-7xk2p",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    ],
                },
            },
        ],
        restartPolicy="Always",
        terminationGracePeriodSeconds=30,
        dnsPolicy="ClusterFirst",
        serviceAccountName="default",
        schedulerName="default-scheduler",
        securityContext={"runAsNonRoot": True, "fsGroup": 2000},
        enableServiceLinks=True,
        preemptionPolicy="PreemptLowerPriority",
        priority=0,
        tolerations=[
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
    )


def mesh_sidecarset(
    *, name: str = "mesh", app: str = "shop", image: str = "docker.io/envoyproxy/envoy:v1.30.1"
) -> JsonObj:
    """An Istio-like proxy: an init container that sets up iptables, the proxy, its volumes."""
    return builders.sidecarset(
        name,
        app=app,
        init_containers=[
            {
                "name": "mesh-init",
                "image": "docker.io/example/mesh-init:1.22.0",
                "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT"],
                "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}, "runAsUser": 0},
                "resources": {"requests": {"cpu": "10m", "memory": "10Mi"}},
            }
        ],
        containers=[
            {
                "name": "mesh-proxy",
                "image": image,
                "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
                "ports": [{"name": "http-envoy-prom", "containerPort": 15090, "protocol": "TCP"}],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "INSTANCE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {
                        "name": "SERVICE_ACCOUNT",
                        "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}},
                    },
                    {"name": "PROXY_CONFIG", "value": '{"concurrency":2,"holdApplicationUntilProxyStarts":true}'},
                ],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}, "periodSeconds": 15},
                "securityContext": {"runAsUser": 1337, "runAsGroup": 1337, "readOnlyRootFilesystem": True},
                "volumeMounts": [
                    {"name": "mesh-certs", "mountPath": "/etc/mesh/certs", "readOnly": True},
                    {"name": "mesh-data", "mountPath": "/var/lib/mesh/data"},
                ],
                "podInjectPolicy": "BeforeAppContainer",
            }
        ],
        volumes=[
            {"name": "mesh-certs", "secret": {"secretName": "mesh-certs"}},
            {"name": "mesh-data", "emptyDir": {}},
        ],
        updateStrategy={"type": "RollingUpdate", "maxUnavailable": "100%"},
    )


def logging_sidecarset(*, name: str = "logging", app: str = "shop") -> JsonObj:
    """A log agent that sees every app volume (shareVolumePolicy) and copies the app's settings."""
    return builders.sidecarset(
        name,
        app=app,
        containers=[
            {
                "name": "log-agent",
                "image": "docker.io/fluent/fluent-bit:3.0.4",
                "podInjectPolicy": "AfterAppContainer",
                "shareVolumePolicy": {"type": "enabled"},
                "transferEnv": [
                    {"sourceContainerName": "app", "envNames": ["LOG_LEVEL", "APP_ENV", "REGION"]},
                    {
                        "sourceContainerNameFrom": {
                            "fieldRef": {
                                "apiVersion": "v1",
                                "fieldPath": "metadata.annotations['logs.example.com/source']",
                            }
                        },
                        "envName": "POD_NAME",
                    },
                ],
                "env": [{"name": "FLUENT_CONF", "value": "/fluent-bit/etc/fluent-bit.conf"}],
                "resources": {"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                "volumeMounts": [{"name": "log-agent-config", "mountPath": "/fluent-bit/etc"}],
            }
        ],
        volumes=[{"name": "log-agent-config", "configMap": {"name": "fluent-bit"}}],
    )


def platform_sidecarset(*, name: str = "platform", app: str = "shop") -> JsonObj:
    """A secrets agent with its own volumes that also stamps annotations on the pod."""
    return builders.sidecarset(
        name,
        app=app,
        containers=[
            {
                "name": "secrets-agent",
                "image": "docker.io/hashicorp/vault:1.16.2",
                "args": ["agent", "-config=/etc/vault/agent.hcl"],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                "volumeMounts": [
                    {"name": "vault-config", "mountPath": "/etc/vault"},
                    {"name": "vault-secrets", "mountPath": "/vault/secrets"},
                    {"name": "vault-home", "mountPath": "/home/vault"},
                ],
            }
        ],
        volumes=[
            {"name": "vault-config", "configMap": {"name": "vault-agent"}},
            {"name": "vault-secrets", "emptyDir": {"medium": "Memory"}},
            {"name": "vault-home", "emptyDir": {}},
        ],
        patchPodMetadata=[
            {
                "annotations": {"vault.example.com/agent": "injected", "vault.example.com/role": "shop"},
                "patchPolicy": "Overwrite",
            },
            {"annotations": {"prometheus.io/scrape": "true"}, "patchPolicy": "Retain"},
        ],
    )


def three_sidecarsets(app: str = "shop") -> list[JsonObj]:
    return [mesh_sidecarset(app=app), logging_sidecarset(app=app), platform_sidecarset(app=app)]


def admission_review(pod: JsonObj, *, namespace: str, uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002") -> JsonObj:
    """The AdmissionReview the API server sends for a ReplicaSet creating `pod`."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "b9f0e5d1-0000-4000-8000-000000000001",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def injected(pod: JsonObj, sidecarsets: Sequence[SidecarSet], *, namespace: str, labels: dict[str, str]) -> JsonObj:
    """`pod` as the webhook would leave it: the engine's patch applied (raises if nothing is injected)."""
    result = engine.inject(pod, namespace=namespace, namespace_labels=labels, sidecarsets=sidecarsets, now=NOW)
    if result.denied or not result.patch:
        raise RuntimeError(f"the engine did not inject the benchmark pod: {result.denied or result.skipped}")
    out: JsonObj = jsonpatch.apply_patch(pod, result.patch)
    return out


def named(template: JsonObj, name: str, *, node: str = NODE) -> JsonObj:
    """A copy of an injected pod template with its own name, bound to `node`."""
    pod = copy.deepcopy(template)
    meta = pod["metadata"]
    meta.pop("generateName", None)
    meta.pop("ownerReferences", None)  # no such ReplicaSet in the benchmark cluster
    meta["name"] = name
    pod["spec"]["nodeName"] = node
    return pod


def ready_status(pod: JsonObj) -> JsonObj:
    """The status a kubelet reports for a pod whose containers all run and are ready."""

    def running(c: JsonObj) -> JsonObj:
        # The resources it runs with, as a 1.33+ kubelet reports them (the API server resizes only
        # pods whose running containers report theirs).
        return builders.container_status(
            c["name"],
            c["image"],
            containerID=f"containerd://{abs(hash((pod['metadata']['name'], c['name']))):016x}",
            started=True,
            state={"running": {"startedAt": NOW}},
            **({"resources": c["resources"]} if c.get("resources") else {}),
        )

    def done(c: JsonObj) -> JsonObj:
        terminated = {"exitCode": 0, "reason": "Completed", "startedAt": NOW, "finishedAt": NOW}
        return builders.container_status(c["name"], c["image"], state={"terminated": terminated})

    spec = pod["spec"]
    status: JsonObj = {
        "phase": "Running",
        "hostIP": "192.168.0.10",
        "podIP": "10.244.0.10",
        "startTime": NOW,
        "qosClass": "Burstable",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": NOW}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "containerStatuses": [running(c) for c in spec["containers"]],
    }
    if spec.get("initContainers"):
        status["initContainerStatuses"] = [done(c) for c in spec["initContainers"]]
    return status


# -- the cluster ----------------------------------------------------------------------------------
async def bounded(calls: Iterable[Callable[[], Awaitable[T]]], *, limit: int) -> list[T]:
    """Run the calls with at most `limit` in flight; the first error is raised after all finish."""
    sem = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with sem:
            return await call()

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def create_ready_pods(
    client: kubeapi.KubeClient, pods: Sequence[JsonObj], *, namespace: str, limit: int = 32
) -> None:
    """POST the pods, then report them Running and Ready through /status (no kubelet needed)."""
    base = f"/api/v1/namespaces/{namespace}/pods"

    def create(pod: JsonObj) -> Callable[[], Awaitable[JsonObj]]:
        return lambda: client.create(base, pod)

    await bounded((create(p) for p in pods), limit=limit)
    await mark_ready(client, pods, namespace=namespace, limit=limit)


async def mark_ready(client: kubeapi.KubeClient, pods: Sequence[JsonObj], *, namespace: str, limit: int = 32) -> None:
    """Report the pods' current spec images running and ready, as a kubelet would after a restart."""
    base = f"/api/v1/namespaces/{namespace}/pods"

    def ready(pod: JsonObj) -> Callable[[], Awaitable[JsonObj]]:
        body = {"status": ready_status(pod)}
        return lambda: client.patch(f"{base}/{pod['metadata']['name']}/status", body, patch_type="merge")

    await bounded((ready(p) for p in pods), limit=limit)


@dataclass
class Cluster:
    """A private control plane and an API client on a background loop."""

    cp: Any  # tests.kube.controlplane.ControlPlane
    loop: Any  # tests.kube.loop.BackgroundLoop
    client: kubeapi.KubeClient

    def run(self, coro: Awaitable[T], timeout: float = 600.0) -> T:
        result: T = self.loop.run(coro, timeout=timeout)
        return result

    async def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        body: JsonObj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        with contextlib.suppress(api.Conflict):
            await self.client.create("/api/v1/namespaces", body)
        # There is no controller-manager here to create the ServiceAccount pods default to.
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
        with contextlib.suppress(api.Conflict):
            await self.client.create(f"/api/v1/namespaces/{name}/serviceaccounts", sa)

    async def install_crd(self) -> None:
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        docs = [d for p in sorted((REPO / "config" / "crd").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]
        crds = [d for d in docs if d and d.get("kind") == "CustomResourceDefinition"]
        if not crds:
            raise RuntimeError("config/crd holds no CustomResourceDefinition")
        for crd in crds:
            await self.client.create(path, crd)
        for _ in range(300):
            got = [await self.client.get(f"{path}/{c['metadata']['name']}") for c in crds]
            if all(
                any(
                    c.get("type") == "Established" and c.get("status") == "True"
                    for c in (g.get("status") or {}).get("conditions") or []
                )
                for g in got
            ):
                # Established does not mean served yet: wait until a list answers.
                try:
                    await self.client.get(SS_PATH)
                    return
                except api.ApiError as e:  # 404, or 429 "storage is (re)initializing"
                    if e.status not in (404, 429, 503):
                        raise
            await asyncio.sleep(0.1)
        raise RuntimeError("the SidecarSet CRD did not become Established within 30 s")

    async def create_node(self, name: str = NODE) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        }
        with contextlib.suppress(api.Conflict):
            await self.client.create("/api/v1/nodes", node)
        # Room for every benchmark pod: the API server checks a resize against the node's allocatable.
        room = {"cpu": "1000", "memory": "1000Gi", "pods": "100000"}
        status = {"status": {"allocatable": room, "capacity": room}}
        await self.client.patch(f"/api/v1/nodes/{name}/status", status, patch_type="strategic")


@contextlib.contextmanager
def api_loop(cp: Any) -> Iterator[Cluster]:
    """A background loop and an API client of `cp` (a tests.kube.controlplane.ControlPlane) on it:
    the client closed, then the loop, on the way out."""
    from tests.kube.loop import BackgroundLoop

    loop = BackgroundLoop()
    client: kubeapi.KubeClient | None = None
    try:

        async def make() -> kubeapi.KubeClient:
            return kubeapi.KubeClient(kubeconfig.load_config(str(cp.kubeconfig)))

        client = loop.run(make())
        yield Cluster(cp, loop, client)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                loop.run(client.close())
        loop.close()


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    """etcd + kube-apiserver only: nothing else acts on the benchmark's objects or uses the CPU."""
    from tests.kube.controlplane import ControlPlane, binaries_dir

    print("starting a private control plane (etcd + kube-apiserver) ...", flush=True)
    cp = ControlPlane(bin_dir=binaries_dir(), controller_manager=False)
    cp.start()
    try:
        with api_loop(cp) as c:
            c.run(c.install_crd())
            c.run(c.create_node())
            yield c
    finally:
        cp.stop()


def run_main(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """Exit with a one-line reason instead of a traceback when the environment lets the run down.

    SIGTERM unwinds like Ctrl-C, so the managers and control planes a benchmark started are stopped
    by its own `finally` blocks and context managers rather than left running."""
    from tests.kube.controlplane import ControlPlaneError

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ControlPlaneError, api.ApiError, RuntimeError, OSError, TimeoutError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def temp_dir(prefix: str) -> Path:
    """A private directory, removed when the benchmark exits (its certificates and inputs are only
    its own)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
