"""Which pods get their sidecar images swapped in place next, and the exact patch for each.

A pure function of the SidecarSet and the pod projections, so every rollout rule (partition,
maxUnavailable, selector, priority, scatter, done detection) is tested without a cluster and
the controller only applies what it is given. Semantics follow Kruise's GetNextUpgradePods,
hot upgrades (the -1/-2 container pairs, sidecarsets.rollout.hotupgrade) and their flips included.
Each planned patch is written by sidecarsets.rollout.podpatch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods import podstate, resizestate
from sidecarsets.pods.projection import PodProjection
from sidecarsets.rollout import hotupgrade, podoverrides, resize
from sidecarsets.rollout.ordering import upgrade_order
from sidecarsets.rollout.podpatch import inplace_annotation, pod_patch, pointer
from sidecarsets.rollout.resize import resize_patch
from sidecarsets.rollout.status import pod_verdicts
from sidecarsets.spec import hotsidecars, selectors
from sidecarsets.spec.enums import UpdateType
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.names import ANN_INPLACE_STATE
from sidecarsets.spec.sidecar import MetadataPatch
from sidecarsets.values import intorpercent


@dataclass(frozen=True)
class PodUpgrade:
    namespace: str
    name: str
    uid: str
    resource_version: str
    patch: list[JsonObj]
    # patchPodMetadata to re-apply in the same patch (as Kruise does on upgrade); the operations
    # depend on the pod's current annotations, which the projection does not keep, so the
    # controller reads the pod and adds them (sidecarsets.spec.podmeta.upgrade_ops).
    metadata: tuple[MetadataPatch, ...] = ()
    sidecarset: str = ""
    # In-place resize (sidecarsets.rollout.resize): the `pods/resize` JSON Patch, sent first, and
    # the without-image hash the pod then records (written from the pod as it is, like `metadata`).
    resize: tuple[JsonObj, ...] = ()
    without_image_hash: str = ""
    sidecars: tuple[str, ...] = ()  # the SidecarSet's sidecar list, which that hash entry records

    @classmethod
    def of(
        cls,
        pod: PodProjection,
        ss: SidecarSet,
        patch: list[JsonObj],
        *,
        metadata: tuple[MetadataPatch, ...] = (),
        resize: tuple[JsonObj, ...] = (),
        without_image_hash: str = "",
        sidecars: tuple[str, ...] = (),
    ) -> PodUpgrade:
        """The upgrade of `pod` (its identity and resourceVersion as planned) for `ss`."""
        return cls(
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            resource_version=pod.resource_version,
            patch=patch,
            metadata=metadata,
            sidecarset=ss.name,
            resize=resize,
            without_image_hash=without_image_hash,
            sidecars=sidecars,
        )


class Stage(Enum):
    """Where a rollout stands after planning; the controller acts on this, users read `Plan.reason`.

    One enum from the planner to what `sidecarctl status`, `preview` and `check-inject` print (its
    values are what their JSON says), so that renaming a stage is a type error wherever it is read.
    """

    UPGRADING = "upgrading"  # `upgrades` holds the pods to patch now
    WAITING = "waiting"  # maxUnavailable is spent, or patched pods are still upgrading
    PARTITION = "partition"  # the remaining pods are held back by the partition
    NOTHING_UPGRADABLE = "nothing upgradable"
    DONE = "done"
    PAUSED = "paused"
    FLIPPING = "flipping"  # HotUpgrade: `upgrades` put the old containers of finished pairs on the empty image
    NOT_UPDATE = "NotUpdate"
    INVALID = "invalid"  # a field the rollout depends on cannot be read
    # Progressing=False with ProgressDeadlineExceeded (sidecarsets.rollout.deadline): never planned
    # here, it is what the glance and the preview say in place of the planner's stage.
    STOPPED = "stopped"


@dataclass(frozen=True)
class Plan:
    upgrades: tuple[PodUpgrade, ...]
    not_upgradable: tuple[tuple[str, str], ...]
    unavailable: int  # pods unavailable because of this SidecarSet's rollout, before this plan
    max_unavailable: int
    done: bool  # every matched pod carries the SidecarSet's current hash
    stage: Stage
    reason: str  # for people: the stage with its numbers, e.g. "waiting: 2/2 unavailable"
    # (namespace, name) -> why that not-upgradable pod cannot take the change, where more can be
    # said than "more than the image differs" (a resize the API server or the node would refuse).
    reasons: Mapping[tuple[str, str], str] = field(default_factory=dict)


def _partition(value: Any, total: int) -> int:
    """Pods to leave on the old revision. A percentage that rounds up to every pod (say 99% of
    10) still lets one pod upgrade; only "100%" (or an integer) holds back all of them."""
    if value is None:
        return 0
    kept = intorpercent.scaled(value, total)
    _, percent = intorpercent.parse(value)
    if percent and total > 1 and kept >= total and value != "100%":
        kept = total - 1
    return min(kept, total)


def _max_unavailable(value: Any, total: int) -> int:
    try:
        m = intorpercent.scaled(value, total, default=1)
        n, _ = intorpercent.parse(value) if value is not None else (1, False)
    except intorpercent.IntOrPercentError:
        return 0
    return max(m, 1) if n > 0 and total > 0 else m


def _by_identity(item: tuple[PodProjection, bool]) -> tuple[str, str, str]:
    pod = item[0]
    return (pod.namespace, pod.name, pod.uid)


def plan_upgrade(
    ss: SidecarSet,
    matched: Sequence[PodProjection],
    *,
    revision: str,
    now: str,
    verdicts: podstate.Verdicts | None = None,
    held_back: Collection[tuple[str, str]] = (),
    resizable: Collection[str] = frozenset(),
    resize_refusal: str | None = None,
) -> Plan:
    """The next step of the rollout over `matched` (pods with distinct namespace/name).

    `verdicts` from `status.pod_verdicts(ss, matched)` saves evaluating every pod again when the
    status was just computed from the same pods. Pods in `held_back` (namespace, name) are not
    planned this time (their patch keeps failing and they wait out a backoff); the others go on.
    `resizable` holds the without-image hashes of the specs that differ from this one only in
    images and resources (`resize.resizable_hashes`): pods injected from them are resized in place,
    unless `resize_refusal` says why no pod can be (the API server does not serve `pods/resize`).
    """
    name, strategy, total = ss.name, ss.update_strategy, len(matched)
    max_unavailable = _max_unavailable(strategy.max_unavailable, total)
    if verdicts is None:
        verdicts = pod_verdicts(ss, matched)
    elif not verdicts.is_for(matched, sidecarset=name, spec_hash=ss.hash):
        raise ValueError("verdicts were evaluated for other pods or another SidecarSet spec")
    infeasible = _infeasible_resizes(matched, verdicts)
    unavailable = _unavailable(matched, verdicts, infeasible)
    reasons = {**podoverrides.outside_bounds(ss, matched), **infeasible}  # both left as they are
    done = sum(verdicts.updated) >= total

    def plan(
        stage: Stage,
        reason: str,
        *,
        upgrades: tuple[PodUpgrade, ...] = (),
        not_upgradable: tuple[tuple[str, str], ...] = (),
    ) -> Plan:
        return Plan(
            upgrades=upgrades,
            not_upgradable=not_upgradable,
            unavailable=unavailable,
            max_unavailable=max_unavailable,
            done=done,
            stage=stage,
            reason=reason,
            reasons=dict(sorted(reasons.items())),
        )

    stopped = _stopped(ss)
    if stopped is not None:
        return plan(*stopped)
    candidates, not_upgradable, waiting, resizes = _candidates(
        ss, matched, verdicts, resizable, reasons, resize_refusal
    )
    not_upgradable = tuple(sorted({*not_upgradable, *reasons}))
    if held_back:
        candidates = [p for p in candidates if p.key not in held_back]
    flips = _flips(ss, matched, now=now, held_back=held_back)
    if flips:  # as Kruise: every pod ready for its flip, before (and instead of) new upgrades
        return plan(Stage.FLIPPING, f"flipping {len(flips)}", upgrades=flips, not_upgradable=not_upgradable)
    if done:
        return plan(Stage.DONE, "done", not_upgradable=not_upgradable)

    order = upgrade_order(candidates, matched, strategy)
    kept = _partition(strategy.partition, total)
    order = order[: max(0, len(order) - kept)]
    chosen = _within_budget(order, unavailable, max_unavailable, ready=lambda p: _ready(ss, p))
    upgrades = tuple(_upgrade(ss, pod, revision=revision, now=now, resizing=resizes.get(pod.key)) for pod in chosen)
    if upgrades:
        stage, reason = Stage.UPGRADING, f"upgrading {len(upgrades)}"
    elif candidates and not order:
        stage, reason = Stage.PARTITION, f"partition: {kept} pods kept on the old revision"
    elif order:
        stage, reason = Stage.WAITING, f"waiting: {unavailable}/{max_unavailable} unavailable"
    elif waiting:
        stage, reason = Stage.WAITING, f"waiting: {waiting} pods still upgrading"
    else:
        stage, reason = Stage.NOTHING_UPGRADABLE, "no upgradable pods"
    return plan(stage, reason, upgrades=upgrades, not_upgradable=not_upgradable)


def _infeasible_resizes(matched: Sequence[PodProjection], verdicts: podstate.Verdicts) -> dict[tuple[str, str], str]:
    """Pods whose resize the node can never fit, with why: the rollout stops at each such pod, which
    runs on as it was, so it holds no part of maxUnavailable and the rest of the rollout goes on."""
    return {
        pod.key: f"resize infeasible on node {pod.node_name or '?'}: {why}"
        for pod, is_new in zip(matched, verdicts.updated, strict=True)
        if is_new and (why := resizestate.infeasible(pod)) is not None
    }


def _unavailable(
    matched: Sequence[PodProjection], verdicts: podstate.Verdicts, infeasible: Collection[tuple[str, str]]
) -> int:
    """Pods unavailable because of this rollout (patched, or being patched, and not available)."""
    return sum(
        1
        for pod, is_new, moving, ok in zip(
            matched, verdicts.updated, verdicts.in_flight, verdicts.available, strict=True
        )
        if (is_new or moving) and not ok and pod.key not in infeasible
    )


def _stopped(ss: SidecarSet) -> tuple[Stage, str] | None:
    """Why no pod may be planned at all, before any pod is looked at."""
    if not ss.name:
        return Stage.INVALID, "invalid: metadata.name: missing"
    if ss.update_strategy.type is UpdateType.NOT_UPDATE:
        return Stage.NOT_UPDATE, "NotUpdate"
    type_problem = ss.problem("spec.updateStrategy.type")
    if type_problem is not None:
        return Stage.INVALID, f"invalid: {type_problem}"
    if ss.update_strategy.paused:
        return Stage.PAUSED, "paused"
    problem = ss.rollout_problem()
    if problem is not None:
        return Stage.INVALID, f"invalid: {problem}"
    return None


def _candidates(
    ss: SidecarSet,
    matched: Sequence[PodProjection],
    verdicts: podstate.Verdicts,
    resizable: Collection[str],
    reasons: dict[tuple[str, str], str],
    resize_refusal: str | None = None,
) -> tuple[list[PodProjection], tuple[tuple[str, str], ...], int, dict[tuple[str, str], resize.ResizeDecision]]:
    """(pods that may be upgraded now, pods that cannot be upgraded in place, pods still upgrading,
    the resize of each candidate that needs one).

    Only pods not yet updated are considered, in namespace/name order, so ties and the
    not-upgradable list never depend on the order the pods came in. A resize the API server
    would refuse makes its pod not upgradable, with the reason added to `reasons`.
    """
    outdated = [(p, f) for p, u, f in zip(matched, verdicts.updated, verdicts.in_flight, strict=True) if not u]
    outdated.sort(key=_by_identity)
    update_selector = ss.update_strategy.selector
    selected = None if update_selector is None else selectors.matcher(update_selector)
    candidates: list[PodProjection] = []
    not_upgradable: list[tuple[str, str]] = []
    resizes: dict[tuple[str, str], resize.ResizeDecision] = {}
    waiting = 0
    for pod, moving in outdated:
        if (selected is not None and not selected(pod.labels)) or pod.key in reasons:
            continue
        entry = pod.hash_without_image_for(ss.name)
        if entry is None or (entry.hash != ss.hash_without_image and entry.hash not in resizable):
            not_upgradable.append(pod.key)
            continue
        if entry.hash != ss.hash_without_image:
            unserved = None if resize_refusal is None else resize.ResizeDecision(refusal=resize_refusal)
            decision = unserved or resize.decide(ss, pod)
            if decision.refusal:
                not_upgradable.append(pod.key)
                reasons[pod.key] = decision.refusal
                continue
            resizes[pod.key] = decision
        if moving and not _superseded(ss, pod):
            waiting += 1
        else:
            candidates.append(pod)
    return candidates, tuple(not_upgradable), waiting, resizes


def _superseded(ss: SidecarSet, pod: PodProjection) -> bool:
    """The pod waits for an image the SidecarSet no longer asks for (say one that cannot be pulled,
    since replaced): the kubelet will never report it, so the pod is patched again, to the image
    wanted now, instead of holding maxUnavailable forever. Not yet ready, it costs no budget."""
    wanted = {**ss.cold_images, **ss.native_images}
    specs = dict(pod.containers) | dict(pod.init_containers)
    return any(name in specs and not podstate.same_image(specs[name], image) for name, image in wanted.items())


def _ready(ss: SidecarSet, pod: PodProjection) -> bool:
    """Kruise's control.IsPodReady: running and ready, and each HotUpgrade pair's idle container emptied."""
    return podstate.is_running_ready(pod) and hotupgrade.empties_done(pod, ss)


def _upgrade(
    ss: SidecarSet, pod: PodProjection, *, revision: str, now: str, resizing: resize.ResizeDecision | None = None
) -> PodUpgrade:
    physical = ss.container_names_in_pod

    def consistent(container: str) -> bool:
        return podstate.is_consistent(pod, sidecarset=ss.name, containers={container} & physical)

    hot_ops, hot_changed = hotupgrade.upgrade_ops(pod, ss, consistent=consistent)
    patch = pod_patch(
        pod,
        ss_name=ss.name,
        images={**ss.cold_images, **ss.native_images},
        new_hash=ss.hash,
        sidecars=ss.sidecar_list,
        revision=revision,
        now=now,
        hot_ops=hot_ops,
        hot_changed=hot_changed,
    )
    steps = resizing.steps if resizing is not None else ()
    return PodUpgrade.of(
        pod,
        ss,
        patch,
        metadata=ss.patch_pod_metadata,
        resize=tuple(resize_patch(pod, steps)) if steps else (),
        without_image_hash="" if resizing is None else ss.hash_without_image,
        sidecars=() if resizing is None else tuple(ss.sidecar_list),
    )


def _flips(
    ss: SidecarSet, matched: Sequence[PodProjection], *, now: str, held_back: Collection[tuple[str, str]]
) -> tuple[PodUpgrade, ...]:
    """The HotUpgrade flips due now: pods whose new containers run and which are ready get their old
    containers put on the empty image (no maxUnavailable: the sidecar keeps serving throughout)."""
    if not hotsidecars.hot_sidecars(ss):
        return ()
    physical = ss.container_names_in_pod
    out: list[PodUpgrade] = []
    for pod in sorted(matched, key=lambda p: (p.namespace, p.name, p.uid)):
        if pod.key in held_back or not podstate.is_active(pod):
            continue

        def consistent_except(idle: set[str], pod: PodProjection = pod) -> bool:
            return podstate.is_consistent(pod, sidecarset=ss.name, containers=physical - idle)

        if not hotupgrade.flip_ready(pod, ss, consistent_except=consistent_except):
            continue
        ops, changed = hotupgrade.flip_ops(pod, ss)
        if not changed:
            continue
        state = inplace_annotation(pod, ss_name=ss.name, changed=changed, revision="", now=now, merge=True)
        ops.append({"op": "add", "path": pointer("metadata", "annotations", ANN_INPLACE_STATE), "value": state})
        out.append(PodUpgrade.of(pod, ss, ops))
    return tuple(out)


def _within_budget(
    order: Sequence[PodProjection], unavailable: int, max_unavailable: int, *, ready: Callable[[PodProjection], bool]
) -> list[PodProjection]:
    """Pods from the front of `order` while maxUnavailable allows; pods already unavailable cost nothing."""
    count = unavailable
    chosen: list[PodProjection] = []
    for pod in order:
        if not ready(pod):
            chosen.append(pod)  # already unavailable: upgrading it costs nothing
            continue
        if count >= max_unavailable:
            break
        count += 1
        chosen.append(pod)
    return chosen
