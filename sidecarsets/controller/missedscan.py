"""The leader's periodic look for pods that run without the sidecars their SidecarSets select.

Without watching every pod of the cluster: pods injected by some SidecarSet are already in the
controller's cache (label `sidecarctl.io/injected=true`), and the others are listed once per
period, per namespace labelled for injection, with the label selector `!sidecarctl.io/injected`
(in pages). What it finds (sidecarsets.pods.missed) is reported as the gauge
`sidecarctl_pods_missing_sidecars{sidecarset}`, a `PodsMissingSidecars` condition on each
SidecarSet (written with its status), and an Event naming the pods the first time they are seen.

Optionally (`--recreate-missed`, off by default) such pods that belong to a controller are evicted
through the Eviction API, which honours PodDisruptionBudgets, at a bounded rate, so their
controller recreates them through admission, injected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from kuberuntime import api, events
from kuberuntime.clock import sleep_or_stop
from kuberuntime.jsontypes import resolve
from sidecarsets.controller import metrics
from sidecarsets.pods import missed
from sidecarsets.pods.projection import PodProjection
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

log = logging.getLogger("sidecarsets.missedscan")

CONDITION = names.CONDITION_MISSING_SIDECARS
SHOWN = 10  # pods named in a condition or Event message


def condition(found: list[missed.MissedPod]) -> dict[str, str]:
    """The PodsMissingSidecars condition for one SidecarSet (True while some pod lacks its sidecars)."""
    if not found:
        return {
            "type": CONDITION,
            "status": "False",
            "reason": "AllPodsInjected",
            "message": "every running pod it selects in a labelled namespace has its sidecars",
        }
    named = ", ".join(f"{m.key} ({m.reason})" for m in found[:SHOWN])
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    return {
        "type": CONDITION,
        "status": "True",
        "reason": "PodsWithoutSidecars",
        "message": f"{len(found)} running pod(s) without its sidecars: {named}{more}",
    }


def _facts(pod: PodProjection) -> missed.PodFacts:
    return missed.PodFacts(
        namespace=pod.namespace,
        name=pod.name,
        labels=pod.labels,
        injected=pod.injected,
        created=pod.creation_timestamp,
        phase=pod.phase,
        deleting=pod.deleting,
        owned=False,  # the projection keeps no owners; read from the pod before any eviction
    )


class RateLimit:
    """A token bucket: at most `per_minute` takes per minute, `burst` at once."""

    def __init__(self, per_minute: float, *, burst: int = 1, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.tokens = float(burst)
        self.monotonic = monotonic
        self.at = monotonic()

    def take(self) -> bool:
        now = self.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class MissedScan:
    def __init__(
        self,
        client: api.Client,
        *,
        manager_namespace: str,
        sidecarsets: Callable[[], Mapping[str, SidecarSet]],
        namespaces: Callable[[], Mapping[str, Mapping[str, str]]],
        injected_pods: Callable[[], Iterable[PodProjection]],
        recorder: events.EventRecorder,
        interval: float = 60.0,
        recreate: bool = False,
        recreate_per_minute: float = 6.0,
        on_change: Callable[[set[str]], None] | None = None,
        may_write: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.client = client
        self.manager_namespace = manager_namespace
        self.sidecarsets = sidecarsets
        self.namespaces = namespaces
        self.injected_pods = injected_pods
        self.recorder = recorder
        self.interval = interval
        self.recreate = recreate
        self.limit = RateLimit(recreate_per_minute)
        self.on_change = on_change
        self.may_write = may_write
        self.missing: dict[str, list[missed.MissedPod]] = {}
        self.scans = 0
        self.evicted: list[tuple[float, str]] = []  # (monotonic time, pod): the recreate rate, observable

    def condition_of(self, sidecarset: str) -> dict[str, str] | None:
        """The condition to write; None (none at all) for a SidecarSet that never missed a pod, so
        the scan adds no status write to every SidecarSet it looks at."""
        found = self.missing.get(sidecarset)
        if found is None:
            return None
        if not found:
            ss = self.sidecarsets().get(sidecarset)
            had = ss is not None and any(
                isinstance(c, Mapping) and c.get("type") == CONDITION for c in ss.status.get("conditions") or []
            )
            if not had:
                return None
        return condition(found)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.scan_once()
            except (api.ApiError, OSError, TimeoutError) as e:
                log.warning("missed-injection scan failed: %s", e)
            if await sleep_or_stop(stop, self.interval):
                return

    async def _unlabelled_pods(self, namespace: str) -> list[missed.PodFacts]:
        out: list[missed.PodFacts] = []
        params: dict[str, str | int] = {"labelSelector": f"!{names.POD_INJECTED_LABEL}", "limit": 500}
        path = f"/api/v1/namespaces/{namespace}/pods"
        while True:
            listing = await self.client.get(path, params=params)
            out += [missed.PodFacts.of(p) for p in listing.get("items") or [] if isinstance(p, dict)]
            token = resolve(listing, "metadata", "continue")
            if not token:
                return out
            params = {**params, "continue": str(token)}

    async def _label_times(self, namespaces: Iterable[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for ns in namespaces:
            listing = await self.client.get("/api/v1/namespaces", params={"fieldSelector": f"metadata.name={ns}"})
            for obj in listing.get("items") or []:
                if not isinstance(obj, dict) or resolve(obj, "metadata", "name") != ns:
                    continue
                when = missed.label_time(obj)
                if when is not None:
                    out[ns] = when
        return out

    async def scan_once(self) -> dict[str, list[missed.MissedPod]]:
        self.scans += 1
        labels = dict(self.namespaces())
        labelled = sorted(
            ns
            for ns, ls in labels.items()
            if ls.get(names.NS_INJECTION_LABEL) == names.NS_INJECTION_ENABLED
            and ns not in names.SYSTEM_NAMESPACES
            and ns != self.manager_namespace
        )
        facts = [_facts(p) for p in self.injected_pods()]
        for ns in labelled:
            facts += await self._unlabelled_pods(ns)
        sets = list(self.sidecarsets().values())
        found = missed.find_missing(facts, sets, labels, manager_namespace=self.manager_namespace)
        with_missing = {m.namespace for pods in found.values() for m in pods}
        if with_missing:  # the reasons need when each namespace was labelled
            times = await self._label_times(sorted(with_missing))
            found = missed.find_missing(
                facts, sets, labels, manager_namespace=self.manager_namespace, labelled_at=times
            )
        await self._publish(found, {ss.name: ss for ss in sets})
        if self.recreate:
            await self._recreate(found)
        return found

    async def _publish(self, found: dict[str, list[missed.MissedPod]], by_name: Mapping[str, SidecarSet]) -> None:
        changed = {n for n in set(found) | set(self.missing) if found.get(n) != self.missing.get(n)}
        previous = self.missing
        self.missing = found
        for name in set(previous) - set(found):  # a deleted SidecarSet: no series
            metrics.forget(name)
        for name, pods in found.items():
            metrics.PODS_MISSING_SIDECARS.labels(*metrics.owner(name)).set(len(pods))
            new = [m for m in pods if m not in set(previous.get(name) or ())]
            ss = by_name.get(name)
            if new and ss is not None:
                named = ", ".join(f"{m.key} ({m.reason})" for m in new[:SHOWN])
                more = f" and {len(new) - SHOWN} more" if len(new) > SHOWN else ""
                await self.recorder.event(
                    ss.obj,
                    type="Warning",
                    reason="PodsMissingSidecars",
                    message=f"{len(new)} running pod(s) without this SidecarSet's sidecars: {named}{more}",
                )
        for name in sorted(changed):
            if found.get(name) or previous.get(name):  # a first scan of a thousand healthy SidecarSets says nothing
                log.info(
                    "missed-injection scan: %s: %d running pod(s) without its sidecars",
                    name,
                    len(found.get(name) or ()),
                )
        if changed and self.on_change is not None:
            self.on_change(changed)

    async def _recreate(self, found: dict[str, list[missed.MissedPod]]) -> None:
        seen: set[str] = set()
        for pods in found.values():
            for m in pods:
                if m.key in seen:
                    continue
                seen.add(m.key)
                if not self.limit.take():
                    return
                await self._evict(m)

    async def _evict(self, m: missed.MissedPod) -> None:
        path = f"/api/v1/namespaces/{m.namespace}/pods/{m.name}"
        try:
            pod = await self.client.get(path)
        except api.NotFound:
            metrics.MISSED_RECREATED.labels("gone").inc()
            return
        if not missed.PodFacts.of(pod).owned:
            self.limit.tokens += 1.0  # nothing would recreate it: left alone, and costs nothing
            return
        if self.may_write is not None and not await self.may_write():
            return
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": m.name, "namespace": m.namespace},
            "deleteOptions": {"preconditions": {"uid": pod["metadata"]["uid"]}},
        }
        try:
            await self.client.create(f"{path}/eviction", body)
        except api.NotFound:
            metrics.MISSED_RECREATED.labels("gone").inc()
            return
        except api.ApiError as e:
            # 429: a PodDisruptionBudget does not allow it now; tried again on a later scan.
            result = "blocked" if e.status == 429 else "error"
            metrics.MISSED_RECREATED.labels(result).inc()
            log.info("not evicting %s to recreate it injected: %s", m.key, e)
            return
        metrics.MISSED_RECREATED.labels("evicted").inc()
        self.evicted.append((time.monotonic(), m.key))
        log.info(
            "evicted %s, which ran without SidecarSet %s's sidecars, for its controller to recreate",
            m.key,
            m.sidecarset,
        )
