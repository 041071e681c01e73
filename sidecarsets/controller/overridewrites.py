"""The leader's part in per-pod overrides: the in-place resizes a changed override asks for, and
the Events that tell a pod's owner what cannot be done.

A mixin of sidecarsets.controller.controller.Controller. What to resize, what is refused and which
env changes need a new pod are sidecarsets.rollout.podoverrides' pure decisions; here they are sent
(through the same pod writes as a rollout's resize: `pods/resize`, resourceVersion-guarded, with the
per-pod backoff) and said: a refused override and an env change are Warning Events on the pod
itself (`kubectl describe pod` shows them to the team that wrote the annotation), once per change;
a refused or infeasible resize is also in the SidecarSet's NotResizablePods Event and the pod's
SidecarSetUpgradable condition, with the rollout's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Collection, Mapping

from sidecarsets.controller.podwrites import PodWrites
from sidecarsets.pods.projection import PodProjection
from sidecarsets.rollout import planner, podoverrides, resize
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

REASON_REFUSED = "OverridesRefused"
REASON_RECREATE = "OverridesNeedRecreate"


class OverrideWrites(PodWrites):
    """Override resizes and Events for a controller that holds the state of PodWrites."""

    resize_served: bool
    # (SidecarSet, pod key, reason) -> the message of the last override Event: said once per change
    _override_said: dict[tuple[str, str, str], str]

    async def _writable(self, name: str) -> bool:
        raise NotImplementedError

    async def _with_overrides(
        self, ss: SidecarSet, matched: list[PodProjection], plan: planner.Plan, held_back: Collection[tuple[str, str]]
    ) -> planner.Plan:
        """Resize the pods at the current spec whose overrides changed, tell owners what cannot be
        done, and return `plan` with the refused resizes among its not-upgradable pods."""
        skip = {(u.namespace, u.name) for u in plan.upgrades} | set(plan.not_upgradable) | set(held_back)
        resizes, refused = podoverrides.resizes(ss, matched, skip=skip)
        if resizes and not self.resize_served:
            refused |= {(u.namespace, u.name): resize.NOT_SERVED for u in resizes}
            resizes = ()
        if refused:
            blocked = tuple(sorted({*plan.not_upgradable, *refused}))
            plan = dataclasses.replace(
                plan, not_upgradable=blocked, reasons=dict(sorted({**plan.reasons, **refused}.items()))
            )
        by_key = {p.key: p for p in matched}
        # Said on the pod too: the override refused, or the resize it asks for (its owner reads the pod).
        asked = {k: why for k, why in plan.reasons.items() if why.startswith(names.ANN_OVERRIDES) or k in refused}
        await self._say(ss, by_key, REASON_REFUSED, asked, "the pod's sidecars are left as they are")
        changes = podoverrides.env_changes(ss, matched)
        await self._say(ss, by_key, REASON_RECREATE, changes, "a running container cannot change its env: recreate it")
        if resizes and await self._writable(ss.name):
            await asyncio.gather(*(self._patch_pod(u) for u in resizes))
        return plan

    async def _say(
        self,
        ss: SidecarSet,
        pods: Mapping[tuple[str, str], PodProjection],
        reason: str,
        found: Mapping[tuple[str, str], str],
        tail: str,
    ) -> None:
        said = self._override_said
        keys = {(ss.name, "/".join(k), reason) for k in found}
        for key in [k for k in said if k[0] == ss.name and k[2] == reason and k not in keys]:
            del said[key]  # the pod is fine again, or gone: a later change is said again
        for pod_key, why in found.items():
            pod, key = pods.get(pod_key), (ss.name, "/".join(pod_key), reason)
            if pod is None or said.get(key) == why:
                continue
            said[key] = why
            meta = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
            await self.recorder.event(
                {"apiVersion": "v1", "kind": "Pod", "metadata": meta},
                type="Warning",
                reason=reason,
                message=f"{why}; {tail}",
            )
