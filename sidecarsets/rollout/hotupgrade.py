"""HotUpgrade as Kruise does it: a sidecar served by one of two containers while the other is upgraded.

A HotUpgrade sidecar `<n>` is injected as `<n>-1` (its image) and `<n>-2` (the
`hotUpgradeEmptyImage`, a container that does nothing), and the pod's working annotation says
which one serves. An upgrade puts the new image on the idle one, so the sidecar keeps running while
the new container starts; the containers read which version they are (`SIDECARSET_VERSION`) and
their partner's (`SIDECARSET_VERSION_ALT`) from annotations set in the same patch, which is how a
proxy hands connections over. Once the new container is running and the pod is ready, the flip
puts the old container on the empty image. Every rule follows Kruise's (UpgradeSidecarContainer,
flipPodSidecarContainer, isPodSidecarInHotUpgrading, isHotUpgradingReady); this module holds them
as pure functions of the SidecarSet and the pod projection.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods.podstate import same_image
from sidecarsets.pods.projection import PodProjection
from sidecarsets.spec import names
from sidecarsets.spec.hotsidecars import HotSidecar, hot_sidecars
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.podmeta import dumps


def working(pod: PodProjection, h: HotSidecar) -> str:
    """The container of the pair that serves: `-1` when the working annotation says so, else `-2`
    (as Kruise's GetPodHotUpgradeContainers reads a missing or unknown entry)."""
    first, second = h.pair
    return first if pod.working(h.name) == first else second


def idle(pod: PodProjection, h: HotSidecar) -> str:
    first, second = h.pair
    return second if working(pod, h) == first else first


def empties_done(pod: PodProjection, ss: SidecarSet) -> bool:
    """Kruise's IsPodReady part for hot sidecars: each idle container is on the empty image (only
    checked where the SidecarSet names one)."""
    return all(not h.empty_image or same_image(pod.image_of(idle(pod, h)), h.empty_image) for h in hot_sidecars(ss))


def to_upgrade(pod: PodProjection, h: HotSidecar, *, consistent: Callable[[str], bool]) -> str | None:
    """The container of the pair that gets the new image (Kruise's findContainerToHotUpgrade), or
    None when the other one already runs it. `consistent(name)`: the kubelet runs that container's spec."""
    first, second = h.pair
    images = {first: pod.image_of(first), second: pod.image_of(second)}
    if same_image(images[first], h.empty_image):
        chosen = first
    elif same_image(images[second], h.empty_image):
        chosen = second
    else:  # the one not ready while its partner is, else the idle one
        ready = [c for c in h.pair if (st := pod.status_of(c)) is not None and st.ready and consistent(c)]
        chosen = (second if ready[0] == first else first) if len(ready) == 1 else idle(pod, h)
    other = second if chosen == first else first
    return None if same_image(images[other], h.image) else chosen


def _ann(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def working_annotation(pod: PodProjection, changes: Mapping[str, str]) -> str:
    merged = dict(pod.hot_working)
    merged.update(changes)
    return dumps(dict(sorted(merged.items())))


def upgrade_ops(
    pod: PodProjection, ss: SidecarSet, *, consistent: Callable[[str], bool]
) -> tuple[list[JsonObj], list[str]]:
    """The image and annotation operations that start a hot upgrade of every hot sidecar of `ss`
    in `pod` (in one patch with the cold images), and the containers changed."""
    ops: list[JsonObj] = []
    changed: list[str] = []
    switch: dict[str, str] = {}
    version = ss.resource_version
    for h in hot_sidecars(ss):
        target = to_upgrade(pod, h, consistent=consistent)
        if target is None:
            continue
        other = h.pair[1] if target == h.pair[0] else h.pair[0]
        index = _index(pod, h, target)
        if index is None:
            continue
        ops.append({"op": "test", "path": f"/spec/{h.field}/{index}/name", "value": target})
        ops.append({"op": "replace", "path": f"/spec/{h.field}/{index}/image", "value": h.image})
        switch[h.name] = target
        other_version, _ = pod.version(other)
        ops.append({"op": "add", "path": _ann(names.ANN_VERSION_PREFIX + target), "value": version})
        ops.append({"op": "add", "path": _ann(names.ANN_VERSION_ALT_PREFIX + target), "value": other_version})
        ops.append({"op": "add", "path": _ann(names.ANN_VERSION_ALT_PREFIX + other), "value": version})
        changed.append(target)
    if switch:
        ops.append({"op": "add", "path": _ann(names.ANN_WORKING_HOT), "value": working_annotation(pod, switch)})
    return ops, changed


def _index(pod: PodProjection, h: HotSidecar, container: str) -> int | None:
    listed = pod.init_containers if h.init else pod.containers
    return next((i for i, (n, _) in enumerate(listed) if n == container), None)


def in_hot_upgrade(pod: PodProjection, ss: SidecarSet) -> bool:
    """Some hot sidecar's idle container is not on the empty image: a flip is still to come."""
    return any(
        (img := pod.image_of(idle(pod, h))) is not None and not same_image(img, h.empty_image) for h in hot_sidecars(ss)
    )


def flip_ready(pod: PodProjection, ss: SidecarSet, *, consistent_except: Callable[[set[str]], bool]) -> bool:
    """Kruise's flip condition: in a hot upgrade, every container but the idle ones runs its spec,
    and the pod is ready (or every container but the idle ones is)."""
    if not in_hot_upgrade(pod, ss):
        return False
    idles = {idle(pod, h) for h in hot_sidecars(ss)}
    if not consistent_except(idles):
        return False
    if pod.phase == "Running" and pod.ready and not pod.deleting:
        return True
    return all(cs.ready for cs in (*pod.container_statuses, *pod.init_statuses) if cs.name not in idles)


def flip_ops(pod: PodProjection, ss: SidecarSet) -> tuple[list[JsonObj], list[str]]:
    """Put each idle container that still runs an image on the empty image; its version annotations
    go to "0" (and its partner's version-alt)."""
    ops: list[JsonObj] = [{"op": "test", "path": "/metadata/resourceVersion", "value": pod.resource_version}]
    changed: list[str] = []
    for h in hot_sidecars(ss):
        old = idle(pod, h)
        if (img := pod.image_of(old)) is None or same_image(img, h.empty_image):
            continue
        index = _index(pod, h, old)
        if index is None:
            continue
        ops.append({"op": "test", "path": f"/spec/{h.field}/{index}/name", "value": old})
        ops.append({"op": "replace", "path": f"/spec/{h.field}/{index}/image", "value": h.empty_image})
        ops.append({"op": "add", "path": _ann(names.ANN_VERSION_PREFIX + old), "value": "0"})
        ops.append({"op": "add", "path": _ann(names.ANN_VERSION_ALT_PREFIX + working(pod, h)), "value": "0"})
        changed.append(old)
    return ops, changed


def statuses_of(pod: PodProjection, containers: Collection[str]) -> dict[str, str]:
    """container -> imageID the kubelet reports now ("" when not reported)."""
    return {c: (st.image_id if (st := pod.status_of(c)) is not None else "") for c in containers}
