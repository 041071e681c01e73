"""The SidecarSet controller: status, revision history and in-place sidecar upgrades.

Level-triggered: watch events only put SidecarSet names on a work queue; a reconcile reads
the caches and converges, so a missed or repeated event cannot leave wrong state. All rollout
state lives on the pods (hash and in-place-state annotations) and on the SidecarSet (status),
so a new leader continues a rollout where the old one stopped.

Pod patches carry a `test` of the pod's resourceVersion: a patch planned from a stale cache
fails instead of landing twice. After patching, the controller waits until its cache has seen
its own writes ("expectations") before planning again; otherwise a stale cache would show the
patched pods as still ready and untouched, and the next plan could exceed maxUnavailable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from kuberuntime import api, events
from kuberuntime.clock import now_rfc3339
from kuberuntime.jsontypes import JsonObj
from kuberuntime.workqueue import WorkQueue, run_workers
from sidecarsets import deadline, history, metrics, names, planner, podmeta, status
from sidecarsets.model import SidecarSet
from sidecarsets.podfailures import PodFailures
from sidecarsets.projection import PodProjection

log = logging.getLogger(__name__)

SS_PATH = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"
RESYNC_SECONDS = 30.0
REPLAN_SECONDS = 0.05  # after a refused patch: plan the rest of the rollout without that pod


def _rv(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


class Controller:
    """Reconciles every SidecarSet; run it only while holding the leader Lease."""

    def __init__(
        self,
        client: api.Client,
        *,
        namespace: str,
        namespaces: Callable[[], Mapping[str, Mapping[str, str]]],
        revisions: Callable[[], Iterable[JsonObj]] | None = None,
        recorder: events.EventRecorder,
        workers: int = 3,
        clock: Callable[[], str] = now_rfc3339,
        may_write: Callable[[], Awaitable[bool]] | None = None,
        failures: PodFailures | None = None,
        conditions: Callable[[str], Iterable[Mapping[str, str]]] | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.namespaces = namespaces
        self.revisions = revisions
        self.recorder = recorder
        self.workers = workers
        self.clock = clock
        # Asked before every batch of writes: False once another replica holds the Lease.
        self.may_write = may_write
        self.failures = failures or PodFailures()
        # Conditions other parts own (PolicyInjection, from the policy sync), written with the status.
        self.conditions = conditions
        self.queue = WorkQueue()
        # Read tolerantly: a SidecarSet written before validation existed is still counted and reported.
        self.sidecarsets: dict[str, SidecarSet] = {}
        self.pods: dict[str, PodProjection] = {}
        self.pods_by_ss: dict[str, set[str]] = {}
        # pod key → resourceVersion our last patch produced; planning waits until the cache has it.
        self.expected: dict[str, int] = {}
        self.reconciles = 0
        # SidecarSet -> seconds until its next pod reaches the progress deadline (sidecarsets.deadline)
        self._deadline_check: dict[str, float] = {}

    # -- event handlers (informer callbacks; they only enqueue) --------------------------------
    def on_sidecarset(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        obj = new or old or {}
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind == "DELETED" or new is None:
            self.sidecarsets.pop(name, None)
            return
        self.sidecarsets[name] = SidecarSet.from_object(new, tolerant=True)
        old_gen = ((old or {}).get("metadata") or {}).get("generation")
        if old is None or old_gen != new.get("metadata", {}).get("generation"):
            self.queue.add(name)
        elif _progressing(old) != _progressing(new):
            self.queue.add(name)  # the stop condition removed by hand: the rollout resumes

    def refresh(self, which: Iterable[str]) -> None:
        """Reconcile these SidecarSets again (something their status reports has changed)."""
        for name in which:
            if name in self.sidecarsets:
                self.queue.add(name)

    def on_namespace(self, kind: str, old: Any, new: Any) -> None:
        if old != new:
            for name, ss in self.sidecarsets.items():
                if ss.namespace_selector is not None:
                    self.queue.add(name)

    def on_pod(self, kind: str, old: PodProjection | None, new: PodProjection | None) -> None:
        pod = new or old
        if pod is None:
            return
        key = f"{pod.namespace}/{pod.name}"
        before = set(old.injected) if old else set()
        after = set(new.injected) if new else set()
        if new is None:
            self.pods.pop(key, None)
            self.expected.pop(key, None)
            self.failures.forget(key)
        else:
            self.pods[key] = new
            exp = self.expected.get(key)
            if exp is not None and _rv(new.resource_version) >= exp:
                del self.expected[key]
        for ss in before - after:
            self.pods_by_ss.get(ss, set()).discard(key)
        for ss in after:
            self.pods_by_ss.setdefault(ss, set()).add(key)
        metrics.TRACKED_PODS.set(len(self.pods))
        for ss in before | after:
            if ss in self.sidecarsets:
                self.queue.add(ss)

    # -- reconcile -----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        for name in self.sidecarsets:
            self.queue.add(name)
        resync = asyncio.create_task(self._resync(stop))
        try:
            await run_workers(self.queue, self.reconcile, workers=self.workers, stop=stop)
        finally:
            resync.cancel()

    async def _resync(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(RESYNC_SECONDS)
            for name in list(self.sidecarsets):
                self.queue.add(name)

    def _pods_of(self, name: str) -> list[PodProjection]:
        return [p for k in self.pods_by_ss.get(name, ()) if (p := self.pods.get(k)) is not None]

    async def reconcile(self, name: str) -> float | None:
        """One pass for one SidecarSet; returns seconds until it wants another look, or None."""
        self.reconciles += 1
        ss = self.sidecarsets.get(name)
        if ss is None:
            metrics.RECONCILES.labels("success").inc()
            return None
        self._deadline_check.pop(name, None)
        try:
            result = await self._reconcile(ss)
        except Exception:
            metrics.RECONCILES.labels("error").inc()
            raise
        check = self._deadline_check.pop(name, None)
        if check is not None:  # a pod reaches its progress deadline then: look again at that moment
            result = check if result is None else min(result, check)
        metrics.RECONCILES.labels("requeue" if result is not None else "success").inc()
        return result

    async def _reconcile(self, ss: SidecarSet) -> float | None:
        name = ss.name
        pods = self._pods_of(name)
        matched = status.matched_pods(ss, pods, self.namespaces())
        in_use = {e.controller_revision for p in pods if (e := p.hash_for(name)) and e.controller_revision}
        cached = None if self.revisions is None else self.revisions()
        latest, collisions = await history.sync_history(
            self.client, ss, namespace=self.namespace, in_use=in_use, cached=cached
        )
        verdicts = status.evaluate(ss, matched)  # shared by the status and the plan: each pod is evaluated once
        new_status = status.compute_status(
            ss, matched, latest_revision=latest, collision_count=collisions, verdicts=verdicts
        )
        now = self.clock()
        for condition in self.conditions(name) if self.conditions is not None else ():
            status.set_condition(new_status, ss.status, condition, now=now)
        progress = deadline.progress(ss, matched, verdicts, revision=latest, now=_time(now))
        if progress.condition is not None:
            status.put_condition(new_status, progress.condition)
        metrics.ROLLOUT_STALLED.labels(name).set(1 if progress.stopped else 0)
        if progress.recheck is not None:
            self._deadline_check[name] = progress.recheck
        if status.status_changed(ss.status, new_status):
            if not await self._writable():
                return None
            await self._write_status(ss, new_status)
        if progress.newly_overdue:
            await self._report_stall(ss, progress)
        if progress.stopped:
            return None  # no pod is touched; a spec change or the condition's removal brings it back

        stale = [k for k in self.expected if k in self.pods_by_ss.get(name, ())]
        if stale:
            return 0.5  # our own pod writes are not in the cache yet: plan again once they are
        plan = planner.plan_upgrade(
            ss, matched, revision=latest, now=self.clock(), verdicts=verdicts, held_back=self.failures.held_back()
        )
        await self._mark_upgradable(ss, matched, set(plan.not_upgradable))
        if plan.not_upgradable:
            metrics.PODS_NOT_UPGRADABLE.labels(name).set(len(plan.not_upgradable))
        else:
            metrics.PODS_NOT_UPGRADABLE.labels(name).set(0)
        if plan.upgrades or plan.stage is planner.Stage.WAITING:
            log.info(
                "rollout: %s (unavailable %d/%d, matched %d): %s",
                plan.reason,
                plan.unavailable,
                plan.max_unavailable,
                len(matched),
                ", ".join(f"{u.namespace}/{u.name}" for u in plan.upgrades),
                extra={"sidecarset": name},
            )
        backing_off = self.failures.next_retry(self.pods_by_ss.get(name, ()))
        if not plan.upgrades:
            if plan.done:
                return None
            return RESYNC_SECONDS if backing_off is None else min(RESYNC_SECONDS, backing_off + 0.05)
        if not await self._writable():
            return None
        results = await asyncio.gather(*(self._patch_pod(u) for u in plan.upgrades))
        if any(results) and plan.stage is planner.Stage.FLIPPING:
            await self.recorder.event(
                ss.obj,
                type="Normal",
                reason="ResetContainerSucceed",
                message="HotUpgrade: the old containers of upgraded pairs are reset to the empty image",
            )
        elif any(results):
            await self.recorder.event(
                ss.obj,
                type="Normal",
                reason="SidecarUpgrade",
                # One message per revision, so repeats aggregate into one Event's count.
                message=f"upgrading sidecar images in place to revision {latest}",
            )
        await self._report_failures(ss, plan.upgrades)
        if any(f"{u.namespace}/{u.name}" in self.failures for u in plan.upgrades):
            # A refused pod now waits out its backoff, held back from the plan: plan again at once, so
            # the rollout goes on with the other pods instead of idling until that pod's retry.
            return REPLAN_SECONDS
        retry = self.failures.next_retry(f"{u.namespace}/{u.name}" for u in plan.upgrades)
        return None if retry is None else retry + 0.05

    async def _writable(self) -> bool:
        if self.may_write is None or await self.may_write():
            return True
        log.warning("not writing: this replica no longer holds the Lease")
        return False

    async def _report_failures(self, ss: SidecarSet, upgrades: Iterable[planner.PodUpgrade]) -> None:
        for upgrade in upgrades:
            key = f"{upgrade.namespace}/{upgrade.name}"
            failure = self.failures.to_report(key)
            if failure is None:
                continue
            await self.recorder.event(
                ss.obj,
                type="Warning",
                reason="UpgradeFailed",
                message=(
                    f"pod {key}: the in-place upgrade was refused {failure.count} times ({failure.reason}); "
                    "it is retried with backoff while the rollout goes on with other pods"
                ),
            )

    async def _report_stall(self, ss: SidecarSet, progress: deadline.Progress) -> None:
        late = progress.newly_overdue
        shown = ", ".join(f"{o.key} ({o.why})" for o in late[:10]) + (" ..." if len(late) > 10 else "")
        log.warning(
            "rollout stopped: %d upgraded pod(s) not ready within the progress deadline: %s",
            len(late),
            shown,
            extra={"sidecarset": ss.name},
        )
        await self.recorder.event(
            ss.obj,
            type="Warning",
            reason=names.REASON_DEADLINE_EXCEEDED,
            message=f"rollout stopped: {len(late)} upgraded pod(s) not ready within "
            f"{ss.update_strategy.progress_deadline_seconds}s: {shown}",
        )

    async def _write_status(self, ss: SidecarSet, new_status: JsonObj) -> None:
        name = ss.name
        body = {"metadata": {"resourceVersion": ss.resource_version}, "status": new_status}
        try:
            updated = await self.client.patch(f"{SS_PATH}/{name}/status", body, patch_type="merge")
            # Keep the cache current so the next pass does not write the same status again.
            if name in self.sidecarsets:
                self.sidecarsets[name] = SidecarSet.from_object(updated, tolerant=True)
        except api.Conflict:
            raise  # the watch brings the newer object; the queue retries with backoff
        except api.NotFound:
            self.sidecarsets.pop(name, None)

    async def _with_metadata(self, upgrade: planner.PodUpgrade, path: str) -> list[JsonObj] | None:
        """The upgrade's patch plus its patchPodMetadata operations, from the pod as it is now;
        None when the pod moved on since it was planned (the watch brings it; planned again)."""
        if not upgrade.metadata:
            return upgrade.patch
        pod = await self.client.get(path)
        meta = pod.get("metadata") or {}
        if str(meta.get("resourceVersion")) != upgrade.resource_version:
            return None
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if isinstance(v, str)}
        ops, warnings = podmeta.upgrade_ops(annotations, upgrade.metadata, sidecarset=upgrade.sidecarset)
        for w in warnings:
            log.warning("pod %s/%s: %s", upgrade.namespace, upgrade.name, w)
        return upgrade.patch + ops

    async def _patch_pod(self, upgrade: planner.PodUpgrade) -> bool:
        key = f"{upgrade.namespace}/{upgrade.name}"
        path = f"/api/v1/namespaces/{upgrade.namespace}/pods/{upgrade.name}"
        try:
            patch = await self._with_metadata(upgrade, path)
            if patch is None:
                metrics.INPLACE_UPGRADES.labels("conflict").inc()
                return False
            result = await self.client.patch(path, patch, patch_type="json")
        except api.NotFound:
            metrics.INPLACE_UPGRADES.labels("gone").inc()
            self.failures.forget(key)
            return False
        except (api.Conflict, api.Invalid) as e:
            # Usually a failed resourceVersion test (the cache was behind, the watch catches up);
            # an admission policy refusing the patch looks the same, so it backs off like any failure.
            metrics.INPLACE_UPGRADES.labels("conflict").inc()
            failure = self.failures.failed(key, f"{e.status} {e.reason}: {e.message}"[:300])
            log.info("pod %s: patch refused (%s), attempt %d; backing off", key, e.reason, failure.count)
            return False
        except api.ApiError as e:
            metrics.INPLACE_UPGRADES.labels("error").inc()
            failure = self.failures.failed(key, f"{e.status} {e.reason}: {e.message}"[:300])
            log.warning("upgrading pod %s failed (attempt %d): %s", key, failure.count, e)
            return False
        self.failures.succeeded(key)
        written = _rv(str((result.get("metadata") or {}).get("resourceVersion") or "0"))
        cached = self.pods.get(key)
        # The watch may have delivered our write before the response arrived: expect only what is missing.
        if cached is None or _rv(cached.resource_version) < written:
            self.expected[key] = written
        metrics.INPLACE_UPGRADES.labels("patched").inc()
        return True

    async def _mark_upgradable(self, ss: SidecarSet, matched: list[PodProjection], stuck: set[tuple[str, str]]) -> None:
        """Set `SidecarSetUpgradable` on pods whose verdict changed, with an Event for new blockers."""
        name = ss.name
        now = self.clock()
        newly_stuck: list[str] = []
        # Pods of one workload share their condition tuple, so each distinct (condition, verdict)
        # is worked out once.
        verdicts: dict[tuple[tuple[str, ...], bool], tuple[JsonObj, bool]] = {}
        for pod in matched:
            blocked = bool(stuck) and pod.key in stuck
            if not pod.upgradable_condition and not blocked:
                continue  # no condition yet and nothing to report: do not write to every pod
            found = verdicts.get((pod.upgradable_condition, blocked))
            if found is None:
                cond = planner.upgradable_condition(pod, {name: blocked}, now=now)
                found = verdicts[(pod.upgradable_condition, blocked)] = (cond, planner.condition_current(pod, cond))
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
                newly_stuck.append(f"{pod.namespace}/{pod.name}")
        if newly_stuck:
            shown = ", ".join(newly_stuck[:10]) + (" ..." if len(newly_stuck) > 10 else "")
            await self.recorder.event(
                ss.obj,
                type="Warning",
                reason="NotUpgradablePods",
                message=(
                    f"{len(newly_stuck)} pod(s) differ from the SidecarSet in more than the image and cannot be "
                    f"upgraded in place; recreate them to pick up the change: {shown}"
                ),
            )


def _progressing(obj: JsonObj | None) -> Any:
    """The Progressing condition of a SidecarSet object, or None."""
    status = (obj or {}).get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, dict) and c.get("type") == names.CONDITION_PROGRESSING:
            return c
    return None


def _time(value: str) -> datetime:
    return deadline.parse_time(value) or datetime.now(UTC)
