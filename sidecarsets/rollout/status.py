"""Which pods a SidecarSet owns and the status counters users watch a rollout by.

Matching follows Kruise's controller, not the injection webhook: a pod counts only if it is
active, the SidecarSet is in its injected list and its sidecars are really there, so a pod
injected by an older, narrower SidecarSet is not reported as "not updated" forever.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods import podstate
from sidecarsets.pods.projection import PodProjection
from sidecarsets.rollout import hotupgrade
from sidecarsets.spec import hotsidecars, selectors
from sidecarsets.spec.model import SidecarSet

_COUNTERS = ("matchedPods", "updatedPods", "readyPods", "updatedReadyPods")


def matched_pods(
    ss: SidecarSet, pods: Iterable[PodProjection], namespace_labels: Mapping[str, Mapping[str, str]]
) -> list[PodProjection]:
    """The pods this SidecarSet owns, in the order given.

    For a namespace whose labels are not known, only a selector on its name alone can be decided;
    anything else is treated as not matching rather than guessed (`SidecarSet.matches_namespace`).

    Replicas of one workload share their label set and container lists (projection hands out one
    instance per distinct value), so the selector and the sidecar check run once per distinct
    object. The memos are keyed by identity; every keyed object is held by a pod in `pods`.
    """
    name = ss.name
    if not name or selectors.is_empty(ss.selector):
        return []  # an empty selector would claim every pod; admission refuses it
    cold, hot, native, hot_init = ss.cold_names, ss.hot_names, ss.native_init_names, ss.hot_init_names
    ns_cache: dict[str, bool] = {}
    labels_cache: dict[int, bool] = {}
    sidecars_cache: dict[tuple[int, int, int], bool] = {}
    out: list[PodProjection] = []
    for pod in pods:
        if name not in pod.injected or not podstate.is_active(pod):
            continue
        in_ns = ns_cache.get(pod.namespace)
        if in_ns is None:
            in_ns = ns_cache[pod.namespace] = ss.matches_namespace(pod.namespace, namespace_labels.get(pod.namespace))
        if not in_ns:
            continue
        labels = pod.labels
        in_sel = labels_cache.get(id(labels))
        if in_sel is None:
            in_sel = labels_cache[id(labels)] = ss.matches_pod(labels)
        if not in_sel:
            continue
        key = (id(pod.containers), id(pod.init_containers), id(pod.hot_working))
        complete = sidecars_cache.get(key)
        if complete is None:
            complete = sidecars_cache[key] = podstate.has_sidecars(
                pod, cold=cold, hot=hot, native_init=native, hot_init=hot_init
            )
        if complete:
            out.append(pod)
    return out


def pod_verdicts(ss: SidecarSet, matched: Sequence[PodProjection]) -> podstate.Verdicts:
    """The per-pod verdicts for `matched` against the SidecarSet's current spec, computed once so
    `compute_status` and `planner.plan_upgrade` can share them."""
    hot = hotsidecars.hot_sidecars(ss)
    return podstate.evaluate(
        matched,
        sidecarset=ss.name,
        spec_hash=ss.hash,
        containers=ss.container_names_in_pod,
        also_ready=(lambda p: hotupgrade.empties_done(p, ss)) if hot else None,
    )


def compute_status(
    ss: SidecarSet,
    matched: Sequence[PodProjection],
    *,
    latest_revision: str | None,
    collision_count: int | None,
    verdicts: podstate.Verdicts | None = None,
) -> JsonObj:
    """The status for `matched`; `verdicts` from `pod_verdicts(ss, matched)` saves evaluating the pods again."""
    if verdicts is None:
        verdicts = pod_verdicts(ss, matched)
    elif not verdicts.is_for(matched, sidecarset=ss.name, spec_hash=ss.hash):
        raise ValueError("verdicts were evaluated for other pods or another SidecarSet spec")
    updated = sum(verdicts.updated)
    ready = sum(verdicts.available)
    updated_ready = sum(map(operator.and_, verdicts.updated, verdicts.available))
    status: JsonObj = {}
    if ss.generation:
        status["observedGeneration"] = ss.generation
    status.update(matchedPods=len(matched), updatedPods=updated, readyPods=ready, updatedReadyPods=updated_ready)
    if latest_revision is not None:
        status["latestRevision"] = latest_revision
    if collision_count is not None:
        status["collisionCount"] = collision_count
    return status


def set_condition(
    status: JsonObj, old_status: Mapping[str, Any] | None, condition: Mapping[str, str], *, now: str
) -> None:
    """Put `condition` (type, status, reason, message) in `status`, keeping its lastTransitionTime
    from `old_status` while its status is unchanged (as metav1.Condition)."""
    kind = condition["type"]
    old = next(
        (c for c in (old_status or {}).get("conditions") or [] if isinstance(c, dict) and c.get("type") == kind), None
    )
    since = old.get("lastTransitionTime") if old and old.get("status") == condition["status"] else None
    others = [c for c in status.get("conditions") or [] if c.get("type") != kind]
    status["conditions"] = [*others, {**condition, "lastTransitionTime": since or now}]


def put_condition(status: JsonObj, condition: Mapping[str, Any]) -> None:
    """Put `condition` in `status` as it is, its lastTransitionTime included (the caller owns it)."""
    others = [c for c in status.get("conditions") or [] if c.get("type") != condition["type"]]
    status["conditions"] = [*others, dict(condition)]


def _normalised(status: Mapping[str, Any]) -> dict[str, Any]:
    """Missing counters read as 0 and null fields as absent, as the API server round-trips them."""
    out = {k: v for k, v in status.items() if v is not None}
    for key in _COUNTERS:
        out.setdefault(key, 0)
    return out


def status_changed(old: Mapping[str, Any] | None, new: JsonObj) -> bool:
    if not isinstance(old, Mapping):
        return True
    return _normalised(old) != _normalised(new)
