"""The rollout of a SidecarSet spec, simulated pass by pass with the controller's own planner.

`sidecarctl preview` shows the batches the controller would run; they must be the controller's,
not a second opinion that drifts from it, so nothing here decides anything the planner decides:
the rollout is simulated by calling `planner.plan_upgrade` pass after pass, as the controller
does, on pod copies to which each pass's patch is applied and on which a kubelet is simulated
(sidecarsets.rollout.simnode: the new image running and ready), until the planner has nothing
more to do. Whatever the planner honours (partition, maxUnavailable, the update selector, priority,
scatter, pods already not ready) the simulation honours by construction.

The simulation assumes the best case the controller can see: every patched pod comes back ready at
once, before the next pass. A real rollout whose pods come back one by one plans more often with
smaller batches, so the batches shown are the waves of a rollout whose pods restart promptly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods import podstate
from sidecarsets.pods.podkeys import pod_key, projection_key
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.rollout import deadline, planner, resize, status
from sidecarsets.rollout.simnode import apply_upgrade, kubelet_report
from sidecarsets.spec import names, selectors
from sidecarsets.spec.model import SidecarSet


@dataclass(frozen=True)
class Batch:
    number: int
    pods: tuple[str, ...]  # namespace/name, in the order the planner chose them


@dataclass(frozen=True)
class Rollout:
    """The simulated rollout: the batches, and where the planner stops after the last one."""

    batches: tuple[Batch, ...]
    stage: planner.Stage  # where the planner stops after the last batch
    reason: str
    max_unavailable: int
    partition: int  # pods the partition keeps on the old revision
    matched: tuple[str, ...]
    already_updated: tuple[str, ...]  # carrying the spec's hash before the first batch
    unavailable_before: int  # pods the planner counted unavailable before the first batch
    not_upgradable: tuple[str, ...]
    kept: tuple[str, ...]  # held back by the partition at the end
    # (pod, why): updated (or in flight) and still not ready at the end: they hold the budget
    waiting_on: tuple[tuple[str, str], ...]
    excluded_by_selector: tuple[str, ...]
    not_ready_before: tuple[tuple[str, str], ...] = ()  # (pod, why): matched pods not available at the start
    flips: int = 0  # HotUpgrade flip passes between batches
    upgraded: tuple[str, ...] = field(default=())
    resized: tuple[str, ...] = ()  # upgraded pods whose sidecars' CPU or memory is resized in place

    @property
    def done(self) -> bool:
        return self.stage is planner.Stage.DONE


def _writes(pod: JsonObj, u: planner.PodUpgrade, now: str) -> list[JsonObj]:
    """The controller's writes to one pod as one patch: the resize, then the upgrade patch with the
    without-image hash a resize records (read from the pod, as the controller reads it)."""
    if not u.without_image_hash:
        return u.patch
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    entry = resize.resize_record(u, annotations.get(names.ANN_HASH_WITHOUT_IMAGE), now=now)
    return [*u.resize[1:], *u.patch, entry]  # one write here: a single resourceVersion test


def partition_of(ss: SidecarSet, total: int) -> int:
    """Pods the partition keeps, counted over `total` matched pods as the planner counts them."""
    return planner._partition(ss.update_strategy.partition, total)


def _excluded(ss: SidecarSet, matched: Sequence[PodProjection], verdicts: podstate.Verdicts) -> tuple[str, ...]:
    sel = ss.update_strategy.selector
    if sel is None:
        return ()
    match = selectors.matcher(sel)
    return tuple(
        sorted(
            projection_key(p)
            for p, updated in zip(matched, verdicts.updated, strict=True)
            if not updated and not match(p.labels)
        )
    )


@dataclass
class _Simulation:
    """The pod copies a simulated rollout works on (raw and projected), and what its passes did."""

    ss: SidecarSet
    namespace_labels: Mapping[str, Mapping[str, str]]
    revision: str
    now: str
    raw: dict[str, JsonObj]
    resizable: Collection[str] = frozenset()
    projected: dict[str, PodProjection] = field(init=False)
    batches: list[Batch] = field(default_factory=list)
    upgraded: list[str] = field(default_factory=list)
    resized: list[str] = field(default_factory=list)
    flips: int = 0

    def __post_init__(self) -> None:
        self.projected = {k: project(v) for k, v in self.raw.items()}

    def look(self) -> tuple[list[PodProjection], podstate.Verdicts]:
        matched = status.matched_pods(self.ss, self.projected.values(), self.namespace_labels)
        return matched, status.pod_verdicts(self.ss, matched)

    def plan(self, matched: list[PodProjection], verdicts: podstate.Verdicts) -> planner.Plan:
        return planner.plan_upgrade(
            self.ss, matched, revision=self.revision, now=self.now, verdicts=verdicts, resizable=self.resizable
        )

    def replace(self, key: str, value: JsonObj) -> None:
        self.raw[key] = value
        self.projected[key] = project(value)

    def land_in_flight(self, matched: Sequence[PodProjection]) -> bool:
        """The kubelet lands the images of pods already upgrading; False when no pod changed."""
        landed = False
        for p in matched:
            key = projection_key(p)
            after = kubelet_report(self.raw[key], now=self.now)
            if after != self.raw[key]:
                self.replace(key, after)
                landed = True
        return landed

    def apply(self, plan: planner.Plan) -> None:
        """One pass's upgrades applied, each pod coming back upgraded and ready; a batch recorded
        unless the pass is a HotUpgrade flip."""
        for u in plan.upgrades:
            key = f"{u.namespace}/{u.name}"
            self.replace(
                key, kubelet_report(apply_upgrade(self.raw[key], _writes(self.raw[key], u, self.now)), now=self.now)
            )
            if u.resize:
                self.resized.append(key)
        if plan.stage is planner.Stage.FLIPPING:
            self.flips += 1
        else:
            chosen = tuple(f"{u.namespace}/{u.name}" for u in plan.upgrades)
            self.batches.append(Batch(len(self.batches) + 1, chosen))
            self.upgraded += chosen

    def run(
        self, plan: planner.Plan, matched: list[PodProjection], verdicts: podstate.Verdicts, passes_left: int
    ) -> tuple[planner.Plan, list[PodProjection], podstate.Verdicts]:
        """Pass after pass from `plan` until the planner has nothing more to do (or no pass is left):
        the last plan, and the matched pods and verdicts it was made from."""
        while passes_left > 0:
            passes_left -= 1
            if not plan.upgrades:
                # Waiting on pods already upgrading: the kubelet lands their images, then the planner goes on.
                if plan.stage is not planner.Stage.WAITING or not self.land_in_flight(matched):
                    break
            else:
                self.apply(plan)
            matched, verdicts = self.look()
            plan = self.plan(matched, verdicts)
        return plan, matched, verdicts


def simulate_rollout(
    ss: SidecarSet,
    pods: Iterable[JsonObj],
    namespace_labels: Mapping[str, Mapping[str, str]],
    *,
    revision: str,
    now: str,
    max_passes: int | None = None,
    resizable: Collection[str] = frozenset(),
) -> Rollout:
    """The rollout of `ss` over `pods` (raw pod objects; only those it matches take part), pass by
    pass as the controller runs it, each pass's pods coming back upgraded and ready before the next."""
    raw: dict[str, JsonObj] = {}
    for obj in pods:
        raw.setdefault(pod_key(obj), obj)
    sim = _Simulation(ss, namespace_labels, revision, now, raw, resizable)
    passes_left = max_passes if max_passes is not None else 2 * len(raw) + 10
    matched, verdicts = sim.look()
    first = sim.plan(matched, verdicts)
    stopped = deadline.is_stopped(ss)  # then the controller touches no pod until the spec or the condition changes
    if stopped:
        first = dataclasses.replace(first, upgrades=())
        passes_left = 0
    already = tuple(sorted(projection_key(p) for p, u in zip(matched, verdicts.updated, strict=True) if u))
    not_ready = tuple(
        sorted(
            (projection_key(p), not_ready_reason(ss, p))
            for p, ok in zip(matched, verdicts.available, strict=True)
            if not ok
        )
    )
    excluded = _excluded(ss, matched, verdicts)
    plan, matched, verdicts = sim.run(first, matched, verdicts, passes_left)
    kept, waiting = _held_at_end(ss, plan, matched, verdicts)
    return Rollout(
        batches=tuple(sim.batches),
        stage=planner.Stage.STOPPED if stopped else plan.stage,
        reason=_stopped_reason(ss) if stopped else plan.reason,
        max_unavailable=plan.max_unavailable,
        partition=partition_of(ss, len(matched)),
        matched=tuple(sorted(projection_key(p) for p in matched)),
        already_updated=already,
        unavailable_before=first.unavailable,
        not_upgradable=tuple(sorted(f"{ns}/{n}" for ns, n in first.not_upgradable)),
        kept=tuple(sorted(kept)),
        waiting_on=tuple(sorted(waiting)),
        excluded_by_selector=excluded,
        not_ready_before=not_ready,
        flips=sim.flips,
        upgraded=tuple(sim.upgraded),
        resized=tuple(sim.resized),
    )


def _held_at_end(
    ss: SidecarSet, plan: planner.Plan, matched: Sequence[PodProjection], verdicts: podstate.Verdicts
) -> tuple[list[str], list[tuple[str, str]]]:
    """(pods the partition keeps on the old revision, (pod, why) updated or in flight and not ready)
    where the last plan leaves the rollout."""
    stuck = {f"{ns}/{n}" for ns, n in plan.not_upgradable}
    selected = selectors.matcher(ss.update_strategy.selector) if ss.update_strategy.selector is not None else None
    kept: list[str] = []
    waiting: list[tuple[str, str]] = []
    for p, is_new, moving, ok in zip(matched, verdicts.updated, verdicts.in_flight, verdicts.available, strict=True):
        key = projection_key(p)
        if (is_new or moving) and not ok:
            waiting.append((key, not_ready_reason(ss, p)))
        elif (
            plan.stage is planner.Stage.PARTITION
            and not is_new
            and key not in stuck
            and (selected is None or selected(p.labels))
        ):
            kept.append(key)
    return kept, waiting


def _stopped_reason(ss: SidecarSet) -> str:
    conditions = ss.status.get("conditions")
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, Mapping) and c.get("type") == names.CONDITION_PROGRESSING:
            return f"stopped ({names.REASON_DEADLINE_EXCEEDED}): {c.get('message') or ''}".rstrip(": ")
    return f"stopped ({names.REASON_DEADLINE_EXCEEDED})"


def not_ready_reason(ss: SidecarSet, pod: PodProjection) -> str:
    """What the kubelet says about a matched pod that is not available."""
    containers = sorted({*ss.cold_images, *ss.native_images})
    if pod.phase != "Running":
        return f"phase {pod.phase or 'unknown'}"
    if not podstate.is_consistent(pod, sidecarset=ss.name, containers=set(containers)):
        return "the new image is not reported running yet"
    return deadline.why_not_ready(pod, containers)
