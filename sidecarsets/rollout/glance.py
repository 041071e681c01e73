"""A SidecarSet's rollout at a glance, from the same verdicts the controller acts on.

The status counters say how far a rollout got; people also ask which pods are being upgraded right
now, what holds the rest back and which pods run without their sidecars. The answers come from the
functions the controller and the missed-injection scan call (status.pod_verdicts, planner.plan_upgrade,
deadline, missed.find_missing) on the pods as they are, so `sidecarctl status` (and `check-inject`,
which quotes it) never tells a story the controller does not act on. Pure: the CLI reads the objects.
(`status` beside it is the SidecarSet's own status: the counters and conditions the controller writes.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods import missed
from sidecarsets.pods.projection import PodProjection
from sidecarsets.rollout import deadline, planner, podoverrides, resize, rolloutsim, specdiff, status
from sidecarsets.spec import names, selectors
from sidecarsets.spec.model import SidecarSet

COUNTERS = ("matchedPods", "updatedPods", "readyPods", "updatedReadyPods")


@dataclass(frozen=True)
class Glance:
    name: str
    generation: int
    observed_generation: int | None
    counts: Mapping[str, int]  # as the SidecarSet's status says
    live: Mapping[str, int]  # as the pods say now (the status may be a moment behind)
    stage: planner.Stage
    reason: str
    stopped: bool  # Progressing=False, ProgressDeadlineExceeded at this generation
    upgrading: tuple[tuple[str, str], ...]  # (pod, why not ready yet): the batch in flight
    not_ready: tuple[tuple[str, str], ...]  # other matched pods not available
    not_upgradable: tuple[specdiff.Blocked, ...]
    excluded_by_selector: tuple[str, ...]
    missing: tuple[missed.MissedPod, ...]
    conditions: tuple[Mapping[str, Any], ...]
    recreate: tuple[tuple[str, str], ...] = ()  # (pod, which env override changed): only a new pod takes it
    kind: str = names.KIND  # or NamespacedSidecarSet, whose `name` is `namespace/name`

    @property
    def summary(self) -> str:
        """One phrase for the overview line: where the rollout stands and what blocks it."""
        parts = ["stopped: ProgressDeadlineExceeded" if self.stopped else self.reason]
        if self.upgrading and not self.stopped:
            parts.append(f"{len(self.upgrading)} in flight")
        if self.not_upgradable:
            parts.append(f"{len(self.not_upgradable)} not upgradable")
        if self.not_ready:
            parts.append(f"{len(self.not_ready)} not ready")
        if self.recreate:
            parts.append(f"{len(self.recreate)} to recreate for env overrides")
        return ", ".join(parts)

    def as_json(self) -> JsonObj:
        return {
            "kind": self.kind,
            "name": self.name,
            "generation": self.generation,
            "observedGeneration": self.observed_generation,
            "counts": dict(self.counts),
            "live": dict(self.live),
            "stage": self.stage.value,
            "reason": self.reason,
            "stopped": self.stopped,
            "upgrading": [{"pod": k, "reason": why} for k, why in self.upgrading],
            "notReady": [{"pod": k, "reason": why} for k, why in self.not_ready],
            "notUpgradable": [b.as_json() for b in self.not_upgradable],
            "excludedByUpdateSelector": list(self.excluded_by_selector),
            "missing": [{"pod": m.key, "reason": m.reason, "owned": m.owned} for m in self.missing],
            "conditions": [dict(c) for c in self.conditions],
            "recreateForOverrides": [{"pod": k, "reason": why} for k, why in self.recreate],
            "summary": self.summary,
        }


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def of(
    ss: SidecarSet,
    pods: Sequence[PodProjection],
    raw_pods: Mapping[str, Mapping[str, Any]],
    namespace_labels: Mapping[str, Mapping[str, str]],
    *,
    stored_revisions: Sequence[Mapping[str, Any]],
    missing: Sequence[missed.MissedPod],
    now: str,
) -> Glance:
    """Where `ss`'s rollout stands over `pods` (the injected pods; `raw_pods` by namespace/name,
    for explaining pods that cannot be upgraded)."""
    matched = status.matched_pods(ss, pods, namespace_labels)
    verdicts = status.pod_verdicts(ss, matched)
    live = status.compute_status(ss, matched, latest_revision=None, collision_count=None, verdicts=verdicts)
    st = ss.status
    revision = str(st.get("latestRevision") or "")
    specs = specdiff.known_specs(ss, stored_revisions)
    resizable = resize.resizable_hashes(ss, [spec for _, spec in specs])
    plan = planner.plan_upgrade(ss, matched, revision=revision, now=now, verdicts=verdicts, resizable=resizable)
    stopped = deadline.is_stopped(ss)
    upgrading: list[tuple[str, str]] = []
    not_ready: list[tuple[str, str]] = []
    for p, is_new, moving, ok in zip(matched, verdicts.updated, verdicts.in_flight, verdicts.available, strict=True):
        if ok:
            continue
        entry = (f"{p.namespace}/{p.name}", rolloutsim.not_ready_reason(ss, p))
        (upgrading if is_new or moving else not_ready).append(entry)
    reasons = plan.reasons  # a resize the API server or the node would refuse: said as such
    blocked = tuple(
        specdiff.Blocked(f"{ns}/{n}", (reasons[(ns, n)],), _compared(reasons[(ns, n)]))
        if (ns, n) in reasons
        else specdiff.why_not_upgradable(ss, raw_pods[f"{ns}/{n}"], specs)
        for ns, n in plan.not_upgradable
        if f"{ns}/{n}" in raw_pods
    )
    excluded: tuple[str, ...] = ()
    if ss.update_strategy.selector is not None:
        match = selectors.matcher(ss.update_strategy.selector)
        excluded = tuple(
            sorted(
                f"{p.namespace}/{p.name}"
                for p, u in zip(matched, verdicts.updated, strict=True)
                if not u and not match(p.labels)
            )
        )
    conditions = tuple(c for c in st.get("conditions") or [] if isinstance(c, Mapping))
    observed = st.get("observedGeneration")
    return Glance(
        name=ss.name,
        generation=ss.generation,
        observed_generation=observed if isinstance(observed, int) else None,
        counts={k: _int(st.get(k)) for k in COUNTERS},
        live={k: _int(live.get(k)) for k in COUNTERS},
        stage=planner.Stage.STOPPED if stopped else plan.stage,
        reason=_stopped_reason(conditions) if stopped else plan.reason,
        stopped=stopped,
        upgrading=tuple(sorted(upgrading)),
        not_ready=tuple(sorted(not_ready)),
        not_upgradable=blocked,
        excluded_by_selector=excluded,
        missing=tuple(missing),
        conditions=conditions,
        recreate=tuple(sorted(("/".join(k), why) for k, why in podoverrides.env_changes(ss, matched).items())),
        kind=ss.kind,
    )


def _compared(reason: str) -> str:
    """What a refusal compared: the pod's own overrides with the bounds, or a resize with what the API
    server and the node take."""
    return "the SidecarSet's override bounds" if reason.startswith(names.ANN_OVERRIDES) else "resize"


def _stopped_reason(conditions: Sequence[Mapping[str, Any]]) -> str:
    for c in conditions:
        if c.get("type") == names.CONDITION_PROGRESSING:
            return str(c.get("message") or names.REASON_DEADLINE_EXCEEDED)
    return names.REASON_DEADLINE_EXCEEDED


def missing_pods(
    sidecarsets: Sequence[SidecarSet],
    injected: Sequence[Mapping[str, Any]],
    unlabelled: Sequence[Mapping[str, Any]],
    namespaces: Sequence[Mapping[str, Any]],
    namespace_labels: Mapping[str, Mapping[str, str]],
    *,
    manager_namespace: str,
) -> dict[str, list[missed.MissedPod]]:
    """The missed-injection scan's answer (sidecarsets.controller.missedscan), from pods already read: injected
    pods (which may lack another SidecarSet) and the unlabelled pods of labelled namespaces."""
    facts = [missed.PodFacts.of(p) for group in (injected, unlabelled) for p in group]
    times: dict[str, str] = {}
    for ns in namespaces:
        when = missed.label_time(ns)
        name = (ns.get("metadata") or {}).get("name")
        if when is not None and isinstance(name, str):
            times[name] = when
    return missed.find_missing(
        facts, sidecarsets, namespace_labels, manager_namespace=manager_namespace, labelled_at=times
    )


def labelled_namespaces(namespace_labels: Mapping[str, Mapping[str, str]], *, manager_namespace: str) -> list[str]:
    """Namespaces whose pods the webhook is asked about, as the scan lists them."""
    return sorted(
        ns
        for ns, ls in namespace_labels.items()
        if ls.get(names.NS_INJECTION_LABEL) == names.NS_INJECTION_ENABLED
        and ns not in names.SYSTEM_NAMESPACES
        and ns != manager_namespace
    )
