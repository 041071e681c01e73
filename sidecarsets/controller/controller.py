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
from kuberuntime.api import rv_number
from kuberuntime.clock import now_rfc3339
from kuberuntime.jsontypes import JsonObj, resolve
from kuberuntime.workqueue import WorkQueue, run_workers
from sidecarsets.controller import history, metrics, reports, tenants
from sidecarsets.controller.leasereads import LeaseReads
from sidecarsets.controller.overridewrites import OverrideWrites
from sidecarsets.controller.passpace import POD_PACE, PassPace
from sidecarsets.controller.podfailures import PodFailures
from sidecarsets.controller.podwrites import POD_WRITES_IN_FLIGHT
from sidecarsets.pods import podstate
from sidecarsets.pods.projection import PodProjection
from sidecarsets.rollout import deadline, planner, resize, status
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet, object_key, status_path
from sidecarsets.spec.revisions import owner_name

log = logging.getLogger("sidecarsets.controller")

SS_PATH = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"
# Every NamespacedSidecarSet, watched across namespaces (one version: v1beta1).
NSS_PATH = f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/{names.NAMESPACED_PLURAL}"
RESYNC_SECONDS = 30.0
REPLAN_SECONDS = 0.05  # after a refused patch: plan the rest of the rollout without that pod


class Controller(OverrideWrites):
    """Reconciles every SidecarSet; run it only while holding the leader Lease."""

    def __init__(
        self,
        client: api.Client,
        *,
        namespace: str,
        namespaces: Callable[[], Mapping[str, Mapping[str, str]]],
        revisions: Callable[[str], Iterable[JsonObj]] | None = None,
        recorder: events.EventRecorder,
        workers: int = 3,
        clock: Callable[[], str] = now_rfc3339,
        may_write: Callable[[], Awaitable[bool]] | None = None,
        failures: PodFailures | None = None,
        conditions: Callable[[str], Iterable[Mapping[str, str]]] | None = None,
        pod_pace: float = POD_PACE,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.namespaces = namespaces
        self.revisions = revisions
        self.recorder = recorder
        self.workers = workers
        self.clock = clock
        # Asked before a reconcile's writes: False once another replica holds the Lease.
        self.lease = LeaseReads(may_write)
        self.failures = failures or PodFailures()
        self.pod_writes = asyncio.Semaphore(POD_WRITES_IN_FLIGHT)
        # Conditions other parts own (PolicyInjection, from the policy sync), written with the status.
        self.conditions = conditions
        self.queue = WorkQueue(name="sidecarset")
        # Read tolerantly: a SidecarSet written before validation existed is still counted and reported.
        self.sidecarsets: dict[str, SidecarSet] = {}
        self.pods: dict[str, PodProjection] = {}
        # SidecarSet -> its pods' keys -> their projections, in the order first seen. A reconcile walks
        # one SidecarSet's pods several times: through this dict it reads them in a stable order that
        # follows their allocation, where a set of keys looked up in `pods` read them in hash order
        # (at 50,000 pods a full reconcile cost 1.8x per pod what it did at 5,000, from cache misses).
        self.pods_by_ss: dict[str, dict[str, PodProjection]] = {}
        # pod key → resourceVersion our last patch produced; planning waits until the cache has it.
        self.expected: dict[str, int] = {}
        self.reconciles = 0
        # SidecarSet -> seconds until its next pod reaches the progress deadline (sidecarsets.rollout.deadline)
        self._deadline_check: dict[str, float] = {}
        # SidecarSet -> (its spec and revisions, as seen, -> the without-image hashes it resizes from)
        self._resizable: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {}
        # Whether the API server serves pods/resize (discovery, kept by the composition root).
        self.resize_served = True
        self._override_said: dict[tuple[str, str, str], str] = {}  # sidecarsets.controller.overridewrites
        self.pace = PassPace(self.queue, pace=pod_pace)  # 0: a pod event queues a pass at once

    # -- event handlers (informer callbacks; they only enqueue) --------------------------------
    def on_sidecarset(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        name = object_key(new or old)
        if kind == "DELETED" or new is None:
            self.sidecarsets.pop(name, None)
            self.queue.add(name)  # its reconcile drops its metric series (after one in flight, if any)
            return
        self.sidecarsets[name] = SidecarSet.from_object(new, tolerant=True)
        old_gen = ((old or {}).get("metadata") or {}).get("generation")
        if old is None or old_gen != new.get("metadata", {}).get("generation"):
            self.queue.add(name)
            if "/" not in name:  # a cluster SidecarSet may now take a NamespacedSidecarSet's names
                self.refresh([key for key in self.sidecarsets if "/" in key])
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
        # What this key was filed under: the informer's old object and the projection held here (they
        # agree, but an entry left behind would hold a stale projection that still counts).
        held = self.pods.get(key)
        before = {*(old.injected if old else ()), *(held.injected if held else ())}
        after = set(new.injected) if new else set()
        if new is None:
            self.pods.pop(key, None)
            self.expected.pop(key, None)
            self.failures.forget(key)
        else:
            self.pods[key] = new
            exp = self.expected.get(key)
            if exp is not None and rv_number(new.resource_version) >= exp:
                del self.expected[key]
        for ss in before - after:
            self.pods_by_ss.get(ss, {}).pop(key, None)
        if new is not None:
            for ss in after:
                self.pods_by_ss.setdefault(ss, {})[key] = new
        metrics.TRACKED_PODS.set(len(self.pods))
        for ss in before | after:
            if ss in self.sidecarsets:
                self.pace.pod_event(ss)

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
        return list(self.pods_by_ss.get(name, {}).values())

    async def reconcile(self, name: str) -> float | None:
        """One pass for one SidecarSet; returns seconds until it wants another look, or None."""
        self.reconciles += 1
        ss = self.sidecarsets.get(name)
        if ss is None:
            metrics.forget(name)
            self._resizable.pop(name, None)
            self.pace.forget(name)
            self.lease.forget(name)
            return None
        self._deadline_check.pop(name, None)
        self.pace.began(name)
        self.lease.began(name, ss.status, ss.generation)
        try:
            with metrics.RECONCILE_DURATION.time():
                result = await self._reconcile(ss)
        except Exception:
            metrics.RECONCILES.labels(*metrics.owner(name), "error").inc()
            raise
        finally:
            self.pace.ended(name)
            self.lease.ended(name)
        check = self._deadline_check.pop(name, None)
        if check is not None:  # a pod reaches its progress deadline then: look again at that moment
            result = check if result is None else min(result, check)
        metrics.RECONCILES.labels(*metrics.owner(name), "requeue" if result is not None else "success").inc()
        return result

    async def _reconcile(self, ss: SidecarSet) -> float | None:
        pods = self._pods_of(ss.name)
        matched = status.matched_pods(ss, pods, self.namespaces())
        synced = await self._sync_status(ss, pods, matched)
        if synced is None:
            return None
        latest, verdicts, revisions = synced
        if self._moved(ss.name, pods):
            # The awaits above (revision history, the Lease read, the status write) let the watch
            # deliver meanwhile, our own last pod patches among them, which clears their expectations;
            # a plan from the older snapshot would count those pods as unpatched and available again,
            # patching them twice (refused by the resourceVersion test) or others past maxUnavailable.
            pods = self._pods_of(ss.name)
            matched = status.matched_pods(ss, pods, self.namespaces())
            verdicts = status.pod_verdicts(ss, matched)
        return await self._roll_out(ss, matched, latest=latest, verdicts=verdicts, revisions=revisions)

    def _moved(self, name: str, snapshot: list[PodProjection]) -> bool:
        """Whether the cache's pods of SidecarSet `name` are no longer exactly `snapshot`."""
        now = self.pods_by_ss.get(name, {})
        return len(now) != len(snapshot) or any(now.get(f"{p.namespace}/{p.name}") is not p for p in snapshot)

    async def _sync_status(
        self, ss: SidecarSet, pods: list[PodProjection], matched: list[PodProjection]
    ) -> tuple[str, podstate.Verdicts, list[JsonObj]] | None:
        """Revision history and status brought up to date; (latest revision, the pods' verdicts, the
        revisions as read before the history's writes) to plan with, or None when no pod is to be
        touched now (writes are not ours, or the rollout stopped)."""
        name = ss.name
        in_use = {e.controller_revision for p in pods if (e := p.hash_for(name)) and e.controller_revision}
        namespace = history.revisions_namespace(ss, self.namespace)
        cached: list[JsonObj] | None = None
        if ss.namespaced:  # the cache holds the manager namespace's only: a tenant's are listed, once
            cached = await history.list_revisions(self.client, ss, namespace=namespace)
        elif self.revisions is not None:
            cached = list(self.revisions(owner_name(ss)))
        latest, collisions = await history.sync_history(
            self.client, ss, namespace=namespace, in_use=in_use, cached=cached
        )
        verdicts = status.pod_verdicts(ss, matched)  # shared by the status and the plan: each pod is evaluated once
        new_status = status.compute_status(
            ss, matched, latest_revision=latest, collision_count=collisions, verdicts=verdicts
        )
        now = self.clock()
        for condition in self.conditions(name) if self.conditions is not None else ():
            status.set_condition(new_status, ss.status, condition, now=now)
        if ss.namespaced:  # a cluster SidecarSet that takes its names wins them in its pods
            labels = self.namespaces().get(ss.namespace)
            found = self.sidecarsets.values()
            await tenants.report_cluster_conflict(
                self.recorder, ss, new_status, sidecarsets=found, namespace_labels=labels, now=now
            )
        progress = deadline.progress(ss, matched, verdicts, revision=latest, now=_time(now))
        if progress.condition is not None:
            status.put_condition(new_status, progress.condition)
        metrics.ROLLOUT_STALLED.labels(*metrics.owner(name)).set(1 if progress.stopped else 0)
        metrics.set_pod_counts(name, new_status)
        if progress.recheck is not None:
            self._deadline_check[name] = progress.recheck
        if status.status_changed(ss.status, new_status):
            if not await self._writable(name):
                return None
            await self._write_status(ss, new_status)
        if progress.newly_overdue:
            await reports.rollout_stalled(self.recorder, ss, progress)
        if progress.stopped:
            return None  # no pod is touched; a spec change or the condition's removal brings it back
        return latest, verdicts, cached or []

    async def _roll_out(
        self,
        ss: SidecarSet,
        matched: list[PodProjection],
        *,
        latest: str,
        verdicts: podstate.Verdicts,
        revisions: list[JsonObj],
    ) -> float | None:
        """Plan the next step of the rollout and patch its pods; returns when to look again, or None."""
        name = ss.name
        stale = [k for k in self.expected if k in self.pods_by_ss.get(name, ())]
        if stale:
            return 0.5  # our own pod writes are not in the cache yet: plan again once they are
        held_back = self.failures.held_back()
        plan = planner.plan_upgrade(
            ss,
            matched,
            revision=latest,
            now=self.clock(),
            verdicts=verdicts,
            held_back=held_back,
            resizable=self._resizable_from(ss, revisions),
            resize_refusal=None if self.resize_served else resize.NOT_SERVED,
        )
        plan = await self._with_overrides(ss, matched, plan, held_back)
        await self._mark_upgradable(ss, matched, set(plan.not_upgradable), plan.reasons)
        if plan.not_upgradable:
            metrics.PODS_NOT_UPGRADABLE.labels(*metrics.owner(name)).set(len(plan.not_upgradable))
        else:
            metrics.PODS_NOT_UPGRADABLE.labels(*metrics.owner(name)).set(0)
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
        if not await self._writable(name):
            return None
        return await self._upgrade(ss, plan, latest=latest)

    def _resizable_from(self, ss: SidecarSet, mine: list[JsonObj]) -> frozenset[str]:
        """Without-image hashes of this SidecarSet's revisions (`mine`) that differ from its spec only in
        images and resources (sidecarsets.rollout.resize): worked out again only when either changes."""
        seen = (ss.hash_without_resources, *sorted(str((r.get("metadata") or {}).get("resourceVersion")) for r in mine))
        cached = self._resizable.get(ss.name)
        if cached is not None and cached[0] == seen:
            return cached[1]
        specs = [spec for r in mine if isinstance(spec := (r.get("data") or {}).get("spec"), Mapping)]
        found = resize.resizable_hashes(ss, specs)
        self._resizable[ss.name] = (seen, found)
        return found

    async def _upgrade(self, ss: SidecarSet, plan: planner.Plan, *, latest: str) -> float | None:
        """Patch the plan's pods and report how it went; returns when to look again, or None."""
        self.pace.began_patching(ss.name)
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
        await reports.upgrade_failures(self.recorder, self.failures, ss, plan.upgrades)
        if any(f"{u.namespace}/{u.name}" in self.failures for u in plan.upgrades):
            # A refused pod now waits out its backoff, held back from the plan: plan again at once, so
            # the rollout goes on with the other pods instead of idling until that pod's retry.
            return REPLAN_SECONDS
        retry = self.failures.next_retry(f"{u.namespace}/{u.name}" for u in plan.upgrades)
        return None if retry is None else retry + 0.05

    async def _writable(self, name: str) -> bool:
        if await self.lease.writable(name):
            return True
        log.warning("not writing: this replica no longer holds the Lease")
        return False

    async def _write_status(self, ss: SidecarSet, new_status: JsonObj) -> None:
        name = ss.name
        body = {"metadata": {"resourceVersion": ss.resource_version}, "status": new_status}
        try:
            updated = await self.client.patch(status_path(ss), body, patch_type="merge")
            # Keep the cache current so the next pass does not write the same status again, unless
            # the watch has already brought a newer object while the patch was on its way back: that
            # one stays (keeping ours would plan with an older spec and make every status write conflict).
            cached = self.sidecarsets.get(name)
            fresh = SidecarSet.from_object(updated, tolerant=True)
            if cached is not None and rv_number(fresh.resource_version) >= rv_number(cached.resource_version):
                self.sidecarsets[name] = fresh
        except api.Conflict:
            raise  # the watch brings the newer object; the queue retries with backoff
        except api.NotFound:
            self.sidecarsets.pop(name, None)


def _progressing(obj: JsonObj | None) -> Any:
    """The Progressing condition of a SidecarSet object, or None."""
    conditions = resolve(obj, "status", "conditions")
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, dict) and c.get("type") == names.CONDITION_PROGRESSING:
            return c
    return None


def _time(value: str) -> datetime:
    return deadline.parse_time(value) or datetime.now(UTC)
