"""Object builders shared by every test tier and the benchmarks.

One implementation of each object shape, all keyword arguments:

- `container(name, image, **fields)`: a container spec.
- `sidecarset(name, *, containers, init_containers, selector, namespace_selector, labels, metadata,
  status, **spec)`: a SidecarSet as a user writes it (one `proxy:1` sidecar for `app: web` pods
  unless told otherwise); any other spec field is passed by its API name (`updateStrategy=...`).
- `pod(name, *, namespace, labels, annotations, containers, init_containers, node, metadata,
  status, **spec)`: a pod as a user or a workload controller creates it (one `app:1` container,
  `app: web`); any other spec field by its API name (`volumes=...`).
- `image_id(image)` and `container_status(name, image, ...)`: what a kubelet reports for a
  container; the fake kubelet reports the same.
- `injected_pod(name, ss, ...)`: a pod as injection from SidecarSet version `ss` left it (hash
  annotations computed from that version, sidecars first, statuses to match), for the controller
  tiers; `shop_sidecarset(...)` is the SidecarSet those pods come from by default, and
  `with_images`, `apply_patch`, `set_ready` and `kubelet_sync` move such pods and SidecarSets on.
- `model(obj)`: a SidecarSet object read the way the controller reads objects from the cluster.

Each argument left out gets the default named above; an argument given replaces the default
whole (`labels={}` means no labels), and `metadata` adds fields to (or replaces them in) the
object's metadata. Callers whose tests depend on other defaults keep a one-line partial.
"""

from __future__ import annotations

import copy
import hashlib
import re
import secrets
from typing import Any

import jsonpatch
import orjson

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.hashing import spec_hash, spec_hash_without_image
from sidecarsets.spec.model import SidecarSet, namespace_of

T0 = "2024-05-01T10:00:00Z"
"""The time injected pods were created, became ready and got their hash annotations."""


def model(obj: Any) -> SidecarSet:
    """A SidecarSet object read the way the controller reads objects from the cluster."""
    return SidecarSet.from_object(obj, tolerant=True)


def container(name: str, image: str, **fields: Any) -> JsonObj:
    """A container spec: name, image and any other field by its API name."""
    return {"name": name, "image": image, **fields}


def sidecarset(
    name: str = "mesh",
    *,
    containers: Any = None,
    init_containers: Any = None,
    selector: Any = None,
    app: str = "web",
    namespace_selector: Any = None,
    labels: dict[str, str] | None = None,
    metadata: JsonObj | None = None,
    status: JsonObj | None = None,
    api_version: str = names.API_VERSION,
    **spec: Any,
) -> JsonObj:
    """A SidecarSet object; by default one `proxy` sidecar (`proxy:1`) for the `app: <app>` pods
    (`app: web`), in `api_version` (v1alpha1).

    `containers`, `init_containers` and `selector` may be anything (tests of bad input pass
    strings; a `selector` replaces the one `app` gives); `init_containers` and
    `namespace_selector` are left out unless given. Other spec fields go in `**spec` under their
    API names and win over the named arguments.
    """
    body: JsonObj = {"selector": selector if selector is not None else {"matchLabels": {"app": app}}}
    if namespace_selector is not None:
        body["namespaceSelector"] = namespace_selector
    if init_containers is not None:
        body["initContainers"] = init_containers
    body["containers"] = containers if containers is not None else [container("proxy", "proxy:1")]
    body.update(spec)
    meta: JsonObj = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    meta.update(metadata or {})
    obj: JsonObj = {"apiVersion": api_version, "kind": "SidecarSet", "metadata": meta, "spec": body}
    if status is not None:
        obj["status"] = status
    return obj


def namespaced_sidecarset(name: str = "mesh", namespace: str = "team-a", **kw: Any) -> JsonObj:
    """A NamespacedSidecarSet (v1beta1) in `namespace`: `sidecarset`'s object of that kind there."""
    obj = sidecarset(name, api_version=names.API_VERSION_V1BETA1, **kw)
    obj["kind"] = names.NAMESPACED_KIND
    obj["metadata"]["namespace"] = namespace
    return obj


def pod(
    name: str | None = "web",
    *,
    namespace: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    containers: list[JsonObj] | None = None,
    init_containers: list[JsonObj] | None = None,
    node: str | None = None,
    metadata: JsonObj | None = None,
    status: JsonObj | None = None,
    **spec: Any,
) -> JsonObj:
    """A pod object; by default `web`, labelled `app: web`, one `app` container (`app:1`).

    `name=None` leaves the name out (a pod made from `generateName`, given in `metadata`);
    `namespace`, `annotations`, `init_containers`, `node` (spec.nodeName) and `status` are left
    out unless given. Other spec fields go in `**spec` under their API names.
    """
    meta: JsonObj = {}
    if name is not None:
        meta["name"] = name
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = labels if labels is not None else {"app": "web"}
    if annotations is not None:
        meta["annotations"] = annotations
    meta.update(metadata or {})
    body: JsonObj = {}
    if init_containers is not None:
        body["initContainers"] = init_containers
    body["containers"] = containers if containers is not None else [container("app", "app:1")]
    if node:
        body["nodeName"] = node
    body.update(spec)
    obj: JsonObj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}
    if status is not None:
        obj["status"] = status
    return obj


def image_id(image: str) -> str:
    """What a container runtime reports as the imageID of `image`: the repository, normalised as
    Docker does (`proxy:1` is `docker.io/library/proxy`), plus a digest.

    The digest is derived from the whole reference, so two references never share an imageID; an
    image pinned by digest reports that digest, as a runtime does.
    """
    ref, _, pinned = image.partition("@")
    last = ref.rsplit("/", 1)[-1]
    repo = ref[: len(ref) - len(last)] + last.split(":", 1)[0]
    first, sep, _ = repo.partition("/")
    if not sep:
        repo = f"docker.io/library/{repo}"
    elif "." not in first and ":" not in first and first != "localhost":
        repo = f"docker.io/{repo}"
    if pinned.startswith("sha256:"):
        return f"{repo}@{pinned}"
    return f"{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def container_status(name: str, image: str, *, ready: bool = True, restarts: int = 0, **fields: Any) -> JsonObj:
    """A containerStatuses entry for a container running `image`; `fields` add or replace entries
    (`containerID`, `started`, `state`, or an `imageID` other than `image_id(image)`)."""
    return {
        "name": name,
        "image": image,
        "imageID": image_id(image),
        "ready": ready,
        "restartCount": restarts,
        **fields,
    }


# -- injected pods, for the controller tiers ----------------------------------------------------
def shop_sidecarset(name: str = "mesh", *, image: str = "envoy:v1", **kw: Any) -> JsonObj:
    """The SidecarSet `injected_pod`'s pods match by default: one `envoy` sidecar (`image`) for the
    `app: shop` pods, at generation 1; `kw` as for `sidecarset`."""
    kw.setdefault("containers", [container("envoy", image)])
    kw.setdefault("selector", {"matchLabels": {"app": "shop"}})
    kw.setdefault("metadata", {"generation": 1})
    return sidecarset(name, **kw)


def with_images(ss: JsonObj, **images: str) -> JsonObj:
    """A copy of `ss` whose named containers use new images (a newer SidecarSet version)."""
    new = copy.deepcopy(ss)
    for c in new["spec"]["containers"]:
        if c["name"] in images:
            c["image"] = images[c["name"]]
    new["metadata"]["generation"] = new["metadata"].get("generation", 1) + 1
    return new


def _hash_entry(ss: JsonObj, value: str) -> JsonObj:
    sidecar_list = sorted(c["name"] for c in ss["spec"]["containers"])
    return {"updateTimestamp": T0, "hash": value, "sidecarSetName": ss["metadata"]["name"], "sidecarList": sidecar_list}


def injected_pod(
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
    """A pod injected from SidecarSet version `ss`, sidecars first, every container running.

    Labelled `app: shop` (plus `labels`) and annotated as injection leaves it: the hash
    annotations computed from `ss`, the injected list, and an unrelated `team` annotation. Its
    conditions are PodScheduled (at `created`) and Ready (`ready`, since `ready_since`); with
    `with_statuses` every container reports its image running (`ready`, `restarts`). A HotUpgrade
    sidecar `<n>` is the pair `<n>-1` (its image, serving) and `<n>-2` (the empty image), with the
    working and version annotations injection writes.
    """
    sidecars: list[JsonObj] = []
    hot_annotations: dict[str, str] = {}
    working: dict[str, str] = {}
    for c in ss["spec"]["containers"]:
        strategy = c.get("upgradeStrategy") or {}
        if strategy.get("upgradeType") != "HotUpgrade":
            sidecars.append(container(c["name"], c["image"]))
            continue
        first, second = f"{c['name']}-1", f"{c['name']}-2"
        sidecars += [container(first, c["image"]), container(second, strategy.get("hotUpgradeEmptyImage", ""))]
        working[c["name"]] = first
        for n, version, alt in ((first, "1", "0"), (second, "0", "1")):
            hot_annotations[names.ANN_VERSION_PREFIX + n] = version
            hot_annotations[names.ANN_VERSION_ALT_PREFIX + n] = alt
    if working:
        hot_annotations[names.ANN_WORKING_HOT] = orjson.dumps(dict(sorted(working.items()))).decode()
    containers = sidecars + [container(n, f"shop/{n}:1.0") for n in app_containers]
    ss_name, spec = names.sidecarset_key(ss["metadata"]["name"], namespace_of(ss)), ss["spec"]
    meta: JsonObj = {"uid": f"uid-{namespace}-{name}", "resourceVersion": "100", "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = T0
    status: JsonObj = {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": created},
            {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ready_since},
        ],
    }
    if with_statuses:
        status["containerStatuses"] = [
            container_status(
                c["name"], c["image"], ready=ready, restarts=restarts, containerID=f"containerd://{name}-{c['name']}"
            )
            for c in containers
        ]
    # Native sidecars (restartPolicy: Always init containers) go into the pod and keep running.
    natives = [
        container(c["name"], c["image"], restartPolicy="Always")
        for c in spec.get("initContainers") or []
        if c.get("restartPolicy") == "Always"
    ]
    extra: JsonObj = {"initContainers": natives} if natives else {}
    if natives and with_statuses:
        status["initContainerStatuses"] = [
            container_status(
                c["name"], c["image"], ready=ready, restarts=restarts, containerID=f"containerd://{name}-{c['name']}"
            )
            for c in natives
        ]
    return pod(
        name,
        namespace=namespace,
        labels={"app": "shop", names.POD_INJECTED_LABEL: "true", **(labels or {})},
        annotations={
            names.ANN_HASH: orjson.dumps({ss_name: _hash_entry(ss, spec_hash(spec))}).decode(),
            names.ANN_HASH_WITHOUT_IMAGE: orjson.dumps(
                {ss_name: _hash_entry(ss, spec_hash_without_image(spec))}
            ).decode(),
            names.ANN_INJECTED_LIST: ss_name,
            "team": "checkout",
            **hot_annotations,
        },
        containers=containers,
        node=node,
        metadata=meta,
        status=status,
        **extra,
    )


def apply_patch(pod_json: JsonObj, patch: list[JsonObj]) -> JsonObj:
    """Apply a planner patch as the API server would (tests fail if a `test` op fails)."""
    result: JsonObj = jsonpatch.apply_patch(pod_json, patch)
    result["metadata"]["resourceVersion"] = str(int(result["metadata"]["resourceVersion"]) + 1)
    return result


def set_ready(pod_json: JsonObj, ready: bool) -> JsonObj:
    """A copy of the pod with its Ready condition and every container's `ready` set to `ready`."""
    out = copy.deepcopy(pod_json)
    for cond in out["status"]["conditions"]:
        if cond["type"] == "Ready":
            cond["status"] = "True" if ready else "False"
    for cs in [*out["status"].get("containerStatuses", []), *out["status"].get("initContainerStatuses", [])]:
        cs["ready"] = ready
    return out


def kubelet_sync(pod_json: JsonObj, *, ready: bool = True) -> JsonObj:
    """The node caught up: a Pending pod is started, and every container whose spec image changed
    is restarted on the new image."""
    out = copy.deepcopy(pod_json)
    images = {c["name"]: c["image"] for c in out["spec"]["containers"]}
    if out["status"]["phase"] == "Pending":
        out["status"]["phase"] = "Running"
        out["status"]["containerStatuses"] = [container_status(n, img, ready=ready) for n, img in images.items()]
    natives = {
        c["name"]: c["image"] for c in out["spec"].get("initContainers") or [] if c.get("restartPolicy") == "Always"
    }
    for cs in [*out["status"].get("containerStatuses", []), *out["status"].get("initContainerStatuses", [])]:
        image = images.get(cs["name"], natives.get(cs["name"]))
        if image is not None and cs["image"] != image:
            cs["image"] = image
            cs["imageID"] = image_id(cs["image"])
            cs["restartCount"] += 1
    return set_ready(out, ready)


def namespace_name(nodeid: str) -> str:
    """A fresh namespace name for the test `nodeid`: its name, made a DNS label, and a random suffix."""
    base = re.sub(r"[^a-z0-9-]+", "-", nodeid.split("::")[-1].lower()).strip("-")[:40].strip("-")
    return f"{base or 't'}-{secrets.token_hex(3)}"
