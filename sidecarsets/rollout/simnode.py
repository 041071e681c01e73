"""A node and an API server simulated on pod copies, for the simulated rollout (sidecarsets.rollout.rolloutsim).

The planner only sees a pod move on when the API server stores its patch and the kubelet reports
the new image running; a preview has neither, so both are played here on one pod at a time: the
pod after a planner patch, and the pod as the kubelet reports it once the new images run and are
ready. Nothing else about the pod changes, so the planner's next pass sees what it would see.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence

import jsonpatch

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods.podkeys import pod_key


class PreviewError(ValueError):
    """The simulation cannot go on (a patch that does not apply to the pod it was planned for)."""


def simulated_image_id(image: str) -> str:
    """An imageID for `image` that no real runtime reported before the upgrade (so the planner sees
    the upgrade land); a digest-pinned image reports its own digest, as a runtime does."""
    if "@" in image:
        return image
    return f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def kubelet_report(pod: JsonObj, *, now: str) -> JsonObj:
    """A copy of `pod` as the kubelet reports it once every container whose spec image changed runs
    the new image and is ready, and every container that reports its resources runs with its spec's
    (a resize applied); nothing else changes.

    A pod that is not Running (or is being deleted) is left as it is: no node is starting it in a
    preview. The pod is ready afterwards when all its containers are, unless it was not ready for
    a reason of its own (every container ready, the pod still not: a readiness gate).
    """
    out = copy.deepcopy(pod)
    meta, spec = out.get("metadata") or {}, out.get("spec") or {}
    st = out.get("status")
    if not isinstance(st, dict) or st.get("phase") != "Running" or meta.get("deletionTimestamp") is not None:
        return out
    images = {c.get("name"): c.get("image") for c in spec.get("containers") or [] if isinstance(c, dict)}
    natives = {
        c.get("name"): c.get("image")
        for c in spec.get("initContainers") or []
        if isinstance(c, dict) and c.get("restartPolicy") == "Always"
    }
    statuses = [cs for cs in st.get("containerStatuses") or [] if isinstance(cs, dict)]
    init_statuses = [cs for cs in st.get("initContainerStatuses") or [] if isinstance(cs, dict)]

    def all_ready() -> bool:
        return (
            len(statuses) == len(images)
            and all(cs.get("ready") is True for cs in statuses)
            and all(cs.get("ready") is True for cs in init_statuses if cs.get("name") in natives)
        )

    conditions = [c for c in st.get("conditions") or [] if isinstance(c, dict)]
    was_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    held_back = not was_ready and all_ready()
    changed = False
    asked = {
        c.get("name"): c.get("resources") or {}
        for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
        if isinstance(c, dict)
    }
    for cs in [*statuses, *init_statuses]:
        if "resources" in cs and cs.get("resources") != asked.get(cs.get("name"), cs.get("resources")):
            cs["resources"] = asked[cs.get("name")]
            changed = True
    for wanted, group in ((images, statuses), (natives, init_statuses)):
        for cs in group:
            image = wanted.get(cs.get("name"))
            if not isinstance(image, str) or cs.get("image") == image:
                continue
            restarts = cs.get("restartCount")
            cs.update(
                image=image,
                imageID=simulated_image_id(image),
                ready=True,
                started=True,
                restartCount=(restarts if isinstance(restarts, int) else 0) + 1,
                state={"running": {"startedAt": now}},
            )
            changed = True
    if not changed:
        return out
    ready = all_ready() and not held_back
    text = "True" if ready else "False"
    for kind in ("ContainersReady", "Ready"):
        cond = next((c for c in conditions if c.get("type") == kind), None)
        if cond is None:
            conditions.append({"type": kind, "status": text, "lastTransitionTime": now})
        elif cond.get("status") != text:
            cond.update(status=text, lastTransitionTime=now)
    st["conditions"] = conditions
    return out


def apply_upgrade(pod: JsonObj, patch: Sequence[JsonObj]) -> JsonObj:
    """The pod after a planner patch, as the API server stores it (a new resourceVersion)."""
    try:
        result: JsonObj = jsonpatch.apply_patch(pod, list(patch))
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise PreviewError(f"pod {pod_key(pod)}: the planned patch does not apply: {e}") from None
    meta = result.setdefault("metadata", {})
    rv = str(meta.get("resourceVersion") or "0")
    meta["resourceVersion"] = str(int(rv) + 1) if rv.isdigit() else rv + "+1"
    return result
