"""Pods built from the node tier's images, and readers for what the kubelet reports about them."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

from tests.kube import images
from tests.kube.adminrest import AdminRest, ApiError
from tests.kube.client import eventually


def http_probe(port: int, path: str = "/ready") -> dict[str, Any]:
    """Probed every second so a started container is Ready within about a second. A stall of the
    node (2 shared cores running the control plane, the manager and the kubelet) must not flip a
    running pod to not Ready: the rollout tests count not-Ready pods against maxUnavailable, so the
    probe allows 2 s per try and 3 misses in a row."""
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": 1,
        "timeoutSeconds": 2,
        "failureThreshold": 3,
    }


def app_container(name: str = "app") -> dict[str, Any]:
    return {
        "name": name,
        "image": images.APP_IMAGE,
        "imagePullPolicy": "Never",
        "readinessProbe": http_probe(images.APP_PORT),
    }


def sidecar_container(image: str, name: str = "proxy") -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "readinessProbe": http_probe(images.SIDECAR_PORT),
    }


def pod(name: str, containers: list[dict[str, Any]], *, grace: int = 5, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {"terminationGracePeriodSeconds": grace, "containers": containers},
    }


def statuses(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in (obj.get("status") or {}).get("containerStatuses") or []}


def is_ready(obj: dict[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
    return conds.get("Ready") == "True"


def create_and_wait_ready(api: AdminRest, ns: str, body: dict[str, Any], *, timeout: float = 60) -> tuple[Any, float]:
    """Create the pod and wait until it is Ready; returns the pod and the seconds it took."""
    started = time.monotonic()
    api.create(f"/api/v1/namespaces/{ns}/pods", body)
    path = f"/api/v1/namespaces/{ns}/pods/{body['metadata']['name']}"

    def ready() -> Any:
        got = api.get(path)
        return got if is_ready(got) else None

    got = eventually(ready, timeout=timeout, what=f"pod {ns}/{body['metadata']['name']} Ready", retrying=(ApiError,))
    return got, time.monotonic() - started


def fetch(ip: str, port: int, path: str) -> str:
    """GET from a pod's IP: the host reaches the node's bridge directly."""
    with urllib.request.urlopen(f"http://{ip}:{port}{path}", timeout=5) as resp:
        body: bytes = resp.read()
    return body.decode().strip()
