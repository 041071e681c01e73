"""The JSON Patch of one pod's in-place upgrade: the image replacements and the hash and
in-place-state annotations that record them.

Apart from the rollout rules (sidecarsets.rollout.planner): which pods move, and when, is the planner's
decision; how one move is written down is this module's, used by the planner for upgrades and
HotUpgrade flips alike, and by the benchmarks to send the very patches the controller sends.

Each patch is an RFC 6902 JSON Patch guarded by `test` operations (resourceVersion and each
container's name at its index), so a pod that changed since it was observed makes the patch
fail instead of writing the wrong container.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from kuberuntime.jsontypes import JsonObj, parse_object
from sidecarsets.pods.projection import PodProjection
from sidecarsets.spec.names import ANN_HASH, ANN_HASH_WITHOUT_IMAGE, ANN_INPLACE_STATE


def pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _hash_annotation(
    pod: PodProjection, *, ss_name: str, new_hash: str, sidecars: list[str], revision: str, now: str
) -> str:
    entries: dict[str, Any] = {}
    for e in pod.hashes:
        if e.sidecarset == ss_name:
            continue
        if e.legacy:
            entries[e.sidecarset] = e.hash
            continue
        entry: JsonObj = {
            "updateTimestamp": e.update_timestamp or None,
            "hash": e.hash,
            "sidecarSetName": e.sidecarset,
            "sidecarList": list(e.sidecar_list),
        }
        if e.controller_revision:
            entry["controllerRevision"] = e.controller_revision
        entries[e.sidecarset] = entry
    mine: JsonObj = {
        "updateTimestamp": now,
        "hash": new_hash,
        "sidecarSetName": ss_name,
        "sidecarList": sidecars,
    }
    if revision:
        mine["controllerRevision"] = revision
    entries[ss_name] = mine
    return orjson.dumps({k: entries[k] for k in sorted(entries)}).decode()


def inplace_annotation(
    pod: PodProjection, *, ss_name: str, changed: list[str], revision: str, now: str, merge: bool = False
) -> str:
    """The in-place state with this SidecarSet's entry recording `changed` containers' imageIDs now;
    with `merge` (a HotUpgrade flip) added to its existing entry, whose revision and time stay."""
    states: dict[str, Any] = {
        e.sidecarset: {
            "revision": e.revision,
            "updateTimestamp": e.update_timestamp or None,
            "lastContainerStatuses": {c: {"imageID": i} for c, i in e.last_image_ids},
        }
        for e in pod.inplace_state
        if e.sidecarset != ss_name
    }
    last: dict[str, Any] = {}
    mine = pod.inplace_for(ss_name)
    if merge and mine is not None:
        revision, now = mine.revision, mine.update_timestamp or now
        last = {c: {"imageID": i} for c, i in mine.last_image_ids}
    for c in changed:
        status = pod.status_of(c)
        last[c] = {"imageID": status.image_id if status else ""}
    states[ss_name] = {"revision": revision, "updateTimestamp": now, "lastContainerStatuses": last}
    return orjson.dumps({k: states[k] for k in sorted(states)}).decode()


def pod_patch(
    pod: PodProjection,
    *,
    ss_name: str,
    images: Mapping[str, str],
    new_hash: str,
    sidecars: list[str],
    revision: str,
    now: str,
    hot_ops: Sequence[JsonObj] = (),
    hot_changed: Sequence[str] = (),
) -> list[JsonObj]:
    """The JSON Patch that moves `pod` to `images` (sidecar name -> image, containers and native-sidecar
    init containers: names are unique across both lists) and records it. `hot_ops` start the
    HotUpgrade of the containers in `hot_changed` (sidecarsets.rollout.hotupgrade) in the same patch."""
    ops: list[JsonObj] = [{"op": "test", "path": "/metadata/resourceVersion", "value": pod.resource_version}]
    changed: list[str] = []
    for field, listed in (("containers", pod.containers), ("initContainers", pod.init_containers)):
        for i, (name, image) in enumerate(listed):
            target = images.get(name)
            if target is None or target == image:
                continue
            ops.append({"op": "test", "path": f"/spec/{field}/{i}/name", "value": name})
            ops.append({"op": "replace", "path": f"/spec/{field}/{i}/image", "value": target})
            changed.append(name)
    ops += hot_ops
    changed += hot_changed
    hash_value = _hash_annotation(
        pod, ss_name=ss_name, new_hash=new_hash, sidecars=sidecars, revision=revision, now=now
    )
    state_value = inplace_annotation(pod, ss_name=ss_name, changed=changed, revision=revision, now=now)
    ops.append({"op": "add", "path": pointer("metadata", "annotations", ANN_HASH), "value": hash_value})
    ops.append({"op": "add", "path": pointer("metadata", "annotations", ANN_INPLACE_STATE), "value": state_value})
    return ops


def without_image_op(raw: str | None, *, ss_name: str, new_hash: str, sidecars: list[str], now: str) -> JsonObj:
    """The operation that records a resized pod's new without-image hash, read from the pod as it is
    (the projection drops this annotation's timestamps, and other SidecarSets' entries must stay as
    written); the entry has injection's form (injector.engine.metadata)."""
    entries = dict(parse_object(raw))
    entries[ss_name] = {"updateTimestamp": now, "hash": new_hash, "sidecarSetName": ss_name, "sidecarList": sidecars}
    value = orjson.dumps({k: entries[k] for k in sorted(entries)}).decode()
    return {"op": "add", "path": pointer("metadata", "annotations", ANN_HASH_WITHOUT_IMAGE), "value": value}
