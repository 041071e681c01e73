"""Questions about one pod relative to one SidecarSet: updated, consistent, ready, done upgrading.

Status counting and upgrade planning must agree on these answers (a pod the planner thinks
is unavailable must not be counted ready in the status), so both import them from here.

"Done upgrading" follows Kruise's in-place detection: the kubelet gives no event when it has
swapped a container image, so the controller records each changed container's imageID before
patching and treats the upgrade as landed once the reported imageID moves away from it (or the
reported image already equals the spec image). When every sidecar image is pinned by digest,
the reported imageID must carry that digest instead.

A reconcile asks these questions of every matched pod; `evaluate` answers them once per
reconcile for both the status and the planner.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from sidecarsets.pods import resizestate
from sidecarsets.pods.projection import PodProjection
from sidecarsets.spec.sidecar import hot_pair

_DIGEST = re.compile(r"@([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})$")


def is_active(pod: PodProjection) -> bool:
    return not pod.deleting and pod.phase not in ("Succeeded", "Failed")


def is_running_ready(pod: PodProjection) -> bool:
    """Kruise's IsRunningAndReady: Running, PodReady True, not being deleted."""
    return pod.phase == "Running" and pod.ready and not pod.deleting


def is_updated(pod: PodProjection, *, sidecarset: str, spec_hash: str) -> bool:
    entry = pod.hash_for(sidecarset)
    return entry is not None and bool(entry.hash) and entry.hash == spec_hash


def has_sidecars(
    pod: PodProjection,
    *,
    cold: Iterable[str],
    hot: Iterable[str],
    native_init: Iterable[str],
    hot_init: Iterable[str] = (),
) -> bool:
    """Every sidecar of the SidecarSet is in the pod (hot ones, containers or native-sidecar init
    containers, as their -1/-2 pair, with the working annotation naming one)."""
    names = {n for n, _ in pod.containers}
    inits = {n for n, _ in pod.init_containers}
    return (
        all(n in names for n in cold)
        and all(names.issuperset(hot_pair(n)) and pod.working(n) is not None for n in hot)
        and all(n in inits for n in native_init)
        and all(inits.issuperset(hot_pair(n)) and pod.working(n) is not None for n in hot_init)
    )


def _images(pod: PodProjection, containers: Collection[str]) -> dict[str, str]:
    """Spec image of each of `containers` in the pod, native-sidecar init containers included."""
    return {n: img for n, img in (*pod.containers, *pod.init_containers) if n in containers}


def is_image_digest(image: str) -> bool:
    return _DIGEST.search(image) is not None


def _repo_and_digest(ref: str) -> tuple[str, str]:
    """Normalise `busybox@sha256:..` / `docker-pullable://docker.io/library/busybox@sha256:..`."""
    if "://" in ref:
        ref = ref.split("://", 1)[1]
    repo, _, digest = ref.partition("@")
    slash = repo.rfind("/")
    colon = repo.rfind(":")
    if colon > slash:  # drop a tag
        repo = repo[:colon]
    first, sep, _ = repo.partition("/")
    if not sep:
        repo = f"docker.io/library/{repo}"
    elif "." not in first and ":" not in first and first != "localhost":
        repo = f"docker.io/{repo}"
    return repo, digest


def _split(ref: str) -> tuple[str, str, str]:
    """(normalised repository, tag or "", digest or "") of an image reference."""
    name, _, digest = ref.partition("@")
    slash, colon = name.rfind("/"), name.rfind(":")
    tag = name[colon + 1 :] if colon > slash else ""
    repo, _ = _repo_and_digest(name)
    return repo, tag, digest


def same_image(pod_image: str | None, wanted: str | None) -> bool:
    """The image in a pod is the one a SidecarSet asks for, as far as an admission step that pins
    images by digest (sigstore's policy-controller, Kyverno's verifyImages) lets one tell: `proxy:2`
    pinned as `proxy:2@sha256:...`, or as a digest-only `proxy@sha256:...` of the same repository.
    Another repository (a mirror) is another image."""
    if pod_image == wanted or pod_image is None or wanted is None:
        return pod_image == wanted
    repo, tag, digest = _split(pod_image)
    want_repo, want_tag, want_digest = _split(wanted)
    if repo != want_repo:
        return False
    if want_digest:
        return digest == want_digest
    if digest:
        return not tag or tag == want_tag
    return (tag or "latest") == (want_tag or "latest")


def digest_matches(image: str, image_id: str) -> bool:
    """The reported imageID names the same repository and digest as a digest-pinned image."""
    if not image_id:
        return False
    repo, digest = _repo_and_digest(image)
    repo_id, digest_id = _repo_and_digest(image_id)
    return bool(digest) and digest == digest_id and repo == repo_id


def update_complete(pod: PodProjection, *, sidecarset: str, containers: Collection[str]) -> bool:
    """No in-place image change of these sidecar containers is still waiting for the kubelet."""
    images = _images(pod, containers)
    if images and all(is_image_digest(img) for img in images.values()):
        for name, image in images.items():
            status = pod.status_of(name)
            if status is None or not digest_matches(image, status.image_id):
                return False
        return True
    state = pod.inplace_for(sidecarset)
    if state is None:
        return True
    recorded = dict(state.last_image_ids)
    for name, image in images.items():
        status = pod.status_of(name)
        if status is None or name not in recorded:
            continue
        if recorded[name] == status.image_id and image != status.image:
            return False
    return True


def upgrade_in_flight(pod: PodProjection, *, sidecarset: str, containers: Collection[str]) -> bool:
    """This SidecarSet patched an image in the pod and the kubelet has not reported it running yet.

    Only containers recorded in the pod's in-place state count, so a pod that was never upgraded
    (say a Pending one without container statuses) is not in flight. A resize of its containers the
    kubelet has not applied is in flight too (one its node cannot fit is not: it will not land).
    """
    if not resizestate.applied(pod, containers) and resizestate.infeasible(pod) is None:
        return True
    state = pod.inplace_for(sidecarset)
    if state is None:
        return False
    images = _images(pod, containers)
    all_digest = bool(images) and all(is_image_digest(img) for img in images.values())
    for name, old_id in state.last_image_ids:
        if name not in images:
            continue
        status = pod.status_of(name)
        if status is None:
            return True
        if all_digest:
            if not digest_matches(images[name], status.image_id):
                return True
        elif old_id == status.image_id and images[name] != status.image:
            return True
    return False


def is_consistent(pod: PodProjection, *, sidecarset: str, containers: Collection[str]) -> bool:
    """Kruise's IsPodStateConsistent: the kubelet reports every container (and each of our native
    sidecars) and the sidecars landed."""
    if len(pod.containers) != len(pod.container_statuses):
        return False
    native = [n for n, _ in pod.init_containers if n in containers]
    if native and any(pod.status_of(n) is None for n in native):
        return False
    return update_complete(pod, sidecarset=sidecarset, containers=containers)


def is_available(pod: PodProjection, *, sidecarset: str, containers: Collection[str]) -> bool:
    return is_running_ready(pod) and is_consistent(pod, sidecarset=sidecarset, containers=containers)


@dataclass(frozen=True, slots=True)
class Verdicts:
    """The answers for each of `pods` (same index) relative to one SidecarSet spec.

    Built once per reconcile and shared by the status and the planner, so a reconcile over
    thousands of pods asks each question once and both sides see the same answers.
    """

    pods: tuple[PodProjection, ...]
    sidecarset: str
    spec_hash: str
    updated: tuple[bool, ...]  # is_updated
    available: tuple[bool, ...]  # is_available
    in_flight: tuple[bool, ...]  # not updated, and upgrade_in_flight

    def is_for(self, pods: Sequence[PodProjection], *, sidecarset: str, spec_hash: str) -> bool:
        """These verdicts answer for exactly these pods (same objects, same order) and this spec."""
        mine = self.pods
        return (
            self.sidecarset == sidecarset
            and self.spec_hash == spec_hash
            and len(mine) == len(pods)
            and all(map(operator.is_, mine, pods))
        )


def evaluate(
    pods: Sequence[PodProjection],
    *,
    sidecarset: str,
    spec_hash: str,
    containers: Collection[str],
    also_ready: Callable[[PodProjection], bool] | None = None,
) -> Verdicts:
    """`Verdicts` for `pods`; the same answers as the per-pod functions above.

    Whether a pod's sidecars have landed depends only on its container list, its container
    statuses and this SidecarSet's in-place record, and replicas of one workload share those
    objects (projection hands out one instance per distinct value), so that part is worked out
    once per distinct combination. The memo is keyed by object identity: every keyed object is
    held by a pod in `pods` for as long as the memo lives, so an id cannot be reused meanwhile.
    `also_ready` adds a condition to availability (HotUpgrade: the idle containers are emptied).
    """
    memo: dict[tuple[int, ...], tuple[bool, bool]] = {}
    updated: list[bool] = []
    available: list[bool] = []
    in_flight: list[bool] = []
    for pod in pods:
        # pod.hash_for and pod.inplace_for, inlined: this loop runs for every pod of every reconcile
        is_new = False
        for entry in pod.hashes:
            if entry.sidecarset == sidecarset:
                is_new = bool(entry.hash) and entry.hash == spec_hash
                break
        last = None
        for state in pod.inplace_state:
            if state.sidecarset == sidecarset:
                last = state.last_image_ids
                break
        key = (
            id(pod.containers),
            id(pod.container_statuses),
            id(pod.init_containers),
            id(pod.init_statuses),
            id(last),
            id(pod.resources),
            id(pod.applied_resources),
            id(pod.resize_conditions),
        )
        found = memo.get(key)
        if found is None:
            found = memo[key] = (
                # A resized sidecar has landed once the kubelet reports its new CPU and memory.
                is_consistent(pod, sidecarset=sidecarset, containers=containers)
                and resizestate.applied(pod, containers),
                upgrade_in_flight(pod, sidecarset=sidecarset, containers=containers),
            )
        consistent, moving = found
        updated.append(is_new)
        ok = consistent and pod.phase == "Running" and pod.ready and not pod.deleting
        available.append(ok and (also_ready is None or also_ready(pod)))
        in_flight.append(moving and not is_new)
    return Verdicts(tuple(pods), sidecarset, spec_hash, tuple(updated), tuple(available), tuple(in_flight))
