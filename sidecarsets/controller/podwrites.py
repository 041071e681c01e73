"""The controller's writes to pods: in-place upgrade patches and the `SidecarSetUpgradable` condition.

A mixin of sidecarsets.controller.controller.Controller, apart from the reconcile logic that decides what to
write: these methods only carry a decision to the API server and keep the bookkeeping the next
pass depends on (expectations of our own writes, the per-pod failure backoff).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kuberuntime import api, events, kubeapi
from kuberuntime.api import rv_number
from kuberuntime.jsontypes import JsonObj
from sidecarsets.controller import metrics
from sidecarsets.controller.podfailures import PodFailures
from sidecarsets.pods.projection import PodProjection
from sidecarsets.rollout import planner, resize, upgradable
from sidecarsets.spec import names, podmeta
from sidecarsets.spec.model import SidecarSet

# These lines are the controller's own, and keep its logger name (log filters select it by name).
log = logging.getLogger("sidecarsets.controller")
# Pod patches in flight at once, across every reconcile. The client's pool is shared with the Lease
# renewal, status writes and the policy sync: a 10,000-pod rollout at maxUnavailable 100% once queued
# every patch on it, and the queued ones (the policy sync's writes behind them too) outlived the
# client's 30 s timeout. Half the pool keeps kube-apiserver as busy as a plain loop of the same
# patches (bench/bench_upgrade.py) and leaves the other half free.
POD_WRITES_IN_FLIGHT = kubeapi.POOL_SIZE // 2


def _tested_against(patch: list[JsonObj], pod: JsonObj) -> list[JsonObj]:
    """The patch with its leading resourceVersion test set to `pod`'s."""
    version = str((pod.get("metadata") or {}).get("resourceVersion") or "")
    return [{**patch[0], "value": version}, *patch[1:]]


def _same_but_status(a: JsonObj, b: JsonObj) -> bool:
    """Two reads of a pod that differ at most in status (and the resourceVersion that records it)."""

    def kept(pod: JsonObj) -> tuple[Any, ...]:
        meta = pod.get("metadata") or {}
        return (
            meta.get("uid"),
            meta.get("labels"),
            meta.get("annotations"),
            meta.get("deletionTimestamp"),
            pod.get("spec"),
        )

    return kept(a) == kept(b)


class PodWrites:
    """Pod patches and conditions for a controller that holds the state below."""

    client: api.Client
    recorder: events.EventRecorder
    clock: Callable[[], str]
    failures: PodFailures
    pods: dict[str, PodProjection]
    # pod key -> resourceVersion our last patch produced; planning waits until the cache has it.
    expected: dict[str, int]
    pod_writes: asyncio.Semaphore  # POD_WRITES_IN_FLIGHT

    async def _with_metadata(
        self, upgrade: planner.PodUpgrade, path: str
    ) -> tuple[list[JsonObj], JsonObj | None] | None:
        """The upgrade's patch plus its patchPodMetadata operations (and for a resize, the pod's new
        without-image hash), from the pod as it is now; None when the pod moved on since it was
        planned (the watch brings it; planned again). A resize is sent here, before the patch,
        which then tests the resourceVersion the resize produced; the resized pod comes back with it."""
        if not upgrade.metadata and not upgrade.without_image_hash:
            if not upgrade.resize:
                return upgrade.patch, None
            # A resize alone (a pod's override changed, sidecarsets.rollout.podoverrides): its patch
            # tests the resourceVersion planned, and nothing else is written.
            alone: JsonObj = await self.client.patch(f"{path}/resize", list(upgrade.resize), patch_type="json")
            metrics.INPLACE_UPGRADES.labels(*metrics.owner(upgrade.sidecarset), "resized").inc()
            return upgrade.patch, alone
        pod = await self.client.get(path)
        meta = pod.get("metadata") or {}
        if str(meta.get("resourceVersion")) != upgrade.resource_version:
            return None
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if isinstance(v, str)}
        ops, warnings = podmeta.upgrade_ops(annotations, upgrade.metadata, sidecarset=upgrade.sidecarset)
        for w in warnings:
            log.warning("pod %s/%s: %s", upgrade.namespace, upgrade.name, w)
        patch = upgrade.patch + ops
        if upgrade.without_image_hash:
            patch.append(resize.resize_record(upgrade, annotations.get(names.ANN_HASH_WITHOUT_IMAGE), now=self.clock()))
        if not upgrade.resize:
            return patch, None
        resized: JsonObj = await self.client.patch(f"{path}/resize", list(upgrade.resize), patch_type="json")
        metrics.INPLACE_UPGRADES.labels(*metrics.owner(upgrade.sidecarset), "resized").inc()
        return _tested_against(patch, resized), resized

    async def _send(self, path: str, patch: list[JsonObj], resized: JsonObj | None) -> JsonObj:
        """The patch; after a resize, once more if the kubelet's status write beat it.

        A kubelet reports a resize in the pod's status at once (PodResizeInProgress), which moves the
        resourceVersion the patch tests. If nothing but the status changed since the resize, the
        plan still holds: the patch goes again, testing the pod's new resourceVersion."""
        try:
            result: JsonObj = await self.client.patch(path, patch, patch_type="json")
            return result
        except (api.Conflict, api.Invalid):
            if resized is None:
                raise
            live = await self.client.get(path)
            if not _same_but_status(live, resized):
                raise
            result = await self.client.patch(path, _tested_against(patch, live), patch_type="json")
            return result

    async def _patch_pod(self, upgrade: planner.PodUpgrade) -> bool:
        async with self.pod_writes:
            return await self._patch_pod_now(upgrade)

    async def _patch_pod_now(self, upgrade: planner.PodUpgrade) -> bool:
        key = f"{upgrade.namespace}/{upgrade.name}"
        path = f"/api/v1/namespaces/{upgrade.namespace}/pods/{upgrade.name}"
        try:
            prepared = await self._with_metadata(upgrade, path)
            if prepared is None:
                metrics.INPLACE_UPGRADES.labels(*metrics.owner(upgrade.sidecarset), "conflict").inc()
                return False
            patch, resized = prepared
            result = await self._send(path, patch, resized) if patch or resized is None else resized
        except api.NotFound:
            metrics.INPLACE_UPGRADES.labels(*metrics.owner(upgrade.sidecarset), "gone").inc()
            self.failures.forget(key)
            return False
        except (api.Conflict, api.Invalid) as e:
            # Usually a failed resourceVersion test (the cache was behind, the watch catches up);
            # an admission policy refusing the patch looks the same, so it backs off like any failure.
            metrics.INPLACE_UPGRADES.labels(*metrics.owner(upgrade.sidecarset), "conflict").inc()
            failure = self.failures.failed(key, f"{e.status} {e.reason}: {e.message}"[:300])
            log.info("pod %s: patch refused (%s), attempt %d; backing off", key, e.reason, failure.count)
            return False
        except api.ApiError as e:
            metrics.INPLACE_UPGRADES.labels(*metrics.owner(upgrade.sidecarset), "error").inc()
            failure = self.failures.failed(key, f"{e.status} {e.reason}: {e.message}"[:300])
            log.warning("upgrading pod %s failed (attempt %d): %s", key, failure.count, e)
            return False
        self.failures.succeeded(key)
        written = rv_number(str((result.get("metadata") or {}).get("resourceVersion") or "0"))
        cached = self.pods.get(key)
        # The watch may have delivered our write before the response arrived: expect only what is missing.
        if cached is None or rv_number(cached.resource_version) < written:
            self.expected[key] = written
        metrics.INPLACE_UPGRADES.labels(*metrics.owner(upgrade.sidecarset), "patched").inc()
        return True

    async def _mark_upgradable(
        self,
        ss: SidecarSet,
        matched: list[PodProjection],
        not_upgradable: set[tuple[str, str]],
        reasons: Mapping[tuple[str, str], str] | None = None,
    ) -> None:
        """Set `SidecarSetUpgradable` on pods whose verdict changed, with an Event for new blockers
        (naming the reason where the plan gives one: a resize the API server or node would refuse)."""
        name = ss.name
        now = self.clock()
        newly_stuck: list[tuple[str, str]] = []
        # Pods of one workload share their condition tuple, so each distinct (condition, verdict)
        # is worked out once.
        verdicts: dict[tuple[tuple[str, ...], bool], tuple[JsonObj, bool]] = {}
        for pod in matched:
            blocked = bool(not_upgradable) and pod.key in not_upgradable
            if not pod.upgradable_condition and not blocked:
                continue  # no condition yet and nothing to report: do not write to every pod
            found = verdicts.get((pod.upgradable_condition, blocked))
            if found is None:
                cond = upgradable.upgradable_condition(pod, {name: blocked}, now=now)
                found = verdicts[(pod.upgradable_condition, blocked)] = (cond, upgradable.condition_current(pod, cond))
            cond, current = found
            if current:
                continue
            path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
            try:
                await self.client.patch(path, {"status": {"conditions": [cond]}}, patch_type="strategic")
            except api.ApiError as e:
                log.info("could not set %s on %s/%s: %s", names.POD_CONDITION_UPGRADABLE, *pod.key, e)
                continue
            if blocked:
                newly_stuck.append(pod.key)
        explained = [k for k in newly_stuck if reasons and k in reasons]
        plain = [k for k in newly_stuck if k not in explained]
        if plain:
            shown = ", ".join("/".join(k) for k in plain[:10]) + (" ..." if len(plain) > 10 else "")
            await self.recorder.event(
                ss.obj,
                type="Warning",
                reason="NotUpgradablePods",
                message=(
                    f"{len(plain)} pod(s) differ from the SidecarSet in more than the image and resources and cannot "
                    f"be upgraded in place; recreate them to pick up the change: {shown}"
                ),
            )
        if explained and reasons:
            shown = "; ".join(f"{'/'.join(k)}: {reasons[k]}" for k in explained[:10])
            await self.recorder.event(
                ss.obj,
                type="Warning",
                reason="NotResizablePods",
                message=f"{len(explained)} pod(s) cannot take the change in place: {shown}",
            )
