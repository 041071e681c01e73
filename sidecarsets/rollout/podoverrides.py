"""Running pods and their per-pod overrides: the bounds they must keep, the resizes a changed
override asks for, and the env changes only a new pod can take.

A pod asks for overrides by its annotation (sidecarsets.overrides); injection merged them and
recorded the env values it applied. Afterwards:

- **bounds**: a pod whose overrides fall outside what its SidecarSet now allows (bounds tightened,
  an env name dropped) is left as it is and counted not upgradable, with the refusal as reason,
  until its owner changes the annotation (`outside_bounds`, which the planner adds to its reasons);
- **resources**: a pod at its SidecarSet's current spec (its without-image hash is the spec's) whose
  sidecars do not run with the SidecarSet's values merged with its overrides is resized in place
  through `pods/resize`, with the same refusals as a rollout's resize (sidecarsets.rollout.resize:
  QoS class, memory limit under resizePolicy NotRequired, ...). Such a resize is the pod owner's
  request: it is not paced by maxUnavailable, though the pod counts unavailable while it lands.
  A pod behind the current spec takes its overrides with the rollout's resize;
- **env**: a running container's env cannot change, so a pod whose annotation asks for other env
  values than the record says were applied is reported (`env_changes`) as needing a recreate, and
  nothing is written.

Only pods that carry the annotation or the record are considered: the record keeps a pod whose
annotation was removed in view (its sidecars go back to the SidecarSet's values); a pod injected
without overrides is never resized by this module.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from sidecarsets.overrides import annotation, merge
from sidecarsets.pods import podstate
from sidecarsets.pods.projection import PodProjection
from sidecarsets.rollout import resize
from sidecarsets.spec.model import SidecarSet

if TYPE_CHECKING:
    from sidecarsets.rollout.planner import PodUpgrade


def _sidecars(ss: SidecarSet) -> tuple[str, ...]:
    return tuple(c.name for c in (*ss.containers, *ss.init_containers))


def _tracked(pod: PodProjection) -> bool:
    return pod.overrides is not None or pod.overrides_env is not None


def refusal(ss: SidecarSet, pod: PodProjection) -> str | None:
    """Why the pod's overrides of `ss`'s sidecars are refused now (None: allowed, or none asked)."""
    return merge.outside(ss, pod.overrides)


def outside_bounds(ss: SidecarSet, matched: Sequence[PodProjection]) -> dict[tuple[str, str], str]:
    """(namespace, name) -> the refusal, for every matched pod whose overrides `ss` no longer allows."""
    out: dict[tuple[str, str], str] = {}
    for pod in matched:
        if pod.overrides is not None and (why := refusal(ss, pod)) is not None:
            out[pod.key] = why
    return out


def resizes(
    ss: SidecarSet, matched: Sequence[PodProjection], *, skip: Collection[tuple[str, str]] = ()
) -> tuple[tuple[PodUpgrade, ...], dict[tuple[str, str], str]]:
    """The `pods/resize` of each pod at the current spec whose sidecars are not at the SidecarSet's
    values merged with its overrides, and the pods such a resize would be refused for (with why).
    Pods in `skip` (planned by the rollout this pass, or already not upgradable) are left out."""
    from sidecarsets.rollout.planner import PodUpgrade  # the planner reads this module's bounds

    upgrades: list[PodUpgrade] = []
    refused: dict[tuple[str, str], str] = {}
    for pod in sorted(matched, key=lambda p: p.key):
        if not _tracked(pod) or pod.key in skip or not podstate.is_active(pod) or not pod.container_statuses:
            continue
        entry = pod.hash_without_image_for(ss.name)
        if entry is None or entry.hash != ss.hash_without_image:
            continue  # behind the spec: the rollout brings its resources, overrides merged
        decision = resize.decide(ss, pod)
        if decision.refusal:
            refused[pod.key] = decision.refusal
        elif decision.steps:
            upgrades.append(PodUpgrade.of(pod, ss, [], resize=tuple(resize.resize_patch(pod, decision.steps))))
    return tuple(upgrades), refused


def env_changes(ss: SidecarSet, matched: Sequence[PodProjection]) -> dict[tuple[str, str], str]:
    """(namespace, name) -> the env vars of `ss`'s sidecars whose override changed since injection:
    only a new pod takes them. Pods whose annotation cannot be read are `outside_bounds`'s."""
    out: dict[tuple[str, str], str] = {}
    for pod in matched:
        if not _tracked(pod):
            continue
        found = annotation.parsed(pod.overrides)
        if isinstance(found, annotation.OverrideError):
            continue
        record = annotation.read_env_record(pod.overrides_env)
        changed: list[str] = []
        for name in _sidecars(ss):
            override = found.get(name)
            asked, applied = dict(override.env if override is not None else ()), record.get(name, {})
            for var in sorted(set(asked) | set(applied)):
                if asked.get(var) != applied.get(var):
                    was, now = applied.get(var), asked.get(var)
                    changed.append(f"{name} env {var}: {_shown(was)} -> {_shown(now)}")
        if changed:
            out[pod.key] = "; ".join(changed)
    return out


def _shown(value: str | None) -> str:
    return "(the SidecarSet's)" if value is None else annotation.shown(value)
