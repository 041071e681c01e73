"""The sidecars in a pod as the controller counts them: current, out of date, upgrading or missing.

Its matching (sidecarsets.rollout.status), its pod predicates (sidecarsets.pods.podstate) and, for
an outdated pod, the rollout glance `sidecarctl status` shows (sidecarsets.rollout.glance), so that
check-inject never tells a story the controller does not act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sidecarctl.cli.checkinject.verdicts import (
    ABSENT,
    CURRENT,
    MISSING,
    OUTDATED,
    PRESENT,
    UPGRADING,
    WOULD_INJECT,
    Cluster,
)
from sidecarsets.pods import missed, podstate
from sidecarsets.pods.projection import PodProjection
from sidecarsets.rollout import rolloutsim, status
from sidecarsets.rollout.planner import Stage
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

if TYPE_CHECKING:
    from sidecarsets.rollout.glance import Glance


def has_all(ss: SidecarSet, pod: PodProjection) -> bool:
    """The pod lists the SidecarSet and carries each of its sidecars, as the controller counts it."""
    return ss.name in pod.injected and podstate.has_sidecars(
        pod, cold=ss.cold_names, hot=ss.hot_names, native_init=ss.native_init_names, hot_init=ss.hot_init_names
    )


def counted(ss: SidecarSet, pod: PodProjection, namespace_labels: Mapping[str, str] | None) -> bool:
    """The controller counts and upgrades the pod for the SidecarSet (status.matched_pods: listed, all
    sidecars there, active, namespace scope, pod selector), whatever the injection rules (paused
    injection, the namespace label, opting out, a canary) say of new pods."""
    return bool(status.matched_pods(ss, [pod], {} if namespace_labels is None else {pod.namespace: namespace_labels}))


def outdated(ss: SidecarSet, pod: PodProjection, namespace_labels: Mapping[str, str] | None) -> bool:
    """Counted at another hash than its spec's: the controller's "not updated"."""
    return counted(ss, pod, namespace_labels) and not podstate.is_updated(pod, sidecarset=ss.name, spec_hash=ss.hash)


def state_of(
    ss: SidecarSet, raw: Mapping[str, Any], pod: PodProjection, *, selects: bool, template: bool, cluster: Cluster
) -> tuple[str, str]:
    """(state, detail) of `ss` in the pod. Sidecars in the pod are judged as the controller counts
    them (`counted`), not by whether they would be injected now; only those it does not count are
    merely present. A pod that does not run (Pending: no node has started it) is current when it
    records the spec's hash: it starts with exactly those sidecars. A running pod is current once
    the kubelet also reports every image the controller patched in."""
    if template:
        return (WOULD_INJECT, "") if selects else (ABSENT, "")
    if not has_all(ss, pod):
        if not selects:
            return ABSENT, ""
        if ss.name in pod.injected:
            return MISSING, f"listed in {names.ANN_INJECTED_LIST} but sidecars are not in the pod"
        ns = cluster.namespace(pod.namespace) or {}
        return MISSING, missed.reason(missed.PodFacts.of(raw), ss, labelled_at=missed.label_time(ns))
    if not counted(ss, pod, cluster.labels.get(pod.namespace)):
        return PRESENT, "in the pod, but the controller does not count it: it does not select the pod now"
    key = f"{pod.namespace}/{pod.name}"
    if not podstate.is_updated(pod, sidecarset=ss.name, spec_hash=ss.hash):
        return OUTDATED, cluster.held.get((ss.name, key), "its rollout could not be placed (pods not listed)")
    if pod.phase == "Running" and podstate.upgrade_in_flight(
        pod, sidecarset=ss.name, containers=ss.container_names_in_pod
    ):
        return UPGRADING, f"the new image is not reported running yet ({rolloutsim.not_ready_reason(ss, pod)})"
    if pod.phase != "Running":
        return CURRENT, f"not running (phase {pod.phase or 'unknown'}): it starts with this version"
    return CURRENT, ""


_STAGES = {
    Stage.PAUSED: "updates are paused (spec.updateStrategy.paused: true)",
    Stage.NOT_UPDATE: "spec.updateStrategy.type is NotUpdate: images are not rolled into running pods",
}


def why_outdated(key: str, glance: Glance) -> str:
    """Why the controller has not upgraded the pod (yet), in the words of its rollout glance."""
    not_ready = dict(glance.not_ready).get(key)
    suffix = f"; the pod is not ready ({not_ready})" if not_ready else ""
    blocked = next((b for b in glance.not_upgradable if b.pod == key), None)
    if glance.stopped:
        found = f"rollout stopped: {glance.reason}"
    elif blocked is not None:
        fields = "; ".join(blocked.fields)
        found = f"not upgradable in place: {fields} (compared with {blocked.compared_with}); recreate the pod"
    elif key in glance.excluded_by_selector:
        found = "outside spec.updateStrategy.selector"
    elif key in dict(glance.upgrading):
        found = f"being upgraded: {dict(glance.upgrading)[key]}"
    elif glance.stage in _STAGES:
        found = _STAGES[glance.stage]
    elif glance.stage is Stage.PARTITION:
        found = f"kept on the old revision by spec.updateStrategy.partition ({glance.reason})"
    elif glance.stage is Stage.WAITING:
        found = f"waiting for its turn: {glance.reason} (spec.updateStrategy.maxUnavailable)"
    else:
        found = f"rollout: {glance.reason}"
    return found + suffix
