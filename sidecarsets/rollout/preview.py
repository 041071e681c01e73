"""What the controller would do with a SidecarSet spec, worked out without touching the cluster.

`sidecarctl preview` answers "what happens if I apply this?" and `sidecarctl status` "where does the
rollout stand?". Both must give the controller's own answers, not a second opinion that drifts from
it, so nothing here decides anything the planner decides.

The answers are found in the rollout simulated with the planner (sidecarsets.rollout.rolloutsim,
on the pod copies of sidecarsets.rollout.simnode), the planner's verdicts explained
(sidecarsets.rollout.specdiff: which container fields stop a pod from being upgraded in place, how
the file's containers differ from the stored ones), and, here, which pods the spec no longer owns
and the revision it would be recorded as. Pure functions of JSON objects; the CLI does the reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kuberuntime.jsontypes import JsonObj, resolve
from sidecarsets.pods import podstate
from sidecarsets.pods.podkeys import projection_key
from sidecarsets.pods.projection import PodProjection
from sidecarsets.rollout import status
from sidecarsets.spec import names, revisions, selectors
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.sidecar import hot_pair

# ---------------------------------------------------------------------------------------------
# The revision


def would_be_revision(ss: SidecarSet, stored_revisions: Iterable[Mapping[str, Any]]) -> str:
    """The ControllerRevision name the controller would record for this spec: an existing revision
    with the same data (which it reuses), else the name it would create."""
    data = revisions.revision_data(ss)
    owner = revisions.owner_name(ss)
    for r in stored_revisions:
        if resolve(r, "metadata", "labels", names.REVISION_LABEL_SIDECARSET) == owner and r.get("data") == data:
            return str(resolve(r, "metadata", "name"))
    return revisions.revision_name(owner, revisions.revision_hash(data, ss.collision_count))


# ---------------------------------------------------------------------------------------------
# Pods the spec does not (or no longer) own


@dataclass(frozen=True)
class Unowned:
    pod: str
    reason: str

    def as_json(self) -> JsonObj:
        return {"pod": self.pod, "reason": self.reason}


def unowned_pods(
    ss: SidecarSet, pods: Iterable[PodProjection], namespace_labels: Mapping[str, Mapping[str, str]]
) -> tuple[list[Unowned], list[Unowned]]:
    """(pods injected by it that this spec does not match, pods it selects that it never injected).

    Neither kind is upgraded: the controller owns only active pods whose injected list names the
    SidecarSet and that carry all of its sidecars (sidecarsets.rollout.status.matched_pods).
    """
    matched = {projection_key(p) for p in status.matched_pods(ss, list(pods), namespace_labels)}
    cold, hot, native, hot_init = ss.cold_names, ss.hot_names, ss.native_init_names, ss.hot_init_names
    dropped: list[Unowned] = []
    never: list[Unowned] = []
    for p in pods:
        key = projection_key(p)
        if key in matched or not podstate.is_active(p):
            continue
        in_ns = ss.matches_namespace(p.namespace, namespace_labels.get(p.namespace))
        selected = in_ns and not selectors.is_empty(ss.selector) and ss.matches_pod(p.labels)
        if ss.name not in p.injected:
            if selected:
                never.append(Unowned(key, "never injected by it (created before it, or not admitted through it)"))
            continue
        if not in_ns:
            dropped.append(Unowned(key, "its namespace is no longer in the SidecarSet's scope"))
        elif not selected:
            dropped.append(Unowned(key, "the selector no longer matches its labels"))
        elif not podstate.has_sidecars(p, cold=cold, hot=hot, native_init=native, hot_init=hot_init):
            have = {n for n, _ in (*p.containers, *p.init_containers)}
            missing = [n for n in (*cold, *native) if n not in have] + [
                n for n in (*hot, *hot_init) if hot_pair(n)[0] not in have
            ]
            dropped.append(
                Unowned(key, f"lacks sidecar(s) {', '.join(missing) or '?'} of this spec: only a new pod gets them")
            )
    dropped.sort(key=lambda u: u.pod)
    never.sort(key=lambda u: u.pod)
    return dropped, never
