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
from sidecarsets import podstate, rawspec, selectors
from sidecarsets.hashing import spec_hash
from sidecarsets.names import NS_NAME_LABEL
from sidecarsets.projection import PodProjection

_COUNTERS = ("matchedPods", "updatedPods", "readyPods", "updatedReadyPods")


def _selector_keys(selector: Mapping[str, Any]) -> set[str]:
    keys = set(selector.get("matchLabels") or {})
    for expr in selector.get("matchExpressions") or []:
        if isinstance(expr, Mapping):
            keys.add(str(expr.get("key")))
    return keys


def namespace_matches(
    selector: Mapping[str, Any] | None, namespace: str, namespace_labels: Mapping[str, Mapping[str, str]]
) -> bool:
    """None selects every namespace. For a namespace whose labels are not known, only a selector on
    its name alone can be decided; anything else is treated as not matching rather than guessed."""
    if selector is None:
        return True
    labels = namespace_labels.get(namespace)
    if labels is None:
        if not _selector_keys(selector) <= {NS_NAME_LABEL}:
            return False
        labels = {}
    if NS_NAME_LABEL not in labels:
        labels = {**labels, NS_NAME_LABEL: namespace}
    return selectors.matches(selector, labels)


def matched_pods(
    ss: JsonObj, pods: Iterable[PodProjection], namespace_labels: Mapping[str, Mapping[str, str]]
) -> list[PodProjection]:
    """The pods this SidecarSet owns, in the order given.

    Replicas of one workload share their label set and container lists (projection hands out one
    instance per distinct value), so the selector and the sidecar check run once per distinct
    object. The memos are keyed by identity; every keyed object is held by a pod in `pods`.
    """
    name = rawspec.name(ss)
    pod_selector = rawspec.pod_selector(ss)
    if not name or pod_selector is None or selectors.is_empty(pod_selector):
        return []  # an empty selector would claim every pod; admission refuses it
    ns_selector = rawspec.namespace_selector(ss)
    cold = [c["name"] for c in rawspec.cold_containers(ss)]
    hot = rawspec.hot_names(ss)
    native = rawspec.native_init_names(ss)
    selected = selectors.matcher(pod_selector)
    ns_cache: dict[str, bool] = {}
    labels_cache: dict[int, bool] = {}
    sidecars_cache: dict[tuple[int, int], bool] = {}
    out: list[PodProjection] = []
    for pod in pods:
        if name not in pod.injected or not podstate.is_active(pod):
            continue
        in_ns = ns_cache.get(pod.namespace)
        if in_ns is None:
            in_ns = ns_cache[pod.namespace] = namespace_matches(ns_selector, pod.namespace, namespace_labels)
        if not in_ns:
            continue
        labels = pod.labels
        in_sel = labels_cache.get(id(labels))
        if in_sel is None:
            in_sel = labels_cache[id(labels)] = selected(labels)
        if not in_sel:
            continue
        key = (id(pod.containers), id(pod.init_containers))
        complete = sidecars_cache.get(key)
        if complete is None:
            complete = sidecars_cache[key] = podstate.has_sidecars(pod, cold=cold, hot=hot, native_init=native)
        if complete:
            out.append(pod)
    return out


def evaluate(ss: JsonObj, matched: Sequence[PodProjection]) -> podstate.Verdicts:
    """The per-pod verdicts for `matched` against the SidecarSet's current spec, computed once so
    `compute_status` and `planner.plan_upgrade` can share them."""
    return podstate.evaluate(
        matched,
        sidecarset=rawspec.name(ss),
        spec_hash=spec_hash(rawspec.spec(ss)),
        containers=set(rawspec.sidecar_list(ss)),
    )


def compute_status(
    ss: JsonObj,
    matched: Sequence[PodProjection],
    *,
    latest_revision: str | None,
    collision_count: int | None,
    verdicts: podstate.Verdicts | None = None,
) -> JsonObj:
    """The status for `matched`; `verdicts` from `evaluate(ss, matched)` saves evaluating the pods again."""
    name = rawspec.name(ss)
    current = spec_hash(rawspec.spec(ss))
    if verdicts is None:
        verdicts = evaluate(ss, matched)
    elif not verdicts.is_for(matched, sidecarset=name, spec_hash=current):
        raise ValueError("verdicts were evaluated for other pods or another SidecarSet spec")
    updated = sum(verdicts.updated)
    ready = sum(verdicts.available)
    updated_ready = sum(map(operator.and_, verdicts.updated, verdicts.available))
    status: JsonObj = {}
    generation = (ss.get("metadata") or {}).get("generation")
    if isinstance(generation, int) and not isinstance(generation, bool):
        status["observedGeneration"] = generation
    status.update(matchedPods=len(matched), updatedPods=updated, readyPods=ready, updatedReadyPods=updated_ready)
    if latest_revision is not None:
        status["latestRevision"] = latest_revision
    if collision_count is not None:
        status["collisionCount"] = collision_count
    return status


def _normalised(status: Mapping[str, Any]) -> dict[str, Any]:
    """Missing counters read as 0 and null fields as absent, as the API server round-trips them."""
    out = {k: v for k, v in status.items() if v is not None}
    for key in _COUNTERS:
        out.setdefault(key, 0)
    return out


def status_changed(old: JsonObj | None, new: JsonObj) -> bool:
    if not isinstance(old, Mapping):
        return True
    return _normalised(old) != _normalised(new)
