"""Which of the SidecarSets that match a pod it gets, and which it already has.

Three rules remove matching SidecarSets before anything is built, in this order: a canary that
selects the pod replaces its base (Kruise's sidecarset-canary/-base annotations); of two that
define one container name, a cluster SidecarSet wins over a NamespacedSidecarSet, else the older
wins (the other is skipped whole, with a warning, rather than giving the pod a name twice); one
whose current hash the pod already records is not injected again (re-invocation and repeated
admission add nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from injector.engine import metadata
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

SKIP_NO_MATCH = "no SidecarSet matches the pod"
SKIP_ALREADY_INJECTED = "already injected"
SKIP_ALL_CONFLICT = "every matching SidecarSet would duplicate a container name (see warnings)"

HashMaps = tuple[dict[str, Any], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Selection:
    """`todo`: the SidecarSets to inject now, in `injection_order` (Kruise's); `hash_maps`: the pod's hash annotations
    as read, without the entries of bases a canary replaces; `sidecar_names`: the container names of
    every SidecarSet the pod gets, now or before; `replaced`: those bases."""

    todo: list[SidecarSet]
    hash_maps: HashMaps
    sidecar_names: frozenset[str]
    replaced: frozenset[str] = frozenset()


def select(
    sidecarsets: Sequence[SidecarSet],
    *,
    namespace: str,
    namespace_labels: Mapping[str, str] | None,
    pod: Mapping[str, Any],
    warnings: list[str],
) -> Selection | str:
    """What the pod gets, or why it gets nothing (one of the SKIP_ reasons). Warnings are appended."""
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    spec: Mapping[str, Any] = pod["spec"]
    matched = [
        ss
        for ss in sidecarsets
        if not ss.injection_paused and ss.matches_namespace(namespace, namespace_labels) and ss.matches_pod(labels)
    ]
    if not matched:
        return SKIP_NO_MATCH
    replaced = {ss.canary_base for ss in matched if ss.canary_base is not None}
    if replaced:
        matched = [ss for ss in matched if ss.name not in replaced]
    chosen = _without_conflicts(
        matched, containers=spec["containers"], init_containers=spec.get("initContainers") or [], warnings=warnings
    )
    if not chosen:
        return SKIP_ALL_CONFLICT
    hash_map, bad = metadata.read_hash_map(annotations.get(names.ANN_HASH))
    if bad:
        warnings.append(f"{names.ANN_HASH}: {bad}")
    hash_map_wi, bad = metadata.read_hash_map(annotations.get(names.ANN_HASH_WITHOUT_IMAGE))
    if bad:
        warnings.append(f"{names.ANN_HASH_WITHOUT_IMAGE}: {bad}")
    # A pod can reach the webhook already injected with a base its canary replaces: the base's
    # MutatingAdmissionPolicy runs first and leaves the canary's pods alone only once the API
    # server enforces the version that excludes them. The canary's same-name containers replace
    # the base's; its bookkeeping goes too, so the base neither counts nor upgrades the pod.
    for base in replaced:
        hash_map.pop(base, None)
        hash_map_wi.pop(base, None)
    todo = sorted(
        (ss for ss in chosen if metadata.recorded_hash(hash_map, ss.name) != ss.hash), key=lambda s: s.injection_order
    )
    if not todo:
        return SKIP_ALREADY_INJECTED
    return Selection(
        todo,
        (hash_map, hash_map_wi),
        frozenset(n for ss in chosen for n in ss.all_container_names),
        frozenset(replaced),
    )


def _without_conflicts(
    matched: Sequence[SidecarSet],
    *,
    containers: Sequence[JsonObj],
    init_containers: Sequence[JsonObj],
    warnings: list[str],
) -> list[SidecarSet]:
    """Drop SidecarSets that would give the pod two containers of one name: a cluster SidecarSet wins
    over a NamespacedSidecarSet whatever their ages (a tenant cannot displace the cluster's sidecar),
    then the oldest wins."""
    app_names = {c["name"] for c in containers}
    init_names = {c["name"] for c in init_containers}
    claimed: dict[str, str] = {}
    chosen: list[SidecarSet] = []
    for ss in sorted(matched, key=precedence):
        if not ss.all_container_names.isdisjoint(claimed):
            clash = sorted(ss.all_container_names.intersection(claimed))
            why = (
                "a cluster SidecarSet" if ss.namespaced and "/" not in claimed[clash[0]] else "older, or first by name"
            )
            warnings.append(
                f"{ss.kind} {ss.name} is not injected: container {clash[0]} is also defined by SidecarSet "
                f"{claimed[clash[0]]}, which takes precedence ({why})"
            )
            continue
        crossed = []
        if init_names:
            crossed += [
                f"container {c.name} (an init container of the pod)" for c in ss.containers if c.name in init_names
            ]
        if ss.init_containers:
            crossed += [
                f"init container {c.name} (a container of the pod)" for c in ss.init_containers if c.name in app_names
            ]
        if crossed:
            warnings.append(f"{ss.kind} {ss.name} is not injected: its {min(crossed)} would duplicate a name")
            continue
        chosen.append(ss)
        claimed.update(dict.fromkeys(ss.all_container_names, ss.name))
    return chosen


def precedence(ss: SidecarSet) -> tuple[bool, str, str]:
    """Cluster SidecarSets first, then older first: the SidecarSet that wins a container name."""
    return (ss.namespaced, ss.creation_timestamp, ss.name)
