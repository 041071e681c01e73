"""Memory kept per injected pod by the controller's pod projections (target: <= 2 KiB).

Run: `.venv/bin/python bench/bench_projection.py [N ...]` (default N=5000). Pods arrive as JSON
bytes, are parsed, projected and dropped, as in a watch stream; tracemalloc counts what stays
alive, including the interned strings the projections share. For comparison it also measures
keeping the parsed pods themselves.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecarsets.pods.projection import project
from sidecarsets.spec.names import (
    ANN_DEFAULT_CONTAINER,
    ANN_HASH,
    ANN_HASH_WITHOUT_IMAGE,
    ANN_INJECTED_LIST,
    ANN_INPLACE_STATE,
    POD_INJECTED_LABEL,
)
from tests.kube import builders

APPS = 10
NODES = 50
IMAGES = {
    "app": "registry.example.com/shop/web:1.42.0",
    "worker": "registry.example.com/shop/worker:1.42.0",
    "metrics": "quay.io/prometheus/statsd-exporter:v0.26.0",
    "envoy": "docker.io/envoyproxy/envoy:v1.30.1",
    "log-agent": "docker.io/fluent/fluent-bit:3.0.4",
}


def _digest(i: int) -> str:
    return f"sha256:{i:064x}"


def _container(name: str, *, sidecar: bool) -> dict[str, Any]:
    env = [
        {"name": "LOG_LEVEL", "value": "info"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    if sidecar:
        env.append({"name": "IS_INJECTED", "value": "true"})
    return builders.container(
        name,
        IMAGES[name],
        ports=[{"containerPort": 8080, "protocol": "TCP"}],
        env=env,
        resources={"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        volumeMounts=[
            {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}
        ],
        terminationMessagePath="/dev/termination-log",
        terminationMessagePolicy="File",
        imagePullPolicy="IfNotPresent",
    )


def _status(name: str, i: int, restarts: int) -> dict[str, Any]:
    """A running container; one digest per image, so replicas share their imageIDs as in a real cluster."""
    return builders.container_status(
        name,
        IMAGES[name],
        restarts=restarts,
        imageID=f"{IMAGES[name].rsplit(':', 1)[0]}@{_digest(list(IMAGES).index(name))}",
        containerID=f"containerd://{i:032x}{list(IMAGES).index(name):032x}",
        started=True,
        state={"running": {"startedAt": "2024-05-01T10:00:00Z"}},
        lastState={},
    )


def make_pod(i: int, *, distinct: bool = False) -> dict[str, Any]:
    """A realistic injected pod. `distinct` makes every pod differ in labels, timestamps and restart
    counts (a StatefulSet-like worst case for sharing)."""
    app = f"shop-{i % APPS}"
    template = f"{(i % APPS) * 7919:010x}"
    name = f"{app}-{template}-{i:05x}"
    ts = f"2024-05-01T10:{(i // 60) % 60:02d}:{i % 60:02d}Z"
    if distinct:
        ts = f"2024-05-{1 + i // 86400 % 28:02d}T{i // 3600 % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}Z"
    hash_entry = {
        "updateTimestamp": ts,
        "hash": "w26c4x8fz245642fdv499b464248f974xddx4x55z5dw55bc6x66464fxz77dc78",
        "sidecarSetName": "mesh",
        "sidecarList": ["envoy"],
        "controllerRevision": "mesh-7d9f8b6c5",
    }
    log_entry = {
        **hash_entry,
        "sidecarSetName": "logging",
        "sidecarList": ["log-agent"],
        "controllerRevision": "logging-5c4b",
    }
    annotations = {
        ANN_HASH: orjson.dumps({"logging": log_entry, "mesh": hash_entry}).decode(),
        ANN_HASH_WITHOUT_IMAGE: orjson.dumps({"logging": log_entry, "mesh": hash_entry}).decode(),
        ANN_INJECTED_LIST: "logging,mesh",
        ANN_DEFAULT_CONTAINER: "app",
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9102",
        "prometheus.io/path": "/metrics",
        "kubectl.kubernetes.io/restartedAt": "2024-04-30T08:00:00Z",
        "team.example.com/owner": "checkout",
        "team.example.com/oncall": "checkout-primary",
    }
    if i % 2:
        annotations[ANN_INPLACE_STATE] = orjson.dumps(
            {
                "mesh": {
                    "revision": "mesh-7d9f8b6c5",
                    "updateTimestamp": ts,
                    "lastContainerStatuses": {"envoy": {"imageID": f"docker.io/envoyproxy/envoy@{_digest(1)}"}},
                }
            }
        ).decode()
    labels = {
        "app": app,
        "pod-template-hash": template,
        "version": "1.42.0",
        "team": "checkout",
        "tier": "frontend",
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/part-of": "shop",
        "topology.example.com/zone": f"zone-{i % 3}",
        "security.istio.io/tlsMode": "istio",
        POD_INJECTED_LABEL: "true",
    }
    if distinct:
        labels["statefulset.kubernetes.io/pod-name"] = name
    containers = ["envoy", "app", "worker", "metrics", "log-agent"]
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": f"{app}-{template}",
        "uid": f"{i % APPS:08x}-0000-0000-0000-000000000000",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    metadata = {
        "generateName": f"{app}-{template}-",
        "uid": f"{i:08x}-1c2d-4e5f-8a9b-{i:012x}",
        "resourceVersion": str(1_000_000 + i),
        "creationTimestamp": ts,
        "ownerReferences": [owner],
    }
    status = {
        "phase": "Running",
        "podIP": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
        "hostIP": f"192.168.0.{i % NODES}",
        "startTime": ts,
        "qosClass": "Burstable",
        "conditions": [
            {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": ts}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "containerStatuses": [_status(c, i, i * 5 + k if distinct else i % 3) for k, c in enumerate(containers)],
    }
    return builders.pod(
        name,
        namespace=f"shop-{i % 4}",
        labels=labels,
        annotations=annotations,
        containers=[_container(c, sidecar=c in ("envoy", "log-agent")) for c in containers],
        node=f"node-{i % NODES:03d}",
        metadata=metadata,
        status=status,
        volumes=[
            {
                "name": "kube-api-access",
                "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]},
            }
        ],
        serviceAccountName="default",
        restartPolicy="Always",
        dnsPolicy="ClusterFirst",
        schedulerName="default-scheduler",
        terminationGracePeriodSeconds=30,
        tolerations=[
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
    )


def _measure(raw: list[bytes], *, keep_projection: bool) -> int:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept: list[Any] = []
    for data in raw:
        pod = orjson.loads(data)
        kept.append(project(pod) if keep_projection else pod)
        del pod
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    size = after - before
    del kept
    return size


def main(argv: list[str]) -> None:
    counts = [int(a) for a in argv] or [5000]
    print(f"{'N':>6} | {'pods':<10} | {'JSON B/pod':>10} | {'dict B/pod':>10} | {'projection B/pod':>16} | vs 2048")
    print("-" * 72)
    for n in counts:
        for distinct in (False, True):
            raw = [orjson.dumps(make_pod(i, distinct=distinct)) for i in range(n)]
            per_json = sum(len(r) for r in raw) // n
            per_dict = _measure(raw, keep_projection=False) // n
            per_proj = _measure(raw, keep_projection=True) // n
            verdict = "ok" if per_proj <= 2048 else "OVER"
            kind = "distinct" if distinct else "replicas"
            print(f"{n:>6} | {kind:<10} | {per_json:>10} | {per_dict:>10} | {per_proj:>16} | {verdict}")


if __name__ == "__main__":
    main(sys.argv[1:])
