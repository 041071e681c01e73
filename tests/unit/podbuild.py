"""Raw SidecarSets and injected pods for the status and planner tests.

Pods are built the way injection leaves them (hash annotations computed from the SidecarSet
version they got, images and container statuses to match), and `kubelet_sync` plays the node's
part after an in-place patch, so tests drive the real annotation and status formats.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import jsonpatch
import orjson

from kuberuntime.jsontypes import JsonObj
from sidecarsets.hashing import spec_hash, spec_hash_without_image
from sidecarsets.names import (
    ANN_HASH,
    ANN_HASH_WITHOUT_IMAGE,
    ANN_INJECTED_LIST,
    POD_INJECTED_LABEL,
)

T0 = "2024-05-01T10:00:00Z"


def image_id(image: str) -> str:
    """What a container runtime reports for `image`: repository plus a content digest."""
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    return f"docker.io/library/{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def sidecarset(
    name: str = "mesh",
    *,
    image: str = "envoy:v1",
    containers: list[JsonObj] | None = None,
    selector: JsonObj | None = None,
    strategy: JsonObj | None = None,
    generation: int = 1,
    **spec_extra: Any,
) -> JsonObj:
    spec: JsonObj = {
        "selector": selector if selector is not None else {"matchLabels": {"app": "shop"}},
        "containers": containers if containers is not None else [{"name": "envoy", "image": image}],
    }
    if strategy is not None:
        spec["updateStrategy"] = strategy
    spec.update(spec_extra)
    return {
        "apiVersion": "sidecarctl.io/v1alpha1",
        "kind": "SidecarSet",
        "metadata": {"name": name, "generation": generation},
        "spec": spec,
    }


def with_images(ss: JsonObj, **images: str) -> JsonObj:
    """A copy of `ss` whose named containers use new images (a newer SidecarSet version)."""
    new = copy.deepcopy(ss)
    for c in new["spec"]["containers"]:
        if c["name"] in images:
            c["image"] = images[c["name"]]
    new["metadata"]["generation"] = new["metadata"].get("generation", 1) + 1
    return new


def _entry(ss: JsonObj, value: str) -> JsonObj:
    names = sorted(c["name"] for c in ss["spec"]["containers"])
    return {"updateTimestamp": T0, "hash": value, "sidecarSetName": ss["metadata"]["name"], "sidecarList": names}


def pod(
    name: str,
    ss: JsonObj,
    *,
    namespace: str = "shop",
    labels: dict[str, str] | None = None,
    phase: str = "Running",
    ready: bool = True,
    ready_since: str = T0,
    created: str = T0,
    node: str = "node-1",
    restarts: int = 0,
    deleting: bool = False,
    app_containers: tuple[str, ...] = ("app", "worker"),
    with_statuses: bool = True,
) -> JsonObj:
    """A pod injected from SidecarSet version `ss`, sidecars first, all containers running."""
    sidecars = [{"name": c["name"], "image": c["image"]} for c in ss["spec"]["containers"]]
    apps = [{"name": n, "image": f"shop/{n}:1.0"} for n in app_containers]
    containers = sidecars + apps
    ss_name = ss["metadata"]["name"]
    spec = ss["spec"]
    meta: JsonObj = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "resourceVersion": "100",
        "creationTimestamp": created,
        "labels": {"app": "shop", POD_INJECTED_LABEL: "true", **(labels or {})},
        "annotations": {
            ANN_HASH: orjson.dumps({ss_name: _entry(ss, spec_hash(spec))}).decode(),
            ANN_HASH_WITHOUT_IMAGE: orjson.dumps({ss_name: _entry(ss, spec_hash_without_image(spec))}).decode(),
            ANN_INJECTED_LIST: ss_name,
            "team": "checkout",
        },
    }
    if deleting:
        meta["deletionTimestamp"] = T0
    statuses = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": image_id(c["image"]),
            "ready": ready,
            "restartCount": restarts,
            "containerID": f"containerd://{name}-{c['name']}",
        }
        for c in containers
    ]
    status: JsonObj = {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": created},
            {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ready_since},
        ],
    }
    if with_statuses:
        status["containerStatuses"] = statuses
    spec_out: JsonObj = {"containers": containers}
    if node:
        spec_out["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec_out, "status": status}


def apply(pod_json: JsonObj, patch: list[JsonObj]) -> JsonObj:
    """Apply a planner patch as the API server would (tests fail if a `test` op fails)."""
    result: JsonObj = jsonpatch.apply_patch(pod_json, patch)
    result["metadata"]["resourceVersion"] = str(int(result["metadata"]["resourceVersion"]) + 1)
    return result


def set_ready(pod_json: JsonObj, ready: bool) -> JsonObj:
    out = copy.deepcopy(pod_json)
    for cond in out["status"]["conditions"]:
        if cond["type"] == "Ready":
            cond["status"] = "True" if ready else "False"
    for cs in out["status"].get("containerStatuses", []):
        cs["ready"] = ready
    return out


def kubelet_sync(pod_json: JsonObj, *, ready: bool = True) -> JsonObj:
    """The node caught up: a Pending pod is started, and every container whose spec image changed
    is restarted on the new image."""
    out = copy.deepcopy(pod_json)
    images = {c["name"]: c["image"] for c in out["spec"]["containers"]}
    if out["status"]["phase"] == "Pending":
        out["status"]["phase"] = "Running"
        out["status"]["containerStatuses"] = [
            {"name": n, "image": img, "imageID": image_id(img), "ready": ready, "restartCount": 0}
            for n, img in images.items()
        ]
    for cs in out["status"].get("containerStatuses", []):
        if cs["image"] != images[cs["name"]]:
            cs["image"] = images[cs["name"]]
            cs["imageID"] = image_id(cs["image"])
            cs["restartCount"] += 1
    return set_ready(out, ready)
